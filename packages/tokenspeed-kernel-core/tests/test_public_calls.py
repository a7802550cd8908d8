"""Public calls served by prepared calls (``core/op.py``, "Launch plans"), on CPU.

The path is on in a CUDA process; here it is switched on by hand and meta tensors stand in for device
tensors (a memo key never describes a CPU tensor). On every op's CPU cases: the third call of one
metadata is served by the prepared call the second one made, and gives what the plain path gives (in
form: meta tensors have no values; the GPU test ``test_launch_gpu`` compares values). What changes the
selection (an override block, a forgotten selection cache, ``solution=``) gets its own prepared call;
hooks, profilers and debug checks take the plain path.
"""

from __future__ import annotations

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.core import op as op_module
from tokenspeed_kernel.core import profiling
from tokenspeed_kernel.core.op import PreparedCall
from tokenspeed_kernel.numerics.cases import standard_cases
from tokenspeed_kernel.numerics.inputs import make_generator

OPS = sorted(tk.all_contracts())
CPU = torch.device("cpu")


@pytest.fixture
def served(monkeypatch):
    """Public serving on, and a count of the calls that took the plain path."""
    monkeypatch.setattr(op_module, "_public_plans", [True])
    plain = []
    dispatch = op_module.Op._dispatch

    def counted(self, *a):
        plain.append(self.name)
        return dispatch(self, *a)

    monkeypatch.setattr(op_module.Op, "_dispatch", counted)
    return plain


def _meta(v):
    if isinstance(v, torch.Tensor) and type(v) is torch.Tensor:
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    return v


def _form(out):
    if isinstance(out, torch.Tensor):
        return (tuple(out.shape), out.stride(), out.dtype)
    if isinstance(out, tuple | list):
        return tuple(_form(o) for o in out)
    return out


def _reset(op):
    op._public_calls.clear()
    op._public_seen.clear()
    op._public_misses.clear()
    op._public_off.clear()
    op._public_hits.clear()


@pytest.mark.parametrize("name", OPS)
def test_the_third_call_is_served_and_gives_what_the_plain_path_gives(served, name):
    op = tk.get_contract(name)
    oc = op.cases
    tried = 0
    for case in standard_cases(name, "cpu")[:3]:
        call = oc.make(case, CPU, make_generator(CPU, case.seed(0)))
        metas = [{k: _meta(v) for k, v in call.items()} for _ in range(4)]
        try:
            want = op._dispatch((), metas[0], "reference", None)
        except Exception:  # a case meta tensors cannot express
            continue
        _reset(op)
        served.clear()
        outs = [op(**m, solution="reference") for m in metas[1:]]
        assert all(_form(o) == _form(want) for o in outs), f"{name} {case.describe()}"
        entries = list(op._public_calls.values())
        if not entries:  # no memo key: an object of another kind (MoE weights), generators
            assert served == [name] * 3
            continue
        tried += 1
        assert len(entries) == 1
        if isinstance(entries[0], PreparedCall):
            assert served == [name], f"{name}: the third call was not served ({served})"
        else:  # cannot be prepared: the plain path serves it
            assert entries[0] is op_module._NO_CALL and served == [name] * 3
    if name in ("rmsnorm", "mm", "moe_gate", "swiglu", "apply_rotary"):
        assert tried, f"{name}: no case was served"


def test_what_changes_the_selection_gets_its_own_prepared_call(served):
    x = torch.empty(4, 64, dtype=torch.bfloat16, device="meta")
    w = torch.empty(64, dtype=torch.bfloat16, device="meta")
    op = tk.rmsnorm
    ref = "reference"  # (meta tensors: the reference kernel runs on them)
    _reset(op)
    for _ in range(3):
        op(x, w, 1e-5, solution=ref)
    assert len(op._public_calls) == 1
    with tk.kernel_override(ref):
        for _ in range(3):
            op(x, w, 1e-5, solution=ref)
    assert len(op._public_calls) == 2
    for _ in range(3):
        op(x, w, 1e-5, override="reference.rmsnorm")
    assert len(op._public_calls) == 3
    from tokenspeed_kernel.core.selection import clear_selection_cache

    clear_selection_cache()
    n = len(served)
    op(x, w, 1e-5, solution=ref)
    assert len(served) == n + 1  # a new generation: seen anew
    for _ in range(3):
        op(x, w, 1e-6, solution=ref)  # another value
    assert len(op._public_calls) == 4
    with pytest.raises(Exception, match="solution"):  # an unhashable target: the plain path names it
        op(x, w, 1e-5, solution=["nope"])


def test_a_served_call_is_found_again_without_a_key_only_for_its_own_metadata(served, monkeypatch):
    """After the key path served a call, the next calls of that metadata find it through the pattern's checks
    (``Op._remember``: a C check of the tensors' metadata, the other arguments by value, the selection context and
    generation) without computing a key; anything the key describes differently takes the key path and is served
    by its own prepared call."""
    op = tk.rmsnorm
    x = torch.empty(4, 64, dtype=torch.bfloat16, device="meta")
    w = torch.empty(64, dtype=torch.bfloat16, device="meta")
    _reset(op)
    keys = []
    memo_key = op_module._memo_key
    monkeypatch.setattr(op_module, "_memo_key", lambda *a: keys.append(1) or memo_key(*a))
    for _ in range(4):  # (seen, prepared, served by the key path: a first call of the process sees two generations)
        op(x, w, 1e-5)
        if 3 in op._public_hits:
            break
    assert len(op._public_hits[3].entries) == 1
    (first,) = op._public_calls.values()

    def served_by(*args, **kwargs):
        """The prepared call that serves this call (None: the plain path), and how many keys it computed."""
        log, calls = [], [c for c in op._public_calls.values() if isinstance(c, PreparedCall)]
        real = [c._served for c in calls]
        for c, r in zip(calls, real):
            c._served = lambda *f, c=c, r=r: log.append(c) or r(*f)
        n = len(keys)
        try:
            out = op(*args, **kwargs)
        finally:
            for c, r in zip(calls, real):
                c._served = r
        assert _form(out) == _form(op._dispatch(args, kwargs, None, None))
        return (log[0] if log else None), len(keys) - n

    assert served_by(x, w, 1e-5) == (first, 0)  # found without a key
    assert served_by(torch.empty(4, 64, dtype=torch.bfloat16, device="meta"), w, 1e-5) == (first, 0)
    others = {
        "shape": (torch.empty(8, 64, dtype=torch.bfloat16, device="meta"), w, 1e-5),
        "dtype": (torch.empty(4, 64, dtype=torch.float32, device="meta"), w, 1e-5),
        "strides": (torch.empty(4, 128, dtype=torch.bfloat16, device="meta")[:, :64], w, 1e-5),
        "value": (x, w, 1e-6),
        "value type": (x, w, 1),  # (kinds other than the pattern's first: the key path every time)
    }
    for what, args in others.items():
        for _ in range(2):  # (seen, then prepared)
            op(*args)
        call, n_keys = served_by(*args)  # not claimed by an entry of other metadata: the key path serves it
        assert call is not None and call is not first and n_keys == 1, what
        assert served_by(*args) == (call, int(what == "value type")), what  # (remembered)
    # a served call of other kinds is known after its first miss: its arguments' kinds are not read again
    kind_reads = []
    memo_kind = op_module._memo_kind
    monkeypatch.setattr(op_module, "_memo_kind", lambda a: kind_reads.append(1) or memo_kind(a))
    call, n_keys = served_by(*others["value type"])
    assert call in op._public_hits[3].skip and n_keys == 1 and not kind_reads
    cpu = (torch.empty(4, 64, dtype=torch.bfloat16), torch.empty(64, dtype=torch.bfloat16), 1e-5)
    for _ in range(3):
        assert served_by(*cpu) == (None, 1)  # (never served: the plain path)
    # each served metadata keeps its own entry; the first is still found without a key
    assert served_by(x, w, 1e-5) == (first, 0)
    with tk.kernel_override("reference"):  # another selection context
        assert served_by(x, w, 1e-5)[1] == 1
    from tokenspeed_kernel.core.selection import clear_selection_cache

    clear_selection_cache()  # another generation
    assert served_by(x, w, 1e-5) == (None, 1)  # (seen anew: the plain path)
    # keyword calls are their own pattern: weight and eps by name, in either order
    for kw in ({"weight": w, "eps": 1e-5}, {"eps": 1e-5, "weight": w}):
        for _ in range(4):
            op(x, **kw)
        call, n_keys = served_by(x, **kw)
        assert call is not None and n_keys == 0, kw


def test_hooks_profilers_and_debug_checks_take_the_plain_path(served, monkeypatch):
    x = torch.empty(4, 64, dtype=torch.bfloat16, device="meta")
    w = torch.empty(64, dtype=torch.bfloat16, device="meta")
    op = tk.rmsnorm
    _reset(op)
    for _ in range(3):
        op(x, w, 1e-5, solution="reference")
    seen = []
    monkeypatch.setattr(profiling, "dispatch_hook", lambda *a: seen.append(a[0]))
    n = len(served)
    op(x, w, 1e-5, solution="reference")
    assert seen == ["rmsnorm"] and len(served) == n + 1
    monkeypatch.setattr(profiling, "dispatch_hook", None)
    monkeypatch.setattr(op_module, "debug_checks_enabled", lambda: True)
    op(x, w, 1e-5, solution="reference")
    assert len(served) == n + 2


def test_a_pattern_without_keys_stops_looking_but_not_for_cpu_calls(served):
    op = tk.rmsnorm
    _reset(op)
    x, w = torch.randn(2, 8), torch.randn(8)  # CPU tensors: no memo key, not counted
    for _ in range(10):
        op(x, w, 1e-5)
    assert not op._public_off and served == ["rmsnorm"] * 10

    class Eps(float):  # an argument of a kind the memo does not describe
        pass

    xm = torch.empty(2, 8, device="meta")
    wm = torch.empty(8, device="meta")
    for _ in range(8):
        op(xm, wm, Eps(1e-5), solution="reference")
    assert (3,) in op._public_off  # (solution= is the call's own keyword, not part of the pattern)


def _moe_weights(e=4, h=64, i=32, **changes):
    """Canonical MXFP4 expert weights on the meta device (``changes``: fields replaced)."""
    m = dict(device="meta", dtype=torch.uint8)
    fields = dict(
        w13=torch.empty(e, 2 * i, h // 2, **m), w2=torch.empty(e, h, i // 2, **m), format="mxfp4",
        w13_scale=torch.empty(e, 2 * i, h // 32, **m), w2_scale=torch.empty(e, h, i // 32, **m),
    )  # fmt: skip
    fields.update(changes)
    return tk.MoEWeights(**fields)


def test_moe_weights_are_served_once_validated_and_the_kernel_gets_each_calls_own(served):
    """MoE weights get a memo key when they pass their checks, so every layer's ``moe_apply`` (weights of one
    metadata) shares one prepared call; the kernel still receives the call's own weights. Weights never checked
    have no key: a call with invalid ones is not served and raises, however many valid ones came first."""
    from tokenspeed_kernel.core.registry import Priority, register_kernel, unregister_kernel

    got = []

    def kernel(x, topk_weights, topk_ids, weights, activation, *, out=None):
        got.append(weights)
        return torch.empty_like(x)

    traits = {n: tk.ANY for n in ("activation", "clamp", "bias", "gate_up_interleaved", "up_offset")}
    register_kernel("moe_apply", name="memotest.moe", solution="memotest", traits=traits,
                    formats=[{"x": "bf16", "w": "mxfp4"}], priority=Priority.SPECIALIZED, impl=kernel)  # fmt: skip
    op = tk.get_contract("moe_apply")
    _reset(op)
    try:
        x = torch.empty(2, 64, dtype=torch.bfloat16, device="meta")
        tw = torch.empty(2, 2, dtype=torch.float32, device="meta")
        ids = torch.empty(2, 2, dtype=torch.int32, device="meta")
        act = tk.MoEActivation()
        layers = [_moe_weights() for _ in range(4)]
        assert all(w.__memo_key__ is None for w in layers)  # not checked yet
        for w in layers:
            op(x, tw, ids, w, act, override="memotest.moe")
        assert all(w.__memo_key__ is not None for w in layers) and len({w.__memo_key__ for w in layers}) == 1
        # (each first call: weights without a key yet, the plain path, which checks them)
        assert served == ["moe_apply"] * 4, served
        served.clear()
        for w in layers:  # the first: the key's first sighting (plain); the second prepares; then served
            op(x, tw, ids, w, act, override="memotest.moe")
        assert served == ["moe_apply"] and len(op._public_calls) == 1, served
        served.clear()
        for w in layers:
            op(x, tw, ids, w, act, override="memotest.moe")
        assert served == []
        assert [id(w) for w in got[-8:]] == [id(w) for w in layers] * 2
        # Invalid weights of the same shapes (a wrong scale dtype), after two unchecked valid ones: never checked,
        # so not served; their checks run.
        for _ in range(2):
            op(x, tw, ids, _moe_weights(), act, override="memotest.moe")
        bad = _moe_weights(w2_scale=torch.empty(4, 64, 1, dtype=torch.float32, device="meta"))
        with pytest.raises(TypeError, match="weights.w2_scale: expected dtype uint8"):
            op(x, tw, ids, bad, act, override="memotest.moe")
        assert bad.__memo_key__ is None
        # Another hidden size has another key: its own prepared call.
        other = _moe_weights(h=128)
        x2 = torch.empty(2, 128, dtype=torch.bfloat16, device="meta")
        for _ in range(3):
            op(x2, tw, ids, other, act, override="memotest.moe")
        assert len(op._public_calls) == 2
        # A MoE plan (a frozen dataclass holding an activation) is a value of the key.
        plan = tk.MoEPlan(kernel="memotest.moe", layout="canonical", format="mxfp4", activation=act)
        served.clear()
        for w in layers:
            op(x, tw, ids, w, act, plan=plan, override="memotest.moe")
        assert served == ["moe_apply"] and len(op._public_calls) == 3, served
    finally:
        unregister_kernel("memotest.moe")
        _reset(op)


def test_validated_moe_weights_carry_a_key_and_replace_drops_it():
    from dataclasses import replace

    def key(**changes):
        w = _moe_weights(**changes)
        w.validate()
        return w.__memo_key__

    w = _moe_weights()
    w.validate()
    assert w.__memo_key__ is not None and w.__memo_key__ == key()  # other weights of the same metadata: one key
    # What the checks read tells keys apart: shapes, the optional tensors, the row order.
    bias = torch.empty(4, 64, dtype=torch.bfloat16, device="meta")
    others = [key(h=128), key(i=64), key(e=8), key(w13_bias=bias), key(gate_up_interleaved=False)]
    assert len({w.__memo_key__, *others}) == 6
    assert replace(w, gate_up_interleaved=False).__memo_key__ is None  # new fields: not checked yet

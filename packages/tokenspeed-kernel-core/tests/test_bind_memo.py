"""The memo of validated call metadata (``core/op.py``): a hit gives what ``bind`` gives.

Meta tensors stand in for device tensors (the memo never serves a CPU tensor, whose values
the checks read; meta tensors have no values, like CUDA tensors outside debug mode). For
every op, on its CPU verify cases, a second call with new tensors of the same metadata must
return exactly what ``bind`` returns for it: the same selection key and the new call's own
objects in the kernel's arguments.
"""

from __future__ import annotations

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.core import op as op_module
from tokenspeed_kernel.numerics.cases import standard_cases
from tokenspeed_kernel.numerics.inputs import make_generator

OPS = sorted(tk.all_contracts())


def _meta(v):
    if isinstance(v, torch.Tensor) and type(v) is torch.Tensor:
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
    return v


def _same(got, want, inputs) -> list[str]:
    """What differs; a tensor of the call must be the call's own object, one bind made must match it in form."""
    ids = {id(v) for v in inputs.values()}

    def _differs(a, b) -> bool:
        if isinstance(b, torch.Tensor) or isinstance(a, torch.Tensor):
            if id(a) in ids or id(b) in ids:
                return a is not b
            return not (
                isinstance(a, torch.Tensor) and (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype)
            )
        return type(a) is not type(b) or a != b

    bad = []
    for i, name in enumerate(("device", "signature", "traits", "sizes")):
        if got[i] != want[i]:
            bad.append(name)
    if len(got[4]) != len(want[4]) or any(_differs(a, b) for a, b in zip(got[4], want[4])):
        bad.append("args")
    if got[5].keys() != want[5].keys() or any(_differs(got[5][k], want[5][k]) for k in want[5]):
        bad.append("kwargs")
    return bad


@pytest.mark.parametrize("name", OPS)
def test_a_memo_hit_equals_bind_on_every_ops_cases(name):
    op = tk.get_contract(name)
    oc = op.cases
    cpu = torch.device("cpu")
    served = 0
    for case in standard_cases(name, "cpu")[:4]:
        call = oc.make(case, cpu, make_generator(cpu, case.seed(0)))
        first = {k: _meta(v) for k, v in call.items()}
        second = {k: _meta(v) for k, v in call.items()}
        try:
            want = op.bind(**second)
        except Exception as exc:  # a case meta tensors cannot express: the memo path raises alike
            with pytest.raises(type(exc)):
                op_module._bind_memoised(op, (), second)
            continue
        op.__dict__.pop("_memo", None)
        op_module._bind_memoised(op, (), first)  # a miss: bind runs and the result is remembered
        memo = op.__dict__.get("_memo") or {}
        got = op_module._bind_memoised(op, (), second)
        assert not _same(got, want, second), f"{name} {case.describe()}: {_same(got, want, second)}"
        served += bool(memo)
    if name in (
        "rmsnorm",
        "mm",
        "mha_decode_with_kvcache",
        "mha_prefill",
        "mha_extend_with_kvcache",
        "apply_rotary",
        "kvcache_store",
        "swiglu",
    ):
        assert served, f"{name}: the memo served none of its cases"


def test_cpu_tensors_are_never_served_and_new_metadata_is_checked():
    x, w = torch.randn(2, 8), torch.ones(8)
    tk.rmsnorm.__dict__.pop("_memo", None)
    op_module._bind_memoised(tk.rmsnorm, (x, w), {})
    assert not tk.rmsnorm.__dict__.get("_memo")  # CPU: bind every time (its value checks read the data)
    xm, wm = _meta(x), _meta(w)
    op_module._bind_memoised(tk.rmsnorm, (xm, wm), {})
    assert len(tk.rmsnorm.__dict__["_memo"]) == 1
    with pytest.raises(ValueError, match="weight"):  # other metadata: a new key, so bind checks it
        op_module._bind_memoised(tk.rmsnorm, (xm, _meta(torch.ones(7))), {})
    with pytest.raises(TypeError, match="x"):
        op_module._bind_memoised(tk.rmsnorm, (xm.to(torch.int32), wm), {})


def test_a_tensor_passed_twice_is_not_remembered_for_calls_that_pass_two():
    a = _meta(torch.randn(4, 8))
    tk.mm.__dict__.pop("_memo", None)
    op_module._bind_memoised(tk.mm, (a, _meta(torch.randn(4, 8)).clone()), {})
    op_module._bind_memoised(tk.mm, (a, a), {})  # same object twice: still a hit of the entry above
    b = _meta(torch.randn(4, 8))
    got = op_module._bind_memoised(tk.mm, (a, b), {})
    assert got[4][0] is a and got[4][1] is b
    tk.mm.__dict__.pop("_memo", None)
    op_module._bind_memoised(tk.mm, (a, a), {})  # a miss with an alias: not remembered
    assert not tk.mm.__dict__.get("_memo")


def test_a_key_tells_apart_strides_value_types_and_values():
    """Whatever the checks read is in the key: the same shape with other strides, a bool where a float was
    (``True == 1.0`` and both hash alike), another value; each of these calls runs ``bind`` and fails there."""
    xm, wm = _meta(torch.randn(2, 8)), _meta(torch.ones(8))
    tk.rmsnorm.__dict__.pop("_memo", None)
    op_module._bind_memoised(tk.rmsnorm, (xm, wm, 1.0), {})
    assert len(tk.rmsnorm.__dict__["_memo"]) == 1
    strided = torch.empty_strided((2, 8), (16, 2), dtype=xm.dtype, device="meta")
    with pytest.raises(ValueError, match="x"):
        op_module._bind_memoised(tk.rmsnorm, (strided, wm, 1.0), {})
    with pytest.raises(TypeError, match="eps"):
        op_module._bind_memoised(tk.rmsnorm, (xm, wm, True), {})
    with pytest.raises(ValueError, match="eps"):
        op_module._bind_memoised(tk.rmsnorm, (xm, wm, -1.0), {})
    with pytest.raises(ValueError, match="residual"):  # a keyword: its own call pattern
        op_module._bind_memoised(tk.rmsnorm, (xm, wm, 1.0), {"residual": _meta(torch.randn(2, 7))})
    got = op_module._bind_memoised(tk.rmsnorm, (xm, wm, 1.0), {})
    assert got[4][0] is xm and got[4][2] == 1.0


def test_a_generated_key_and_the_generic_key_give_the_same_entry_contents():
    """A call pattern whose kinds have no generated function (an object of another kind) takes the generic
    key; both paths serve what bind gives."""
    a, b = _meta(torch.randn(4, 8)), _meta(torch.randn(5, 8))
    tk.mm.__dict__.pop("_memo", None)
    tk.mm.__dict__.pop("_memo_keys", None)
    first = op_module._bind_memoised(tk.mm, (a, b), {})
    a2, b2 = _meta(torch.randn(4, 8)), _meta(torch.randn(5, 8))
    got = op_module._bind_memoised(tk.mm, (a2, b2), {})
    assert got[:4] == first[:4] and got[4][0] is a2 and got[4][1] is b2
    assert [len(v) for v in tk.mm.__dict__["_memo_keys"].values()] == [1]
    key = op_module._memo_key(tk.mm, (a2, b2), {}, (a2, b2))
    assert type(key[0]) is int  # the generated function's tag

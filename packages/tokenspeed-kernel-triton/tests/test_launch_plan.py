"""Launch plans (``tokenspeed_kernel.launch``, "Launch plans") on CPU: a replay makes the launches the wrapper makes.

The kernels are real ``triton.jit`` functions (their parameters drive the launch key); their launches go to a
fake C launcher that logs its arguments, and CPU tensors stand in for device tensors (the launch key's guard
reads ``is_cpu``). Every address in a log is named by where it comes from (an argument plus an offset, or the
n-th allocation of the call plus an offset), so a replay's log can be compared with the wrapper's own on new
tensors: same kernels, grids, scalars and addresses. The GPU test (``test_launch_gpu``) compares outputs.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
import triton
import triton.language as tl
from _fake_launch import FakeLauncher
from torch.utils._python_dispatch import TorchDispatchMode

from tokenspeed_kernel import launch as L
from tokenspeed_kernel.core import recording


@triton.jit
def _k_rows(x, w, tmp, n, eps, BLOCK: tl.constexpr):
    pass


@triton.jit
def _k_out(tmp, y, x_tail, stride, BLOCK: tl.constexpr):
    pass


class _Jit:
    """A JIT function's parameters; ``[grid]`` logs a JIT launch and returns a fake compiled kernel."""

    def __init__(self, fn, log):
        from triton.runtime.jit import JITFunction

        jf = fn if isinstance(fn, JITFunction) else JITFunction(fn.fn)  # (an InterpretedFunction under the interpreter)
        self.params, self.__name__, self.log = jf.params, jf.__name__, log
        self.device_caches = {}
        self.kernel = types.SimpleNamespace(
            run=FakeLauncher(log), function=id(self), packed_metadata=("meta", fn.__name__)
        )

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("jit", grid, args))
            return self.kernel

        return run


@pytest.fixture
def fake_gpu(monkeypatch):
    """CPU tensors pass for device tensors; the device and stream a GPU process would read."""
    from triton import knobs

    monkeypatch.setattr(L, "_DEVICE_ATTR", "is_cpu")
    # Replays allocate through torch's C allocation, which no dispatch mode sees: the logs' mode (_Allocs) is let
    # through, and learns of those allocations from the allocator itself.
    monkeypatch.setattr(L, "_dispatch_modes", lambda: 0)
    real = L._fast_allocator

    def logged_allocator(m, dev):
        fast = real(m, dev)

        def alloc(size, stride, dtype):
            t = fast(size, stride, dtype)
            if _Allocs.current is not None:
                _Allocs.current.allocs.append(t)
            return t

        return alloc if fast is not None else None

    monkeypatch.setattr(L, "_fast_allocator", logged_allocator)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 1234, raising=False)
    log: list = []

    def launcher(fn):
        c = L.CachedLaunch(_Jit(fn, log))
        c._knobs, c._compilation, c._cacheable = knobs.runtime, knobs.compilation, True
        c._getdev, c._getstream = (lambda: 0), (lambda dev: 1234)
        return c

    return types.SimpleNamespace(log=log, launcher=launcher, rows=launcher(_k_rows), out=launcher(_k_out))


def _wrapper(g, side=None, extra_op=False):
    """A kernel wrapper of the usual shape: outputs and a temporary allocated, two launches, one on a view."""

    def run(x, w, eps):
        y = torch.empty_like(x)
        tmp = torch.empty((x.shape[0], 4), dtype=torch.float32)
        if extra_op:
            tmp.zero_()
        g.rows[(x.shape[0],)](x, w, tmp if side is None else side, x.shape[1], eps, BLOCK=16)
        g.out[(x.shape[0], 2)](tmp, y, x[:, 1:], x.stride(0), BLOCK=32)
        return y, tmp

    return run


class _Allocs(TorchDispatchMode):
    current = None  # the open one (replays' allocations: ``fake_gpu``)

    def __init__(self):
        super().__init__()
        self.allocs = []

    def __enter__(self):
        _Allocs.current = self
        return super().__enter__()

    def __exit__(self, *exc):
        _Allocs.current = None
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__.startswith("empty"):
            self.allocs.append(out)
        return out


def _named(entries, inputs, allocs):
    """The launcher logs with each address named: ("arg", i, offset) or ("alloc", n, offset)."""

    def name(v):
        if type(v) is not int or v < 4096:
            return v
        for i, t in enumerate(inputs):
            s = t.untyped_storage()
            if s.data_ptr() <= v < s.data_ptr() + s.nbytes():
                return ("arg", i, v - t.data_ptr())
        for n, t in enumerate(allocs):
            if t.data_ptr() <= v < t.data_ptr() + t.untyped_storage().nbytes():
                return ("alloc", n, v - t.data_ptr())
        return ("unknown", v)

    return [(kind, tuple(name(v) for v in a)) for kind, a in entries]


def _logged(g, fn, args):
    start = len(g.log)
    with _Allocs() as m:
        out = fn(*args)
    return out, _named(g.log[start:], [a for a in args if isinstance(a, torch.Tensor)], m.allocs)


def _inputs(rows=3, cols=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen), torch.randn(cols, generator=gen), 1e-5


def test_replay_makes_the_wrappers_launches_on_new_tensors(fake_gpu):
    g = fake_gpu
    run = _wrapper(g)
    run(*_inputs())  # misses: compiles (fake) and fills the launch caches
    _, plan, why = L.record(run, _inputs(seed=1))
    assert plan is not None, why
    assert plan.launches == ("_k_rows", "_k_out") and plan.allocations == 2
    new = _inputs(seed=2)
    want_out, want = _logged(g, run, new)
    got_out, got = _logged(g, plan.replay, new)
    assert [k for k, _ in want] == ["hit", "hit"] and got == want
    # the results are new tensors of the wrapper's geometry, and the view's offset follows the new x
    for a, b in zip(got_out, want_out):
        assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype) and a.data_ptr() != b.data_ptr()
    assert ("arg", 0, 4) in got[1][1]  # x[:, 1:] of the new x (float32: 4 bytes on)


def test_a_replay_allocates_the_recorded_geometry_through_torchs_c_allocation(fake_gpu, monkeypatch):
    """A replay allocates every output and temporary with torch's C allocation of the device type (no dispatcher:
    cheaper than ``torch.empty_like``), given the recorded size, strides and dtype; a strided output
    keeps its strides. That allocation skips torch's deterministic fill of new memory, so under deterministic
    algorithms the replay runs the call's own path (whose allocations fill), and under a dispatch mode too (which
    does not see it)."""
    g = fake_gpu
    calls = []

    def counted(*a):
        calls.append(1)
        return _wrapper(g)(*a)

    counted(*_inputs())
    _, plan, why = L.record(counted, _inputs(seed=1))
    assert plan is not None, why
    src = plan.replay.__source__
    assert "m0 = _za0(_zs0, _zt0, _zd0)" in src and "m1 = _za1(_zs1, _zt1, _zd1)" in src, src
    new = _inputs(seed=2)
    n = len(calls)
    got = plan.replay(*new)
    assert len(calls) == n  # replayed
    for a, b in zip(got, _wrapper(g)(*new)):
        assert (a.shape, a.stride(), a.dtype, a.device) == (b.shape, b.stride(), b.dtype, b.device)
        assert type(a) is torch.Tensor and not a.requires_grad
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        y, _ = plan.replay(*new)
        y_served, _ = plan.replay_served(*new)
    finally:
        torch.use_deterministic_algorithms(was)
    assert len(calls) == n + 2  # both took the call's own path
    # (the wrapper's torch.empty_like filled them; the fake kernel did not write)
    assert y.isnan().all() and y_served.isnan().all()
    plan.replay(*new)
    assert len(calls) == n + 2
    # under a dispatch mode (which would not see the C allocations) the call's own path runs too
    monkeypatch.setattr(L, "_dispatch_modes", torch._C._len_torch_dispatch_stack)
    _, plan, why = L.record(counted, _inputs(seed=1))
    assert plan is not None, why
    n = len(calls)
    with _Allocs() as mode:
        plan.replay(*new)
        plan.replay_served(*new)
    assert len(calls) == n + 2 and len(mode.allocs) == 4  # (two calls of the wrapper, two allocations each)
    plan.replay(*new)
    assert len(calls) == n + 2

    # an output of a strided argument's shape and strides (every other column)
    def strided(x, w, eps):
        y = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype)
        g.rows[(x.shape[0],)](x, w, y, x.shape[1], eps, BLOCK=16)
        return y

    wide = torch.randn(3, 128)[:, ::2]
    strided(wide, *_inputs()[1:])
    _, plan, why = L.record(strided, (wide, *_inputs()[1:]))
    assert plan is not None, why
    assert "m0 = _za0(" in plan.replay.__source__
    assert plan.replay(torch.randn(3, 128)[:, ::2], *_inputs()[1:]).stride() == (128, 2)


def test_the_c_allocation_serves_the_launches_device_or_the_cpu_only():
    """torch's C allocation takes the current device of its type: a replay uses it for the launches' device (which
    it guards as the current one) and the CPU, and ``torch.empty_strided`` with the device for any other."""
    guards = torch._C._dynamo.guards

    def on(device):
        return types.SimpleNamespace(device=torch.device(device))

    assert L._fast_allocator(on("cuda:1"), 1) is guards._empty_strided_cuda
    assert L._fast_allocator(on("cuda:0"), 1) is None
    assert L._fast_allocator(on("cpu"), 0) is guards._empty_strided_cpu
    assert L._fast_allocator(on("meta"), 0) is None


@dataclasses.dataclass(frozen=True)
class _Pair:
    out: torch.Tensor
    scratch: torch.Tensor
    extra: torch.Tensor | None = None


@dataclasses.dataclass
class _MutablePair:
    out: torch.Tensor
    scratch: torch.Tensor


def test_a_frozen_dataclass_result_is_rebuilt_of_the_replays_tensors(fake_gpu):
    """A wrapper may return a frozen dataclass of its allocations (``MoEDispatchResult``): the replay builds a new one
    of its own allocations; a mutable one is refused (a caller may have changed what the recording saw)."""
    g = fake_gpu
    base = _wrapper(g)
    base(*_inputs())

    def paired(x, w, eps):
        y, tmp = base(x, w, eps)
        return _Pair(y, tmp)

    _, plan, why = L.record(paired, _inputs(seed=1))
    assert plan is not None, why
    new = _inputs(seed=2)
    want, _ = _logged(g, paired, new)
    got, _ = _logged(g, plan.replay, new)
    assert type(got) is _Pair and got.extra is None
    for a, b in ((got.out, want.out), (got.scratch, want.scratch)):
        assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype) and a.data_ptr() != b.data_ptr()
    assert got.out.data_ptr() != got.scratch.data_ptr()
    _, plan, why = L.record(lambda x, w, eps: _MutablePair(*base(x, w, eps)), _inputs())
    assert plan is None and "the result (_MutablePair) is not" in why, why


def test_a_replay_falls_back_when_a_guard_fails(fake_gpu):
    g = fake_gpu
    calls = []

    def counted(*a):
        calls.append(1)
        return _wrapper(g)(*a)

    counted(*_inputs())
    _, plan, why = L.record(counted, _inputs())
    assert plan is not None, why
    n = len(calls)
    x, w, eps = _inputs()
    plan.replay(x, w, eps)
    assert len(calls) == n  # replayed
    for args in (
        (x, w, 1e-6),  # another value
        (torch.randn(5, 64), w, eps),  # another shape
        (x.double(), w, eps),  # another dtype
        (torch.randn(64, 3).t(), w, eps),  # other strides
        (torch.randn(3 * 64 + 1)[1:].view(3, 64), w, eps),  # x misaligned (recorded aligned: specialised on it)
    ):
        plan.replay(*args)
        n += 1
        assert len(calls) == n, args[0].shape
    with L.jit_launches():
        plan.replay(x, w, eps)
    assert len(calls) == n + 1
    # The served variant trusts the caller's key for metadata and values (the public path matched them); the
    # process state is still checked.
    plan.replay_served(x, w, 1e-6)
    assert len(calls) == n + 1
    with L.jit_launches():
        plan.replay_served(x, w, eps)
    assert len(calls) == n + 2
    n += 1
    from triton import knobs

    hook = knobs.runtime.launch_enter_hook
    hook.add(print)  # a profiler's hook: every launch takes Triton's path
    try:
        plan.replay(x, w, eps)
    finally:
        hook.remove(print)
    assert len(calls) == n + 2


@pytest.mark.parametrize(
    "case, refusal",
    [
        ("aten op", "ATen op aten.zero_"),
        ("side buffer", "neither an argument's nor an allocation's"),
        ("miss", "_k_rows: a launch through Triton's JIT path"),
        ("triton outside the cache", "a Triton launch outside the launch cache"),
        ("graph", "test: an eager CUDA graph"),
        ("nothing", "no cached launch"),
        ("result", "the result (Tensor) is not the call's allocations or arguments"),
    ],
)
def test_calls_that_cannot_be_replayed_are_refused(fake_gpu, case, refusal):
    g = fake_gpu
    base = _wrapper(g)
    base(*_inputs())
    if case == "aten op":
        run = _wrapper(g, extra_op=True)
    elif case == "side buffer":
        run = _wrapper(g, side=torch.empty(3, 4))
    elif case == "miss":
        g.rows = g.launcher(_k_rows)  # an empty cache: the next launch compiles
        run = _wrapper(g)
    elif case == "triton outside the cache":

        def run(x, w, eps):
            L._recorder_hook()  # what Triton's launcher calls for a launch the cache did not make
            return base(x, w, eps)
    elif case == "graph":
        from tokenspeed_kernel.graphs import GraphCache

        cache = GraphCache("test")

        def run(x, w, eps):
            cache.run("k", (x,), lambda t: t * 1)
            return base(x, w, eps)
    elif case == "nothing":

        def run(x, w, eps):
            return x
    else:

        def run(x, w, eps):
            return base(x, w, eps)[0][1:]  # a view of an allocation

    _, plan, why = L.record(run, _inputs())
    assert plan is None and refusal in why, why


def test_recording_leaves_no_hook_and_nothing_open(fake_gpu):
    from triton import knobs

    g = fake_gpu
    run = _wrapper(g)
    run(*_inputs())
    with pytest.raises(ZeroDivisionError):
        L.record(lambda *a: 1 / 0, _inputs())
    L.record(run, _inputs())
    assert L._recorder_hook not in knobs.runtime.launch_enter_hook.calls
    assert recording.active == 0 and getattr(recording.state, "recorder", None) is None
    # a hit outside a recording records nothing
    run(*_inputs())


def test_plain_values_are_compared_by_value_and_objects_by_identity(fake_gpu):
    """A frozen dataclass of plain values (an activation) or a tuple of them is guarded by value: an equal new one
    replays; another object (weights) is guarded by identity."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Cfg:
        eps: float
        dims: tuple

    @dataclasses.dataclass(frozen=True)
    class Weights:  # an object of another kind (MoE weights): its tensor fields are read by identity
        w: torch.Tensor

    @dataclasses.dataclass
    class Mutable:  # could swap its tensor under a plan: not a source of addresses
        w: torch.Tensor

    g = fake_gpu
    base = _wrapper(g)
    calls = []

    def run(x, weights, cfg):
        calls.append(1)
        return base(x, weights.w, cfg.eps)

    x, w, eps = _inputs()
    weights = Weights(w)
    run(x, weights, Cfg(eps, (1, 2)))
    _, plan, why = L.record(run, (x, weights, Cfg(eps, (1, 2))))
    assert plan is not None, why
    n = len(calls)
    plan.replay(x, weights, Cfg(eps, (1, 2)))  # equal, not identical: replayed
    assert len(calls) == n
    plan.replay(x, weights, Cfg(eps, (1, 3)))  # another value: the wrapper
    plan.replay(x, Weights(w), Cfg(eps, (1, 2)))  # another object holding the same tensor: the wrapper
    assert len(calls) == n + 2
    _, plan, why = L.record(run, (x, Mutable(w), Cfg(eps, (1, 2))))
    assert plan is None and "neither an argument's nor an allocation's" in why


def triton_call(op: str):
    """``(wrapper, positional arguments, keyword arguments)`` of the Triton kernel of ``op`` on the first standard
    CPU case (``op+variant``: the first case where that field is set, e.g. ``moe_gate+norm``): the kernel's own
    arguments, as bind gives them (bind's value checks of CPU tensors stay outside a recording, as on a GPU)."""
    import tokenspeed_kernel as tk
    from tokenspeed_kernel import registry
    from tokenspeed_kernel.core.plugins import ensure_loaded
    from tokenspeed_kernel.numerics.cases import get_op_cases, standard_cases
    from tokenspeed_kernel.numerics.inputs import make_generator

    ensure_loaded()
    op, _, variant = op.partition("+")
    oc = get_op_cases(op)
    spec = next(s for s in registry.for_op(op) if s.name == f"triton.{op}")
    cpu = torch.device("cpu")
    case = next(c for c in standard_cases(op, "cpu") if not variant or c[variant])
    call = oc.make(case, cpu, make_generator(cpu, case.seed(0)))
    _, _, _, _, kargs, kkwargs = tk.get_contract(op).bind(**call)
    return spec.resolve(), kargs, kkwargs


def fake_package_launchers(g, monkeypatch) -> None:
    """Every launcher made so far a fake GPU one: its JIT path compiles nothing, its C launcher logs into ``g.log``."""
    from triton import knobs

    for c in list(L._all):
        try:
            fake = _Jit(c.fn, g.log)
        except AttributeError:  # not a Triton JIT function (another package's launcher)
            continue
        monkeypatch.setattr(c, "fn", fake)
        monkeypatch.setattr(c, "_params", fake.params)
        for name, value in (("_knobs", knobs.runtime), ("_compilation", knobs.compilation), ("_cacheable", True),
                            ("_getdev", lambda: 0), ("_getstream", lambda dev: 1234), ("_cache", {}), ("_keys", {})):  # fmt: skip
            monkeypatch.setattr(c, name, value)


@pytest.mark.parametrize(
    "op",
    [
        "rmsnorm", "apply_rotary_and_store", "mha_decode_with_kvcache", "mha_decode_append_kvcache", "moe_gate",
        "moe_gate+norm",
    ],
)  # fmt: skip
def test_the_decode_ops_triton_calls_record_and_replay_their_launches(fake_gpu, streams, monkeypatch, op):
    """The GPT-OSS decode step's Triton ops, through their real wrappers: every launcher of the package made a fake
    GPU one (its JIT path compiles nothing, its C launcher logs), a call records, and its replay makes the launches
    the wrapper makes on new tensors. (The GPU test checks the outputs; this keeps a wrapper from growing an ATen op
    or a side buffer unnoticed in CI.)"""
    import tokenspeed_kernel as tk

    fn, kargs, kkwargs = triton_call(op)  # (moe_gate+norm: the router with the norm before it, GPT-OSS's call)
    op = op.partition("+")[0]

    # (the keywords' values are arguments too, as a prepared call passes them: the norm's weight and residual)
    n_pos, names = len(kargs), tuple(kkwargs)

    def args():
        return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in (*kargs, *kkwargs.values()))

    # Decode attention split in two (its partials in the stream's scratch, and the stream's counters the last split
    # merges by), with an attention plan, whose call must record too.
    extra = {}
    if op == "mha_decode_with_kvcache":
        extra = {"num_splits": 2, "plan": tk.mha_plan(cache_seqlens=kargs[4].tolist())}
    elif op == "mha_decode_append_kvcache":  # (GPT-OSS's decode call: the new K/V written and rotated, split in two)
        extra = {"num_splits": 2, "plan": tk.mha_plan(cache_seqlens=kargs[6].tolist())}

    def run(*vals):
        return fn(*vals[:n_pos], **dict(zip(names, vals[n_pos:])), **extra)

    run(*args())  # under the interpreter: every launcher the call uses exists from here on (some are made lazily)
    g = fake_gpu
    fake_package_launchers(g, monkeypatch)
    run(*args())  # misses: the fake JIT path fills the launch caches
    _, plan, why = L.record(run, args())
    assert plan is not None, f"{op}: {why}"
    _, want = _logged(g, run, args())
    _, got = _logged(g, plan.replay, args())
    assert want and all(k == "hit" for k, _ in want), want
    assert got == want, f"{op}: {plan}"
    if extra:  # one launch, which takes the stream's counters
        assert (
            plan.launches == ("decode_split_kernel" if op == "mha_decode_with_kvcache" else "decode_append_kernel",)
            and ("unknown", L._BUFFERS[(1234, "counters")].data_ptr()) in want[0][1]
        )
        # and the stream's scratch for its partials: the call allocates its output only
        assert ("unknown", L._BUFFERS[(1234, "scratch")].data_ptr()) in want[0][1] and plan.allocations == 1


@pytest.fixture
def streams(monkeypatch):
    """Fresh stream counters, the current stream a settable handle, no capture unless set."""
    state = types.SimpleNamespace(stream=1234, capturing=False)
    monkeypatch.setattr(L, "_BUFFERS", {})
    monkeypatch.setattr(L, "_OUTGROWN", [])
    monkeypatch.setattr(L, "_current_stream", lambda device: state.stream)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: state.stream, raising=False)  # (a replay's)
    monkeypatch.setattr(L, "_capturing", lambda: state.capturing)
    return state


def test_stream_buffers_are_kept_per_stream_and_kind_and_grown_without_freeing(streams):
    cpu = torch.device("cpu")
    a = L.stream_counters(cpu, 10)
    assert a.dtype == torch.int32 and a.numel() >= 10 and int(a.abs().max()) == 0
    assert L.stream_counters(cpu, 10) is a  # the same stream: the same counters
    streams.stream = 99
    assert L.stream_counters(cpu, 10) is not a  # another stream: its own
    streams.stream = 1234
    big = L.stream_counters(cpu, 3 * a.numel())  # outgrown: a larger buffer, and the old one kept
    assert big.numel() >= 3 * a.numel() and int(big.abs().max()) == 0 and L._OUTGROWN == [a]
    assert L.stream_counters(cpu, 5) is big
    # The stream's scratch: another buffer (fp32, never the counters, which must stay zero), kept and grown alike.
    scratch = L.stream_scratch(cpu, 10)
    assert scratch.dtype == torch.float32 and scratch.numel() >= 10 and scratch.data_ptr() != big.data_ptr()
    assert L.stream_scratch(cpu, 10) is scratch and L.stream_counters(cpu, 5) is big
    more = L.stream_scratch(cpu, 3 * scratch.numel())
    assert more.numel() >= 3 * scratch.numel() and L._OUTGROWN[-1] is scratch
    streams.capturing = True  # a capture: the graph's own, fresh each time, never kept
    c1, c2 = L.stream_counters(cpu, 5), L.stream_counters(cpu, 5)
    assert c1 is not big and c2 is not c1 and int(c1.abs().max()) == 0 and L._BUFFERS[(1234, "counters")] is big
    assert L.stream_scratch(cpu, 5) is not more and L._BUFFERS[(1234, "scratch")] is more


def _counting_wrapper(g, n=6, offset=2):
    """A wrapper whose launch counts on the stream's counters (at an offset) besides its output."""

    def run(x, w, eps):
        y = torch.empty_like(x)
        counters = L.stream_counters(x.device, n)
        g.rows[(x.shape[0],)](x, w, counters[offset:], x.shape[1], eps, BLOCK=16)
        return y

    return run


def test_a_replay_looks_its_stream_buffers_up_again_only_on_another_stream_or_after_one_was_made(fake_gpu, streams):
    """A replay keeps the addresses its last lookup gave, with the stream and the count of buffers made: the same
    stream with no buffer made since takes them without a lookup (here a buffer swapped in behind the replay's back,
    which no real call does, shows which it took); another stream, or a buffer made since, looks up again."""
    g = fake_gpu
    run = _counting_wrapper(g)
    run(*_inputs())
    _, plan, why = L.record(run, _inputs(seed=1))
    assert plan is not None, why
    new = _inputs(seed=2)
    kept = L._BUFFERS[(1234, "counters")]

    def replayed_counters():
        n = len(g.log)
        plan.replay(*new)
        ((kind, args),) = g.log[n:]
        assert kind == "hit"
        return args

    assert kept.data_ptr() + 8 in replayed_counters()
    L._BUFFERS[(1234, "counters")] = swapped = torch.zeros_like(kept)  # (no buffer made: the count is unchanged)
    assert kept.data_ptr() + 8 in replayed_counters()  # the addresses it kept, no lookup
    streams.stream = 77  # another stream: a lookup (none there yet: the wrapper runs and makes them)
    plan.replay(*new)
    made = L._BUFFERS[(77, "counters")]
    assert made.data_ptr() + 8 in replayed_counters()
    streams.stream = 1234  # back: the last lookup was another stream's, so a lookup again finds the swapped one
    assert swapped.data_ptr() + 8 in replayed_counters()
    L._BUFFERS[(1234, "counters")] = kept
    assert swapped.data_ptr() + 8 in replayed_counters()
    L.stream_counters(torch.device("cpu"), 10 * kept.numel())  # a buffer made (grown): a lookup again
    assert L._BUFFERS[(1234, "counters")].data_ptr() + 8 in replayed_counters()


def test_a_replay_takes_the_counters_of_its_own_stream(fake_gpu, streams):
    g = fake_gpu
    run = _counting_wrapper(g)
    run(*_inputs())  # misses: compiles (fake) and fills the launch caches
    streams.stream = 5  # a stream without counters yet: the recorded call makes them, which is not its work
    _, plan, why = L.record(run, _inputs(seed=1))
    assert plan is not None and (5, "counters") in L._BUFFERS, why
    streams.stream = 1234
    run(*_inputs())
    counters = L._BUFFERS[(1234, "counters")]
    new = _inputs(seed=2)
    n = len(g.log)
    plan.replay(*new)
    ((kind, args),) = g.log[n:]
    assert kind == "hit" and counters.data_ptr() + 8 in args  # the counters at their offset (2 int32)
    # Another stream: the replay has none of its counters, so the wrapper runs (and makes them); then replays.
    streams.stream = 77
    n = len(g.log)
    plan.replay(*new)
    assert L._BUFFERS[(77, "counters")] is not counters and g.log[n][0] == "hit"
    n = len(g.log)
    plan.replay(*new)
    assert L._BUFFERS[(77, "counters")].data_ptr() + 8 in g.log[n][1]
    # Outgrown (another call asked for more): the replay takes the new buffer.
    grown = L.stream_counters(torch.device("cpu"), 10 * counters.numel())
    n = len(g.log)
    plan.replay(*new)
    assert grown.data_ptr() + 8 in g.log[n][1]
    # While capturing, the replay falls back to the wrapper, whose counters are fresh (the graph's own).
    streams.capturing = True
    seen = []
    real = L.stream_counters

    def spy(device, k):
        seen.append(real(device, k))
        return seen[-1]

    L.stream_counters = spy
    try:
        n = len(g.log)
        plan.replay(*new)
    finally:
        L.stream_counters = real
    assert len(seen) == 1 and seen[0].data_ptr() + 8 in g.log[n][1]

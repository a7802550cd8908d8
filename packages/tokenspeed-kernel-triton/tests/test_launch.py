"""The cached launch path (``tokenspeed_kernel.launch``) against Triton's own binder, on CPU.

A cache hit skips Triton's binder, so two things must hold, and both are checked
against Triton itself (``create_function_from_signature``, the binder ``fn[grid]``
runs, built for an sm90 target; no GPU needed):

1. the launch key is at least as fine as Triton's specialisation: no two argument
   lists with one key get different specialisations. The argument lists are the
   real ones of the package's kernels (recorded while a 1-layer tiny GPT-OSS runs
   prefill and a decode step under the interpreter, plus the ops it does not use),
   each mutated per position (misaligned tensors, other dtypes, None, ints at 1, 16,
   2**31, bools, floats);
2. the argument list a hit hands to the C launcher is exactly the list Triton's
   binder produces (positional, keyword constexprs, defaults), and the hit launches
   the kernel the miss compiled.

The GPU test (``test_launch_gpu``) runs every op both ways on the H200 and compares the outputs bit for bit.
"""

from __future__ import annotations

import types

import pytest
import torch
from _fake_launch import FakeLauncher

import tokenspeed_kernel as tk
from tokenspeed_kernel import launch as L


def _triton_binder(fn):
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import JITFunction, create_function_from_signature

    jf = fn if isinstance(fn, JITFunction) else JITFunction(fn.fn)
    return jf.params, create_function_from_signature(jf.signature, jf.params, make_backend(GPUTarget("cuda", 90, 32)))


@pytest.fixture(scope="module")
def recorded():
    """(fn, args, kwargs) of every distinct kernel launched by a tiny model and a few more ops (CPU, interpreter)."""
    calls = {}
    original = L.CachedLaunch.launch

    def record(self, grid, args, kwargs):
        calls.setdefault((self.fn, len(args)), (self.fn, args, dict(kwargs)))
        return original(self, grid, args, kwargs)

    L.CachedLaunch.launch = record
    try:
        from tokenspeed_kernel.models import gpt_oss as m

        with tk.kernel_override("triton"):
            cfg = m.GptOssConfig.tiny().with_layers(1)
            model = m.GptOssModel(cfg, m.random_weights(cfg, device=torch.device("cpu"), seed=0), max_positions=64)
            cache = model.new_cache(1, 32, page_size=16)
            slots = cache.reserve(0, 8)
            tokens, positions, cu, last = m.pack_prompts([[1, 2, 3, 4, 5, 6, 7, 8]], torch.device("cpu"))
            model.prefill(tokens, positions, cu, 8, cache, slots, last_index=last)
            sampler = m.Sampler(m.SamplingParams(), 1, torch.device("cpu"))
            runner = m.DecodeRunner(model, cache, 1, sampler, cuda_graph=False)
            runner.set_state(torch.tensor([3]), torch.tensor([8]))
            runner.step()
            x = torch.randn(4, 64)
            tk.swiglu(torch.randn(4, 128))
            tk.quantize_fp8(x, granularity="per_token")
            tk.quantize_mxfp4(x)
            tk.top_k_top_p_sample(torch.randn(2, 50), 5, 0.9, uniform=torch.rand(2))
    finally:
        L.CachedLaunch.launch = original
    assert len(calls) >= 10, sorted(getattr(fn, "__name__", "?") for fn, _ in calls)
    return list(calls.values())


def _variants(value):
    """Arguments of other kinds and specialisations for one runtime position."""
    if isinstance(value, torch.Tensor):
        flat = value.reshape(-1)
        wide = torch.zeros(flat.numel() + 8, dtype=value.dtype)
        return [
            value,
            wide[1 : 1 + flat.numel()].view(value.shape),
            value.to(torch.float16),
            value.to(torch.int32),
            None,
        ]
    if value is None:
        return [None, torch.zeros(4)]
    if type(value) is bool:
        return [value, not value, 1]
    if type(value) is int:
        return [value, 1, 0, 16, 17, -16, 2**31, 2**31 - 1, 2**63, True, 2.0]
    if type(value) is float:
        return [value, 1, 3.5]
    return [value]


def _check_refines(fn, args, kwargs, key_of=None):
    """Conflicts: our key maps two argument lists to different Triton specialisations."""
    params, binder = _triton_binder(fn)
    n = len(args)
    keyfs = [L._key_function(params[:n], [L._kind(a) for a in args])]
    key_of = key_of or (lambda *cand: L._spec_and_args(keyfs, params[:n], cand)[0])
    seen: dict = {}
    conflicts = []
    lists = [args]
    for i, (p, a) in enumerate(zip(params, args)):
        if not p.is_constexpr:
            lists += [(*args[:i], v, *args[i + 1 :]) for v in _variants(a)]
    for cand in lists:
        try:
            key = key_of(*cand)
        except L._Uncacheable:
            continue
        spec = tuple(binder(*cand, **kwargs)[1])
        if seen.setdefault(key, spec) != spec:
            conflicts.append((key, seen[key], spec))
    return conflicts, len(lists)


def test_launch_key_refines_triton_specialisation(recorded, on_device):
    checked = 0
    for fn, args, kwargs in recorded:
        conflicts, n = _check_refines(fn, args, kwargs)
        assert not conflicts, (fn.__name__, conflicts[:2])
        checked += n
    assert checked > 200


def test_refinement_check_has_teeth(recorded, on_device):
    """A key without the alignment bit conflates argument lists Triton tells apart: the check sees it."""
    fn, args, kwargs = next((f, a, k) for f, a, k in recorded if any(isinstance(x, torch.Tensor) for x in a))

    def coarse(*cand):
        return tuple((x.dtype,) if isinstance(x, torch.Tensor) else L._kind(x) for x in cand)

    conflicts, _ = _check_refines(fn, args, kwargs, key_of=coarse)
    assert conflicts


class _FakeJit:
    """A real kernel's parameters and Triton binder; ``[grid]`` records a JIT launch and returns a fake compiled kernel."""

    def __init__(self, fn):
        self.params, self.binder = _triton_binder(fn)
        self.__name__ = fn.__name__
        self.device_caches = {}
        self.log = []
        self.compiled = {}

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            bound, spec, _ = self.binder(*args, **kwargs)
            spec = tuple(spec)
            kernel = self.compiled.setdefault(
                spec,
                types.SimpleNamespace(
                    run=FakeLauncher(self.log), function=len(self.compiled) + 100, packed_metadata=("meta", spec)
                ),
            )
            self.log.append(("jit", grid, list(bound.values()), kernel.function))
            return kernel

        return run


def _cached(fake):
    c = L.CachedLaunch(fake)
    c._knobs = types.SimpleNamespace(launch_enter_hook=None, debug=False)
    c._compilation = types.SimpleNamespace(instrumentation_mode="")
    c._cacheable = True
    c._getdev = lambda: 0
    c._getstream = lambda dev: 1234
    return c


def _same_args(got, want, *, addresses: bool) -> bool:
    """``got`` is ``want`` position by position: the same object, or (``addresses``) a tensor's address."""
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor) and addresses:
            if type(g) is not int or g != w.data_ptr():
                return False
        elif g is not w and not (type(g) is type(w) and not isinstance(w, torch.Tensor) and g == w):
            return False
    return True


@pytest.fixture
def on_device(monkeypatch):
    """Generated key functions take these CPU tensors for device tensors (their guard reads ``is_cpu``)."""
    monkeypatch.setattr(L, "_DEVICE_ATTR", "is_cpu")


def test_hit_passes_the_binders_argument_list(recorded, on_device):
    for fn, args, kwargs in recorded:
        fake = _FakeJit(fn)
        c = _cached(fake)
        c[(3, 2)](*args, **kwargs)
        c[(3, 2)](*args, **kwargs)
        assert [e[0] for e in fake.log] == ["jit", "hit"], fn.__name__
        _, _, bound, function = fake.log[0]
        hit = fake.log[1][1]
        assert hit[:5] == (3, 2, 1, 1234, function), fn.__name__
        assert hit[9] == ("meta", tuple(fake.binder(*args, **kwargs)[1]))
        # Same order: positional, constexprs, defaults; each tensor as its address (the C launcher takes an int
        # as the pointer), every other argument the same object.
        assert _same_args(hit[13:], bound, addresses=True), fn.__name__


def test_a_host_tensor_reaches_the_launcher_as_a_tensor(recorded):
    """With the real guard (``is_cuda``), CPU tensors fail the generated function: the hit passes them as they
    are, so Triton's launcher still refuses a host pointer with its own error."""
    fn, args, kwargs = next((f, a, k) for f, a, k in recorded if any(isinstance(x, torch.Tensor) for x in a))
    fake = _FakeJit(fn)
    c = _cached(fake)
    c[(1,)](*args, **kwargs)
    c[(1,)](*args, **kwargs)
    assert [e[0] for e in fake.log] == ["jit", "hit"]
    assert _same_args(fake.log[1][1][13:], fake.log[0][2], addresses=False)


def test_a_new_specialisation_misses_and_runs_its_own_kernel(recorded, on_device):
    fn, args, kwargs = next((f, a, k) for f, a, k in recorded if any(isinstance(x, torch.Tensor) for x in a))
    i = next(i for i, x in enumerate(args) if isinstance(x, torch.Tensor))
    fake = _FakeJit(fn)
    c = _cached(fake)
    wide = torch.zeros(args[i].numel() + 8, dtype=args[i].dtype)
    moved = (*args[:i], wide[1 : 1 + args[i].numel()].view(args[i].shape), *args[i + 1 :])
    for a in (args, moved, args, moved):
        c[(1,)](*a, **kwargs)
    kinds = [e[0] for e in fake.log]
    assert kinds == ["jit", "jit", "hit", "hit"]
    assert fake.log[2][1][4] == fake.log[0][3] and fake.log[3][1][4] == fake.log[1][3] != fake.log[0][3]


def test_jit_fallbacks(recorded):
    fn, args, kwargs = recorded[0]
    fake = _FakeJit(fn)
    c = _cached(fake)
    with L.jit_launches():
        c[(1,)](*args, **kwargs)
        c[(1,)](*args, **kwargs)
    assert [e[0] for e in fake.log] == ["jit", "jit"]
    from triton.knobs import HookChain

    chain = HookChain()
    c._knobs.launch_enter_hook = chain  # Triton 3.6's default: an empty chain, so the cache is used
    c[(1,)](*args, **kwargs)
    c[(1,)](*args, **kwargs)
    assert [e[0] for e in fake.log][2:] == ["jit", "hit"]
    chain.add(lambda *a: None)  # a profiler's hook: it must see every launch
    c[(1,)](*args, **kwargs)
    c[(1,)](*args, **kwargs)
    c._knobs.launch_enter_hook = lambda *a: None  # older Triton: a bare callable
    c[(1,)](*args, **kwargs)
    assert [e[0] for e in fake.log][4:] == ["jit", "jit", "jit"]
    c._knobs.launch_enter_hook = None
    c[lambda meta: (1,)](*args, **kwargs)  # a callable grid is never cached
    c[lambda meta: (1,)](*args, **kwargs)
    assert [e[0] for e in fake.log][7:] == ["jit", "jit"]


def test_runtime_argument_by_keyword_is_an_error(recorded):
    fn, args, kwargs = recorded[0]
    params, _ = _triton_binder(fn)
    assert not params[0].is_constexpr
    name = params[0].name
    c = _cached(_FakeJit(fn))
    with pytest.raises(TypeError, match=name):
        c[(1,)](*args[1:], **{name: args[0]}, **kwargs)


def test_runtime_binding_of_a_gpu_process_caches(monkeypatch, recorded):
    """With the launcher's own runtime binding (Triton's knobs as they are, a CUDA device as a GPU
    process sees it), the second call is a hit: the cache is not bypassed by Triton's defaults."""
    from triton import knobs

    monkeypatch.setattr(knobs.runtime, "interpret", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 99, raising=False)
    fn, args, kwargs = recorded[0]
    fake = _FakeJit(fn)
    c = L.CachedLaunch(fake)
    for _ in range(3):
        c[(2,)](*args, **kwargs)
    assert [e[0] for e in fake.log] == ["jit", "hit", "hit"]
    assert fake.log[1][1][3] == 99
    assert L.launch_cache_info([c]) == {fn.__name__: {"cached": 1, "uncacheable": 0, "misses": 1, "unmodelled": 0}}


def test_launchers_are_held_only_by_their_functions():
    """``cached`` remembers its launchers weakly: a stand-in function (a test's recorder) and what it holds are
    freed with it, while ``launch_cache_info`` still lists every live launcher."""
    import gc
    import weakref

    from tokenspeed_kernel.launch import cached, launch_cache_info

    class StandIn:  # a kernel stand-in with a __dict__, holding a large object as a recorder holds its calls
        __name__ = "stand_in_kernel"

        def __init__(self):
            self.held = torch.empty(1 << 20)

    fn = StandIn()
    held = weakref.ref(fn.held)
    launcher = cached(fn)
    assert cached(fn) is launcher
    assert "stand_in_kernel" in launch_cache_info()
    del fn, launcher
    gc.collect()
    assert held() is None
    assert "stand_in_kernel" not in launch_cache_info()


def test_host_cdiv_and_next_power_of_2_are_tritons():
    """The wrappers' plain host helpers give ``triton.cdiv`` / ``triton.next_power_of_2``'s values (those are
    ConstexprFunctions: microseconds a host call)."""
    import triton

    assert all(L.cdiv(a, b) == triton.cdiv(a, b) for a in range(-64, 600) for b in range(1, 70))
    assert all(L.next_power_of_2(n) == triton.next_power_of_2(n) for n in range(0, 1 << 17))
    assert L.next_power_of_2(2**40 + 1) == 2**41


def test_a_second_argument_kinds_hit_passes_addresses_too(recorded, on_device):
    """A position that is None in one call and a tensor in another (an optional residual) gets a second
    generated function; both calls hit, each with its own kernel and every tensor as its address."""
    params_of = {fn: _triton_binder(fn)[0] for fn, _, _ in recorded}
    fn, args, kwargs, i = next(
        (f, a, k, i) for f, a, k in recorded for i, x in enumerate(a) if x is None and not params_of[f][i].is_constexpr
    )
    other = (*args[:i], torch.zeros(8), *args[i + 1 :])
    fake = _FakeJit(fn)
    c = _cached(fake)
    for a in (args, other, args, other):
        c[(1,)](*a, **kwargs)
    assert [e[0] for e in fake.log] == ["jit", "jit", "hit", "hit"], fn.__name__
    assert len(c._keys[len(args)]) == 2
    assert _same_args(fake.log[2][1][13:], fake.log[0][2], addresses=True)
    assert _same_args(fake.log[3][1][13:], fake.log[1][2], addresses=True)
    assert fake.log[3][1][4] == fake.log[1][3] != fake.log[0][3]

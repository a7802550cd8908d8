"""Launch plans: a prepared call's kernel launches recorded once and replayed (host cost).

A prepared call (:meth:`Op.prepare`) still runs its kernel's Python wrapper on every
call: config and plan lookups, output allocation, the launch key of every
:class:`~tokenspeed_kernel.launch.CachedLaunch`, the C launch. In a GPT-OSS decode step
on the H100 machine that was 21-40 us an op call in situ (``py-spy`` of the 24-layer
step, ``docs/benchmarks/h200-2026-12-01/host-cost``), for kernels that run 2-10 us.
Since a prepared call's arguments keep their metadata (the contract of ``prepare``),
everything the wrapper computes from them is the same on every call except the tensors'
addresses. :func:`record` runs the call once while watching what it does; when every
device effect was a cached launch, it returns a *replay*: a generated function that
allocates the same outputs and temporaries, and calls each launch's C launcher with
the new addresses, and nothing else.

What the recording sees (and refuses):

- every :class:`CachedLaunch` launch. A hit is recorded (compiled kernel, grid,
  arguments with tensors as addresses); any launch that takes Triton's JIT path
  (a miss, a kernel the cache does not model, tensor descriptors), a Triton launch
  outside the cache (Triton's launch hook is set while recording) and an eager
  CUDA-graph replay (:mod:`~tokenspeed_kernel.graphs`) make the call not recordable;
- every ATen op (a ``TorchDispatchMode``): allocations (``empty*``) are recorded with
  their size, strides and dtype; views are allowed (no device work); any other op (a
  copy, a fill, cuBLAS, a library's custom op) makes the call not recordable.

Every address a launch received must come from the call: a tensor argument (its own
address, or inside it when exactly one argument holds it), an allocation of the call
(its address plus the same offset), or a tensor field of an argument object guarded by
identity (its address is a constant the plan keeps alive). Anything else (a buffer a
wrapper cached on the side) makes the call not recordable: a replay could not tell
whether the wrapper would pick the same one. The call's result must be its
allocations, or its tensor arguments, exactly.

A replay checks, then falls back to the prepared call's own path when any fails:
every tensor argument's shape and dtype (cheap; strides are the caller's promise, checked
under ``TOKENSPEED_KERNEL_DEBUG=1`` before a replay is reached), every other argument's
value (plain values) or identity (objects), the current device, the 16-byte alignment of
each address the kernel was specialised on, no Triton launch hook (profilers see every
launch through the JIT path), no :func:`~tokenspeed_kernel.launch.jit_launches` block
and Triton's debug and instrumentation settings as recorded.

Not recorded at all: under ``TOKENSPEED_KERNEL_LAUNCH=jit`` or ``TOKENSPEED_KERNEL_LAUNCH_PLANS=0``, without CUDA, on ROCm
(the cache is off there), under the Triton interpreter, while a CUDA graph is being captured.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import launch as _L

__all__ = ["LaunchPlan", "NotRecordable", "launch_plans_enabled", "record"]

_ENV_OFF = os.environ.get("TOKENSPEED_KERNEL_LAUNCH_PLANS", "1").strip().lower() in ("0", "false", "no", "off")
_T, _P = torch.Tensor, torch.nn.Parameter
_SCALARS = (type(None), bool, int, float, str)
_tags = itertools.count()


class NotRecordable(Exception):
    """What made a call not recordable (the message says)."""


def launch_plans_enabled() -> bool:
    """Whether prepared calls record launch plans in this process (module doc)."""
    if _ENV_OFF or _L._ENV_JIT or torch.version.hip or not torch.cuda.is_available():
        return False
    try:
        from triton import knobs
    except ImportError:
        return False

    return not knobs.runtime.interpret


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """A recorded call: its replay function and what it does (``launches`` kernel names, ``allocations``)."""

    replay: Callable[..., Any]
    launches: tuple[str, ...]
    allocations: int

    def __repr__(self) -> str:
        return f"LaunchPlan({len(self.launches)} launches: {', '.join(self.launches)}; {self.allocations} allocations)"


class _Recorder:
    def __init__(self) -> None:
        self.hits: list[tuple] = []  # (launcher, entry, grid, device, args, launch args)
        self.allocs: list[torch.Tensor] = []
        self.refused: list[str] = []

    def refuse(self, why: str) -> None:
        if len(self.refused) < 4:
            self.refused.append(why)


#: ATen ops a recorded call may run besides allocations and views: metadata reads (no device work).
_METADATA = {"sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_contiguous", "dim", "device", "layout"}
_ALLOCATIONS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}


class _Watch(TorchDispatchMode):
    """Records allocations; refuses every ATen op with device work."""

    def __init__(self, rec: _Recorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in _ALLOCATIONS:
            if type(out) is _T:
                self.rec.allocs.append(out)
            else:
                self.rec.refuse(f"{func} returned {type(out).__name__}")
        elif not (getattr(func, "is_view", False) or name in _METADATA):
            self.rec.refuse(f"ATen op {func}")
        return out


def _recorder_hook(*args: Any, **kwargs: Any) -> None:
    """Triton's launch hook while recording: a launch that reached Triton's own path."""
    rec = getattr(_L._state, "recorder", None)
    if rec is not None:
        rec.refuse("a Triton launch outside the launch cache")


def record(run: Callable[..., Any], flat: tuple) -> tuple[Any, LaunchPlan | None, str]:
    """``run(*flat)``, watched: its result, the :class:`LaunchPlan` that replays it (None when it cannot be
    recorded) and why not (``""`` when it can)."""
    from triton import knobs

    if getattr(_L._state, "recorder", None) is not None:  # inside another call's recording: its launches are that one's
        return run(*flat), None, "inside another recording"
    rec = _Recorder()
    chain = knobs.runtime.launch_enter_hook
    _L._state.recorder = rec
    with _L._blocks_lock:
        _L._recording += 1
    added = hasattr(chain, "add") and _recorder_hook not in chain.calls
    if added:
        chain.add(_recorder_hook)
    else:
        rec.refuse("Triton's launch hook is not a HookChain")
    try:
        with _Watch(rec):
            result = run(*flat)
    finally:
        if added:
            chain.remove(_recorder_hook)
        with _L._blocks_lock:
            _L._recording -= 1
        _L._state.recorder = None
    if rec.refused:
        return result, None, "; ".join(rec.refused)
    try:
        return result, _build(rec, flat, result, run, knobs), ""
    except NotRecordable as e:
        return result, None, str(e)


def note_refusal(why: str) -> None:
    """Called by paths with device work the recording cannot replay (an eager graph's replay)."""
    rec = getattr(_L._state, "recorder", None)
    if rec is not None:
        rec.refuse(why)


def _storage_range(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _sources(flat: tuple) -> tuple[list[tuple[str, torch.Tensor]], list[str], dict[str, Any]]:
    """(expression, tensor) of every tensor the call's arguments reach, the guards on the arguments, the
    namespace they use. Tensors are read from the arguments; objects' tensors (one field deep) are constants
    of a replay guarded by the object's identity."""
    sources: list[tuple[str, torch.Tensor]] = []
    guards: list[str] = []
    ns: dict[str, Any] = {}
    for i, a in enumerate(flat):
        t = type(a)
        if t is _T or t is _P:
            ns[f"_s{i}"], ns[f"_d{i}"] = a.shape, a.dtype
            guards.append(f"a{i}.shape != _s{i} or a{i}.dtype is not _d{i}")
            sources.append((f"a{i}", a))
        elif a is None or t is bool:
            guards.append(f"a{i} is not {a!r}")
        elif t in _SCALARS or t is torch.dtype or t is torch.device:
            ns[f"_v{i}"], ns[f"_t{i}"] = a, t
            guards.append(f"type(a{i}) is not _t{i} or a{i} != _v{i}")
        else:
            ns[f"_o{i}"] = a  # kept alive: its tensors' addresses stay valid
            guards.append(f"a{i} is not _o{i}")
            fields = (
                [(f.name, getattr(a, f.name)) for f in dataclasses.fields(a)]
                if dataclasses.is_dataclass(a)
                else list(enumerate(a))
                if t is tuple
                else []
            )
            for name, v in fields:
                vs = v if type(v) is tuple else (v,)
                for k, x in enumerate(vs):
                    if isinstance(x, torch.Tensor):
                        c = f"_k{i}_{name}_{k}"
                        ns[c] = x.data_ptr()
                        sources.append((c, x))
    return sources, guards, ns


def _address(p: int, sources: list, allocs: list[torch.Tensor]) -> tuple[str, str | None, int | None]:
    """Where address ``p`` comes from in a replay: (expression, the argument it is read from (its address, and
    so its alignment, changes from call to call) or None, the allocation it lies in or None)."""
    if p == 0:  # an empty tensor's: no memory
        return "0", None, None
    exact = [e for e, t in sources if t.data_ptr() == p]
    if len(exact) == 1:
        e = exact[0]
        return (f"p_{e}", e, None) if e.startswith("a") else (e, None, None)
    if len(exact) > 1:
        raise NotRecordable(f"address {p:#x} is the start of more than one argument ({', '.join(exact)})")
    for j, m in enumerate(allocs):
        lo, hi = _storage_range(m)
        if lo <= p < hi:
            off = p - m.data_ptr()
            return (f"q{j}" if off == 0 else f"(q{j} + {off})"), None, j
    inside = [(e, t) for e, t in sources if _storage_range(t)[0] <= p < _storage_range(t)[1]]
    if len(inside) == 1:
        e, t = inside[0]
        off = p - t.data_ptr()
        return (f"(p_{e} + {off})", e, None) if e.startswith("a") else (f"({e} + {off})", None, None)
    if inside:
        raise NotRecordable(f"address {p:#x} lies in more than one argument ({', '.join(e for e, _ in inside)})")
    raise NotRecordable(f"address {p:#x} is neither an argument's nor an allocation's (a buffer held elsewhere)")


def _result(r: Any, flat: tuple, allocs: list[torch.Tensor], used: set[int]) -> str:
    """The replay's expression of the call's result (module doc); adds the allocations it returns to ``used``."""
    if r is None:
        return "None"
    if type(r) is tuple or type(r) is list:
        inner = ", ".join(_result(x, flat, allocs, used) for x in r)
        return f"({inner}{',' if len(r) == 1 else ''})" if type(r) is tuple else f"[{inner}]"
    if isinstance(r, torch.Tensor):
        for i, a in enumerate(flat):
            if r is a:
                return f"a{i}"
        for j, m in enumerate(allocs):
            if r is m or (
                r.data_ptr() == m.data_ptr() and r.shape == m.shape and r.stride() == m.stride() and r.dtype == m.dtype
            ):
                used.add(j)
                return f"m{j}"
    raise NotRecordable(f"the result ({type(r).__name__}) is not the call's allocations or arguments")


def _build(rec: _Recorder, flat: tuple, result: Any, run: Callable[..., Any], knobs: Any) -> LaunchPlan:
    if not rec.hits:
        raise NotRecordable("no cached launch")
    sources, guards, ns = _sources(flat)
    devs = {h[3] for h in rec.hits}
    if len(devs) != 1:
        raise NotRecordable("launches on more than one device")
    dev = devs.pop()
    used_allocs: set[int] = set()
    lines: list[str] = []
    aligned: set[str] = set()
    read: list[str] = []  # the arguments whose addresses the launches take
    for n, (launcher, entry, g, _, args, largs) in enumerate(rec.hits):
        ns[f"_l{n}"], ns[f"_f{n}"], ns[f"_m{n}"] = entry.launch, entry.function, entry.packed
        ns[f"_co{n}"], ns[f"_pdl{n}"], ns[f"_tail{n}"] = entry.coop, entry.pdl, entry.tail
        exprs = []
        for k, (p, a, v) in enumerate(zip(launcher._params, args, largs)):
            if isinstance(a, torch.Tensor):
                if type(v) is not int:
                    raise NotRecordable(f"{launcher.__name__}: a tensor reached the launcher as a tensor")
                e, arg, j = _address(v, sources, rec.allocs)
                if arg is not None and arg not in read:
                    read.append(arg)
                if arg is not None and v & 15 == 0 and not (p.do_not_specialize or p.do_not_specialize_on_alignment):
                    aligned.add(e)  # specialised on this argument's alignment: a replay checks it
                if j is not None:
                    used_allocs.add(j)
                exprs.append(e)
            else:
                ns[f"_c{n}_{k}"] = v
                exprs.append(f"_c{n}_{k}")
        lines.append(
            f"    _l{n}({g[0]}, {g[1]}, {g[2]}, s, _f{n}, _co{n}, _pdl{n}, None, None, _m{n}, None, None, None, "
            f"{', '.join(exprs)}{', ' if exprs else ''}*_tail{n})"
        )
    out = _result(result, flat, rec.allocs, used_allocs)
    n_flat = len(flat)
    params = ", ".join(f"a{i}" for i in range(n_flat))
    ns.update(
        _fallback=run, _getdev=torch._C._cuda_getDevice, _getstream=torch._C._cuda_getCurrentRawStream,
        _empty=torch.empty_strided, _chain=knobs.runtime.launch_enter_hook, _rt=knobs.runtime,
        _comp=knobs.compilation, _dbg=knobs.runtime.debug, _instr=knobs.compilation.instrumentation_mode, _L=_L,
        _dev=dev,
    )  # fmt: skip
    # (a recording open on this thread must see these launches: the prepared path goes through the launch cache)
    checks = guards + [
        "_rt.launch_enter_hook is not _chain", "_chain.calls", "_L._jit_blocks", "_L._recording", "_getdev() != _dev", "_rt.debug is not _dbg",
        "_comp.instrumentation_mode != _instr",
    ]  # fmt: skip
    body = [f"    if {' or '.join(f'({c})' for c in checks)}:", f"        return _fallback({params})"]
    body += [f"    p_{e} = {e}.data_ptr()" for e in read]
    if aligned:
        body += [f"    if ({' | '.join(sorted(aligned))}) & 15:", f"        return _fallback({params})"]
    for j, m in enumerate(rec.allocs):
        if j in used_allocs:
            ns[f"_zs{j}"], ns[f"_zt{j}"], ns[f"_zd{j}"], ns[f"_zv{j}"] = tuple(m.shape), m.stride(), m.dtype, m.device
            body.append(f"    m{j} = _empty(_zs{j}, _zt{j}, dtype=_zd{j}, device=_zv{j})")
            body.append(f"    q{j} = m{j}.data_ptr()")
    body.append("    s = _getstream(_dev)")
    body += lines
    body.append(f"    return {out}")
    src = f"def replay({params}):\n" + "\n".join(body) + "\n"
    exec(compile(src, f"<tokenspeed_kernel launch plan {next(_tags)}>", "exec"), ns)
    fn = ns["replay"]
    fn.__source__ = src  # for tests and explain
    return LaunchPlan(fn, tuple(h[0].__name__ for h in rec.hits), len(used_allocs))

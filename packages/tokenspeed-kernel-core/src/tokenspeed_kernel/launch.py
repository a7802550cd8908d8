"""Cached launches of Triton and Gluon kernels: the host path of every kernel call.

``fn[grid](*args, **kwargs)`` on a ``triton.jit`` function cost 10-26 us of host
time on the H200 machine (two runs of ``tools/host_probe.py``) for kernels that run
1.5 us (the GPT-OSS ``rmsnorm`` row):
Triton binds every argument, builds a specialisation list, turns the options into
a string for its cache key, checks the kernel's globals and goes through two
Python launcher layers before the C launch (about 5 us of that). A decode step
makes hundreds of such launches.

:class:`CachedLaunch` keeps the compiled kernel per *specialisation key* and
launches it through the C launcher directly::

    _rmsnorm = CachedLaunch(_rmsnorm_kernel)
    _rmsnorm[grid](x, w, y, n, eps, BLOCK=1024, num_warps=8)   # same call as the JIT function

The key is computed from the arguments with a function generated for the kernel's
parameter list and the argument kinds it has seen (up to four per argument count: a
position that takes None or a tensor): a guard chain checks each position's type
(an int within i32), then one flat tuple holds per tensor its dtype and whether its
address is 16-byte aligned, per int whether it is 1 or divisible by 16; arguments of
other kinds (an int past i32, a tensor subclass) get a slower tagged key per
position. Then the keyword arguments (constexprs and options),
the current device and the Triton settings that change code (``knobs.runtime.debug``,
``knobs.compilation.instrumentation_mode``; like Triton's own cache, not the kernel's
globals, which are constants in every kernel of the packages). That is at least as
fine as Triton's own specialisation (``native_specialize_impl``; the CPU test
``test_launch.py`` checks it against Triton's binder), so one key never names two
different compiled kernels. A miss runs the JIT path (``fn[grid](...)``, which
compiles or finds the kernel in Triton's cache, and launches it) and stores what
the next call needs.

The JIT path stays the fallback, and is taken for every call:

- under ``TRITON_INTERPRET=1`` (the interpreter has no compiled kernel);
- while a Triton launch hook is set (``knobs.runtime.launch_enter_hook`` holds one:
  Proton and other profilers see every launch as before; a hit passes no hook to
  the C launcher, where Triton's own path calls the empty hook chain every launch);
- on ROCm (the AMD backend specialises tensors on their size too; not measured
  there, so not cached);
- for a grid that is not a tuple (a callable grid), a kernel that needs a global or profile scratch buffer,
  or an argument of another type (tensor descriptors, tuples);
- inside :func:`jit_launches` (tests compare both paths with it), or with
  ``TOKENSPEED_KERNEL_LAUNCH=jit`` in the environment.

Runtime arguments must be positional (they are in every call in the packages);
keywords are for constexprs and launch options, and a runtime argument passed by
keyword raises ``TypeError`` naming it, on every path.

Launch plans
------------

Without a plan, a prepared call (``Op.prepare``; public calls are served by prepared
calls too, ``core/op.py``) runs its kernel's Python wrapper on every call: config and
plan lookups, output allocation, the launch key of every :class:`CachedLaunch`, the C
launch. In a GPT-OSS decode step on the H100 machine that was 21-38 us an op call in
situ (``host_probe.py --sites``, session 18 call 2) for kernels that run 1.5-10 us, and
the Triton ops' wrappers were about 43 % of the step's host time (``py-spy``, call 1;
``docs/benchmarks/h200-2026-12-01/host-cost``). Since a prepared call's arguments keep
their metadata (the contract of ``prepare``), everything the wrapper computes from them
is the same on every call except the tensors' addresses. :func:`record` runs the call
once while watching what it does; when every device effect was a cached launch, it
returns a *replay*: a generated function that allocates the same outputs and
temporaries, and calls each launch's C launcher with the new addresses, and nothing else.

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
(its address plus the same offset), or a tensor field of a frozen dataclass or tuple
argument, guarded by identity (its address is a constant; the plan holds the tensor), or
the current stream's counters or scratch (:func:`stream_counters`, :func:`stream_scratch`:
a replay takes its own stream's at the same offset, and runs the call's own path when that
stream has none large enough or is being captured).
Plain values (scalars, dtypes, tuples and frozen dataclasses of them) are guarded by
value. Anything else (a buffer a wrapper cached on the side) makes the call not
recordable: a replay could not tell whether the wrapper would pick the same one. The
call's result must be its allocations, or its tensor arguments, exactly, or None, or tuples,
lists and frozen dataclasses of them (``MoEDispatchResult``: the replay builds a new one).

A replay checks, then falls back to the prepared call's own path when any fails:
every tensor argument's shape, strides and dtype (the prepared call's promise, which the
wrapper path would survive and a replay, whose grid and strides are baked in, would not),
every other argument's value (plain values) or identity (objects), the current device, the
16-byte alignment of each address the kernel was specialised on, no open recording (its
launches must reach it), no Triton launch hook (profilers see every launch through the JIT
path), no :func:`jit_launches` block, and Triton's debug and instrumentation settings as
recorded; when the call uses stream buffers, that the stream is not being captured (the call's
own path then takes the graph's); when it allocates, that deterministic algorithms are off and no
``TorchDispatchMode`` is active (below). A replay allocates what the call allocated (outputs and
temporaries of the same geometry, stream-ordered like the wrapper's) and nothing else, through
torch's C allocation (:func:`_fast_allocator`: the one Inductor's generated code uses, no dispatcher;
it skips the deterministic fill of new memory and no dispatch mode sees it, hence those two
checks). A replay keeps the addresses of the stream buffers it last looked up, with the stream and
the count of buffers made by then: while both are unchanged it takes them again without a lookup.

Not recorded at all: under ``TOKENSPEED_KERNEL_LAUNCH=jit`` or
``TOKENSPEED_KERNEL_LAUNCH_PLANS=0``, without CUDA, on ROCm (the cache is off there),
under the Triton interpreter, while a CUDA graph is being captured.

This module imports Triton only when a kernel is first launched; the core package
does not depend on Triton.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from .core import recording as _rec
from .core.codegen import guarded_tuple_function, plain_value

__all__ = [
    "CachedLaunch", "LaunchPlan", "NotRecordable", "cached", "cdiv", "jit_launches", "launch_cache_info",
    "launch_plans_enabled", "next_power_of_2", "record", "stream_counters", "stream_scratch",
]  # fmt: skip

_state = threading.local()
_ENV_JIT = os.environ.get("TOKENSPEED_KERNEL_LAUNCH", "").strip().lower() == "jit"

#: Triton's integer types by range (``native_specialize_impl``): i32, i64, else u64.
_I32_MIN, _I32_END, _I64_END = -(2**31), 2**31, 2**63
#: generated key functions per positional-arg count (argument kinds that vary: None or a tensor).
_MAX_KEY_FUNCTIONS = 4


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for host ints. Triton 3.6's ``triton.cdiv`` and ``triton.next_power_of_2`` are
    ``ConstexprFunction`` objects: called on the host they cost 2.3-3.3 us on the 2-core machine (an
    import and two comprehensions a call), 4.7-5.3 us under cProfile on the H200 machine, three times a
    wrapper call (``apply_rotary``, ``moe_route``: session 12 call 1's cProfile tables); these are plain functions."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two ``>= n`` for a host int ``n >= 0``, 0 for 0: ``triton.next_power_of_2``'s
    values (see :func:`cdiv`)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


#: ``jit_launches`` blocks open in any thread: while none is, a launch reads no thread-local state
#: (``getattr`` on a ``threading.local`` cost about 0.4 us a launch on the 2-core machine).
_jit_blocks = 0
_blocks_lock = threading.Lock()


def _jit_forced() -> bool:
    return _ENV_JIT or (_jit_blocks > 0 and getattr(_state, "jit", False))


@contextlib.contextmanager
def jit_launches() -> Iterator[None]:
    """Within the block, every :class:`CachedLaunch` on this thread takes Triton's JIT path."""
    global _jit_blocks
    before = getattr(_state, "jit", False)
    _state.jit = True
    with _blocks_lock:
        _jit_blocks += 1
    try:
        yield
    finally:
        _state.jit = before
        with _blocks_lock:
            _jit_blocks -= 1


def _slow_spec(a: Any) -> tuple:
    """A tagged key component for an argument whose kind differs from the generated fast path's.

    Such a key starts with the string ``"slow"``, where a generated function's key starts with its
    tag (an int), so the two cannot collide. Raises ``_Uncacheable`` for kinds Triton specialises in ways this module does not model.
    """
    t = type(a)
    if a is None:
        return ("none",)
    if t is bool:
        return ("bool",)
    if t is int:
        return ("int", a == 1, a & 15 == 0, _I32_MIN <= a < _I32_END, a < _I64_END)
    if t is float:
        return ("float",)
    if isinstance(a, torch.Tensor):
        return ("tensor", a.dtype, a.data_ptr() & 15 == 0)
    raise _Uncacheable(t.__name__)


class _Uncacheable(Exception):
    pass


def _kind(a: Any) -> str:
    """The argument kind the generated key function is specialised for (:func:`_slow_spec`'s tag)."""
    try:
        return _slow_spec(a)[0]
    except _Uncacheable:
        return "other"


#: a tag per generated key function, first in its keys (two functions' keys never collide).
_tags = itertools.count()


#: the tensor attribute a generated key function requires of a tensor it passes by address (CPU tests swap it).
_DEVICE_ATTR = "is_cuda"


def _key_function(params: list[Any], kinds: list[str]) -> Any:
    """A function ``key(*args)`` for positional ``args`` of the given ``kinds``: ``(key, launch_args)``,
    or None for other kinds.

    One guard chain checks every position's type (an int within i32, a tensor on the GPU); when it
    holds, the key is one flat tuple: the function's tag, then per tensor its dtype (and alignment
    bit), per int one class (1, divisible by 16, other), per constexpr its value (a float, bool or
    None adds nothing: its kind is the guard's). A flat tuple of plain values is built and hashed once
    per call, where a tuple per argument cost a tuple each. ``launch_args`` are the arguments with
    each tensor replaced by its address: Triton's C launcher takes an int as a pointer as it is,
    where for a tensor it calls ``data_ptr()`` and ``cuPointerGetAttribute`` (the C launch of a
    6-pointer kernel: 9.6 us given tensors, 4.6 us given addresses on the H200 machine, session 12).
    The guard's ``is_cuda`` keeps what that check caught: a CPU tensor takes the slow path, whose
    launch gets the tensor and raises there.
    """
    guards, parts, prelude, args = [], [str(next(_tags))], [], []
    for i, (p, kind) in enumerate(zip(params, kinds)):
        a = f"a{i}"
        args.append(a)
        if p.is_constexpr:
            parts.append(a)
            continue
        spec = not p.do_not_specialize
        align = not p.do_not_specialize_on_alignment
        if kind == "tensor":
            guards.append(f"(type({a}) is _T or type({a}) is _P) and {a}.{_DEVICE_ATTR}")
            prelude.append(f"p{i} = {a}.data_ptr()")
            args[-1] = f"p{i}"
            parts.append(f"{a}.dtype")
            if spec and align:
                parts.append(f"p{i} & 15 == 0")
        elif kind == "int":
            guards.append(f"type({a}) is int and _I32_MIN <= {a} < _I32_END")
            if spec:
                parts.append(f"(1 if {a} == 1 else 2 if {a} & 15 == 0 else 0)" if align else f"{a} == 1")
        elif kind == "float":
            guards.append(f"type({a}) is float")
        elif kind == "bool":
            guards.append(f"type({a}) is bool")
        elif kind == "none":
            guards.append(f"{a} is None")
        else:
            raise _Uncacheable(kind)
    ns: dict[str, Any] = {
        "_T": torch.Tensor, "_P": torch.nn.Parameter, "_I32_MIN": _I32_MIN, "_I32_END": _I32_END,
    }  # fmt: skip
    return guarded_tuple_function(len(kinds), guards, parts, ns, "launch key", prelude=prelude, second=args)


def _spec_and_args(keyfs: list[Any], params: list[Any], args: tuple) -> tuple[tuple, tuple]:
    """The specialisation part of a launch key and the arguments the C launcher gets: the first generated
    function whose guards hold (tensors as addresses), else a tagged tuple of :func:`_slow_spec` per
    position and the arguments as they are (raises ``_Uncacheable``)."""
    for keyf in keyfs:  # one per argument kinds seen (an optional tensor: None or not)
        got = keyf(*args)
        if got is not None:
            return got
    return ("slow", *(a if p.is_constexpr else _slow_spec(a) for p, a in zip(params, args))), args


def _note_jit(name: str) -> None:
    """A launch through Triton's JIT path while this thread records a launch plan: the call is not recordable."""
    _rec.refuse(f"{name}: a launch through Triton's JIT path")


def _only_recorder(calls: Any) -> bool:
    """Whether the only launch hook is a launch-plan recording's (which must not turn the cache off)."""
    return type(calls) is list and all(c is _recorder_hook for c in calls)


class _Entry:
    """What a cache hit needs: the C launch function and its fixed arguments."""

    __slots__ = ("coop", "function", "launch", "packed", "pdl", "tail")

    def __init__(self, launch, function, coop, pdl, packed, tail) -> None:
        self.launch, self.function, self.coop, self.pdl, self.packed, self.tail = (
            launch, function, coop, pdl, packed, tail,
        )  # fmt: skip


class CachedLaunch:
    """``fn[grid](*args, **kwargs)`` of a Triton/Gluon JIT function with a cached launch (module doc)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", repr(fn))
        self._cache: dict[Any, _Entry | None] = {}
        self._keys: dict[int, list[Any]] = {}  # positional-arg count -> key functions (one per argument kinds)
        self._lock = threading.Lock()
        params = getattr(fn, "params", None)
        self._params = list(params) if params is not None else None
        self._runtime_names = frozenset(p.name for p in self._params if not p.is_constexpr) if params else frozenset()
        self._cacheable = params is not None and hasattr(fn, "device_caches")
        self.misses = 0  # calls that took the JIT path to fill the cache (not counted on a hit)
        self.unmodelled = 0  # misses whose argument kinds the key does not model (tensor descriptors): JIT'd
        self._knobs: Any = None
        self._compilation: Any = None
        self._getdev: Any = None
        self._getstream: Any = None

    def __repr__(self) -> str:
        return f"CachedLaunch({self.__name__}, {len(self._cache)} cached)"

    def __getitem__(self, grid: Any):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def _check_kwargs(self, kwargs: dict[str, Any]) -> None:
        bad = self._runtime_names.intersection(kwargs)
        if bad:
            raise TypeError(
                f"{self.__name__}: runtime argument(s) {sorted(bad)} passed by keyword; "
                "CachedLaunch takes runtime arguments positionally (keywords are for constexprs and options)"
            )

    def launch(self, grid: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        """Launch on the current device and stream (what ``fn[grid](*args, **kwargs)`` does)."""
        if self._knobs is None:
            self._bind_runtime()
        # Triton 3.6 keeps the hooks in a HookChain (empty unless a profiler added one); older ones a callable or None.
        hook = self._knobs.launch_enter_hook
        calls = getattr(hook, "calls", hook)
        if (
            self._cacheable
            and type(grid) is tuple
            and (not calls or (_rec.active and _only_recorder(calls)))
            and not ((_ENV_JIT or _jit_blocks) and _jit_forced())
        ):
            keyfs = self._keys.get(len(args))
            if keyfs is not None:
                dev = self._getdev()
                try:
                    spec, largs = _spec_and_args(keyfs, self._params, args)
                    key = (spec, tuple(kwargs.items()), dev, self._knobs.debug, self._compilation.instrumentation_mode)
                    entry = self._cache.get(key, False)
                except (_Uncacheable, TypeError):
                    entry = None
                if entry:
                    g = grid if len(grid) == 3 else (*grid, 1, 1)
                    if _rec.active:
                        rec = getattr(_rec.state, "recorder", None)
                        if rec is not None:
                            rec.hits.append((self, entry, g, dev, args, largs))
                    entry.launch(
                        g[0], g[1], g[2], self._getstream(dev), entry.function, entry.coop, entry.pdl, None, None,
                        entry.packed, None, None, None, *largs, *entry.tail,
                    )  # fmt: skip
                    return
                if entry is None:  # uncacheable call (or key): JIT path every time
                    if _rec.active:
                        _note_jit(self.__name__)
                    self._check_kwargs(kwargs)
                    self.fn[grid](*args, **kwargs)
                    return
                self._miss(grid, args, kwargs)
                return
            self._miss(grid, args, kwargs)
            return
        if _rec.active:
            _note_jit(self.__name__)
        self._check_kwargs(kwargs)
        self.fn[grid](*args, **kwargs)

    def _bind_runtime(self) -> None:
        from triton import knobs

        self._knobs = knobs.runtime
        self._compilation = knobs.compilation
        if self._cacheable and (torch.version.hip or knobs.runtime.interpret or not torch.cuda.is_available()):
            self._cacheable = False
        if self._cacheable:
            self._getdev = torch._C._cuda_getDevice
            self._getstream = torch._C._cuda_getCurrentRawStream

    def _miss(self, grid: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        """JIT path; then remember the compiled kernel under this call's key."""
        if _rec.active:
            _note_jit(self.__name__)
        self._check_kwargs(kwargs)
        self.misses += 1
        kernel = self.fn[grid](*args, **kwargs)
        if kernel is None or not 1 <= len(grid) <= 3:
            return  # no compiled kernel handed back (yet): the next call takes this path again
        params = self._params
        assert params is not None
        n = len(args)
        try:
            with self._lock:
                keyfs = self._keys.get(n)
                if keyfs is None:
                    keyfs = self._keys[n] = []
                if len(keyfs) < _MAX_KEY_FUNCTIONS and all(kf(*args) is None for kf in keyfs):
                    kinds = [_kind(a) for a in args]
                    if "other" not in kinds:  # tensor descriptors, tuples: the tagged slow key names them
                        keyf = _key_function(params[:n], kinds)
                        if keyf(*args) is not None:  # (an int past i32 fails its own guard: slow key)
                            keyfs.append(keyf)
            # computed again: the hit path's key came from the functions before this miss added one
            key = (
                _spec_and_args(keyfs, params, args)[0], tuple(kwargs.items()), self._getdev(), self._knobs.debug,
                self._compilation.instrumentation_mode,
            )  # fmt: skip
            hash(key)
        except (_Uncacheable, TypeError):
            self.unmodelled += 1
            return
        entry = None
        if hasattr(kernel, "result"):
            kernel = kernel.result()
        run = kernel.run
        launch = getattr(run, "launch", None)
        simple = (
            launch is not None
            and not getattr(run, "global_scratch_size", 0)
            and not getattr(run, "profile_scratch_size", 0)
        )
        if simple:
            tail = tuple(kwargs[p.name] if p.name in kwargs else p.default for p in params[n:])
            entry = _Entry(
                launch, kernel.function, run.launch_cooperative_grid, run.launch_pdl, kernel.packed_metadata, tail
            )
        with self._lock:
            self._cache[key] = entry


def launch_cache_info(launchers: list[CachedLaunch] | None = None) -> dict[str, dict[str, int]]:
    """Per launcher (by kernel name): cached specialisations, uncacheable keys (JIT every call), misses, and
    ``unmodelled`` misses (arguments of a kind the key does not model, such as tensor descriptors: JIT every call).

    ``launchers``: default every launcher :func:`cached` made.
    """
    out = {}
    for k in list(_all) if launchers is None else launchers:
        cached_n = sum(1 for e in k._cache.values() if e is not None)
        out[k.__name__] = {
            "cached": cached_n, "uncacheable": len(k._cache) - cached_n, "misses": k.misses, "unmodelled": k.unmodelled,
        }  # fmt: skip
    return out


def cached(fn: Any) -> CachedLaunch:
    """The :class:`CachedLaunch` of ``fn`` (one per JIT function, kept on it): ``cached(k)[grid](...)``."""
    launcher = fn.__dict__.get("_tokenspeed_launch")
    if launcher is None:
        launcher = fn.__dict__["_tokenspeed_launch"] = CachedLaunch(fn)
        _all.add(launcher)
    return launcher


#: Every launcher :func:`cached` made, held weakly: a launcher lives as long as the function it is stored on
#: (a kernel's for the process; a test's stand-in for the test, with whatever its calls recorded).
_all: weakref.WeakSet[CachedLaunch] = weakref.WeakSet()


# -- launch plans --------------------------------------------------------------------------------

_ENV_OFF = os.environ.get("TOKENSPEED_KERNEL_LAUNCH_PLANS", "1").strip().lower() in ("0", "false", "no", "off")
_T, _P = torch.Tensor, torch.nn.Parameter
_plan_tags = itertools.count()


#: buffers per (CUDA stream (its raw handle), kind): "counters" (int32, zero between launches: :func:`stream_counters`)
#: and "scratch" (fp32 temporaries a launch writes and reads itself: :func:`stream_scratch`).
_BUFFERS: dict[tuple[int, str], torch.Tensor] = {}
#: buffers a stream outgrew: kept, since a launch plan or a captured graph may hold their address.
_OUTGROWN: list[torch.Tensor] = []
#: buffers made so far (a replay's lookup of its stream's buffers is good while this and the stream are unchanged)
_buffers_made = 0
_KINDS = {"counters": (torch.int32, torch.zeros, 4096), "scratch": (torch.float32, torch.empty, 1 << 16)}
#: whether the current stream is being captured (torch's C function where this build has it: one Python frame less
#: than ``torch.cuda.is_current_stream_capturing``, which only calls it)
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing)


def stream_counters(device: torch.device, n: int) -> torch.Tensor:
    """At least ``n`` int32 counters, zero, for ``device``'s current stream.

    For kernels whose programs count their arrivals so that the last one of a group does the group's epilogue
    (it zeroes the counter): the counters are zero before a launch and after it, so launches on one stream share
    them in stream order. Per stream, because two launches running at once must not count into one counter. Never
    freed (an outgrown buffer is kept): a launch plan's replay or a captured graph may hold the address. While the
    stream is being captured: fresh zeroed counters of the graph's memory pool (the graph zeroes them at every
    replay), so a graph replayed on another stream never shares counters with eager launches. Off CUDA (the Triton
    interpreter): fresh zeroed counters. A launch-plan recording notes the buffer; a replay takes the counters of
    its own stream (launch plans, module doc)."""
    return _stream_buffer(device, n, "counters")


def stream_scratch(device: torch.device, n: int) -> torch.Tensor:
    """At least ``n`` fp32 elements of scratch for ``device``'s current stream, contents undefined.

    For temporaries one launch writes and reads itself (decode attention's split partials, merged by the last split):
    launches on one stream run in order, so they share the scratch, and a call allocates nothing for them. The rules
    of :func:`stream_counters` otherwise (per stream, never freed, fresh while capturing or off CUDA, replays take
    their own stream's). Never for a temporary that a later launch reads, nor with a launch that lets the next one
    start early (programmatic dependent launch)."""
    return _stream_buffer(device, n, "scratch")


def _stream_buffer(device: torch.device, n: int, kind: str) -> torch.Tensor:
    global _buffers_made
    dtype, make, least = _KINDS[kind]
    stream = _current_stream(device)
    if stream is None or _capturing():
        return make(n, dtype=dtype, device=device)
    b = _BUFFERS.get((stream, kind))
    if b is None or b.numel() < n:
        if b is not None:
            _OUTGROWN.append(b)
        size = max(n, least, 2 * b.numel() if b is not None else 0)
        # (a stream's setup, not the call's work: a recording does not see it, since a replay looks the buffer up;
        # else a call's first use of a new stream could not be recorded)
        with _disable_current_modes():
            b = _BUFFERS[(stream, kind)] = make(size, dtype=dtype, device=device)
        _buffers_made += 1
    rec = getattr(_rec.state, "recorder", None)
    if rec is not None:
        rec.buffers.append((b, n, kind))
    return b


def _current_stream(device: torch.device) -> int | None:
    """The raw handle of ``device``'s current stream (what a replay reads too); None off CUDA."""
    if device.type != "cuda":
        return None
    return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None else torch.cuda.current_device())


def _buffer_address(stream: int, n: int, kind: str) -> int:
    """A replay's stream buffer: the address of ``stream``'s (at least ``n`` elements), or 0 when it has none that
    large (the replay then runs the call's own path, which makes one). The replay checks once, before its buffers,
    that the stream is not being captured (a CUDA call: one a replay, not one a buffer), and looks its buffers up
    again only on another stream or after a buffer was made (module doc, "Launch plans")."""
    b = _BUFFERS.get((stream, kind))
    if b is None or b.numel() < n:
        return 0
    return b.data_ptr()


class NotRecordable(Exception):
    """What made a call not recordable (the message says)."""


def launch_plans_enabled() -> bool:
    """Whether prepared calls record launch plans in this process (module doc)."""
    if _ENV_OFF or _ENV_JIT or torch.version.hip or not torch.cuda.is_available():
        return False
    try:
        from triton import knobs
    except ImportError:
        return False

    return not knobs.runtime.interpret


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """A recorded call: its replay function and what it does (``launches`` kernel names, ``allocations``).

    ``replay_served``: the same without the guards on the arguments' metadata and plain values, for a caller that
    matched them already (a public call served by its memo key); objects' identity and the process state are still
    checked."""

    replay: Callable[..., Any]
    replay_served: Callable[..., Any]
    launches: tuple[str, ...]
    allocations: int

    def __repr__(self) -> str:
        return f"LaunchPlan({len(self.launches)} launches: {', '.join(self.launches)}; {self.allocations} allocations)"


class _Recorder:
    def __init__(self) -> None:
        self.hits: list[tuple] = []  # (launcher, entry, grid, device, args, launch args)
        self.allocs: list[torch.Tensor] = []
        self.buffers: list[tuple[torch.Tensor, int, str]] = []  # (a stream's buffer, elements the call asked, kind)
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
    _rec.refuse("a Triton launch outside the launch cache")


def record(run: Callable[..., Any], flat: tuple) -> tuple[Any, LaunchPlan | None, str]:
    """``run(*flat)``, watched: its result, the :class:`LaunchPlan` that replays it (None when it cannot be
    recorded) and why not (``""`` when it can)."""
    from triton import knobs

    # Inside another call's recording (on this thread), the launches are that one's.
    if getattr(_rec.state, "recorder", None) is not None:
        return run(*flat), None, "inside another recording"
    rec = _Recorder()
    chain = knobs.runtime.launch_enter_hook
    _rec.state.recorder = rec
    with _rec.lock:  # the hook is added by the first open recording (any thread) and removed by the last
        _rec.active += 1
        if _rec.active == 1 and hasattr(chain, "add"):
            chain.add(_recorder_hook)
    if _recorder_hook not in getattr(chain, "calls", ()):
        rec.refuse("Triton's launch hook is not a HookChain")
    try:
        with _Watch(rec):
            result = run(*flat)
    finally:
        with _rec.lock:
            _rec.active -= 1
            if _rec.active == 0 and hasattr(chain, "remove"):
                chain.remove(_recorder_hook)
        _rec.state.recorder = None
    if rec.refused:
        return result, None, "; ".join(rec.refused)
    try:
        return result, _build(rec, flat, result, run, knobs), ""
    except NotRecordable as e:
        return result, None, str(e)


def _storage_range(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.data_ptr() + s.nbytes()


def _sources(flat: tuple) -> tuple[list[tuple[str, torch.Tensor]], list[str], list[str], dict[str, Any]]:
    """(expression, tensor) of every tensor the call's arguments reach; the guards on the arguments' metadata
    and values (what a served public call's key already matched) and on objects' identity; the namespace they
    use. Tensors are read from the arguments; objects' tensors (one field deep) are constants of a replay
    guarded by the object's identity."""
    sources: list[tuple[str, torch.Tensor]] = []
    guards: list[str] = []
    identity: list[str] = []
    ns: dict[str, Any] = {}
    for i, a in enumerate(flat):
        t = type(a)
        if t is _T or t is _P:
            ns[f"_s{i}"], ns[f"_st{i}"], ns[f"_d{i}"] = a.shape, a.stride(), a.dtype
            guards.append(f"a{i}.shape != _s{i} or a{i}.stride() != _st{i} or a{i}.dtype is not _d{i}")
            sources.append((f"a{i}", a))
        elif a is None or t is bool:
            guards.append(f"a{i} is not {a!r}")
        elif plain_value(a):  # (what the validation memo describes by value too)
            ns[f"_v{i}"], ns[f"_t{i}"] = a, t
            guards.append(f"type(a{i}) is not _t{i} or a{i} != _v{i}")
        else:
            ns[f"_o{i}"] = a  # kept alive: its tensors' addresses stay valid
            identity.append(f"a{i} is not _o{i}")
            # Only objects that cannot change under the plan (a frozen dataclass, a tuple) lend their tensors: a
            # mutable one could swap a field for another tensor, which the replay would not see.
            frozen = dataclasses.is_dataclass(a) and not isinstance(a, type) and t.__dataclass_params__.frozen
            fields = (
                [(f.name, getattr(a, f.name)) for f in dataclasses.fields(a)]
                if frozen
                else list(enumerate(a))
                if t is tuple
                else []
            )
            for name, v in fields:
                vs = v if type(v) is tuple else (v,)
                for k, x in enumerate(vs):
                    if isinstance(x, torch.Tensor):
                        c = f"_k{i}_{name}_{k}"
                        ns[c], ns[f"{c}_held"] = x.data_ptr(), x  # (held: the address stays the tensor's)
                        sources.append((c, x))
    return sources, guards, identity, ns


def _address(
    p: int, sources: list, allocs: list[torch.Tensor], buffers: list[tuple[torch.Tensor, int, str]] = ()
) -> tuple[str, str | None, int | None]:
    """Where address ``p`` comes from in a replay: (expression, the argument it is read from (its address, and
    so its alignment, changes from call to call) or None, the allocation it lies in or None)."""
    if p == 0:  # an empty tensor's: no memory
        return "0", None, None
    for j, (b, _, _) in enumerate(buffers):  # a stream's buffer: the replay looks up its own stream's
        lo, hi = _storage_range(b)
        if lo <= p < hi:
            off = p - b.data_ptr()
            return (f"c{j}" if off == 0 else f"(c{j} + {off})"), None, None
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


def _result(r: Any, flat: tuple, allocs: list[torch.Tensor], used: set[int], ns: dict[str, Any]) -> str:
    """The replay's expression of the call's result (module doc); adds the allocations it returns to ``used`` and the
    dataclass types it builds to ``ns``."""
    if r is None:
        return "None"
    if type(r) is tuple or type(r) is list:
        inner = ", ".join(_result(x, flat, allocs, used, ns) for x in r)
        return f"({inner}{',' if len(r) == 1 else ''})" if type(r) is tuple else f"[{inner}]"
    t = type(r)
    if dataclasses.is_dataclass(r) and t.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        fields = dataclasses.fields(r)
        if all(f.init for f in fields):  # (a field the constructor does not take could not be rebuilt)
            name = f"_res{sum(k.startswith('_res') for k in ns)}"
            ns[name] = t
            inner = ", ".join(f"{f.name}={_result(getattr(r, f.name), flat, allocs, used, ns)}" for f in fields)
            return f"{name}({inner})"
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


#: How many ``TorchDispatchMode``s are active (a C function; the CPU tests replace it).
_dispatch_modes = torch._C._len_torch_dispatch_stack


def _fast_allocator(m: torch.Tensor, dev: int) -> Any:
    """torch's C allocation of ``m``'s device type (``torch._C._dynamo.guards._empty_strided_<type>(size, stride,
    dtype)``, what Inductor's generated code allocates with): no dispatcher, no argument parser (1.11 us against
    ``torch.empty_like``'s 1.74 on an H100 host, session 29). It allocates on the current device of its type, so it serves an allocation on
    the launches' device (which a replay guards as the current one) or on the CPU; None for any other (the replay
    then calls ``torch.empty_strided`` with the device). It skips torch's deterministic fill of new memory, and a
    ``TorchDispatchMode`` does not see it, so a replay with allocations runs the call's own path while
    deterministic algorithms are on or a dispatch mode is active (:data:`_dispatch_modes`)."""
    if m.device.type == "cuda" and m.device.index != dev:
        return None
    if m.device.type not in ("cuda", "cpu"):
        return None
    guards = getattr(getattr(torch._C, "_dynamo", None), "guards", None)  # (a torch without them: empty_strided)
    return getattr(guards, f"_empty_strided_{m.device.type}", None)


def _build(rec: _Recorder, flat: tuple, result: Any, run: Callable[..., Any], knobs: Any) -> LaunchPlan:
    if not rec.hits:
        raise NotRecordable("no cached launch")
    sources, guards, identity, ns = _sources(flat)
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
                e, arg, j = _address(v, sources, rec.allocs, rec.buffers)
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
    out = _result(result, flat, rec.allocs, used_allocs, ns)
    n_flat = len(flat)
    params = ", ".join(f"a{i}" for i in range(n_flat))
    ns.update(
        _fallback=run, _getdev=torch._C._cuda_getDevice, _getstream=torch._C._cuda_getCurrentRawStream,
        _empty=torch.empty_strided, _det=torch._C._get_deterministic_algorithms, _modes=_dispatch_modes, _chain=knobs.runtime.launch_enter_hook, _rt=knobs.runtime,
        _comp=knobs.compilation, _dbg=knobs.runtime.debug, _instr=knobs.compilation.instrumentation_mode,
        _dev=dev, _L=sys.modules[__name__], _R=_rec, _buf=_buffer_address,
    )  # fmt: skip
    # (a recording open on this thread must see these launches: the prepared path goes through the launch cache)
    state = [
        "_rt.launch_enter_hook is not _chain", "_chain.calls", "_L._jit_blocks", "_R.active", "_getdev() != _dev",
        "_rt.debug is not _dbg", "_comp.instrumentation_mode != _instr",
    ]  # fmt: skip
    if used_allocs:  # (the C allocations skip torch's deterministic fill and the dispatcher: :func:`_fast_allocator`)
        state += ["_det()", "_modes()"]
    rest = [f"    p_{e} = {e}.data_ptr()" for e in read]
    if aligned:
        rest += [f"    if ({' | '.join(sorted(aligned))}) & 15:", f"        return _fallback({params})"]
    for j, m in enumerate(rec.allocs):
        if j in used_allocs:
            ns[f"_zs{j}"], ns[f"_zt{j}"], ns[f"_zd{j}"], ns[f"_zv{j}"] = tuple(m.shape), m.stride(), m.dtype, m.device
            fast = _fast_allocator(m, dev)
            if fast is not None:
                ns[f"_za{j}"] = fast
                rest.append(f"    m{j} = _za{j}(_zs{j}, _zt{j}, _zd{j})")
            else:
                rest.append(f"    m{j} = _empty(_zs{j}, _zt{j}, dtype=_zd{j}, device=_zv{j})")
            rest.append(f"    q{j} = m{j}.data_ptr()")
    rest.append("    s = _getstream(_dev)")
    if rec.buffers:  # (captured, the call's own path takes the graph's fresh buffers)
        rest += ["    if _L._capturing():", f"        return _fallback({params})"]
        # The addresses the last lookup gave, with its stream and the count of buffers made before it, in one item
        # (one store: a thread never sees one stream's addresses under another's handle). While neither changed, a
        # lookup would give the same addresses.
        ns["_bs"] = [(None, None, None)]
        cs = ", ".join(f"c{j}" for j in range(len(rec.buffers)))
        rest += ["    bs, made = _bs[0], _L._buffers_made", "    if bs[0] == s and bs[1] == made:"]
        rest += [f"        {cs}, = bs[2]", "    else:"]
        for j, (_, n, kind) in enumerate(rec.buffers):
            rest += [f"        c{j} = _buf(s, {n}, {kind!r})", f"        if not c{j}:"]
            rest.append(f"            return _fallback({params})")
        rest.append(f"        _bs[0] = (s, made, ({cs},))")
    rest += lines
    rest.append(f"    return {out}")
    fns = []
    for name, checks in (("replay", guards + identity + state), ("replay_served", identity + state)):
        head = [f"    if {' or '.join(f'({c})' for c in checks)}:", f"        return _fallback({params})"]
        src = f"def {name}({params}):\n" + "\n".join(head + rest) + "\n"
        exec(compile(src, f"<tokenspeed_kernel launch plan {next(_plan_tags)}>", "exec"), ns)
        fn = ns[name]
        fn.__source__ = src  # for tests and explain
        fns.append(fn)
    return LaunchPlan(fns[0], fns[1], tuple(h[0].__name__ for h in rec.hits), len(used_allocs))


_rec.install(record, launch_plans_enabled)

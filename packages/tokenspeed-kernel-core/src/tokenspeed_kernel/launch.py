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

This module imports Triton only when a kernel is first launched; the core package
does not depend on Triton.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from .core.codegen import guarded_tuple_function

__all__ = ["CachedLaunch", "cached", "cdiv", "jit_launches", "launch_cache_info", "next_power_of_2"]

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


#: launch-plan recordings open in any thread (``launch_plan.record``): while none is, a hit records nothing.
_recording = 0


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
    rec = getattr(_state, "recorder", None)
    if rec is not None:
        rec.refuse(f"{name}: a launch through Triton's JIT path")


def _only_recorder(calls: Any) -> bool:
    """Whether the only launch hook is a launch-plan recording's (which must not turn the cache off)."""
    from .launch_plan import _recorder_hook

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
            and (not calls or (_recording and _only_recorder(calls)))
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
                    if _recording:
                        rec = getattr(_state, "recorder", None)
                        if rec is not None:
                            rec.hits.append((self, entry, g, dev, args, largs))
                    entry.launch(
                        g[0], g[1], g[2], self._getstream(dev), entry.function, entry.coop, entry.pdl, None, None,
                        entry.packed, None, None, None, *largs, *entry.tail,
                    )  # fmt: skip
                    return
                if entry is None:  # uncacheable call (or key): JIT path every time
                    if _recording:
                        _note_jit(self.__name__)
                    self._check_kwargs(kwargs)
                    self.fn[grid](*args, **kwargs)
                    return
                self._miss(grid, args, kwargs)
                return
            self._miss(grid, args, kwargs)
            return
        if _recording:
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
        if _recording:
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

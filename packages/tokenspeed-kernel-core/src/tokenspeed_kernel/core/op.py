"""The public op object and the one dispatch path every call goes through.

An :class:`Op` holds everything about one public op:

- its contract (format roles, typed traits, size buckets: :class:`OpContract`);
- ``bind``: the argument checks, written with the public signature and
  docstring, which end in :func:`kernel_call`: the call's device, format
  signature, traits, sizes and the arguments the selected kernel receives;
- ``fake``: the outputs' shapes and dtypes for the same arguments (meta
  implementation: the torch custom op of :mod:`tokenspeed_kernel.compile`);
- ``reference``: the PyTorch reference implementation and what it supports
  (registered as ``reference.<op>``, the last resort);
- ``workload``: where its verify/bench cases, cost model and peers live
  (``"module:attribute"``, imported only by the tooling).

Calling the op validates (``bind``), selects (cached by signature, traits,
size buckets, device and overrides), and runs the kernel inside a profiling
scope when a profiler is on. Nothing on that path allocates, synchronises or
imports, so a dispatched call can be captured in a CUDA graph.

Validation can be memoised (``Op(memo_bind=True)``, :func:`_bind_memoised`): a call whose arguments have the
metadata of an earlier valid call (per tensor: type, shape, strides, dtype,
device; every other argument by type and value) reuses that call's selection key
and rebuilds the kernel's arguments from the new call's objects. The key comes from a
function generated per call pattern (positional count, keyword names) and argument
kinds: one guard chain, one flat tuple (:func:`_memo_key_function`); arguments of
other kinds take the generic description (:func:`_describe`). Only where the
checks read nothing but that metadata: never with a CPU tensor (whose values the
checks read), under ``TOKENSPEED_KERNEL_DEBUG=1``, or with an argument of another
kind (generators, MoE weights not validated yet), which runs ``bind`` every time. An
object that carries a ``__memo_key__`` other than None (an attention plan: the host
values its checks read; MoE weights once validated or converted: what their checks
read) is described by that key and handed to the kernel as the object of the new call.

Launch plans (a CUDA process with Triton, ``tokenspeed_kernel.launch``: "Launch plans"): a public call whose
metadata has a memo key (as above: every tensor on the device, every other argument a plain value) is
served by a :class:`PreparedCall` of that metadata from its second sighting on, keyed by the memo key, the
call's ``solution``/``override``, the open ``kernel_override`` blocks and the selection cache's generation
(``clear_selection_cache`` forgets them all). A prepared call records its kernel's launches and replays them
(``launch``'s module doc says what it checks and refuses); one that cannot be recorded calls the selected
kernel directly with the call's arguments. So a served call skips ``bind``, selection and the kernel's Python
wrapper. Not with a dispatch hook, a profiler, or ``TOKENSPEED_KERNEL_DEBUG=1`` (the plain path runs);
``TOKENSPEED_KERNEL_LAUNCH_PLANS=0`` turns it off. Once the key path served a call (without ``solution``/``override``),
the call pattern keeps a check of it (:func:`_hit_function`: torch's C ``TensorGuards`` check of the tensors, which
covers what the key describes of them, the other arguments' key parts by value, the selection context and
generation), and later calls try those checks before computing a key: a key costs a Python read of each tensor's
shape, strides, dtype and device, and a hash.

Hints (``Op(hints=(...))``): keyword arguments that carry host metadata a kernel
may use (an attention plan). ``bind`` passes one only when the caller gave it, and
the selected kernel receives it only when its signature names it: a kernel that
reads the same facts on the device needs none of it, and its result is the same.

Eager and captured calls (``selection``'s module doc): where selection picks one kernel for eager calls and
another for calls captured in a CUDA graph (``Selection.captured``; only for ops that are ``rerunnable``), the call
checks whether the current CUDA stream is being captured and runs the captured pick then; a prepared call holds a
second prepared call for it. A captured call must not be the captured pick's first run (cuBLAS creates its handle
then, Triton compiles a new specialisation: neither may happen inside a capture, and an engine's eager warm-up ran
the eager pick only). So the first eager call of a selection (plain path) and of each prepared call's metadata also
runs the captured pick once, before the eager pick, whose outputs are the call's. Calls whose selection does not
differ by mode never make the check.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import itertools
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from . import profiling
from . import recording as _recording
from . import selection as _selection
from .codegen import VALUE_TYPES, guarded_tuple_function, plain_value
from .contracts import OpContract, add_to_catalog, size_bucket
from .profiling import kernel_scope, profiler_active
from .selection import Target, select_for_device
from .selection import _context as _selection_context
from .settings import debug_checks_enabled

__all__ = ["Op", "NotPreparable", "PreparedCall", "Reference", "KernelCall", "kernel_call", "hinted_kwargs"]

#: What ``bind`` returns: (device, format signature, traits, sizes, kernel args, kernel kwargs).
KernelCall = tuple[torch.device, tuple[str, ...], Mapping[str, object], tuple[int, ...], tuple, dict]


def _never() -> bool:
    return False


#: captured picks the plain path ran once outside a capture (module doc, "Eager and captured calls"): id -> selection.
_WARMED: dict[int, Any] = {}


#: whether the current CUDA stream is being captured (without CUDA: never; a torch without CUDA raises instead).
_is_capturing: Callable[[], bool] = torch.cuda.is_current_stream_capturing if torch.cuda.is_available() else _never


def kernel_call(
    device: torch.device,
    signature: tuple[str, ...],
    traits: Mapping[str, object],
    sizes: tuple[int, ...],
    *args: Any,
    **kwargs: Any,
) -> KernelCall:
    """The end of an op's ``bind``: what selection sees and what the kernel receives.

    ``signature``: one format per role of the contract; ``traits``: the call's
    trait values (a dict in the contract's order, or ``(name, value)`` pairs);
    ``sizes``: one int per :class:`~tokenspeed_kernel.core.contracts.Size` of the
    contract, read from shapes (never from tensor values: no sync).
    """
    return device, signature, traits, sizes, args, kwargs


@dataclass(frozen=True)
class Reference:
    """An op's PyTorch reference: ``impl`` (``"module:function"``, the kernel
    convention) and the formats/traits it supports (``ANY`` for every value)."""

    impl: str
    formats: list[dict[str, Any]]
    traits: Mapping[str, object] = field(default_factory=dict)
    tags: tuple[str, ...] = ("deterministic",)


@dataclass(frozen=True, eq=False, kw_only=True)
class Op(OpContract):
    """A public op; calling it runs the selected kernel (see the module doc)."""

    bind: Callable[..., KernelCall]
    fake: Callable[..., Any]
    reference: Reference
    workload: str
    #: arguments the op writes in place (declared to torch.compile).
    mutates: tuple[str, ...] = ()
    #: an op that writes in place and also returns one new tensor (gdn_decode's output).
    mutating_result: bool = False
    #: running the selected kernel twice on the call's kernel arguments does nothing but rewrite the outputs (no
    #: argument written in place: an op that ``mutates`` is never rerunnable; random draws are made by ``bind``, not
    #: by the kernel: the sampler is rerunnable). Only then may selection pick another
    #: kernel for calls captured in a CUDA graph, which the op also runs once, outside the capture, the first time a
    #: call of that metadata runs eagerly (module doc, "Eager and captured calls").
    rerunnable: bool = True
    #: memoise validation by call metadata (module doc): for ops whose checks cost more than
    #: describing their arguments (bind -> memo hit on the 2-core machine, meta tensors, two runs: mm
    #: 5.4-5.6 -> 3.4-4.2 us, apply_rotary 5.2-6.2 -> 3.9, kvcache_store 5.6-6.4 -> 4.0-4.2,
    #: mha_decode_with_kvcache 9.6-12.9 -> 5.0-5.4; rmsnorm's 2.2-2.9 us bind is about even with its
    #: 2.5 us memo, moe_route's 1.3 us bind beats its 2.1-2.5 us memo).
    memo_bind: bool = False
    #: keyword arguments a kernel receives only if its signature names them (module doc).
    hints: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.mutates:
            object.__setattr__(self, "rerunnable", False)
        sig = inspect.signature(self.bind)
        params = list(sig.parameters.values())
        for name in ("solution", "override"):
            params.append(
                inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Target | None)
            )
        doc = inspect.getdoc(self.bind) or self.doc
        doc += (
            "\n\nEvery op also takes ``solution=`` / ``override=`` (keyword-only): force a solution "
            "or a kernel for this call (see ``tokenspeed_kernel.kernel_override``)."
        )
        for attr, value in (
            ("__signature__", sig.replace(parameters=params, return_annotation=inspect.Signature.empty)),
            ("__doc__", doc),
            ("__name__", self.name),
            ("__qualname__", self.name),
            ("__module__", self.bind.__module__),
        ):
            object.__setattr__(self, attr, value)
        object.__setattr__(self, "_public_calls", {})  # call metadata -> its prepared call (or _NO_CALL)
        object.__setattr__(self, "_public_seen", set())  # call metadata seen once
        object.__setattr__(self, "_public_misses", {})  # call pattern -> device calls without a key
        object.__setattr__(self, "_public_off", set())  # call patterns that stopped looking
        object.__setattr__(self, "_public_hits", {})  # call pattern -> its served calls' checks (_hit_function)
        add_to_catalog(self)

    def __repr__(self) -> str:
        return f"<tokenspeed_kernel op {self.name}>"

    def __call__(
        self, *args: Any, solution: Target | None = None, override: Target | None = None, **kwargs: Any
    ) -> Any:
        on = _public_plans[0]
        if on is None:
            on = _public_plans[0] = _recording.plans_enabled()  # (None until a launch path is loaded)
        if on and self._public_off and (len(args), *kwargs) in self._public_off:
            on = False
        if on and profiling.dispatch_hook is None and not profiler_active() and not debug_checks_enabled():
            flat = (*args, *kwargs.values())
            if solution is None and override is None:
                hit = self._public_hits.get((len(args), *kwargs) if kwargs else len(args))
                if hit is not None:
                    call = hit(*flat)
                    if call is not None:
                        return call._served(*flat)
            key = _memo_key(self, args, kwargs, flat)
            if key is _MISS:
                self._unserved(args, kwargs, flat)
            else:
                full = (key, solution, override, _selection_context.get(), _selection.generation)
                try:
                    call = self._public_calls.get(full)
                except TypeError:  # an unhashable target: the plain path names the problem
                    call = _NO_CALL
                if call is None:
                    self._public_misses.pop((len(args), *kwargs), None)
                    return self._sighted(full, args, kwargs, flat, solution, override)
                if call is not _NO_CALL:
                    if solution is None and override is None and _TensorGuards is not None:
                        self._remember(args, kwargs, flat, full, call)
                    return call._served(*flat)  # (its key matched the metadata the replay's guards would check)
        return self._dispatch(args, kwargs, solution, override)

    def _remember(self, args: tuple, kwargs: dict, flat: tuple, full: tuple, call: PreparedCall) -> None:
        """Let the next calls of this metadata find ``call`` without a key (module doc, "Launch plans": the served
        calls' checks, :func:`_hit_function`), unless an entry that these tensors pass already holds it."""
        global _TensorGuards
        pattern = (len(args), *kwargs) if kwargs else len(args)
        hit = self._public_hits.get(pattern)
        if hit is not None and call in hit.skip:
            return  # (a call of other kinds: known, so its kinds are not read again on every call)
        kinds = [_memo_kind(a) for a in flat]
        if hit is None:
            hit = _hit_function(kinds)
            if hit is None:
                return
            self._public_hits[pattern] = hit
        elif kinds != hit.kinds:
            if len(hit.skip) >= _MAX_HITS * 8:
                hit.skip.clear()
            hit.skip.add(call)  # (the function reads the positions of its first kinds)
            return
        tensors = tuple(a for a in flat if type(a) is _T or type(a) is _P)
        entries = hit.entries
        for entry in entries:
            if entry[4] is call and entry[0](*tensors):
                return  # (held, and it is these tensors' metadata the check misses: another reason, not a slot)
        try:
            check = _TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None).check
        except Exception:  # (a torch whose guard class changed: every call keeps the key path, and stops trying)
            _TensorGuards = None
            return
        entry = (check, hit.others(*flat), full[3], full[4], call)
        if len(entries) < _MAX_HITS:
            entries.append(entry)
        else:
            entries[hit.next % _MAX_HITS] = entry
            hit.next += 1

    def _unserved(self, args: tuple, kwargs: dict, flat: tuple) -> None:
        """A call whose metadata has no key. With an argument of another kind (MoE weights), after 8 such calls of one
        call pattern (positional count, keyword names) since its last newly seen metadata, calls of that pattern stop
        looking for a prepared call (the key costs 1-3 us for nothing). Calls with a CPU tensor are not counted: the
        same pattern on the device must still be served."""
        if any((type(a) is _T or type(a) is _P) and a.is_cpu for a in flat):
            return
        pattern = (len(args), *kwargs)
        misses = self._public_misses
        n = misses[pattern] = misses.get(pattern, 0) + 1
        if n >= 8:
            self._public_off.add(pattern)

    def _sighted(self, full: Any, args: tuple, kwargs: dict, flat: tuple, solution: Any, override: Any) -> Any:
        """A call of metadata not served yet (module doc, "Launch plans"): the first sighting runs plainly, the
        second prepares a call the next ones run (and whose launches it records)."""
        calls, seen = self._public_calls, self._public_seen
        if full not in seen:
            if len(seen) >= _MAX_MEMO:  # metadata that varies per call (token counts): start over
                seen.clear()
            seen.add(full)
            return self._dispatch(args, kwargs, solution, override)
        try:
            call = self.prepare(*args, solution=solution, override=override, **kwargs)
        except (NotPreparable, ValueError):  # (ValueError: one tensor passed twice)
            call = _NO_CALL
        if len(calls) >= _MAX_MEMO:
            calls.clear()
        calls[full] = call
        return self._dispatch(args, kwargs, solution, override) if call is _NO_CALL else call._served(*flat)

    def _dispatch(self, args: tuple, kwargs: dict, solution: Target | None, override: Target | None) -> Any:
        """Validate, select, call (the path of every call without a prepared one)."""
        if self.memo_bind:
            device, signature, traits, sizes, kargs, kkwargs = _bind_memoised(self, args, kwargs)
        else:
            device, signature, traits, sizes, kargs, kkwargs = self.bind(*args, **kwargs)
        sel = select_for_device(self.name, signature, traits, sizes, device, solution, override)
        if sel.captured is not None:
            if _is_capturing():
                sel = sel.captured
            elif id(sel.captured) not in _WARMED:
                _WARMED[id(sel.captured)] = sel.captured  # (kept: its id is never reused)
                warm = hinted_kwargs(self.hints, sel.captured.fn, kkwargs) if self.hints and kkwargs else kkwargs
                sel.captured.fn(*kargs, **warm)
        if self.hints and kkwargs:
            kkwargs = hinted_kwargs(self.hints, sel.fn, kkwargs)
        hook = profiling.dispatch_hook
        if hook is not None:
            hook(self.name, signature, traits, kargs, kkwargs)
        if profiler_active():
            with kernel_scope(self.name, sel.spec.name):
                return sel.fn(*kargs, **kkwargs)
        return sel.fn(*kargs, **kkwargs)

    def prepare(
        self, *args: Any, solution: Target | None = None, override: Target | None = None, **kwargs: Any
    ) -> PreparedCall:
        """Validate and select once for calls of these arguments' metadata; returns a :class:`PreparedCall`.

        Calling the result with arguments of the same metadata (tensors of the same shapes, strides,
        dtypes and device; the same other values; the same keywords) runs the kernel selected now,
        without checking or selecting again: an engine prepares once per step shape (or per layer) and
        calls many times, as FlashInfer's plan/run does. The caller owns that promise; with
        ``TOKENSPEED_KERNEL_DEBUG=1`` every call is checked against it, and a call whose metadata
        differs raises. Nothing runs now. An object of another kind (MoE weights) is passed by
        position too: a call may pass another one of the same kind and tensor metadata (another
        layer's weights). Values of CPU tensors are not checked again either.
        """
        return PreparedCall(self, args, kwargs, solution, override)

    def call_key(self, *args: Any, **kwargs: Any) -> tuple[tuple[str, ...], dict[str, object], dict[str, int]]:
        """What selection sees for a call: (format signature, complete traits, sizes by name).

        Runs the argument checks only (works on fake tensors); no kernel runs.
        """
        _, signature, traits, sizes, _, _ = self.bind(*args, **kwargs)
        full = self.normalize_traits(dict(traits))
        return tuple(signature), full, {s.name: int(n) for s, n in zip(self.sizes, sizes)}

    def selected_kernel(
        self, *args: Any, solution: Target | None = None, override: Target | None = None, **kwargs: Any
    ):
        """The :class:`~tokenspeed_kernel.core.selection.Selection` this call would run (nothing runs)."""
        device, signature, traits, sizes, _, _ = self.bind(*args, **kwargs)
        return select_for_device(self.name, signature, traits, sizes, device, solution, override)

    @property
    def cases(self) -> Any:
        """The op's verify/bench cases (:class:`tokenspeed_kernel.numerics.cases.OpCases`), imported on first use."""
        module, _, attr = self.workload.partition(":")
        return getattr(importlib.import_module(module), attr)

    def buckets(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """The size buckets of sizes given by name (every size of the contract)."""
        missing = [s.name for s in self.sizes if s.name not in sizes]
        unknown = sorted(set(sizes) - {s.name for s in self.sizes})
        if missing or unknown:
            raise ValueError(
                f"sizes: op {self.name!r} has sizes {[s.name for s in self.sizes]}; missing {missing}, unknown {unknown}"
            )
        return tuple(size_bucket(int(sizes[s.name])) for s in self.sizes)


#: per kernel function: the keyword names its signature takes (None: it takes ``**kwargs``).
_TAKES: dict[Any, frozenset[str] | None] = {}


def hinted_kwargs(hints: tuple[str, ...], fn: Callable[..., Any], kwargs: dict) -> dict:
    """``kwargs`` without the hints ``fn``'s signature does not name (module doc); removes them in place
    (``kwargs`` is the call's own dict: bind and the memo build one per call)."""
    takes = _TAKES.get(fn, _MISS)
    if takes is _MISS:
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # a builtin without a signature: it cannot name a hint
            params = {}
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        takes = _TAKES[fn] = None if var_kw else frozenset(params)
    if takes is not None:
        for h in hints:
            if h in kwargs and h not in takes:
                del kwargs[h]
    return kwargs


# -- the memo of validated call metadata ----------------------------------------------------------

_T = torch.Tensor
_P = torch.nn.Parameter
#: whether public calls are served by prepared calls with launch plans (decided at the first call).
_public_plans: list[bool | None] = [None]
#: a call metadata that cannot be prepared: the plain path serves it.
_NO_CALL = object()
_MISS = object()
_MAX_MEMO = 4096


def _describe(a: Any) -> Any:
    """An argument's part of the memo key, or ``_MISS`` when the call cannot be memoised."""
    t = type(a)
    if t is _T or t is _P:
        if a.is_cpu:
            return _MISS
        return (a.shape, a.stride(), a.dtype, a.device)
    if t in VALUE_TYPES:
        return (t, a)
    if t is tuple and _all_ints(a):
        return (t, a)
    key = getattr(a, "__memo_key__", None)
    if key is not None:
        return (t, key)  # what the checks read of it (an attention plan's lengths)
    if _plain_dataclass(a):
        return (t, a)  # a frozen dataclass of plain values (MoEActivation, ...)
    return _MISS


def _plain_dataclass(a: Any) -> bool:
    """A frozen dataclass instance of plain values (:func:`~tokenspeed_kernel.core.codegen.plain_value`: hashable
    by value; a ``MoEPlan`` holds its ``MoEActivation``)."""
    return dataclasses.is_dataclass(a) and not isinstance(a, type) and plain_value(a)


def _memo_kind(a: Any) -> Any:
    """What a generated memo key function guards a position on: the argument's kind, or None (no function)."""
    t = type(a)
    if t is _T or t is _P:
        return "tensor"
    if t in VALUE_TYPES:
        return t
    if t is tuple and _all_ints(a):
        return "ints"
    if getattr(a, "__memo_key__", None) is not None:
        return ("memo_key", t)
    if _plain_dataclass(a):
        return ("dataclass", t)
    return None


def _memo_key_function(kinds: list[Any]) -> Any:
    """``key(*flat)`` for a call's arguments (positional, then keyword values) of these kinds, or None when
    one differs: the same facts as :func:`_describe` gives, in one flat tuple behind one guard chain."""
    guards, parts, ns = _key_pieces(kinds)
    return guarded_tuple_function(len(kinds), guards, parts, ns, "memo key")


def _key_pieces(kinds: list[Any], tensors: bool = True) -> tuple[list[str], list[str], dict[str, Any]]:
    """The guards and key parts of positions of these kinds (``a0``, ``a1``, ...), and the names they use;
    without ``tensors``, the tensor positions are left out (a ``TensorGuards`` check reads them)."""
    guards, parts, ns = [], [str(next(_memo_tags))], {"_T": _T, "_P": _P, "_ints": _all_ints}
    for i, kind in enumerate(kinds):
        a = f"a{i}"
        if kind == "tensor":
            if tensors:
                guards.append(f"(type({a}) is _T or type({a}) is _P) and not {a}.is_cpu")
                parts += [f"{a}.shape", f"{a}.stride()", f"{a}.dtype", f"{a}.device"]
        elif kind == "ints":
            guards.append(f"type({a}) is tuple and _ints({a})")
            parts.append(a)
        elif kind is type(None):
            guards.append(f"{a} is None")
        elif isinstance(kind, type):  # a value type: the guard fixes the type, the key holds the value
            ns[f"_t{i}"] = kind
            guards.append(f"type({a}) is _t{i}")
            parts.append(a)
        else:  # ("memo_key", type) or ("dataclass", type)
            ns[f"_t{i}"] = kind[1]
            # (an object whose key is None has not been checked yet: MoEWeights before their first validation)
            guards.append(f"type({a}) is _t{i} and {a}.__memo_key__ is not None" if kind[0] == "memo_key"
                          else f"type({a}) is _t{i}")  # fmt: skip
            parts.append(f"{a}.__memo_key__" if kind[0] == "memo_key" else a)
    if not tensors:
        parts = parts[1:]  # (the tag tells generated key functions apart; entries compare within one function)
    return guards, parts, ns


def _hit_function(kinds: list[Any]) -> Any:
    """``hit(*flat)``: the served call of an entry whose metadata the call has, or None; None when a position's
    kind has no memo key (:func:`_memo_kind`). One function per call pattern, for the argument kinds of its first
    served call (calls of other kinds take the key path). An entry (``hit.entries``, at most :data:`_MAX_HITS`,
    replaced in turn) holds a ``TensorGuards`` check of the tensor arguments (torch's C check of Dynamo's guards:
    exact type, distinct objects, dispatch keys, dtype, device, requires_grad, sizes and strides: at least what the
    memo key describes), the other arguments' key parts (``hit.others(*flat)``), the selection context and
    generation of the full key, and the call. So a hit is a call the key path would serve."""
    if None in kinds:
        return None
    guards, parts, ns = _key_pieces(kinds, tensors=False)
    tensors = ", ".join(f"a{i}" for i, k in enumerate(kinds) if k == "tensor")
    names = ", ".join(f"a{i}" for i in range(len(kinds)))
    others = f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    src = (
        f"def hit({names}):\n"
        f"    if not ({' and '.join(guards) or 'True'}):\n"
        f"        return None\n"
        f"    o, c, g = {others}, _ctx(), _sel.generation\n"
        f"    for check, v, vc, vg, call in _entries:\n"
        f"        if v == o and vc == c and vg == g and check({tensors}):\n"
        f"            return call\n"
        f"    return None\n"
        f"def others({names}):\n"
        f"    return {others}\n"
    )
    ns.update(_ctx=_selection_context.get, _sel=_selection, _entries=[])
    exec(compile(src, f"<tokenspeed_kernel served calls {len(kinds)} args>", "exec"), ns)
    hit = ns["hit"]
    hit.entries, hit.others, hit.kinds, hit.next, hit.__source__ = ns["_entries"], ns["others"], kinds, 0, src
    hit.skip = set()  # served calls of other kinds (``Op._remember``)
    return hit


#: entries of a call pattern's :func:`_hit_function` (the GPT-OSS decode step calls an op with two metadata).
_MAX_HITS = 8

try:
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # (a torch without it: every served call takes the key path)
    _TensorGuards = None


def _all_ints(a: tuple) -> bool:
    return all(type(x) is int for x in a)


_memo_tags = itertools.count()
#: generated memo key functions per call pattern (argument kinds that vary: None or a tensor).
_MAX_MEMO_FUNCTIONS = 4


def _memo_key(op: Op, args: tuple, kwargs: dict, flat: tuple) -> Any:
    """The memo key of a call, or ``_MISS``: a generated function's flat key when one of the call pattern's
    (positional count, keyword names) guards holds, else the tuple of :func:`_describe` per argument."""
    keys = op.__dict__.get("_memo_keys")
    if keys is None:
        keys = {}
        object.__setattr__(op, "_memo_keys", keys)
    pattern = (len(args), *kwargs)
    fns = keys.get(pattern)
    if fns is None:
        fns = keys[pattern] = []
    for fn in fns:
        key = fn(*flat)
        if key is not None:
            return key
    if len(fns) < _MAX_MEMO_FUNCTIONS:
        kinds = [_memo_kind(a) for a in flat]
        if None not in kinds:
            fn = _memo_key_function(kinds)
            key = fn(*flat)
            if key is not None:  # (a CPU tensor fails its own guard: it is never served)
                fns.append(fn)
                return key
    parts = [_describe(a) for a in args]
    for name in kwargs:
        parts.append(name)
        parts.append(_describe(kwargs[name]))
    return _MISS if _MISS in parts else tuple(parts)


def _bind_memoised(op: Op, args: tuple, kwargs: dict) -> KernelCall:
    """``op.bind(*args, **kwargs)``, or its memoised result for a call of the same metadata (module doc)."""
    memo = op.__dict__.get("_memo")
    if memo is None:
        memo = {}
        object.__setattr__(op, "_memo", memo)
    if debug_checks_enabled():
        return op.bind(*args, **kwargs)
    flat = (*args, *kwargs.values())
    key = _memo_key(op, args, kwargs, flat)
    if key is _MISS:
        return op.bind(*args, **kwargs)
    entry = memo.get(key)
    if entry is not None:
        device, signature, traits, sizes, get_args, names, get_kwargs, consts = entry
        ext = (*flat, *consts) if consts else flat
        return device, signature, traits, sizes, get_args(ext), dict(zip(names, get_kwargs(ext)))
    result = op.bind(*args, **kwargs)
    device, signature, traits, sizes, kargs, kkwargs = result
    rebuild = None if _aliased(flat) else _rebuild(flat, kargs, kkwargs)
    if rebuild is not None:
        if len(memo) >= _MAX_MEMO:  # shapes that vary per call (token counts): start over
            memo.clear()
        memo[key] = (device, signature, traits, sizes, *rebuild)
    return result


def _aliased(flat: tuple) -> bool:
    """One tensor passed twice: a rebuild by identity could not tell the two places apart."""
    tensors = [a for a in flat if type(a) is _T or type(a) is _P]
    return len({id(a) for a in tensors}) != len(tensors)


def _recipes(flat: tuple, kargs: tuple, kkwargs: dict) -> tuple | None:
    """Where a later call's kernel arguments come from: ``(arg indices, keyword names, keyword indices,
    consts)``, indices into ``(*flat, *consts)`` (:func:`_recipe`); None when one cannot be rebuilt."""
    consts: list[Any] = []
    recipe_args = [_recipe(v, flat, consts) for v in kargs]
    recipe_kwargs = [_recipe(v, flat, consts) for v in kkwargs.values()]
    if None in recipe_args or None in recipe_kwargs:
        return None
    return recipe_args, tuple(kkwargs), recipe_kwargs, tuple(consts)


def _rebuild(flat: tuple, kargs: tuple, kkwargs: dict) -> tuple | None:
    """How a later call's kernel arguments come from its own arguments ``flat``: ``(get_args, keyword
    names, get_kwargs, consts)``, each getter reading ``(*flat, *consts)``; None when one cannot be rebuilt."""
    found = _recipes(flat, kargs, kkwargs)
    if found is None:
        return None
    recipe_args, names, recipe_kwargs, consts = found
    return _getter(recipe_args), names, _getter(recipe_kwargs), consts


def _runner(fn: Callable[..., Any], n_flat: int, recipes: tuple) -> Callable[..., Any]:
    """``run(a0, ..., a{n_flat-1})``: ``fn`` called with the kernel arguments the recipes name, written out (a
    generated function: no tuple of the call's arguments, no getter, no keyword dict built per call)."""
    recipe_args, names, recipe_kwargs, consts = recipes
    ns: dict[str, Any] = {"_fn": fn}

    def expr(i: int) -> str:
        if i < n_flat:
            return f"a{i}"
        ns[f"_c{i}"] = consts[i - n_flat]
        return f"_c{i}"

    params = ", ".join(f"a{i}" for i in range(n_flat))
    call = [expr(i) for i in recipe_args] + [f"{k}={expr(i)}" for k, i in zip(names, recipe_kwargs)]
    src = f"def run({params}):\n    return _fn({', '.join(call)})\n"
    exec(compile(src, f"<tokenspeed_kernel prepared call {n_flat} args>", "exec"), ns)
    return ns["run"]


def _getter(indices: list[int]) -> Callable[[tuple], tuple]:
    """``ext -> tuple(ext[i] for i in indices)``, as one C call."""
    if not indices:
        return lambda ext: ()
    if len(indices) == 1:
        i = indices[0]
        return lambda ext: (ext[i],)
    return operator.itemgetter(*indices)


def _recipe(v: Any, flat: tuple, consts: list) -> int | None:
    """Where a kernel argument comes from in ``(*flat, *consts)``: the index of an object of the call (by
    identity), or of a plain value bind computed (a function of the key, appended to ``consts``); None when
    neither."""
    for i, a in enumerate(flat):
        if v is a and type(a) not in VALUE_TYPES:
            return i
    if type(v) in VALUE_TYPES or (type(v) is tuple and _all_ints(v)) or _plain_dataclass(v):
        consts.append(v)
        return len(flat) + len(consts) - 1
    return None


class NotPreparable(TypeError):
    """``Op.prepare`` of an op whose ``bind`` builds kernel arguments per call (the sampler's ``[B]`` constants)."""


class PreparedCall:
    """One op call validated and selected once (:meth:`Op.prepare`): calling it runs the kernel directly.

    ``kernel``: the selected kernel's name. A call must pass as many positional arguments and the same
    keyword names as :meth:`Op.prepare` got (``TypeError`` otherwise); the kernel receives the call's own
    objects where ``bind`` passed the prepared call's (by position), and the plain values ``bind`` computed.
    Where selection picks another kernel for calls captured in a CUDA graph, ``captured_call`` is the prepared
    call of that pick, which calls made while the current stream is captured run (the module doc).
    """

    __slots__ = (
        "_call",
        "_consts",
        "_eager_run",
        "_eager_served",
        "_fn",
        "_get_args",
        "_get_kwargs",
        "_key",
        "_kw_names",
        "_n",
        "_names",
        "_plain",
        "_run",
        "_served",
        "_tries",
        "_warm",
        "captured_call",
        "kernel",
        "launch_plan",
        "op",
        "plan_status",
    )  # fmt: skip

    def __init__(
        self,
        op: Op,
        args: tuple,
        kwargs: dict,
        solution: Target | None,
        override: Target | None,
        *,
        captured: bool = False,
    ) -> None:
        flat = (*args, *kwargs.values())
        device, signature, traits, sizes, kargs, kkwargs = op.bind(*args, **kwargs)
        sel = select_for_device(op.name, signature, traits, sizes, device, solution, override)
        self.captured_call = None
        if captured:
            sel = sel.for_graph
        elif sel.captured is not None:
            self.captured_call = PreparedCall(op, args, kwargs, solution, override, captured=True)
            self._run, self._served = self._routed_run, self._routed_served
        self._warm = self.captured_call is not None  # (its first eager call also runs the captured pick)
        if op.hints and kkwargs:
            kkwargs = hinted_kwargs(op.hints, sel.fn, dict(kkwargs))
        if _aliased(flat):
            raise ValueError(f"{op.name}.prepare: one tensor passed twice; pass distinct tensors (or call the op)")
        recipes = _recipes(flat, kargs, kkwargs)
        if recipes is None or not all(k.isidentifier() for k in recipes[1]):
            raise NotPreparable(f"{op.name}.prepare: its checks build kernel arguments a prepared call cannot rebuild")
        self.op, self.kernel, self._fn = op, sel.spec.name, sel.fn
        self._n, self._kw_names = len(args), tuple(kwargs)
        arg_i, self._names, kw_i, self._consts = recipes
        self._get_args, self._get_kwargs = _getter(arg_i), _getter(kw_i)
        self._plain = _runner(sel.fn, len(flat), recipes)
        self._paths(self._plain)
        self._key = (device, tuple(signature), _trait_items(traits), tuple(sizes))
        self._call = (signature, traits)
        self.launch_plan = None
        self._tries = 0
        if device.type == "cuda" and _recording.plans_enabled():
            self._paths(self._record_run)
            self.plan_status = "not recorded yet (from the second call)"
        else:
            self.plan_status = "off (TOKENSPEED_KERNEL_LAUNCH_PLANS=0, TOKENSPEED_KERNEL_LAUNCH=jit, no CUDA, or ROCm)"

    def _record_run(self, *flat: Any) -> Any:
        """The call while it has no launch plan: the first runs plainly (it compiles and fills the launch caches);
        the next ones record (``tokenspeed_kernel.launch``, "Launch plans") until one records or three could not."""
        n = self._tries = self._tries + 1
        if n == 1 or _is_capturing():
            return self._plain(*flat)
        result, plan, why = _recording.record(self._plain, flat)
        if plan is not None:
            self.launch_plan, self.plan_status = plan, "recorded"
            self._paths(plan.replay, plan.replay_served)
        else:
            self.plan_status = f"not recordable: {why}"
            if n >= 4:
                self._paths(self._plain)
        return result

    def _paths(self, run: Callable[..., Any], served: Callable[..., Any] | None = None) -> None:
        """Set the paths of eager calls (behind the routers when the captured pick differs)."""
        if self.captured_call is None:
            self._run, self._served = run, served or run
        else:
            self._eager_run, self._eager_served = run, served or run

    def _routed_run(self, *flat: Any) -> Any:
        if _is_capturing():
            return self.captured_call._run(*flat)  # type: ignore[union-attr]
        if self._warm:
            self._warm_captured(flat)
        return self._eager_run(*flat)

    def _routed_served(self, *flat: Any) -> Any:
        if _is_capturing():
            return self.captured_call._served(*flat)  # type: ignore[union-attr]
        if self._warm:
            self._warm_captured(flat)
        return self._eager_served(*flat)

    def _warm_captured(self, flat: tuple) -> None:
        """The first eager call runs the captured pick once too, outside any capture (the module doc)."""
        self._warm = False
        self.captured_call._plain(*flat)  # type: ignore[union-attr]

    def __repr__(self) -> str:
        also = f" ({self.captured_call.kernel} when captured)" if self.captured_call is not None else ""
        return f"<tokenspeed_kernel prepared {self.op.name} -> {self.kernel}{also}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) != self._n or tuple(kwargs) != self._kw_names:
            raise TypeError(
                f"{self.op.name} (prepared): expected {self._n} positional arguments and keywords "
                f"{list(self._kw_names)}, got {len(args)} and {list(kwargs)}"
            )
        if self.captured_call is not None and _is_capturing():
            return self.captured_call(*args, **kwargs)
        if self._warm:
            self._warm_captured((*args, *kwargs.values()))
        if profiling.dispatch_hook is None and not profiler_active() and not debug_checks_enabled():
            return self._run(*args, *kwargs.values())
        if debug_checks_enabled():
            self._check(args, kwargs)
        ext = (*args, *kwargs.values(), *self._consts)
        kargs = self._get_args(ext)
        kkwargs = dict(zip(self._names, self._get_kwargs(ext))) if self._names else {}
        hook = profiling.dispatch_hook
        if hook is not None:
            hook(self.op.name, self._call[0], self._call[1], kargs, kkwargs)
        if profiler_active():
            with kernel_scope(self.op.name, self.kernel):
                return self._fn(*kargs, **kkwargs)
        return self._fn(*kargs, **kkwargs)

    def _check(self, args: tuple, kwargs: dict) -> None:
        """Debug mode: the call's own checks, and the metadata the prepared call stands for."""
        device, signature, traits, sizes, _, _ = self.op.bind(*args, **kwargs)
        got = (device, tuple(signature), _trait_items(traits), tuple(sizes))
        if got != self._key:
            raise ValueError(f"{self.op.name} (prepared for {self._key}): this call is {got}; prepare it anew")


def _trait_items(traits: Mapping[str, object] | tuple) -> tuple:
    return traits if type(traits) is tuple else tuple(traits.items())

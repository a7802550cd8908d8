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
and rebuilds the kernel's arguments from the new call's objects. Only where the
checks read nothing but that metadata: never with a CPU tensor (whose values the
checks read), under ``TOKENSPEED_KERNEL_DEBUG=1``, or with an argument of another
kind (MoE weights, generators), which runs ``bind`` every time. An object that
carries a ``__memo_key__`` (an attention plan: the host values its checks read) is
described by that key and handed to the kernel as the object of the new call.

Hints (``Op(hints=(...))``): keyword arguments that carry host metadata a kernel
may use (an attention plan). ``bind`` passes one only when the caller gave it, and
the selected kernel receives it only when its signature names it: a kernel that
reads the same facts on the device needs none of it, and its result is the same.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from . import profiling
from .contracts import OpContract, add_to_catalog, size_bucket
from .profiling import kernel_scope, profiler_active
from .selection import Target, select_for_device
from .settings import debug_checks_enabled

__all__ = ["Op", "Reference", "KernelCall", "kernel_call", "hinted_kwargs"]

#: What ``bind`` returns: (device, format signature, traits, sizes, kernel args, kernel kwargs).
KernelCall = tuple[torch.device, tuple[str, ...], Mapping[str, object], tuple[int, ...], tuple, dict]


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
    #: memoise validation by call metadata (module doc): for ops whose checks cost more than
    #: describing their arguments (measured on the 2-core machine: mm 5.3 -> 3.9 us, apply_rotary
    #: 8.1 -> 5.7, mha_decode_with_kvcache 14.0 -> 8.6; rmsnorm's 2.3 us bind would get slower).
    memo_bind: bool = False
    #: keyword arguments a kernel receives only if its signature names them (module doc).
    hints: tuple[str, ...] = ()

    def __post_init__(self) -> None:
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
        add_to_catalog(self)

    def __repr__(self) -> str:
        return f"<tokenspeed_kernel op {self.name}>"

    def __call__(
        self, *args: Any, solution: Target | None = None, override: Target | None = None, **kwargs: Any
    ) -> Any:
        if self.memo_bind:
            device, signature, traits, sizes, kargs, kkwargs = _bind_memoised(self, args, kwargs)
        else:
            device, signature, traits, sizes, kargs, kkwargs = self.bind(*args, **kwargs)
        sel = select_for_device(self.name, signature, traits, sizes, device, solution, override)
        if self.hints and kkwargs:
            kkwargs = hinted_kwargs(self.hints, sel.fn, kkwargs)
        hook = profiling.dispatch_hook
        if hook is not None:
            hook(self.name, signature, traits, kargs, kkwargs)
        if profiler_active():
            with kernel_scope(self.name, sel.spec.name):
                return sel.fn(*kargs, **kkwargs)
        return sel.fn(*kargs, **kkwargs)

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
#: types passed by value into a memo key (hashable, compared by value, never holding tensors).
_VALUE_TYPES = frozenset({type(None), bool, int, float, str, torch.dtype, torch.device})
_MISS = object()
_MAX_MEMO = 4096


def _describe(a: Any) -> Any:
    """An argument's part of the memo key, or ``_MISS`` when the call cannot be memoised."""
    t = type(a)
    if t is _T or t is _P:
        if a.is_cpu:
            return _MISS
        return (a.shape, a.stride(), a.dtype, a.device)
    if t in _VALUE_TYPES:
        return (t, a)
    if t is tuple and all(type(x) is int for x in a):
        return (t, a)
    key = getattr(a, "__memo_key__", None)
    if key is not None:
        return (t, key)  # what the checks read of it (an attention plan's lengths)
    if _plain_dataclass(a):
        return (t, a)  # a frozen dataclass of plain values (MoEActivation, ...)
    return _MISS


def _plain_dataclass(a: Any) -> bool:
    """A frozen dataclass instance whose fields are all plain values (hashable by value)."""
    if isinstance(a, type) or not dataclasses.is_dataclass(a) or not type(a).__dataclass_params__.frozen:
        return False
    return all(type(getattr(a, f.name)) in _VALUE_TYPES for f in dataclasses.fields(a))


def _bind_memoised(op: Op, args: tuple, kwargs: dict) -> KernelCall:
    """``op.bind(*args, **kwargs)``, or its memoised result for a call of the same metadata (module doc)."""
    memo = op.__dict__.get("_memo")
    if memo is None:
        memo = {}
        object.__setattr__(op, "_memo", memo)
    parts = [_describe(a) for a in args]
    for name in kwargs:
        parts.append(name)
        parts.append(_describe(kwargs[name]))
    if _MISS in parts or debug_checks_enabled():
        return op.bind(*args, **kwargs)
    key = tuple(parts)
    entry = memo.get(key)
    if entry is not None:
        device, signature, traits, sizes, recipe_args, recipe_kwargs = entry
        flat = (*args, *kwargs.values())
        return (
            device, signature, traits, sizes,
            tuple(flat[i] if i >= 0 else c for i, c in recipe_args),
            {k: (flat[i] if i >= 0 else c) for k, (i, c) in recipe_kwargs.items()},
        )  # fmt: skip
    result = op.bind(*args, **kwargs)
    device, signature, traits, sizes, kargs, kkwargs = result
    flat = (*args, *kwargs.values())
    tensors = [a for a in flat if type(a) is _T or type(a) is _P]
    if len({id(a) for a in tensors}) != len(tensors):
        return result  # one tensor passed twice: a recipe by identity could not tell the two places apart
    recipe_args = [_recipe(v, flat) for v in kargs]
    recipe_kwargs = {k: _recipe(v, flat) for k, v in kkwargs.items()}
    if all(r is not None for r in recipe_args) and all(r is not None for r in recipe_kwargs.values()):
        if len(memo) >= _MAX_MEMO:  # shapes that vary per call (token counts): start over
            memo.clear()
        memo[key] = (device, signature, traits, sizes, tuple(recipe_args), recipe_kwargs)
    return result


def _recipe(v: Any, flat: tuple) -> tuple[int, Any] | None:
    """How a kernel argument is rebuilt: ``(index, None)`` for an object of the call (by identity),
    ``(-1, v)`` for a plain value bind computed (a function of the key), None when neither."""
    for i, a in enumerate(flat):
        if v is a and type(a) not in _VALUE_TYPES:
            return (i, None)
    if type(v) in _VALUE_TYPES or (type(v) is tuple and all(type(x) is int for x in v)):
        return (-1, v)
    if _plain_dataclass(v):
        return (-1, v)
    return None

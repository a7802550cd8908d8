"""``torch.compile`` support: every public op as a torch custom op (opt-in).

Model code that is to be compiled calls the ops through :data:`ops` instead of
``tokenspeed_kernel`` itself; the signatures are the public ops' (without ``out=``)::

    from tokenspeed_kernel.compile import ops   # registers the custom ops (once)

    @torch.compile(fullgraph=True)
    def block(x, w, ...):
        h = ops.rmsnorm(x, w, 1e-5)
        return ops.mm(h, w_up)

The custom ops are made from the op objects (:class:`tokenspeed_kernel.core.op.Op`),
so every op is covered by construction. Each ``torch.ops.tokenspeed_kernel.<op>``
has a schema derived from the op's argument annotations: tensors, numbers,
strings and dtypes cross as they are; typed argument objects (``MoEWeights``,
``MoEActivation``, ``MoEPlan``, ``AttentionPlan``) cross as their fields; ``int | Tensor`` arguments
as two optional slots; ``solution=``/``override=`` as one string (alternatives
joined by ``|``); results as a list of tensors. The fake implementation is the
op's ``fake``; the real one rebuilds the arguments and calls the op, so argument
checks and selection run once, inside the custom op, exactly as in eager mode.
Dynamo records one opaque node per op: no graph break, no tracing into checks or
selection.

When selection happens: when the compiled graph *executes*, inside the custom op;
later calls are a dictionary hit in the selection cache. So nothing about the
kernel choice is baked into the compiled artifact: an override active when the
compiled function runs applies, and changing it needs no recompile. Under a CUDA
graph the kernel selected while recording is the one replayed.

Nothing is registered when ``tokenspeed_kernel`` is imported: the eager hot path
never goes through this module. :func:`register_custom_ops` (idempotent; also run
on the first access to :data:`ops`) defines the ops.

Not covered: ``out=`` (the custom ops are functional; Inductor plans the buffers),
autograd (inference ops: compile under ``torch.no_grad()``), a ``generator=``
(pass ``uniform=`` to ``top_k_top_p_sample``). Ops that write in place
(``kvcache_store``) are declared as mutating those arguments.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .core.contracts import all_contracts
from .core.op import Op
from .core.selection import Target
from .ops import moe as _moe

__all__ = ["NAMESPACE", "OP_NAMES", "register_custom_ops", "ops", "schema_args", "schema_of"]  # noqa: F822

#: The ``torch.library`` namespace: the ops are ``torch.ops.tokenspeed_kernel.<name>``.
NAMESPACE = "tokenspeed_kernel"

#: Arguments the custom ops do not take: ``out`` (functional ops), the overrides (their own slots).
_NOT_IN_SCHEMA = ("out",)


# ----------------------------------------------------------------------------- codecs
# A codec maps one public argument to schema slots and back.


class _Codec:
    def schema(self, name: str) -> list[str]:  # "Type name" entries
        raise NotImplementedError

    def encode(self, value: Any, name: str) -> tuple:
        raise NotImplementedError

    def decode(self, it: Iterator[Any]) -> Any:
        raise NotImplementedError

    def absent(self, name: str) -> tuple:
        """The slots of a field of an absent (None) optional dataclass."""
        return tuple(None for _ in self.schema(name))


class _Plain(_Codec):
    def __init__(self, type_text: str) -> None:
        self.type_text = type_text

    def schema(self, name: str) -> list[str]:
        return [f"{self.type_text} {name}"]

    def encode(self, value: Any, name: str) -> tuple:
        return (value,)

    def decode(self, it: Iterator[Any]) -> Any:
        return next(it)


class _TensorOrNumber(_Codec):
    """``int | Tensor`` / ``float | Tensor``: a tensor slot and a number slot, one of them None."""

    def __init__(self, number: str) -> None:
        self.number = number

    def schema(self, name: str) -> list[str]:
        return [f"Tensor? {name}_tensor", f"{self.number}? {name}_number"]

    def encode(self, value: Any, name: str) -> tuple:
        return (value, None) if isinstance(value, torch.Tensor) else (None, value)

    def decode(self, it: Iterator[Any]) -> Any:
        t, n = next(it), next(it)
        return t if t is not None else n


class _Absent(_Codec):
    """An argument that cannot cross a schema (a ``torch.Generator``): must be None under compile."""

    def schema(self, name: str) -> list[str]:
        return []

    def encode(self, value: Any, name: str) -> tuple:
        if value is not None:
            raise TypeError(f"{name}: cannot be passed through tokenspeed_kernel.compile.ops (pass None)")
        return ()

    def decode(self, it: Iterator[Any]) -> Any:
        return None


class _Opaque(_Codec):
    """A tuple of tensors and host numbers (``MoEWeights.extra``): three typed lists and one letter per item."""

    def schema(self, name: str) -> list[str]:
        return [f"Tensor[] {name}_tensors", f"int[] {name}_ints", f"float[] {name}_floats", f"str {name}_kinds"]

    def encode(self, value: Any, name: str) -> tuple:
        tensors: list[torch.Tensor] = []
        ints: list[int] = []
        floats: list[float] = []
        kinds = ""
        for item in value:
            if isinstance(item, torch.Tensor):
                tensors.append(item)
                kinds += "t"
            elif isinstance(item, bool):
                ints.append(int(item))
                kinds += "b"
            elif isinstance(item, int):
                ints.append(item)
                kinds += "i"
            elif isinstance(item, float):
                floats.append(item)
                kinds += "f"
            else:
                raise TypeError(
                    f"{name}: a {type(item).__name__} cannot cross the custom-op boundary "
                    "(supported: tensors, ints, bools, floats)"
                )
        return tensors, ints, floats, kinds

    def absent(self, name: str) -> tuple:
        return [], [], [], ""  # list slots are not nullable: empty ones

    def decode(self, it: Iterator[Any]) -> Any:
        tensors, ints, floats, kinds = next(it), next(it), next(it), next(it)
        lists = {"t": iter(tensors), "i": iter(ints), "b": iter(ints), "f": iter(floats)}
        return tuple(bool(next(lists[c])) if c == "b" else next(lists[c]) for c in kinds)


class _Dataclass(_Codec):
    """A typed argument object crossing as its fields (``optional``: plus a presence flag)."""

    def __init__(self, cls: type, optional: bool) -> None:
        self.cls = cls
        self.optional = optional
        hints = typing.get_type_hints(cls)
        self.fields = [(f.name, _codec(hints[f.name], optional=optional)) for f in dataclasses.fields(cls)]

    def schema(self, name: str) -> list[str]:
        out = [f"bool {name}_present"] if self.optional else []
        for field_name, codec in self.fields:
            out += codec.schema(f"{name}_{field_name}")
        return out

    def encode(self, value: Any, name: str) -> tuple:
        if value is None:
            if not self.optional:
                raise TypeError(f"{name}: expected {self.cls.__name__}, got None")
            return (False, *(x for n, c in self.fields for x in c.absent(f"{name}_{n}")))
        if not isinstance(value, self.cls):
            raise TypeError(f"{name}: expected {self.cls.__name__}, got {type(value).__name__}")
        out: tuple = (True,) if self.optional else ()
        for field_name, codec in self.fields:
            out += codec.encode(getattr(value, field_name), f"{name}.{field_name}")
        return out

    def decode(self, it: Iterator[Any]) -> Any:
        if self.optional and not next(it):
            for _, codec in self.fields:
                codec.decode(it)
            return None
        return _build(self.cls, tuple((n, c.decode(it)) for n, c in self.fields))


@functools.lru_cache(maxsize=256)
def _build_cached(cls: type, items: tuple) -> Any:
    return cls(**dict(items))


def _build(cls: type, items: tuple) -> Any:
    # A model has one or two activations: rebuilding (and re-validating) one per call costs ~2 us.
    if all(not isinstance(v, torch.Tensor) for _, v in items):
        try:
            return _build_cached(cls, items)
        except TypeError:  # unhashable field values
            pass
    return cls(**dict(items))


_SCALARS = {int: "SymInt", float: "float", bool: "bool", str: "str", torch.dtype: "ScalarType"}


def _codec(hint: Any, *, optional: bool = False) -> _Codec:
    """The codec of one annotation (``optional``: every slot may be None, for an absent dataclass)."""
    args = typing.get_args(hint)
    is_union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    members = [a for a in args if a is not type(None)] if is_union else [hint]
    nullable = optional or (is_union and type(None) in args)
    q = "?" if nullable else ""
    if members == [torch.Tensor]:
        return _Plain(f"Tensor{q}")
    if len(members) == 2 and torch.Tensor in members:
        number = next(m for m in members if m is not torch.Tensor)
        return _TensorOrNumber(_SCALARS[number])
    if len(members) == 1:
        m = members[0]
        if m in _SCALARS:
            return _Plain(f"{_SCALARS[m]}{q}")
        if m is tuple or typing.get_origin(m) is tuple:
            return _Opaque()
        if m is torch.Generator:
            return _Absent()
        if dataclasses.is_dataclass(m):
            return _Dataclass(m, optional=nullable)
    raise TypeError(f"no custom-op schema for annotation {hint!r}")


# ----------------------------------------------------------------------------- one custom op per op


@dataclasses.dataclass
class _Bridge:
    op: Op
    params: list[inspect.Parameter]
    codecs: list[_Codec]

    def __post_init__(self) -> None:
        # Plain tuples for the traced wrapper (Dynamo follows these without inspect objects).
        self.names = tuple(p.name for p in self.params)
        self.defaults = tuple(p.default for p in self.params)

    @functools.cached_property
    def schema(self) -> str:
        mutates = set(self.op.mutates)
        entries = []
        for i, (p, c) in enumerate(zip(self.params, self.codecs)):
            for e in c.schema(p.name):
                if p.name in mutates:
                    type_text, name = e.split(" ")
                    e = f"{type_text}(a{i}!) {name}"
                entries.append(e)
        entries += ["str? solution", "str? override"]
        # An op that writes in place returns nothing (kvcache_store) or one fresh tensor (gdn_decode's
        # output): functionalization takes no list results from mutating ops.
        if self.op.mutates:
            returns = "Tensor" if self.op.mutating_result else "()"
        else:
            returns = "Tensor[]"
        return f"({', '.join(entries)}) -> {returns}"

    def encode(self, args: tuple, kwargs: dict) -> tuple:
        unknown = set(kwargs) - set(self.names)
        if unknown:
            raise TypeError(f"{self.op.name}() got unexpected keyword argument(s) {sorted(unknown)}")
        out: tuple = ()
        for i, (name, default, codec) in enumerate(zip(self.names, self.defaults, self.codecs)):
            if i < len(args):
                value = args[i]
            elif name in kwargs:
                value = kwargs[name]
            elif default is inspect.Parameter.empty:
                raise TypeError(f"{self.op.name}() missing required argument {name!r}")
            else:
                value = default
            out += codec.encode(value, name)
        return out

    def decode(self, schema_args: tuple) -> tuple[dict[str, Any], Target | None, Target | None]:
        it = iter(schema_args)
        kwargs = {p.name: c.decode(it) for p, c in zip(self.params, self.codecs)}
        solution, override = next(it), next(it)
        return kwargs, _target(solution), _target(override)

    def real(self, *schema_args: Any) -> Any:
        kwargs, solution, override = self.decode(schema_args)
        result = self.op(**kwargs, solution=solution, override=override)
        return self._result(result)

    def fake(self, *schema_args: Any) -> Any:
        kwargs, _, _ = self.decode(schema_args)
        # As the op is called: positional parameters by position, keyword-only ones by name.
        positional = [kwargs.pop(p.name) for p in self.params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        result = self.op.fake(*positional, **kwargs)
        return self._result(result)

    def _result(self, result: Any) -> Any:
        if self.op.mutates:
            return result.contiguous() if self.op.mutating_result else None
        return _flatten(result)


def _target(t: str | None) -> Target | None:
    if t is None:
        return None
    parts = tuple(t.split("|"))
    return parts[0] if len(parts) == 1 else parts


def _schema_target(t: Target | None) -> str | None:
    if t is None or isinstance(t, str):
        return t
    return "|".join(t)


def _flatten(result: Any) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        items = [result]
    elif dataclasses.is_dataclass(result):
        items = [getattr(result, f.name) for f in dataclasses.fields(result)]
    else:
        items = list(result)
    # The fake implementations' outputs are contiguous; a kernel's strided result must not leak out.
    return [t if t.is_contiguous() else t.contiguous() for t in items]


#: Ops whose result is a typed object rebuilt from the tensor list.
_RESULT_TYPES: dict[str, type] = {"moe_dispatch": _moe.MoEDispatchResult}


def _bridge(op: Op) -> _Bridge:
    hints = typing.get_type_hints(op.bind)
    params = [p for p in inspect.signature(op.bind).parameters.values() if p.name not in _NOT_IN_SCHEMA]
    return _Bridge(op, params, [_codec(hints[p.name]) for p in params])


_lock = threading.Lock()
_bridges: dict[str, _Bridge] = {}
#: Owns the registrations (a Library unregisters its ops when it is destroyed).
_library: torch.library.Library | None = None


def register_custom_ops() -> None:
    """Define ``torch.ops.tokenspeed_kernel.<op>`` for every public op, with its fake implementation.

    Idempotent and thread-safe; an op already defined in this process (e.g. by a
    reloaded copy of this module) is left as it is.
    """
    global _library
    if _library is not None:
        return
    with _lock:
        if _library is not None:
            return
        namespace = getattr(torch.ops, NAMESPACE)
        library = torch.library.Library(NAMESPACE, "FRAGMENT")
        for name, op in sorted(all_contracts().items()):
            bridge = _bridges.setdefault(name, _bridge(op))
            if hasattr(namespace, name):
                continue
            # Library.define + a CompositeExplicitAutograd kernel rather than torch.library.custom_op:
            # custom_op adds a Python autograd layer, a Dynamo-disable wrapper and an aliasing check
            # to every call; these ops have no backward anyway.
            library.define(name + bridge.schema)
            library.impl(name, bridge.real, "CompositeExplicitAutograd")
            torch.library.register_fake(f"{NAMESPACE}::{name}", bridge.fake, lib=library)
        _library = library


def schema_of(op: str) -> str:
    """The custom op's schema for a public op (its ``torch.ops.tokenspeed_kernel`` declaration)."""
    return (_bridges.get(op) or _bridge(all_contracts()[op])).schema


def schema_args(op: str, *args: Any, solution: Target | None = None, override: Target | None = None, **kwargs: Any):
    """The custom op's arguments for a public-op call (what :data:`ops` passes)."""
    bridge = _bridges.get(op) or _bridge(all_contracts()[op])
    return (*bridge.encode(args, kwargs), _schema_target(solution), _schema_target(override))


# ----------------------------------------------------------------------------- the model-facing namespace


def _finish(name: str, result: Any) -> Any:
    if result is None or isinstance(result, torch.Tensor):
        return result
    cls = _RESULT_TYPES.get(name)
    if cls is not None:
        return cls(*result)
    return result[0] if len(result) == 1 else tuple(result)


def _wrapper(bridge: _Bridge) -> Callable[..., Any]:
    """A function with the op's public signature (minus ``out=``) that calls the custom op."""
    name = bridge.op.name
    overload = getattr(getattr(torch.ops, NAMESPACE), name).default

    def call(*args: Any, solution: Target | None = None, override: Target | None = None, **kwargs: Any) -> Any:
        return _finish(name, overload(*bridge.encode(args, kwargs), _schema_target(solution), _schema_target(override)))

    sig = inspect.signature(bridge.op)
    call.__signature__ = sig.replace(parameters=[p for p in sig.parameters.values() if p.name not in _NOT_IN_SCHEMA])  # type: ignore[attr-defined]
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f":func:`tokenspeed_kernel.{name}` through ``torch.ops.{NAMESPACE}.{name}`` (no ``out=``)."
    return call


class CompileOps:
    """The public ops through the custom ops: same signatures as ``tokenspeed_kernel.<op>``, no ``out=``.

    Use the instance :data:`ops`. Host-side helpers that are never traced
    (``moe_plan``, ``moe_process_weights``) are forwarded unchanged so the
    namespace can stand in for ``tokenspeed_kernel`` in model code.
    """

    moe_plan = staticmethod(_moe.moe_plan)
    moe_process_weights = staticmethod(_moe.moe_process_weights)

    def __init__(self) -> None:
        for name, bridge in _bridges.items():
            setattr(self, name, _wrapper(bridge))


def _ops() -> CompileOps:
    register_custom_ops()
    namespace = CompileOps()
    # Cache it as a real module attribute: later lookups (and Dynamo's) skip __getattr__.
    globals()["ops"] = namespace
    globals()["OP_NAMES"] = tuple(sorted(_bridges))
    return namespace


def __getattr__(name: str) -> Any:
    if name == "ops":
        return _ops()
    if name == "OP_NAMES":
        return tuple(sorted(all_contracts()))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Per-op cases: shapes, input generators, comparisons, shrinking, capture replay.

One :class:`OpCases` per public op, in the module named like the op's family; the
op object names it (``Op.workload``) and :func:`get_op_cases` finds it by the op's
name. Shared by ``verify`` and ``bench``:

- ``defaults``: a complete small case; a :class:`Case` is the op, a dtype and the
  parameters that differ from nothing (every parameter is stored);
- ``sets``: named shape sets (``cpu``/``gpu`` for verify, ``bench-cpu``/``bench-gpu``
  for bench) as lists of parameter overrides;
- ``make``: the public op's keyword arguments for a case (the shared generators);
- ``reference_call``: the same call upcast for the reference (or unchanged);
- ``outputs``: the named output tensors of a call's result;
- ``compare``: kernel outputs vs reference outputs -> checks with tolerances;
- ``shrink``: for ``--bisect``, moves that make a case smaller;
- ``from_capture``: a :class:`Case` from a shape-capture entry (``bench --replay``);
- ``cost``: the FLOP/byte model of a call (``bench``'s rates and % of ceilings),
  ``metric``: the rate a report plots (``tflops`` or ``tbps``);
- ``peers``: external libraries timed next to the kernels (never selectable).

Cost conventions (so numbers compare with PERFORMANCE.md): a multiply-add is 2
FLOPs; attention counts only the (query, key) pairs the mask lets through; MoE
weights are counted for active experts only at their storage size; element-wise
ops count every input read and output written.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ...core.contracts import all_contracts, get_contract

__all__ = [
    "Case",
    "Cost",
    "Peer",
    "PeerCall",
    "PeerSkip",
    "io_cost",
    "nbytes",
    "OpCases",
    "Shrink",
    "CapturedCall",
    "get_op_cases",
    "all_op_cases",
    "standard_cases",
    "custom_case",
    "cases_from_file",
    "cases_from_capture",
    "parse_value",
    "call_for_kernel",
    "clone_call",
    "case_call_key",
]


@dataclass(frozen=True)
class Case:
    """One op call's shape: the op, the activation dtype and named parameters.

    ``params`` is a sorted tuple of (name, value) so cases hash and compare;
    values are ints, floats, bools, strings, None or tuples of ints.
    """

    op: str
    dtype: str
    params: tuple[tuple[str, Any], ...]
    label: str = ""

    @staticmethod
    def make(op: str, dtype: str, params: Mapping[str, Any], label: str = "") -> Case:
        return Case(op, dtype, tuple(sorted((k, _freeze(v)) for k, v in params.items())), label)

    def __getitem__(self, name: str) -> Any:
        for k, v in self.params:
            if k == name:
                return v
        raise KeyError(f"case of {self.op}: no parameter {name!r}")

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default

    def as_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def replace(self, **params: Any) -> Case:
        d = self.as_dict()
        d.update(params)
        return Case.make(self.op, self.dtype, d, self.label)

    def seed(self, base: int) -> int:
        """A seed that differs per case but is stable across runs and machines."""
        return (base * 1_000_003 + zlib.crc32(repr((self.op, self.dtype, self.params)).encode())) % (2**31)

    def describe(self, *, defaults: Mapping[str, Any] | None = None) -> str:
        """``bf16 tokens=7 hidden=2880 residual=True``: parameters differing from ``defaults``
        (all of them without defaults), shrinkable dims always shown."""
        keep = get_op_cases(self.op).always_show if defaults is not None else ()
        order = {k: i for i, k in enumerate(defaults or ())}
        parts = [self.dtype]
        for k, v in sorted(self.params, key=lambda kv: (order.get(kv[0], len(order)), kv[0])):
            if defaults is not None and k not in keep and defaults.get(k, _MISSING) == v:
                continue
            parts.append(f"{k}={_fmt(v)}")
        return " ".join(parts)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "dtype": self.dtype, "params": {k: _thaw(v) for k, v in self.params}}
        if self.label:
            out["label"] = self.label
        return out

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Case:
        return Case.make(data["op"], data["dtype"], data.get("params", {}), data.get("label", ""))


_MISSING = object()


def _freeze(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


def _thaw(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_thaw(x) for x in v]
    return v


def _fmt(v: Any) -> str:
    """Values as the CLI reads them back (``5,17``; a 1-tuple is ``6,``)."""
    if isinstance(v, tuple):
        if len(v) > 6:
            return f"{','.join(str(x) for x in v[:3])},...,{v[-1]}[{len(v)}]"
        return ",".join(str(x) for x in v) + ("," if len(v) == 1 else "")
    return str(v)


@dataclass(frozen=True)
class Cost:
    """What a call must compute and move at least; ``compute`` names the matmul ceiling
    the FLOP rate is compared with (``fp8`` for FP8 GEMMs, ``bf16`` otherwise)."""

    flops: float
    bytes: float
    compute: str = "bf16"


class PeerSkip(Exception):
    """The peer cannot run this case (the message says why)."""


@dataclass
class PeerCall:
    """A prepared peer call: ``fn()`` runs it; ``context`` (optional) wraps the whole timing."""

    fn: Callable[[], Any]
    note: str = ""
    context: Callable[[], Any] | None = None


@dataclass
class Peer:
    """An external library timed next to an op's kernels on the same case, never selected.

    ``prepare(case, call, device)`` converts the case's call outside the timed region;
    ``available(device)`` is None if the peer can run there, else why not. A library
    that wraps as a kernel is registered as one instead, with ``peer=True``.
    """

    name: str
    prepare: Callable[[Case, dict[str, Any], torch.device], PeerCall]
    available: Callable[[torch.device], str | None] = lambda device: None
    doc: str = ""


def nbytes(*tensors: Any) -> float:
    """Bytes of the tensors given (None and non-tensors count 0)."""
    return float(sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor)))


def io_cost(flops_per_output: float = 0.0) -> Callable[[Case, dict[str, Any], Mapping[str, Any]], Cost]:
    """The cost model of an element-wise op: every input tensor read, every output written."""

    def cost(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
        inputs = [v for v in call.values() if isinstance(v, torch.Tensor)]
        out_elems = sum(t.numel() for t in outputs.values() if isinstance(t, torch.Tensor))
        return Cost(flops_per_output * out_elems, nbytes(*inputs) + nbytes(*outputs.values()))

    return cost


def needs_cuda(device: torch.device) -> str | None:
    return None if device.type == "cuda" else "needs a CUDA device"


#: A bisect move: a case -> smaller candidate cases, most aggressive first.
Shrink = Callable[[Case], Sequence[Case]]


@dataclass
class CapturedCall:
    """A call as shape capture recorded it (see :mod:`tokenspeed_kernel.core.profiling`)."""

    op: str
    signature: tuple[str, ...]
    traits: dict[str, Any]
    args: list[Any]
    kwargs: dict[str, Any]
    samples: dict[str, list]
    count: int = 1

    def shape(self, where: int | str) -> tuple[int, ...] | None:
        d = self.args[where] if isinstance(where, int) else self.kwargs.get(where)
        return tuple(d["tensor"]) if isinstance(d, dict) and "tensor" in d else None

    def dtype(self, where: int | str) -> str | None:
        d = self.args[where] if isinstance(where, int) else self.kwargs.get(where)
        return d.get("dtype") if isinstance(d, dict) else None

    def value(self, where: int | str, default: Any = None) -> Any:
        if isinstance(where, int):
            d = self.args[where] if where < len(self.args) else None
        else:
            d = self.kwargs.get(where)
        if isinstance(d, dict) and "value" in d:
            return d["value"]
        return default

    def is_none(self, where: int | str) -> bool:
        return self.value(where, default=_MISSING) is None

    def sample(self, where: int | str) -> list | None:
        key = f"args.{where}" if isinstance(where, int) else f"kwargs.{where}"
        return self.samples.get(key)

    def obj(self, where: int | str) -> dict[str, Any] | None:
        d = self.args[where] if isinstance(where, int) else self.kwargs.get(where)
        return d if isinstance(d, dict) else None


@dataclass
class OpCases:
    """Everything verify and bench need to exercise one public op."""

    op: str
    defaults: dict[str, Any]
    #: dtypes swept when the caller names none, per device type ("cpu" / "cuda").
    dtypes: dict[str, tuple[str, ...]]
    #: named shape sets: lists of parameter overrides (an entry may set "dtype"/"dtypes"/"label").
    sets: dict[str, list[dict[str, Any]]]
    make: Callable[[Case, torch.device, torch.Generator], dict[str, Any]]
    compare: Callable[[Case, dict[str, torch.Tensor], dict[str, torch.Tensor]], list]
    outputs: Callable[[dict[str, Any], Any], dict[str, torch.Tensor]]
    reference_call: Callable[[Case, dict[str, Any]], dict[str, Any]] = lambda case, call: call
    #: bisect moves, tried in order (batch first, then sequences, heads, tokens, experts).
    shrink: list[Shrink] = field(default_factory=list)
    from_capture: Callable[[CapturedCall], Case | None] | None = None
    #: parameters always shown in a case's description.
    always_show: tuple[str, ...] = ()
    #: adapt a call to a given kernel (e.g. convert MoE weights to its layout).
    for_kernel: Callable[[dict[str, Any], Any], dict[str, Any]] | None = None
    #: for a kernel whose declared semantics differ from the op reference's: ``(case, call, spec) ->
    #: (expected outputs, compare)``, or None for the op reference and ``compare`` (e.g. W4A8 MoE
    #: kernels, against the float32 W4A8 reference within ``fp8_matmul``).
    kernel_reference: Callable[[Case, dict[str, Any], Any], tuple[dict[str, torch.Tensor], Callable] | None] | None = (
        None
    )
    #: parameters holding tuples of ints (a bare int given for one becomes a 1-tuple).
    tuple_params: tuple[str, ...] = ()
    #: the FLOP/byte model of a call (see the module doc).
    cost: Callable[[Case, dict[str, Any], Mapping[str, Any]], Cost] = field(default_factory=io_cost)
    #: which rate a report plots: "tflops" (compute-bound work) or "tbps".
    metric: str = "tbps"
    #: external libraries timed next to the kernels.
    peers: list[Peer] = field(default_factory=list)

    @property
    def fn(self) -> Callable[..., Any]:
        """The public op (its :class:`~tokenspeed_kernel.core.op.Op` object)."""
        return get_contract(self.op)


def get_op_cases(op: str) -> OpCases:
    """The cases of the public op named ``op`` (its ``Op.workload``)."""
    found = all_contracts().get(op)
    if found is None:
        raise KeyError(f"op: no verify/bench cases for {op!r}; known: {sorted(all_contracts())}")
    return found.cases


def all_op_cases() -> dict[str, OpCases]:
    """Every public op's cases, by op name."""
    return {name: op.cases for name, op in all_contracts().items()}


def _expand(op: str, entries: Iterable[Mapping[str, Any]], dtypes: Sequence[str] | None, default_dtypes) -> list[Case]:
    oc = get_op_cases(op)
    out: list[Case] = []
    for entry in entries:
        entry = dict(entry)
        label = entry.pop("label", "")
        own = entry.pop("dtypes", None) or ([entry.pop("dtype")] if "dtype" in entry else None)
        entry.pop("dtype", None)
        unknown = set(entry) - set(oc.defaults)
        if unknown:
            raise ValueError(f"case of {op}: unknown parameter(s) {sorted(unknown)}; known: {sorted(oc.defaults)}")
        params = _coerce(oc, {**oc.defaults, **entry})
        use = own or default_dtypes
        if dtypes:
            use = [d for d in dtypes if d in (own or dtypes)]
        for dt in use:
            c = Case.make(op, dt, params, label)
            if c not in out:
                out.append(c)
    return out


def _coerce(oc: OpCases, params: dict[str, Any]) -> dict[str, Any]:
    for name in oc.tuple_params:
        if isinstance(params.get(name), int):
            params[name] = (params[name],)
    return params


def standard_cases(
    op: str, shape_set: str, *, dtypes: Sequence[str] | None = None, device_type: str = "cpu"
) -> list[Case]:
    """The op's named shape set (``cpu``, ``gpu``, ``bench-cpu``, ``bench-gpu``) as cases.

    ``dtypes`` replaces the set's dtype sweep (entries pinned to other dtypes are dropped).
    """
    oc = get_op_cases(op)
    if shape_set not in oc.sets:
        raise ValueError(f"shape set: {op} has no set {shape_set!r}; sets: {sorted(oc.sets)}")
    default_dtypes = oc.dtypes.get(device_type) or oc.dtypes.get("cpu") or ("bf16",)
    if shape_set.startswith("bench"):
        # Timing every dtype of the verify sweep says little; bench sets pin dtypes where they matter.
        default_dtypes = default_dtypes[:1]
    return _expand(op, oc.sets[shape_set], dtypes, default_dtypes)


def custom_case(
    op: str, params: Mapping[str, Any], *, dtypes: Sequence[str] | None = None, device_type: str = "cpu"
) -> list[Case]:
    """Cases from the op's defaults with ``params`` replaced (``--shape k=v ...``)."""
    oc = get_op_cases(op)
    default_dtypes = oc.dtypes.get(device_type) or ("bf16",)
    return _expand(op, [params], dtypes, (default_dtypes[0],))


def parse_value(raw: str) -> Any:
    """A CLI value: ``true``/``false``/``none``, int, float, ``a,b,c`` (tuple of ints) or a string."""
    low = raw.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    raw = raw.strip()
    if "," in raw or raw.startswith("("):
        return tuple(int(x) for x in raw.strip("()[]").split(",") if x.strip())
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw


def cases_from_capture(data: Mapping[str, Any]) -> list[tuple[Case, int]]:
    """(case, call count) for every entry of a shape-capture file that can be replayed."""
    out: list[tuple[Case, int]] = []
    for entry in data.get("entries", []):
        call = CapturedCall(
            op=entry["op"],
            signature=tuple(entry.get("signature", ())),
            traits=dict(entry.get("traits", {})),
            args=list(entry.get("args", [])),
            kwargs=dict(entry.get("kwargs", {})),
            samples=dict(entry.get("samples", {})),
            count=int(entry.get("count", 1)),
        )
        try:
            oc = get_op_cases(call.op)
        except KeyError:
            continue
        if oc.from_capture is None:
            continue
        case = oc.from_capture(call)
        if case is not None:
            out.append((dataclasses.replace(case, label=case.label or f"captured x{call.count}"), call.count))
    return out


def cases_from_file(path: str) -> list[Case]:
    """Cases from a JSON file: a shape-capture file, or a list of
    ``{"op": ..., "dtype": ..., "params": {...}}`` objects (params may be partial)."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict) and "entries" in data:
        return [c for c, _ in cases_from_capture(data)]
    if isinstance(data, dict):
        data = data.get("cases", [])
    out: list[Case] = []
    for item in data:
        op = item["op"]
        oc = get_op_cases(op)
        params = item.get("params", {k: v for k, v in item.items() if k not in ("op", "dtype", "label")})
        unknown = set(params) - set(oc.defaults)
        if unknown:
            raise ValueError(
                f"{path}: case of {op}: unknown parameter(s) {sorted(unknown)}; known: {sorted(oc.defaults)}"
            )
        dtype = item.get("dtype") or (oc.dtypes.get("cpu") or ("bf16",))[0]
        out.append(Case.make(op, dtype, _coerce(oc, {**oc.defaults, **params}), item.get("label", "")))
    return out


def clone_call(call: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a call whose tensors (also inside MoE weights) are fresh clones."""
    from ...ops.moe import MoEWeights

    def c(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.clone()
        if isinstance(v, MoEWeights):
            kw = {f.name: c(getattr(v, f.name)) for f in dataclasses.fields(v)}
            kw["extra"] = tuple(c(x) for x in v.extra)
            return MoEWeights(**kw)
        return v

    return {k: c(v) for k, v in call.items()}


def call_for_kernel(op: str, call: dict[str, Any], spec: Any) -> dict[str, Any]:
    """The call adapted to kernel ``spec`` and forced onto it (``override=`` or a MoE plan)."""
    oc = get_op_cases(op)
    if oc.for_kernel is not None:
        out = oc.for_kernel(call, spec)
        if out is not None:
            return out
    return {**call, "override": spec.name}


def _fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    # A shape environment lets data-dependent ops (bincount in the MoE generators) return fake sizes.
    return FakeTensorMode(shape_env=ShapeEnv())


def case_call_key(case: Case, *, seed: int = 0) -> tuple[tuple[str, ...], dict[str, Any], dict[str, int]]:
    """What selection sees for ``case``'s call: (format signature, complete traits, sizes by name).

    The inputs are built by the op's case generator on fake tensors (no memory is
    allocated, whatever the case's size) and the op object's argument checks read
    the key (:meth:`~tokenspeed_kernel.core.op.Op.call_key`); no kernel runs.
    """
    from .. import inputs

    op = get_contract(case.op)
    dev = torch.device("cpu")
    with _fake_mode():
        call = op.cases.make(case, dev, inputs.make_generator(dev, case.seed(seed)))
        return op.call_key(**call)

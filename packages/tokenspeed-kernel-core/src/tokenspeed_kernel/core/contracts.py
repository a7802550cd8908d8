"""Op contracts: each public op's format roles and typed trait schema.

A contract says which tensor roles make up a call's format signature and which
traits (typed, with allowed values and a default) describe the call. Kernels are
checked against the contract when they register: an unknown trait, a value of the
wrong type, or a format string nobody knows fails there, not at selection.

A kernel that does not declare a trait supports only that trait's default value;
a trait without a default must be declared by every kernel.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .formats import is_known_format

__all__ = [
    "REQUIRED",
    "ANY",
    "Range",
    "Size",
    "TraitSpec",
    "OpContract",
    "TraitMatcher",
    "size_bucket",
    "bucket_range",
    "describe_bucket",
    "add_to_catalog",
    "get_contract",
    "all_contracts",
]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


class _Any:
    def __repr__(self) -> str:
        return "ANY"


#: Marks a trait with no default: every kernel must declare the values it supports.
REQUIRED: Any = _Required()
#: A kernel supports every value of the trait the contract allows.
ANY: Any = _Any()


@dataclass(frozen=True)
class Range:
    """Integer values lo..hi inclusive, optionally powers of two only."""

    lo: int
    hi: int
    power_of_two: bool = False

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        if not self.lo <= value <= self.hi:
            return False
        return not self.power_of_two or (value > 0 and value & (value - 1) == 0)

    def __repr__(self) -> str:
        p2 = ", powers of two" if self.power_of_two else ""
        return f"{self.lo}..{self.hi}{p2}"


@dataclass(frozen=True)
class Size:
    """A size of a call that selection sees through its power-of-two bucket.

    The best kernel depends on it (``mm`` at M = 1 and at M = 4096), so it is part
    of the selection cache key and of the measured tables' groups as a bucket:
    bucket ``b = n.bit_length()`` holds ``2**(b-1) <= n < 2**b`` (bucket 0 holds 0).
    """

    name: str
    doc: str = ""


def size_bucket(n: int) -> int:
    """The power-of-two bucket of a size: ``n.bit_length()`` (1 -> 1, 2..3 -> 2, 4..7 -> 3, ...)."""
    return n.bit_length()


def bucket_range(bucket: int) -> tuple[int, int]:
    """The sizes ``(lo, hi)`` (inclusive) bucket ``bucket`` holds."""
    if bucket <= 0:
        return 0, 0
    return 1 << (bucket - 1), (1 << bucket) - 1


def describe_bucket(bucket: int) -> str:
    lo, hi = bucket_range(bucket)
    return str(lo) if lo == hi else f"{lo}..{hi}"


@dataclass(frozen=True)
class TraitSpec:
    """One trait of an op: its type, default (or REQUIRED), allowed values and doc.

    ``measured=False`` marks a trait that belongs to the kernel rather than to the
    call (MoE's weight ``layout``): measured times of kernels that differ only in it
    are compared with each other, so it is left out of the measured tables' groups.
    """

    type: type
    default: Any = REQUIRED
    allowed: tuple | Range | None = None
    doc: str = ""
    measured: bool = True

    def check_value(self, op: str, name: str, value: object, *, who: str) -> None:
        ok_type = isinstance(value, self.type) and not (self.type is int and isinstance(value, bool))
        if not ok_type:
            raise TypeError(
                f"{who}: trait {name!r} of op {op!r} must be {self.type.__name__}, got {value!r} ({type(value).__name__})"
            )
        if self.allowed is not None and value not in self.allowed:
            raise ValueError(f"{who}: trait {name!r} of op {op!r} must be one of {self.allowed!r}, got {value!r}")


class TraitMatcher:
    """The set of values of one trait that a kernel supports."""

    __slots__ = ("everything", "values")

    def __init__(self, values: object) -> None:
        self.everything = values is ANY
        self.values = None if self.everything else values

    def __contains__(self, value: object) -> bool:
        return self.everything or value is ANY or value in self.values  # type: ignore[operator]

    def __repr__(self) -> str:
        if self.everything:
            return "any"
        if isinstance(self.values, Range):
            return repr(self.values)
        return "|".join(repr(v) for v in sorted(self.values, key=lambda v: (str(type(v)), v)))  # type: ignore[union-attr]


@dataclass(frozen=True, eq=False)
class OpContract:
    """A public op's contract: its family, format roles, trait schema and size buckets.

    :class:`tokenspeed_kernel.core.op.Op` (every public op) extends it with the
    argument checks, the call and everything the tooling needs.
    """

    name: str
    family: str
    roles: tuple[str, ...]
    traits: Mapping[str, TraitSpec]
    sizes: tuple[Size, ...] = ()
    doc: str = ""

    def measured_traits(self, traits: Mapping[str, object]) -> dict[str, object]:
        """``traits`` without the ones measured tables do not group by (see :class:`TraitSpec`)."""
        return {k: v for k, v in traits.items() if k not in self.traits or self.traits[k].measured}

    def normalize_traits(self, traits: Mapping[str, object]) -> dict[str, object]:
        """Check a call's traits against the schema and fill the defaults."""
        unknown = set(traits) - set(self.traits)
        if unknown:
            raise ValueError(
                f"traits: op {self.name!r} has no trait(s) {sorted(unknown)}; known: {sorted(self.traits)}"
            )
        out: dict[str, object] = {}
        for name, spec in self.traits.items():
            if name in traits:
                value = traits[name]
                if value is not ANY:  # ANY: every kernel's value (moe_plan lets every layout compete)
                    spec.check_value(self.name, name, value, who="call")
            elif spec.default is REQUIRED:
                raise ValueError(f"traits: op {self.name!r} needs trait {name!r}")
            else:
                value = spec.default
            out[name] = value
        return out

    def build_matchers(self, declared: Mapping[str, object], *, kernel: str) -> dict[str, TraitMatcher]:
        """Turn a kernel's trait declaration into matchers, failing on any mistake."""
        who = f"kernel {kernel!r}"
        unknown = set(declared) - set(self.traits)
        if unknown:
            raise ValueError(
                f"{who}: unknown trait(s) {sorted(unknown)} for op {self.name!r}; the contract has {sorted(self.traits)}"
            )
        matchers: dict[str, TraitMatcher] = {}
        for name, spec in self.traits.items():
            if name not in declared:
                if spec.default is REQUIRED:
                    raise ValueError(f"{who}: op {self.name!r} requires every kernel to declare trait {name!r}")
                matchers[name] = TraitMatcher((spec.default,))
                continue
            raw = declared[name]
            if raw is ANY:
                matchers[name] = TraitMatcher(ANY)
                continue
            if isinstance(raw, Range):
                if spec.type is not int:
                    raise TypeError(f"{who}: trait {name!r} is {spec.type.__name__}; a Range needs an int trait")
                matchers[name] = TraitMatcher(raw)
                continue
            values = tuple(raw) if isinstance(raw, (tuple, list, set, frozenset)) else (raw,)
            if not values:
                raise ValueError(f"{who}: trait {name!r} declares no value")
            for v in values:
                spec.check_value(self.name, name, v, who=who)
            matchers[name] = TraitMatcher(frozenset(values))
        return matchers

    def build_size_ranges(self, declared: Mapping[str, Range], *, kernel: str) -> dict[str, Range]:
        """Check a kernel's supported sizes: a :class:`Range` per size name, on bucket boundaries."""
        who = f"kernel {kernel!r}"
        names = {s.name for s in self.sizes}
        unknown = set(declared) - names
        if unknown:
            raise ValueError(
                f"{who}: unknown size(s) {sorted(unknown)} for op {self.name!r}; its sizes: {sorted(names)}"
            )
        out: dict[str, Range] = {}
        for name, rng in declared.items():
            if not isinstance(rng, Range) or rng.power_of_two:
                raise TypeError(f"{who}: size {name!r} takes a Range(lo, hi), got {rng!r}")
            lo_ok = rng.lo == 0 or (rng.lo > 0 and rng.lo & (rng.lo - 1) == 0)
            hi_ok = rng.hi >= 1 << 40 or ((rng.hi + 1) & rng.hi) == 0
            if not (lo_ok and hi_ok and rng.lo <= rng.hi):
                raise ValueError(
                    f"{who}: size {name!r} range {rng!r} must cover whole power-of-two buckets "
                    "(lo 0 or a power of two, hi + 1 a power of two, e.g. Range(1, 63) or Range(64, 2**62))"
                )
            out[name] = rng
        return out

    def build_formats(
        self, declared: Iterable[Mapping[str, str | Iterable[str]]], *, kernel: str
    ) -> tuple[dict[str, frozenset[str]], ...]:
        """Check a kernel's format declaration: a list of {role: format(s)} alternatives."""
        who = f"kernel {kernel!r}"
        alternatives = []
        for entry in declared:
            unknown = set(entry) - set(self.roles)
            if unknown:
                raise ValueError(
                    f"{who}: unknown format role(s) {sorted(unknown)} for op {self.name!r}; roles: {self.roles}"
                )
            missing = set(self.roles) - set(entry)
            if missing:
                raise ValueError(f"{who}: formats entry {dict(entry)} misses role(s) {sorted(missing)}")
            alt: dict[str, frozenset[str]] = {}
            for role, fmts in entry.items():
                names = (fmts,) if isinstance(fmts, str) else tuple(fmts)
                for f in names:
                    if not is_known_format(f):
                        raise ValueError(f"{who}: unknown format {f!r} for role {role!r}")
                alt[role] = frozenset(names)
            alternatives.append(alt)
        if not alternatives:
            raise ValueError(f"{who}: declares no formats")
        return tuple(alternatives)


_CATALOG: dict[str, OpContract] = {}


def add_to_catalog(contract: OpContract) -> None:
    """Record a public op (done once, when its module defines it)."""
    if contract.name in _CATALOG:
        raise ValueError(f"op {contract.name!r} is already defined")
    _CATALOG[contract.name] = contract


def get_contract(op: str) -> OpContract:
    """The public op named ``op`` (its :class:`~tokenspeed_kernel.core.op.Op` object)."""
    try:
        return _CATALOG[op]
    except KeyError:
        raise ValueError(f"op: unknown op {op!r}; known ops: {', '.join(sorted(_CATALOG))}") from None


def all_contracts() -> dict[str, OpContract]:
    """Every public op by name."""
    return dict(_CATALOG)

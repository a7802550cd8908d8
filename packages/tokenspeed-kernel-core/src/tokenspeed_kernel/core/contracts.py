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
    "TraitSpec",
    "OpContract",
    "TraitMatcher",
    "define_op",
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
class TraitSpec:
    type: type
    default: Any = REQUIRED
    allowed: tuple | Range | None = None
    doc: str = ""

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
        return self.everything or value in self.values  # type: ignore[operator]

    def __repr__(self) -> str:
        if self.everything:
            return "any"
        if isinstance(self.values, Range):
            return repr(self.values)
        return "|".join(repr(v) for v in sorted(self.values, key=lambda v: (str(type(v)), v)))  # type: ignore[union-attr]


@dataclass(frozen=True)
class OpContract:
    """A public op: its family, format roles and trait schema."""

    name: str
    family: str
    roles: tuple[str, ...]
    traits: Mapping[str, TraitSpec]
    doc: str = ""

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


_CONTRACTS: dict[str, OpContract] = {}


def define_op(
    name: str,
    *,
    family: str,
    roles: Iterable[str],
    traits: Mapping[str, TraitSpec] | None = None,
    doc: str = "",
) -> OpContract:
    """Declare a public op's contract (done once, by the op's module)."""
    if name in _CONTRACTS:
        raise ValueError(f"op {name!r} is already defined")
    contract = OpContract(name=name, family=family, roles=tuple(roles), traits=dict(traits or {}), doc=doc)
    _CONTRACTS[name] = contract
    return contract


def get_contract(op: str) -> OpContract:
    _ensure_ops_defined()
    try:
        return _CONTRACTS[op]
    except KeyError:
        raise ValueError(f"op: unknown op {op!r}; known ops: {sorted(_CONTRACTS)}") from None


def all_contracts() -> dict[str, OpContract]:
    _ensure_ops_defined()
    return dict(_CONTRACTS)


_ops_loaded = False


def _ensure_ops_defined() -> None:
    # The ops package defines the contracts when it is imported; importing
    # tokenspeed_kernel imports it, but a plugin could import this module first.
    global _ops_loaded
    if not _ops_loaded:
        _ops_loaded = True
        import tokenspeed_kernel.ops  # noqa: F401

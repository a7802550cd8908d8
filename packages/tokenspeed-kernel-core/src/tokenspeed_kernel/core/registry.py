"""The kernel registry and ``@register_kernel``.

A :class:`KernelSpec` is everything selection, verification and benchmarking
need to know about a kernel without importing it: op, unique name, solution,
capability, formats, traits, priority band, tags and the implementation (a
callable or a lazy ``"module:attr"`` string resolved on first use).
"""

from __future__ import annotations

import contextvars
import importlib
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from .contracts import Range, TraitMatcher, bucket_range, describe_bucket, get_contract
from .platform import KNOWN_FEATURES, Platform, arch_version

__all__ = [
    "Priority",
    "Capability",
    "KernelSpec",
    "KernelRegistry",
    "registry",
    "register_kernel",
    "unregister_kernel",
    "KNOWN_TAGS",
]


class Priority(IntEnum):
    """Priority bands; a kernel may sit anywhere inside its band (e.g. PORTABLE + 5)."""

    REFERENCE = 0
    PORTABLE = 100
    PERFORMANT = 200
    SPECIALIZED = 300

    @staticmethod
    def band_value(value: int) -> int:
        """The band a priority falls in, as the band's base value (REFERENCE for anything below PORTABLE)."""
        for band in reversed(Priority):
            if value >= band:
                return int(band)
        return int(Priority.REFERENCE)

    @staticmethod
    def band_name(value: int) -> str:
        return Priority(Priority.band_value(value)).name

    @staticmethod
    def band_of(value: int) -> str:
        """The name of the band a priority falls in."""
        return Priority.band_name(value)


#: Tags selection and the tooling understand.
KNOWN_TAGS = frozenset({"deterministic", "cuda_graph_safe", "latency", "throughput", "experimental"})


@dataclass(frozen=True)
class Capability:
    """What a kernel needs from the platform.

    ``vendors`` empty means any vendor, the CPU included. Arch bounds compare the
    ordered arch version within the platform's vendor (``min_arch="sm90"``).
    """

    vendors: frozenset[str] = frozenset()
    min_arch: str | None = None
    max_arch: str | None = None
    features: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "vendors", frozenset(self.vendors))
        object.__setattr__(self, "features", frozenset(self.features))
        bad = self.vendors - {"nvidia", "amd", "cpu"}
        if bad:
            raise ValueError(f"capability: unknown vendor(s) {sorted(bad)}; expected nvidia, amd or cpu")
        unknown = self.features - KNOWN_FEATURES
        if unknown:
            raise ValueError(f"capability: unknown feature(s) {sorted(unknown)}; known: {sorted(KNOWN_FEATURES)}")
        for a in (self.min_arch, self.max_arch):
            if a is not None:
                arch_version(a)

    def reject_reason(self, platform: Platform) -> str | None:
        if self.vendors and platform.vendor not in self.vendors:
            return f"needs vendor {'/'.join(sorted(self.vendors))}, platform is {platform.vendor}"
        for bound, cmp, word in ((self.min_arch, lambda a, b: a < b, ">="), (self.max_arch, lambda a, b: a > b, "<=")):
            if bound is None:
                continue
            if bound[:2] != platform.arch[:2]:
                return f"needs arch {word} {bound}, platform is {platform.arch}"
            if cmp(platform.arch_version, arch_version(bound)):
                return f"needs arch {word} {bound}, platform is {platform.arch}"
        missing = self.features - platform.features
        if missing:
            return f"needs feature(s) {', '.join(sorted(missing))} that {platform.arch} lacks"
        return None

    def describe(self) -> str:
        parts = []
        if self.vendors:
            parts.append("/".join(sorted(self.vendors)))
        if self.min_arch or self.max_arch:
            parts.append(f"{self.min_arch or ''}..{self.max_arch or ''}")
        if self.features:
            parts.append("+".join(sorted(self.features)))
        return " ".join(parts) or "any"


@dataclass
class KernelSpec:
    op: str
    name: str
    solution: str
    capability: Capability
    formats: tuple[dict[str, frozenset[str]], ...]
    traits: dict[str, TraitMatcher]
    priority: int
    tags: frozenset[str]
    impl: Callable[..., Any] | str
    weight_preprocessor: Callable[..., Any] | str | None = None
    source: str = "core"
    #: False for kernels that compile but have never been run on real hardware.
    hardware_validated: bool = True
    doc: str = ""
    #: size name -> the sizes the kernel supports (a call outside is not offered to it).
    sizes: dict[str, Range] = field(default_factory=dict)
    #: True for a thin wrapper of an external library users would call instead:
    #: bench also reports it as the peer (every kernel's time relative to it).
    peer: bool = False
    _resolved: Callable[..., Any] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def band(self) -> str:
        return Priority.band_of(self.priority)

    def resolve(self) -> Callable[..., Any]:
        """The implementation, importing a lazy ``"module:attr"`` on first use."""
        fn = self._resolved
        if fn is None:
            with self._lock:
                fn = self._resolved
                if fn is None:
                    fn = _load_attr(self.impl, what=f"kernel {self.name!r}")
                    self._resolved = fn
        return fn

    def resolve_weight_preprocessor(self) -> Callable[..., Any] | None:
        if self.weight_preprocessor is None:
            return None
        return _load_attr(self.weight_preprocessor, what=f"weight preprocessor of {self.name!r}")

    def format_reject_reason(self, signature: tuple[str, ...], roles: tuple[str, ...]) -> str | None:
        for alt in self.formats:
            if all(fmt in alt[role] for role, fmt in zip(roles, signature, strict=True)):
                return None
        got = ", ".join(f"{r}={f}" for r, f in zip(roles, signature, strict=True))
        return f"formats {got} not supported (supports {self.describe_formats()})"

    def size_reject_reason(self, buckets: Mapping[str, int] | None) -> str | None:
        """Why a call of these size buckets is outside the kernel's declared sizes (None: it is not)."""
        if not self.sizes or buckets is None:
            return None
        bad = []
        for name, rng in self.sizes.items():
            lo, hi = bucket_range(buckets[name])
            if lo < rng.lo or hi > rng.hi:
                bad.append(f"{name}={describe_bucket(buckets[name])} (supports {rng.lo}..{rng.hi})")
        return ("size " + "; ".join(bad)) if bad else None

    @property
    def weight_layout(self) -> str:
        """The MoE weight layout the kernel takes: its preprocessor's, else ``"canonical"``
        if it takes canonical weights, else the layout it declares."""
        matcher = self.traits.get("layout")
        if matcher is None or matcher.everything or "canonical" in matcher:
            return "canonical" if self.weight_preprocessor is None else _single(matcher, self.name)
        return _single(matcher, self.name)

    def trait_reject_reason(self, traits: Mapping[str, object]) -> str | None:
        bad = [f"{k}={v!r} (supports {self.traits[k]!r})" for k, v in traits.items() if v not in self.traits[k]]
        return ("trait " + "; ".join(bad)) if bad else None

    def describe_formats(self) -> str:
        return " or ".join(
            "{" + ", ".join(f"{r}: {'|'.join(sorted(fs))}" for r, fs in alt.items()) + "}" for alt in self.formats
        )

    def describe_traits(self) -> str:
        return ", ".join(f"{k}={m!r}" for k, m in self.traits.items())


def _single(matcher: TraitMatcher, kernel: str) -> str:
    values = sorted(matcher.values) if not matcher.everything else []
    if len(values) != 1:
        raise ValueError(f"kernel {kernel!r}: expected one weight layout, declares {matcher!r}")
    return values[0]


def _load_attr(target: Callable[..., Any] | str, *, what: str) -> Callable[..., Any]:
    if callable(target):
        return target
    module, sep, attr = target.partition(":")
    if not sep:
        raise ValueError(f"{what}: lazy implementation {target!r} must be 'module:attr'")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


_current_source: contextvars.ContextVar[str] = contextvars.ContextVar("tokenspeed_kernel_source", default="core")


class KernelRegistry:
    """All registered kernels, by name and by op. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._by_name: dict[str, KernelSpec] = {}
        self._by_op: dict[str, tuple[KernelSpec, ...]] = {}
        self._listeners: list[Callable[[], None]] = []
        self.generation = 0

    def add_listener(self, fn: Callable[[], None]) -> None:
        self._listeners.append(fn)

    def _changed(self) -> None:
        self.generation += 1
        for fn in self._listeners:
            fn()

    def register(self, spec: KernelSpec, *, replace: bool = False) -> KernelSpec:
        with self._lock:
            old = self._by_name.get(spec.name)
            if old is not None and not replace:
                raise ValueError(
                    f"name: kernel {spec.name!r} is already registered (by {old.source}); pass replace=True to replace it"
                )
            if spec.name in self.solutions() - {spec.solution}:
                raise ValueError(f"name: kernel name {spec.name!r} collides with a solution name")
            if old is not None:
                self._remove(old)
            self._by_name[spec.name] = spec
            self._by_op[spec.op] = (*self._by_op.get(spec.op, ()), spec)
            self._changed()
        return spec

    def _remove(self, spec: KernelSpec) -> None:
        del self._by_name[spec.name]
        self._by_op[spec.op] = tuple(s for s in self._by_op[spec.op] if s.name != spec.name)

    def unregister(self, name: str) -> KernelSpec:
        with self._lock:
            spec = self._by_name.get(name)
            if spec is None:
                raise KeyError(f"name: no kernel named {name!r}")
            self._remove(spec)
            self._changed()
            return spec

    def get(self, name: str) -> KernelSpec | None:
        return self._by_name.get(name)

    def for_op(self, op: str) -> tuple[KernelSpec, ...]:
        return self._by_op.get(op, ())

    def all(self) -> list[KernelSpec]:
        return list(self._by_name.values())

    def solutions(self) -> set[str]:
        return {s.solution for s in self._by_name.values()}


registry = KernelRegistry()


def register_kernel(
    op: str,
    *,
    name: str,
    solution: str,
    formats: Iterable[Mapping[str, str | Iterable[str]]],
    traits: Mapping[str, object] | None = None,
    capability: Capability | None = None,
    priority: int = Priority.PORTABLE,
    tags: Iterable[str] = (),
    impl: Callable[..., Any] | str | None = None,
    weight_preprocessor: Callable[..., Any] | str | None = None,
    hardware_validated: bool = True,
    sizes: Mapping[str, Range] | None = None,
    peer: bool = False,
    replace: bool = False,
    doc: str = "",
) -> Any:
    """Register a kernel for ``op``.

    With ``impl`` given (a callable or a lazy ``"module:attr"`` string) the spec is
    registered at once and returned; without it, this is a decorator that
    registers the decorated function and returns it unchanged.

    ``sizes`` limits the call sizes the kernel is offered (``{"m": Range(1, 63)}``);
    ranges cover whole power-of-two buckets (``lo`` 0 or a power of two, ``hi + 1``
    a power of two), since selection decides per bucket. A MoE kernel with a
    ``weight_preprocessor`` takes only weights in its own layout: the ``layout``
    trait (default: the kernel's name).
    """

    def _do(fn: Callable[..., Any] | str) -> KernelSpec:
        contract = get_contract(op)
        declared = dict(traits or {})
        if weight_preprocessor is not None:
            # A kernel with its own weight layout takes weights converted to it only.
            if "layout" not in contract.traits:
                raise ValueError(f"weight_preprocessor: op {op!r} takes no preprocessed weights")
            layout = declared.setdefault("layout", name)
            if not isinstance(layout, str) or layout == "canonical":
                raise ValueError(
                    f"kernel {name!r}: a weight preprocessor writes its own layout: declare layout='<name>' "
                    f"(one string, not 'canonical'), got {layout!r}"
                )
        if not name or not isinstance(name, str):
            raise ValueError("name: a kernel needs a non-empty string name")
        if not solution or not isinstance(solution, str):
            raise ValueError(f"solution: kernel {name!r} needs a non-empty solution name")
        unknown_tags = set(tags) - KNOWN_TAGS
        if unknown_tags:
            raise ValueError(
                f"tags: kernel {name!r} has unknown tag(s) {sorted(unknown_tags)}; known: {sorted(KNOWN_TAGS)}"
            )
        if not isinstance(priority, int):
            raise TypeError(f"priority: kernel {name!r} needs an int priority (a Priority band + offset)")
        spec = KernelSpec(
            op=op,
            name=name,
            solution=solution,
            capability=capability or Capability(),
            formats=contract.build_formats(formats, kernel=name),
            traits=contract.build_matchers(declared, kernel=name),
            priority=int(priority),
            tags=frozenset(tags),
            impl=fn,
            weight_preprocessor=weight_preprocessor,
            source=_current_source.get(),
            hardware_validated=hardware_validated,
            doc=doc or (getattr(fn, "__doc__", None) or "").strip().split("\n")[0],
            sizes=contract.build_size_ranges(sizes or {}, kernel=name),
            peer=bool(peer),
        )
        return registry.register(spec, replace=replace)

    if impl is not None:
        return _do(impl)

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        _do(fn)
        return fn

    return decorator


def unregister_kernel(name: str) -> KernelSpec:
    return registry.unregister(name)

"""Kernel selection: filter, rank, cache, explain, obey overrides.

``select_kernel`` filters an op's registered kernels by capability, format
signature and traits, ranks the survivors (measured oracle if any, then the
objective's tag, then priority, then name), caches the decision by everything
that can change it, and returns the implementation.

Overrides, strongest first:

1. per call: ``solution="triton"`` or ``override="triton.rmsnorm"``;
2. :func:`kernel_override` (a ``contextvars`` context manager, thread/task local);
3. ``TOKENSPEED_KERNEL_OVERRIDE``: ``"triton"`` (every op) or
   ``"rmsnorm=reference,mha_prefill=fa3.mha_prefill"``;
4. a TOML file named by ``TOKENSPEED_KERNEL_CONFIG``::

       [override]
       "*" = "triton"          # every op
       rmsnorm = "reference"

A target is a kernel name or a solution name; a tuple/list (or ``a|b`` in the env
var and the file) tries each in order. An override that no eligible kernel
satisfies raises :class:`OverrideError` with every candidate's reason; it never
falls back silently. Environment and file are read once; call
:func:`reload_settings` after changing them at run time.

Measured ranking: an oracle installed with :func:`set_selection_oracle` scores
candidates (lower is better; scored ones rank first). Without one,
``TOKENSPEED_KERNEL_ORACLE=table.json[,more.json]`` names measured tables
(:mod:`tokenspeed_kernel.benchmark.oracle`; ``default`` = the shipped ones), unset
means the table shipped for the platform's device if there is one (NVIDIA H200),
and ``none`` turns measured ranking off. Oracles run on cache misses only.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import tomllib
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .contracts import get_contract
from .platform import Platform, _fake, current_platform, platform_for_device
from .plugins import ensure_loaded
from .registry import KernelSpec, Priority, registry

__all__ = [
    "NoKernelFoundError",
    "OverrideError",
    "Candidate",
    "Selection",
    "select_kernel",
    "select_spec",
    "explain_selection",
    "format_explanation",
    "kernel_override",
    "reload_settings",
    "set_selection_oracle",
    "clear_selection_cache",
]

logger = logging.getLogger("tokenspeed_kernel.selection")

Target = str | tuple[str, ...]


@dataclass(frozen=True)
class Candidate:
    name: str
    solution: str
    priority: int
    eligible: bool
    reason: str  # why rejected, or why ranked where it is
    score: float | None = None
    rank: int | None = None
    selected: bool = False


class NoKernelFoundError(LookupError):
    """No registered kernel can run this call; ``candidates`` says why for each."""

    def __init__(self, message: str, candidates: Sequence[Candidate] = ()) -> None:
        self.candidates = list(candidates)
        lines = [message]
        lines += [f"  - {c.name} [{c.solution}]: {c.reason}" for c in self.candidates]
        if not self.candidates:
            lines.append("  (no kernel is registered for this op)")
        super().__init__("\n".join(lines))


class OverrideError(NoKernelFoundError):
    """An explicit override names no kernel that can run this call."""


@dataclass(frozen=True)
class Selection:
    spec: KernelSpec
    fn: Callable[..., Any]
    forced_by: str | None  # which override mechanism decided, if any


# ---------------------------------------------------------------------------
# Override state


def _parse_targets(raw: str) -> Target:
    parts = tuple(p.strip() for p in raw.split("|") if p.strip())
    if not parts:
        raise ValueError(f"override: empty target in {raw!r}")
    return parts[0] if len(parts) == 1 else parts


def _parse_override_string(raw: str, *, where: str) -> dict[str, Target]:
    out: dict[str, Target] = {}
    for item in (x.strip() for x in raw.split(",")):
        if not item:
            continue
        op, sep, target = item.partition("=")
        if not sep:
            op, target = "*", item
        out[op.strip()] = _parse_targets(target)
    if not out:
        raise ValueError(f"{where}: no override in {raw!r}")
    return out


#: ``oracle(spec, signature, traits, platform)`` -> a score (lower is better) or None.
Oracle = Callable[[KernelSpec, tuple[str, ...], Mapping[str, object], Platform], float | None]


@dataclass(frozen=True)
class _Settings:
    env: Mapping[str, Target]
    config: Mapping[str, Target]
    config_path: str | None
    log_selection: bool
    debug: bool
    #: the measured oracle TOKENSPEED_KERNEL_ORACLE names (or the shipped default); None when off.
    oracle: Oracle | None = None


def _load_oracle_setting() -> Oracle | None:
    raw = os.environ.get("TOKENSPEED_KERNEL_ORACLE", "").strip()
    if raw.lower() in ("none", "off", "0"):
        return None
    if not raw:
        return _shipped_oracle
    from ..benchmark.oracle import oracle_for_setting

    return oracle_for_setting([p.strip() for p in raw.split(",") if p.strip()])


def _shipped_oracle(
    spec: KernelSpec, signature: tuple[str, ...], traits: Mapping[str, object], platform: Platform
) -> float | None:
    """The measured table shipped for the platform's device, if there is one (loaded on first use)."""
    if platform.vendor == "cpu" or not platform.device_name:
        return None  # tables are shipped for named accelerators only: a CPU never loads them
    from ..benchmark.oracle import shipped_oracle

    table = shipped_oracle(platform.device_name)
    return table(spec, signature, traits, platform) if table is not None else None


def _load_settings() -> _Settings:
    env_raw = os.environ.get("TOKENSPEED_KERNEL_OVERRIDE", "").strip()
    env = _parse_override_string(env_raw, where="TOKENSPEED_KERNEL_OVERRIDE") if env_raw else {}
    path = os.environ.get("TOKENSPEED_KERNEL_CONFIG") or None
    config: dict[str, Target] = {}
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(f"TOKENSPEED_KERNEL_CONFIG: no such file {path!r}") from None
        unknown = set(data) - {"override"}
        if unknown:
            raise ValueError(
                f"TOKENSPEED_KERNEL_CONFIG {path}: unknown table(s) {sorted(unknown)}; expected [override]"
            )
        for op, target in data.get("override", {}).items():
            if isinstance(target, str):
                config[op] = _parse_targets(target)
            elif isinstance(target, list) and target and all(isinstance(t, str) for t in target):
                config[op] = tuple(target)
            else:
                raise TypeError(
                    f"TOKENSPEED_KERNEL_CONFIG {path}: override for {op!r} must be a string or list of strings"
                )
    log = os.environ.get("TOKENSPEED_KERNEL_LOG", "")
    return _Settings(
        env=env,
        config=config,
        config_path=path,
        log_selection="selection" in {x.strip() for x in log.split(",")},
        debug=os.environ.get("TOKENSPEED_KERNEL_DEBUG", "") not in ("", "0"),
        oracle=_load_oracle_setting(),
    )


_settings: _Settings | None = None
_settings_lock = threading.Lock()


def settings() -> _Settings:
    global _settings
    s = _settings
    if s is None:
        with _settings_lock:
            if _settings is None:
                _settings = _load_settings()
            s = _settings
    return s


def reload_settings() -> None:
    """Re-read the environment and the config file, and forget cached decisions."""
    global _settings
    with _settings_lock:
        _settings = _load_settings()
    clear_selection_cache()


# Context overrides: an immutable tuple of (op, target) pairs, innermost last,
# so it can sit in the cache key as it is.
_context: contextvars.ContextVar[tuple[tuple[str, Target], ...]] = contextvars.ContextVar(
    "tokenspeed_kernel_override", default=()
)


def _as_target(value: object, *, what: str) -> Target:
    if isinstance(value, str):
        return value
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TypeError(f"{what}: an override target is a kernel or solution name, or a list of them; got {value!r}")


@contextlib.contextmanager
def kernel_override(solution: Target | None = None, /, **per_op: Target) -> Iterator[None]:
    """Force kernels inside this context (thread- and task-local).

    ``kernel_override("triton")`` forces the Triton solution for every op;
    ``kernel_override(rmsnorm="reference", mha_prefill=("fa3", "triton"))``
    forces per op. Inner contexts win over outer ones.
    """
    entries: list[tuple[str, Target]] = []
    if solution is not None:
        entries.append(("*", _as_target(solution, what="kernel_override")))
    for op, target in per_op.items():
        get_contract(op)
        entries.append((op, _as_target(target, what=f"kernel_override({op}=...)")))
    token = _context.set(_context.get() + tuple(entries))
    try:
        yield
    finally:
        _context.reset(token)


def _context_target(op: str, ctx: tuple[tuple[str, Target], ...]) -> Target | None:
    for key, target in reversed(ctx):
        if key == op or key == "*":
            return target
    return None


def _mapping_target(op: str, mapping: Mapping[str, Target]) -> Target | None:
    return mapping.get(op, mapping.get("*"))


# ---------------------------------------------------------------------------
# Oracle


_oracle: Oracle | None = None


def set_selection_oracle(oracle: Oracle | None) -> None:
    """Install a measured-cost oracle: ``oracle(spec, signature, traits, platform)``
    returns an expected time (lower is better) or None when it has no measurement.

    It takes precedence over ``TOKENSPEED_KERNEL_ORACLE`` and the shipped tables;
    ``None`` removes it (they apply again)."""
    global _oracle
    _oracle = oracle
    clear_selection_cache()


# ---------------------------------------------------------------------------
# Core


_cache: dict[tuple, Selection] = {}
# The dispatch fast path keys by device (and the fake platform, if any) instead of
# the platform, so a cache hit skips platform lookup.
_device_cache: dict[tuple, Selection] = {}
_cache_lock = threading.Lock()
_warned_reference: set[str] = set()
#: Kernels whose lazy implementation raised on import: name -> error (never retried).
_broken: dict[str, str] = {}


def clear_selection_cache() -> None:
    with _cache_lock:
        _cache.clear()
        _device_cache.clear()


registry.add_listener(clear_selection_cache)


def _evaluate(
    op: str,
    signature: tuple[str, ...],
    traits: Mapping[str, object],
    platform: Platform,
    objective: str | None,
) -> list[Candidate]:
    contract = get_contract(op)
    if len(signature) != len(contract.roles):
        raise ValueError(
            f"signature: op {op!r} has format roles {contract.roles}, got {len(signature)} format(s) {signature}"
        )
    full = contract.normalize_traits(traits)
    oracle = _oracle if _oracle is not None else settings().oracle
    rows: list[tuple[tuple, Candidate]] = []
    for spec in registry.for_op(op):
        broken = _broken.get(spec.name)
        reason = (
            (f"implementation failed to load: {broken}" if broken else None)
            or spec.capability.reject_reason(platform)
            or spec.format_reject_reason(signature, contract.roles)
            or spec.trait_reject_reason(full)
        )
        if reason:
            rows.append(((2,), Candidate(spec.name, spec.solution, spec.priority, False, reason)))
            continue
        score = oracle(spec, signature, full, platform) if oracle is not None else None
        wants = objective is not None and objective in spec.tags
        key = (0 if score is not None else 1, score or 0.0, 0 if wants else 1, -spec.priority, spec.name)
        why = f"priority {spec.priority} ({spec.band})"
        if score is not None:
            why = f"measured {score:.4g}; " + why
        if wants:
            why += f"; tagged {objective}"
        rows.append((key, Candidate(spec.name, spec.solution, spec.priority, True, why, score)))
    rows.sort(key=lambda r: r[0])
    out = []
    rank = 0
    for _, cand in rows:
        if cand.eligible:
            rank += 1
            cand = Candidate(**{**cand.__dict__, "rank": rank})
        out.append(cand)
    return out


def _restrict(cands: list[Candidate], target: Target) -> tuple[list[Candidate], list[Candidate]]:
    """Split candidates into those the target allows and the others, target order first."""
    targets = (target,) if isinstance(target, str) else target
    known_solutions = registry.solutions()
    for t in targets:
        if registry.get(t) is None and t not in known_solutions:
            raise OverrideError(
                f"override: {t!r} is neither a registered kernel nor a solution "
                f"(solutions: {', '.join(sorted(known_solutions))})"
            )
    allowed: list[Candidate] = []
    for t in targets:
        allowed += [c for c in cands if (c.name == t or c.solution == t) and c not in allowed]
    others = [c for c in cands if c not in allowed]
    return allowed, others


def _decide(
    op: str,
    signature: tuple[str, ...],
    traits: Mapping[str, object],
    platform: Platform,
    objective: str | None,
    solution: Target | None,
    override: Target | None,
    ctx: tuple[tuple[str, Target], ...],
) -> tuple[list[Candidate], Candidate, str | None]:
    ensure_loaded()
    cands = _evaluate(op, signature, traits, platform, objective)
    s = settings()
    forced: tuple[str, Target] | None = None
    for where, target in (
        ("override=", override),
        ("solution=", solution),
        ("kernel_override()", _context_target(op, ctx)),
        ("TOKENSPEED_KERNEL_OVERRIDE", _mapping_target(op, s.env)),
        (f"TOKENSPEED_KERNEL_CONFIG ({s.config_path})", _mapping_target(op, s.config)),
    ):
        if target is not None:
            forced = (where, target)
            break
    pool = cands
    if forced is not None:
        where, target = forced
        allowed, _ = _restrict(cands, target)
        pool = allowed
        if not any(c.eligible for c in allowed):
            shown = allowed or cands
            raise OverrideError(
                f"{where} forces {target!r} for op {op!r} on {platform.arch}, but no such kernel can run this call "
                f"(signature {signature}, traits {dict(traits)}):",
                shown,
            )
    eligible = [c for c in pool if c.eligible]
    if not eligible:
        raise NoKernelFoundError(
            f"no kernel for op {op!r} on {platform.arch} with signature {signature} and traits {dict(traits)}:", cands
        )
    if forced is not None:
        targets = (forced[1],) if isinstance(forced[1], str) else forced[1]
        # The first target (in the caller's order) that has an eligible kernel wins.
        for t in targets:
            hit = [c for c in eligible if c.name == t or c.solution == t]
            if hit:
                return cands, hit[0], forced[0]
    return cands, eligible[0], None


def select_spec(
    op: str,
    signature: tuple[str, ...],
    traits: Mapping[str, object],
    *,
    platform: Platform | None = None,
    objective: str | None = None,
    solution: Target | None = None,
    override: Target | None = None,
) -> Selection:
    """Select (and cache) the kernel for a call; see :func:`select_kernel`."""
    plat = platform or current_platform()
    ctx = _context.get()
    if isinstance(traits, dict):
        trait_key = tuple(traits.items())
    else:
        trait_key = tuple(traits)
        traits = dict(traits)
    key = (op, signature, trait_key, plat.cache_key, objective, solution, override, ctx)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    while True:
        cands, chosen, forced_by = _decide(op, signature, traits, plat, objective, solution, override, ctx)
        spec = registry.get(chosen.name)
        assert spec is not None
        try:
            fn = spec.resolve()
            break
        except Exception as exc:  # a kernel whose library cannot load is reported and skipped
            _broken[spec.name] = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"tokenspeed_kernel: kernel {spec.name!r} failed to load and is skipped: {_broken[spec.name]}",
                RuntimeWarning,
                stacklevel=3,
            )
    selection = Selection(spec, fn, forced_by)
    with _cache_lock:
        _cache[key] = selection
    _log_decision(op, signature, traits, plat, selection, cands)
    return selection


def select_for_device(
    op: str,
    signature: tuple[str, ...],
    traits: Mapping[str, object] | tuple[tuple[str, object], ...],
    device: Any,
    solution: Target | None,
    override: Target | None,
) -> Selection:
    """The dispatch hot path: :func:`select_spec` for the platform of ``device``.

    ``traits`` may be a tuple of ``(name, value)`` pairs, which hashes without a copy.
    """
    fake = _fake.get()
    key = (
        op,
        signature,
        traits if type(traits) is tuple else tuple(traits.items()),
        device,
        fake.cache_key if fake is not None else None,
        solution,
        override,
        _context.get(),
    )
    hit = _device_cache.get(key)
    if hit is None:
        hit = select_spec(
            op, signature, dict(traits), platform=platform_for_device(device), solution=solution, override=override
        )
        with _cache_lock:
            _device_cache[key] = hit
    return hit


def select_kernel(
    op: str,
    signature: tuple[str, ...],
    traits: Mapping[str, object],
    *,
    platform: Platform | None = None,
    objective: str | None = None,
    solution: Target | None = None,
    override: Target | None = None,
) -> Callable[..., Any]:
    """The implementation of the best kernel for this call.

    ``signature``: one format string per role of the op's contract, in order.
    ``traits``: the call's traits (missing ones take the contract's defaults).
    """
    return select_spec(
        op, signature, traits, platform=platform, objective=objective, solution=solution, override=override
    ).fn


def _log_decision(op, signature, traits, plat, selection: Selection, cands) -> None:
    s = settings()
    if s.log_selection:
        others = ", ".join(
            f"{c.name}" + ("" if c.eligible else " (rejected)") for c in cands if c.name != selection.spec.name
        )
        how = f" forced by {selection.forced_by}" if selection.forced_by else ""
        logger.warning(
            "tokenspeed_kernel: %s %s %s on %s -> %s%s; others: %s",
            op,
            signature,
            dict(traits),
            plat.arch,
            selection.spec.name,
            how,
            others or "none",
        )
    if plat.vendor != "cpu" and selection.spec.priority < Priority.PORTABLE and selection.forced_by is None:
        if op not in _warned_reference:
            _warned_reference.add(op)
            warnings.warn(
                f"tokenspeed_kernel: no accelerated kernel for {op} {signature} {dict(traits)} on {plat.arch}; "
                f"using the PyTorch reference ({selection.spec.name})",
                RuntimeWarning,
                stacklevel=4,
            )


def explain_selection(
    op: str,
    signature: tuple[str, ...],
    traits: Mapping[str, object],
    *,
    platform: Platform | None = None,
    objective: str | None = None,
    solution: Target | None = None,
    override: Target | None = None,
) -> list[Candidate]:
    """Every candidate for this call: its rank and score, or the exact reason it was rejected.

    The candidate selection would pick is marked ``selected``; if the call cannot
    be served (or an override does not fit) every candidate is still returned,
    none selected, and the error is not raised.
    """
    plat = platform or current_platform()
    try:
        cands, chosen, _ = _decide(op, signature, dict(traits), plat, objective, solution, override, _context.get())
    except NoKernelFoundError as exc:
        return exc.candidates or _evaluate(op, signature, dict(traits), plat, objective)
    return [Candidate(**{**c.__dict__, "selected": c.name == chosen.name}) for c in cands]


def format_explanation(cands: Sequence[Candidate]) -> str:
    lines = []
    for c in cands:
        mark = "*" if c.selected else ("+" if c.eligible else "-")
        rank = f"#{c.rank}" if c.rank else "  "
        lines.append(f"{mark} {rank:>3} {c.name:<40} [{c.solution}] {c.reason}")
    return "\n".join(lines)

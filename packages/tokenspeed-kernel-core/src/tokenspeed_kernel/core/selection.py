"""Kernel selection: filter, rank, cache, explain, obey overrides.

``select_kernel`` filters an op's registered kernels by capability, format
signature, traits and supported sizes, ranks the survivors, caches the decision
by everything that can change it (the call's size *buckets* included: the best
``mm`` kernel at M = 1 is not the best at M = 4096), and returns the
implementation.

Ranking (fair: a plugin's kernel competes on the same terms as ours):

1. kernels with a measured score (:mod:`tokenspeed_kernel.core.measured`) are
   ordered by it, and sit together at the band of the highest-banded of them;
2. a kernel without a score ranks above them when its band is higher, below them
   otherwise; unmeasured kernels order by the objective's tag, then priority;
3. REFERENCE-band kernels (the PyTorch references) come last: the last resort.

Eager and captured calls. A measured score is device time (CUDA-graph medians):
what a call pays inside a CUDA graph. An eager call pays the slower of its host
path and its device time, and at decode sizes the host path decides (a recorded
Triton launch against ``torch.mm``'s dispatch, say). Where a table also holds
*eager* scores for the call (``bench --eager``), the call is ranked twice: by its
eager scores for eager calls, by its device scores for calls captured in a CUDA
graph. When the two rankings pick different kernels (and the op is ``rerunnable``:
running a kernel twice on a call's arguments only rewrites the outputs, so the
captured pick can run once outside the capture first; ``core/op.py``), the :class:`Selection` is the
eager pick and carries the captured one in ``captured``; the op's call takes it
while the current CUDA stream is being captured (one check, made only for such
calls). Overrides decide both. ``TOKENSPEED_KERNEL_EAGER_SCORES=0`` ranks eager
calls by device time too: one pick, so an eager call and its CUDA-graph replay
run the same kernel (bit-identical results). Selections made ahead of the call that fix a
choice for both modes (``moe_plan``: the weights' layout) take the captured pick.

Overrides, strongest first:

1. per call: ``solution="triton"`` or ``override="triton.rmsnorm"``;
2. :func:`kernel_override` (a ``contextvars`` context manager, thread/task local);
3. ``TOKENSPEED_KERNEL_OVERRIDE`` and 4. the ``TOKENSPEED_KERNEL_CONFIG`` file
   (:mod:`tokenspeed_kernel.core.settings`).

A target is a kernel name or a solution name; a tuple/list (or ``a|b`` in the env
var and the file) tries each in order. An override that no eligible kernel
satisfies raises :class:`OverrideError` with every candidate's reason; it never
falls back silently.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from . import measured
from . import settings as _settings
from .contracts import describe_bucket, get_contract, size_bucket
from .platform import Platform, _fake, current_platform, platform_for_device
from .plugins import ensure_loaded
from .registry import KernelSpec, Priority, registry
from .settings import Target

__all__ = [
    "NoKernelFoundError",
    "OverrideError",
    "Candidate",
    "Selection",
    "Target",
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
    #: the pick for a call captured in a CUDA graph, where it differs from this (the eager) pick (module doc).
    captured: Selection | None = None

    @property
    def for_graph(self) -> Selection:
        """The selection a call captured in a CUDA graph runs (ranked by device time)."""
        return self.captured or self


# ---------------------------------------------------------------------------
# Overrides


# Context overrides: an immutable tuple of (op, target) pairs, innermost last,
# so it can sit in the cache key as it is.
_context: contextvars.ContextVar[tuple[tuple[str, Target], ...]] = contextvars.ContextVar(
    "tokenspeed_kernel_override", default=()
)


def _as_target(value: object, *, what: str) -> Target:
    if isinstance(value, str) and value.strip():
        return value
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, str) and v.strip() for v in value):
        return tuple(value)
    raise TypeError(
        f"{what}: expected a kernel or solution name, or a non-empty list of them; got {value!r} "
        f"({type(value).__name__})"
    )


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
        try:
            get_contract(op)
        except ValueError as exc:
            known = str(exc).partition("known ops: ")[2]
            raise ValueError(f"kernel_override({op}=...): unknown op {op!r}; ops: {known}") from None
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
# Measured scores

#: ``oracle(op, signature, traits, buckets, platform)`` -> {kernel: score} (lower is better) or None.
Oracle = Callable[[str, tuple[str, ...], Mapping[str, object], Mapping[str, int] | None, Platform], Any]
_oracle: Oracle | None = None


def set_selection_oracle(oracle: Oracle | None) -> None:
    """Install a measured-cost oracle: a :class:`~tokenspeed_kernel.core.measured.MeasuredTable`,
    or ``oracle(op, signature, traits, buckets, platform)`` returning ``{kernel name: score}`` (lower is better; kernels it has not measured are
    absent) or None. ``buckets`` maps size names to power-of-two buckets, or is None
    when the caller gives no sizes.

    It takes precedence over ``TOKENSPEED_KERNEL_ORACLE`` and the plugins' tables;
    ``None`` removes it (they apply again)."""
    global _oracle
    _oracle = oracle
    clear_selection_cache()


_env_tables: dict[tuple[str, ...], measured.MeasuredTable] = {}


def _env_table(paths: tuple[str, ...], platform: Platform) -> list[measured.MeasuredTable]:
    out: list[measured.MeasuredTable] = []
    for p in paths:
        if p == "default":
            out += measured.tables_for_device(platform.device_name) if platform.device_name else []
            continue
        table = _env_tables.get((p,))
        if table is None:
            var = _settings.ENV["oracle"]
            try:
                table = measured.MeasuredTable.load(p)
            except FileNotFoundError:
                raise _settings.SettingsError(f"{var}: no such file {p!r}") from None
            except (ValueError, KeyError, TypeError) as exc:
                raise _settings.SettingsError(f"{var}: {p}: {exc}") from None
            _env_tables[(p,)] = table
        out.append(table)
    return out


def _scores(
    op: str,
    signature: tuple[str, ...],
    traits: Mapping[str, object],
    buckets: dict[str, int] | None,
    plat: Platform,
    eager: bool = False,
) -> tuple[Mapping[str, float], str] | None:
    """(kernel -> score, what matched), or None; ``eager``: the eager scores (None where none are measured)."""
    if _oracle is not None:
        if isinstance(_oracle, measured.MeasuredTable):
            return _oracle.lookup(op, signature, traits, buckets, plat, eager=eager)
        if eager:
            return None  # an oracle function scores one way
        got = _oracle(op, signature, traits, buckets, plat)
        return (got, "set_selection_oracle") if got else None
    if plat.vendor == "cpu":
        return None  # tables are measured on accelerators
    tables = _env_table(_settings.settings().oracle, plat)
    # A later table wins for a group both hold (TOKENSPEED_KERNEL_ORACLE's order).
    for table in reversed(tables):
        found = table.lookup(op, signature, traits, buckets, plat, eager=eager)
        if found is not None:
            return found
    return None


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


#: bumped whenever the cached selections are forgotten: caches of whole calls (the ops' own prepared calls)
#: hold it in their keys, so they forget theirs too.
generation = 0


def clear_selection_cache() -> None:
    global generation
    with _cache_lock:
        _cache.clear()
        _device_cache.clear()
        generation += 1


def reload_settings() -> None:
    """Re-read the environment and the config file, and forget cached decisions."""
    _env_tables.clear()
    _settings.reload()


registry.add_listener(clear_selection_cache)
measured._listeners.append(clear_selection_cache)
_settings._listeners.append(clear_selection_cache)


def _named_buckets(op: Any, buckets: tuple[int, ...] | None) -> dict[str, int] | None:
    if buckets is None:
        return None
    return {s.name: b for s, b in zip(op.sizes, buckets, strict=True)}


def _evaluate(
    op: str,
    signature: tuple[str, ...],
    traits: Mapping[str, object],
    buckets: tuple[int, ...] | None,
    platform: Platform,
    objective: str | None,
    eager: bool = False,
) -> list[Candidate]:
    contract = get_contract(op)
    if len(signature) != len(contract.roles):
        raise ValueError(
            f"signature: op {op!r} has format roles {contract.roles}, got {len(signature)} format(s) {signature}"
        )
    full = contract.normalize_traits(traits)
    named = _named_buckets(contract, buckets)
    # (an op that is not rerunnable never splits: its eager calls rank as captured ones; core/op.py)
    eager = eager and _settings.settings().eager_scores and getattr(contract, "rerunnable", True)
    found = (_scores(op, signature, full, named, platform, eager=True) if eager else None) or _scores(
        op, signature, full, named, platform
    )
    scores, matched = found if found is not None else ({}, "")
    eligible: list[tuple[KernelSpec, float | None]] = []
    rejected: list[Candidate] = []
    for spec in registry.for_op(op):
        broken = _broken.get(spec.name)
        reason = (
            (f"implementation failed to load: {broken}" if broken else None)
            or spec.capability.reject_reason(platform)
            or spec.format_reject_reason(signature, contract.roles)
            or spec.trait_reject_reason(full)
            or spec.size_reject_reason(named)
        )
        if reason:
            rejected.append(Candidate(spec.name, spec.solution, spec.priority, False, reason))
            continue
        score = scores.get(spec.name) if spec.priority >= Priority.PORTABLE else None
        eligible.append((spec, score))
    measured_bands = [Priority.band_value(s.priority) for s, score in eligible if score is not None]
    block = max(measured_bands) if measured_bands else None
    rows: list[tuple[tuple, Candidate]] = []
    for spec, score in eligible:
        wants = 0 if objective is not None and objective in spec.tags else 1
        band = Priority.band_value(spec.priority)
        why = f"priority {spec.priority} ({spec.band})"
        if objective is not None and not wants:
            why += f"; tagged {objective}"
        if spec.priority < Priority.PORTABLE:
            key: tuple = (3, wants, -spec.priority, spec.name)
            why += "; the last resort"
        elif score is not None:
            key = (1, score, wants, -spec.priority, spec.name)
            why = f"measured {score:.3g} ({matched}); " + why
        elif block is None:
            key = (0, wants, -spec.priority, spec.name)
        elif band > block:
            key = (0, wants, -spec.priority, spec.name)
            why += f"; not measured, above the measured kernels' {Priority.band_name(block)} band"
        else:
            key = (2, wants, -spec.priority, spec.name)
            why += f"; not measured, below the measured kernels (band {Priority.band_name(block)})"
        rows.append((key, Candidate(spec.name, spec.solution, spec.priority, True, why, score)))
    rows.sort(key=lambda r: r[0])
    out = [replace(c, rank=i + 1) for i, (_, c) in enumerate(rows)]
    return out + rejected


def _restrict(cands: list[Candidate], target: Target, where: str) -> list[Candidate]:
    """The candidates the target allows, in target order."""
    targets = (target,) if isinstance(target, str) else target
    known_solutions = registry.solutions()
    for t in targets:
        if registry.get(t) is None and t not in known_solutions:
            raise OverrideError(
                f"{where}: {t!r} is neither a registered kernel nor a solution "
                f"(solutions: {', '.join(sorted(known_solutions))}); the candidates are:",
                cands,
            )
    allowed: list[Candidate] = []
    for t in targets:
        allowed += [c for c in cands if (c.name == t or c.solution == t) and c not in allowed]
    return allowed


def _describe_call(signature, traits, buckets, contract) -> str:
    text = f"signature {signature}, traits {dict(traits)}"
    if buckets is not None and contract.sizes:
        text += ", sizes " + ", ".join(f"{s.name}={describe_bucket(b)}" for s, b in zip(contract.sizes, buckets))
    return text


def _decide(
    op: str,
    signature: tuple[str, ...],
    traits: Mapping[str, object],
    buckets: tuple[int, ...] | None,
    platform: Platform,
    objective: str | None,
    solution: Target | None,
    override: Target | None,
    ctx: tuple[tuple[str, Target], ...],
    eager: bool = False,
) -> tuple[list[Candidate], Candidate, str | None]:
    ensure_loaded()
    contract = get_contract(op)
    if solution is not None:
        solution = _as_target(solution, what="solution")
    if override is not None:
        override = _as_target(override, what="override")
    cands = _evaluate(op, signature, traits, buckets, platform, objective, eager)
    s = _settings.settings()
    forced: tuple[str, Target] | None = None
    for where, target in (
        ("override=", override),
        ("solution=", solution),
        ("kernel_override()", _context_target(op, ctx)),
        (_settings.ENV["override"], _mapping_target(op, s.env_override)),
        (f"{_settings.ENV['config']} ({s.config_path})", _mapping_target(op, s.config_override)),
    ):
        if target is not None:
            forced = (where, target)
            break
    call = _describe_call(signature, traits, buckets, contract)
    pool = cands
    if forced is not None:
        where, target = forced
        pool = _restrict(cands, target, where)
        if not any(c.eligible for c in pool):
            raise OverrideError(
                f"{where} forces {target!r} for op {op!r} on {platform.arch}, but no such kernel can run this call "
                f"({call}):",
                pool or cands,
            )
    eligible = [c for c in pool if c.eligible]
    if not eligible:
        raise NoKernelFoundError(f"no kernel for op {op!r} on {platform.arch} with {call}:", cands)
    if forced is not None:
        targets = (forced[1],) if isinstance(forced[1], str) else forced[1]
        # The first target (in the caller's order) that has an eligible kernel wins.
        for t in targets:
            hit = [c for c in eligible if c.name == t or c.solution == t]
            if hit:
                return cands, hit[0], forced[0]
    return cands, eligible[0], None


def _buckets_of(op: str, sizes: Mapping[str, int] | None) -> tuple[int, ...] | None:
    if sizes is None:
        return None
    return get_contract(op).buckets(sizes)


def select_spec(
    op: str,
    signature: tuple[str, ...],
    traits: Mapping[str, object],
    *,
    sizes: Mapping[str, int] | None = None,
    platform: Platform | None = None,
    objective: str | None = None,
    solution: Target | None = None,
    override: Target | None = None,
) -> Selection:
    """Select (and cache) the kernel for a call; see :func:`select_kernel`."""
    return _select(
        op, signature, traits, _buckets_of(op, sizes), platform or current_platform(), objective, solution, override
    )


def _select(
    op: str,
    signature: tuple[str, ...],
    traits: Mapping[str, object] | tuple,
    buckets: tuple[int, ...] | None,
    plat: Platform,
    objective: str | None,
    solution: Target | None,
    override: Target | None,
) -> Selection:
    ctx = _context.get()
    if isinstance(traits, Mapping):
        trait_key = tuple(traits.items())
    else:
        trait_key = tuple(traits)
        traits = dict(traits)
    if solution is not None and type(solution) is not str:
        solution = _as_target(solution, what="solution")
    if override is not None and type(override) is not str:
        override = _as_target(override, what="override")
    key = (op, signature, trait_key, buckets, plat.cache_key, objective, solution, override, ctx)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    args = (op, signature, traits, buckets, plat, objective, solution, override, ctx)
    cands, selection = _resolved(args, eager=False)
    if selection.forced_by is None and _eager_measured(op, signature, traits, buckets, plat):  # (overrides: both)
        eager_cands, eager = _resolved(args, eager=True)
        if eager.spec.name != selection.spec.name:
            cands, selection = eager_cands, replace(eager, captured=selection)
    with _cache_lock:
        _cache[key] = selection
    _log_decision(op, signature, traits, buckets, plat, selection, cands)
    return selection


def _eager_measured(
    op: str, signature: tuple[str, ...], traits: Mapping[str, object], buckets: tuple[int, ...] | None, plat: Platform
) -> bool:
    """Whether a table holds eager scores for this call (else eager calls rank as captured ones)."""
    contract = get_contract(op)
    full, named = contract.normalize_traits(traits), _named_buckets(contract, buckets)
    return _scores(op, signature, full, named, plat, eager=True) is not None


def _resolved(args: tuple, *, eager: bool) -> tuple[list[Candidate], Selection]:
    """The candidates and the selection ``_decide(*args)`` makes, its kernel loaded (kernels that fail to load are
    reported once and skipped)."""
    while True:
        cands, chosen, forced_by = _decide(*args, eager=eager)
        spec = registry.get(chosen.name)
        assert spec is not None
        try:
            return cands, Selection(spec, spec.resolve(), forced_by)
        except Exception as exc:  # a kernel whose library cannot load is reported and skipped
            _broken[spec.name] = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"tokenspeed_kernel: kernel {spec.name!r} failed to load and is skipped: {_broken[spec.name]}",
                RuntimeWarning,
                stacklevel=5,
            )


def select_for_device(
    op: str,
    signature: tuple[str, ...],
    traits: Mapping[str, object] | tuple[tuple[str, object], ...],
    sizes: tuple[int, ...],
    device: Any,
    solution: Target | None,
    override: Target | None,
) -> Selection:
    """The dispatch hot path: the selection for a call on ``device``.

    ``traits`` may be a tuple of ``(name, value)`` pairs, which hashes without a copy;
    ``sizes`` are the call's sizes (bucketed here).
    """
    fake = _fake.get()
    buckets = (sizes[0].bit_length(),) if len(sizes) == 1 else tuple(size_bucket(n) for n in sizes)
    key = (
        op,
        signature,
        traits if type(traits) is tuple else tuple(traits.items()),
        buckets,
        device,
        fake.cache_key if fake is not None else None,
        solution,
        override,
        _context.get(),
    )
    try:
        hit = _device_cache.get(key)
    except TypeError:
        hit = None  # an unhashable target (a list): _select normalises it or names it
    if hit is None:
        hit = _select(op, signature, traits, buckets, platform_for_device(device), None, solution, override)
        try:
            with _cache_lock:
                _device_cache[key] = hit
        except TypeError:
            pass
    return hit


def select_kernel(
    op: str,
    signature: tuple[str, ...],
    traits: Mapping[str, object],
    *,
    sizes: Mapping[str, int] | None = None,
    platform: Platform | None = None,
    objective: str | None = None,
    solution: Target | None = None,
    override: Target | None = None,
) -> Callable[..., Any]:
    """The implementation of the best kernel for this call.

    ``signature``: one format string per role of the op's contract, in order.
    ``traits``: the call's traits (missing ones take the contract's defaults).
    ``sizes``: the call's sizes by name (the contract's ``sizes``), or None when
    unknown (ranked by measurements over every size).
    """
    return select_spec(
        op, signature, traits, sizes=sizes, platform=platform, objective=objective, solution=solution, override=override
    ).fn


def _log_decision(op, signature, traits, buckets, plat, selection: Selection, cands) -> None:
    s = _settings.settings()
    if s.log_selection:
        others = ", ".join(
            f"{c.name}" + ("" if c.eligible else " (rejected)") for c in cands if c.name != selection.spec.name
        )
        how = f" forced by {selection.forced_by}" if selection.forced_by else ""
        if selection.captured is not None:
            how += f" (eager; {selection.captured.spec.name} when captured in a CUDA graph)"
        logger.warning(
            "tokenspeed_kernel: %s %s on %s -> %s%s; others: %s",
            op,
            _describe_call(signature, traits, buckets, get_contract(op)),
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
                stacklevel=5,
            )


def explain_selection(
    op: str,
    signature: tuple[str, ...],
    traits: Mapping[str, object],
    *,
    sizes: Mapping[str, int] | None = None,
    platform: Platform | None = None,
    objective: str | None = None,
    solution: Target | None = None,
    override: Target | None = None,
    captured: bool = False,
) -> list[Candidate]:
    """Every candidate for this call: its rank and score, or the exact reason it was rejected.

    The candidate selection would pick is marked ``selected``; if the call cannot
    be served (or an override does not fit) every candidate is still returned,
    none selected, and the error is not raised. Ranked as for an eager call (eager
    scores where measured), or with ``captured=True`` as for a call captured in a
    CUDA graph (device time; module doc, "Eager and captured calls").
    """
    plat = platform or current_platform()
    buckets = _buckets_of(op, sizes)
    eager = not captured
    try:
        cands, chosen, _ = _decide(
            op, signature, dict(traits), buckets, plat, objective, solution, override, _context.get(), eager=eager
        )
    except NoKernelFoundError as exc:
        return exc.candidates or _evaluate(op, signature, dict(traits), buckets, plat, objective, eager)
    return [replace(c, selected=c.name == chosen.name) for c in cands]


def format_explanation(cands: Sequence[Candidate]) -> str:
    lines = []
    for c in cands:
        mark = "*" if c.selected else ("+" if c.eligible else "-")
        rank = f"#{c.rank}" if c.rank else "  "
        lines.append(f"{mark} {rank:>3} {c.name:<40} [{c.solution}] {c.reason}")
    return "\n".join(lines)

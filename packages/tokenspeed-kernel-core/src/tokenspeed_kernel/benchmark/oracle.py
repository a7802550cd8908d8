"""A measured selection oracle: rank kernels by the times ``bench`` measured.

Selection ranks the eligible kernels of a call by (measured score if any, objective
tag, priority, name). :class:`MeasuredOracle` supplies the measured score from bench
JSON reports (``tokenspeed-kernel bench --json``):

- Each case of a report is turned back into the call the public op makes for it
  (the shared case generators, on fake tensors: no memory is allocated), and the
  call's format signature and traits are read at dispatch, exactly as selection
  sees them; ops whose cases adapt the call per kernel (MoE weights converted to a
  kernel's layout) are read per kernel.
- A case's time for a kernel is its CUDA-graph median when every kernel of the case
  has one (it excludes host overhead), else its plain median. Peers are ignored.
- Cases are grouped by (arch, device, op, signature, traits). A group's score for a
  kernel is the geometric mean over the group's cases of its time over the fastest
  time in that case, among the kernels measured in every case of the group: 1.0 is
  "always fastest", 1.3 "30 % slower on average". A group with fewer than two such
  kernels says nothing about ranking and is dropped. The same case measured twice
  (same device) counts once: the CUDA-graph measurement, else the newer one.

The oracle answers for a (kernel, signature, traits, platform) whose group it
holds, preferring the platform's own device over other devices of the same arch,
and None otherwise; a kernel without a score ranks after every kernel with one,
so re-measure after adding a kernel. Tables are small JSON files
(:meth:`MeasuredOracle.save`, :meth:`MeasuredOracle.load`) that record their
source reports and dates.

Activation (read by :mod:`tokenspeed_kernel.core.selection` with its other settings):

- ``TOKENSPEED_KERNEL_ORACLE=table.json[,more.json]``: these tables (a later table
  wins for a group both hold); ``default`` names the tables shipped in
  ``tokenspeed_kernel/data`` (then used on any device of their arch);
- unset: the shipped table of the platform's device, when its device name
  contains a key of :data:`SHIPPED_TABLES` (``NVIDIA H200``: ``oracle_h200.json``);
- ``none``: no measured oracle (priority and tags only).

:func:`tokenspeed_kernel.set_selection_oracle` installs an oracle that takes
precedence over all of these. Build a table with
``tokenspeed-kernel oracle build REPORT.json... -o table.json`` or
``tokenspeed-kernel bench ... --oracle-out table.json``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import math
import os
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

__all__ = [
    "MeasuredOracle",
    "OracleEntry",
    "SHIPPED_TABLES",
    "call_signature",
    "oracle_for_setting",
    "shipped_oracle",
]

SCHEMA = 1
KIND = "tokenspeed-kernel-oracle"

#: Device-name substring -> the table shipped in ``tokenspeed_kernel/data`` for it.
SHIPPED_TABLES: dict[str, str] = {"H200": "oracle_h200.json"}

_TraitKey = tuple[tuple[str, Any], ...]


def _trait_key(traits: Mapping[str, Any]) -> _TraitKey:
    return tuple(sorted(traits.items()))


@dataclass(frozen=True)
class OracleEntry:
    """The scores of one (arch, device, op, signature, traits) group."""

    arch: str
    device: str
    op: str
    signature: tuple[str, ...]
    traits: dict[str, Any]
    #: kernel name -> geometric mean of its time over the case's fastest (>= 1.0).
    scores: dict[str, float]
    cases: int
    #: ``graph`` (CUDA-graph medians), ``events``/``wall-clock`` (plain medians) or ``mixed``.
    timing: str

    def to_json(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "device": self.device,
            "op": self.op,
            "signature": list(self.signature),
            "traits": dict(self.traits),
            "cases": self.cases,
            "timing": self.timing,
            "scores": dict(sorted(self.scores.items(), key=lambda kv: (kv[1], kv[0]))),
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> OracleEntry:
        return OracleEntry(
            arch=str(data["arch"]),
            device=str(data.get("device", "")),
            op=str(data["op"]),
            signature=tuple(data["signature"]),
            traits=dict(data["traits"]),
            scores={str(k): float(v) for k, v in data["scores"].items()},
            cases=int(data.get("cases", 0)),
            timing=str(data.get("timing", "")),
        )


@dataclass
class MeasuredOracle:
    """Measured scores per (arch, op, signature, traits); callable as a selection oracle.

    ``oracle(spec, signature, traits, platform)`` returns the kernel's score (lower
    is better, 1.0 = fastest in every measured case) or None without data.
    """

    entries: list[OracleEntry] = field(default_factory=list)
    #: the reports the table was built from: path, device, arch, date, cases used.
    sources: list[dict[str, Any]] = field(default_factory=list)
    created: str = ""
    #: what the build left out and why (failed cases, groups with one kernel, ...).
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # (arch, op, signature, traits) -> the groups of every measured device, in table order.
        self._index: dict[tuple[str, str, tuple[str, ...], _TraitKey], list[OracleEntry]] = {}
        for e in self.entries:
            self._index.setdefault((e.arch, e.op, e.signature, _trait_key(e.traits)), []).append(e)

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, op: str, signature: Sequence[str], traits: Mapping[str, Any], platform: Any) -> OracleEntry | None:
        """The group a call falls in on ``platform`` (its device's own if measured), or None.

        ``traits`` must be complete (the contract's defaults filled in), as selection passes them.
        """
        found = self._index.get((platform.arch, op, tuple(signature), _trait_key(traits)))
        if not found:
            return None
        name = getattr(platform, "device_name", "")
        return next((e for e in found if e.device == name), found[0])

    def __call__(self, spec: Any, signature: tuple[str, ...], traits: Mapping[str, Any], platform: Any) -> float | None:
        entry = self.lookup(spec.op, signature, traits, platform)
        return entry.scores.get(spec.name) if entry is not None else None

    # -- persistence ---------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "kind": KIND,
            "created": self.created,
            "sources": list(self.sources),
            "notes": list(self.notes),
            "entries": [e.to_json() for e in self.entries],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, where: str = "oracle table") -> MeasuredOracle:
        """A table from its JSON form. Traits are completed with the ops' current defaults;
        an entry naming an unknown op or trait is left out (and noted)."""
        if not isinstance(data, Mapping) or data.get("kind") != KIND or data.get("schema") != SCHEMA:
            got = (
                f"kind {data.get('kind')!r}, schema {data.get('schema')!r}"
                if isinstance(data, Mapping)
                else "not a JSON object"
            )
            raise ValueError(
                f"{where}: not a TokenSpeed-kernel oracle table (expected kind {KIND!r}, schema {SCHEMA}; got {got})"
            )
        from ..core.contracts import get_contract

        entries, notes = [], list(data.get("notes", []))
        for raw in data.get("entries", []):
            entry = OracleEntry.from_json(raw)
            try:
                traits = get_contract(entry.op).normalize_traits(entry.traits)
            except (KeyError, ValueError, TypeError) as exc:
                notes.append(f"{where}: entry {entry.op} {entry.signature} left out: {exc}")
                continue
            entries.append(OracleEntry(**{**entry.__dict__, "traits": traits}))
        return cls(entries, sources=list(data.get("sources", [])), created=str(data.get("created", "")), notes=notes)

    def save(self, path: str | os.PathLike) -> None:
        """Write the table as JSON."""
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> MeasuredOracle:
        """Read a table written by :meth:`save`."""
        with open(path) as f:
            data = json.load(f)
        return cls.from_json(data, where=str(path))

    @classmethod
    def merge(cls, oracles: Iterable[MeasuredOracle]) -> MeasuredOracle:
        """One table from several; for a group two tables hold (same device), the later one wins."""
        by_group: dict[tuple, OracleEntry] = {}
        sources: list[dict[str, Any]] = []
        notes: list[str] = []
        for o in oracles:
            for e in o.entries:
                by_group[(e.arch, e.device, e.op, e.signature, _trait_key(e.traits))] = e
            sources += o.sources
            notes += o.notes
        return cls(list(by_group.values()), sources=sources, created=time.strftime("%Y-%m-%d %H:%M:%S %Z"), notes=notes)

    # -- building ------------------------------------------------------------

    @classmethod
    def from_reports(cls, reports: Iterable[str | os.PathLike | Mapping[str, Any]]) -> MeasuredOracle:
        """Build a table from bench reports (paths to ``bench --json`` files or their parsed JSON).

        Runs on any machine (the calls are rebuilt on fake CPU tensors); kernels of
        ops that convert weights per kernel must be registered here to be read.
        """
        measured: dict[tuple, _Measurement] = {}
        sources: list[dict[str, Any]] = []
        notes: list[str] = []
        for i, report in enumerate(reports):
            if isinstance(report, Mapping):
                data, where = report, f"report #{i + 1}"
            else:
                where = os.fspath(report)
                with open(report) as f:
                    data = json.load(f)
            sources.append(_read_report(data, where, measured, notes))
        # Rebuilding calls costs more than reading, so only the measurements kept are rebuilt.
        for m in measured.values():
            m.calls, skipped = _calls_for_case(m.case, list(m.times), _platform(m.arch, m.device), m.seed)
            for name, why in skipped.items():
                notes.append(f"{m.what}: {name} left out ({why})")
                m.times.pop(name)
        entries = _aggregate(measured.values(), notes)
        for s in sources:
            s["cases_used"] = sum(1 for m in measured.values() if m.source == s["path"])
        return cls(entries, sources=sources, created=time.strftime("%Y-%m-%d %H:%M:%S %Z"), notes=notes)

    def describe(self) -> str:
        """A human-readable listing: one block per group, kernels best first."""
        lines = [f"oracle table: {len(self.entries)} group(s), created {self.created or '?'}"]
        for s in self.sources:
            lines.append(
                f"  source {s.get('path')}: {s.get('device') or s.get('arch')} {s.get('date', '')}"
                f" ({s.get('cases_used', '?')} case(s) used)"
            )
        for e in sorted(self.entries, key=lambda e: (e.arch, e.device, e.op, e.signature, _trait_key(e.traits))):
            traits = ", ".join(f"{k}={v}" for k, v in e.traits.items())
            lines.append(f"{e.device or e.arch} {e.op} {'/'.join(e.signature)} {{{traits}}}")
            lines.append(f"  {e.cases} case(s), {e.timing} timing")
            for name, score in sorted(e.scores.items(), key=lambda kv: (kv[1], kv[0])):
                lines.append(f"    {score:7.3f}  {name}")
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# Reading reports


@dataclass
class _Measurement:
    """One case of one report: every kernel's time and its call's (signature, traits)."""

    arch: str
    device: str
    case: Any
    times: dict[str, float]  # kernel -> microseconds
    timing: str
    source: str
    date: str
    seed: int
    what: str  # how notes name the case
    calls: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = field(default_factory=dict)  # kernel -> call

    @property
    def op(self) -> str:
        return self.case.op


def _device_of(info: Mapping[str, Any]) -> tuple[str, str]:
    arch = info.get("arch")
    if not arch:
        raise ValueError("the report names no device arch")
    name = info.get("name") or str(info.get("platform", "")).split(" (")[0]
    return str(arch), "" if name == arch else str(name)


def _read_report(data: Mapping[str, Any], where: str, measured: dict, notes: list[str]) -> dict[str, Any]:
    if not isinstance(data, Mapping) or "results" not in data or "device" not in data or data.get("schema") != 1:
        raise ValueError(f"{where}: not a bench report (expected schema 1 with 'device' and 'results')")
    arch, device = _device_of(data["device"])
    date = str(data["device"].get("date", ""))
    seed = int(data.get("settings", {}).get("seed", 0))
    from ..numerics.cases import Case

    for r in data["results"]:
        case = Case.from_json(r["case"])
        what = f"{where}: {r['op']} {r.get('label') or case.describe()}"
        if r.get("error"):
            notes.append(f"{what}: left out ({r['error']})")
            continue
        kernels = [
            e
            for e in r.get("entries", [])
            if e.get("kind") == "kernel" and e.get("status") == "ok" and e.get("median_us")
        ]
        if not kernels:
            continue
        graph = all(e.get("graph_median_us") for e in kernels)
        times = {e["name"]: float(e["graph_median_us"] if graph else e["median_us"]) for e in kernels}
        timing = "graph" if graph else _timing_name(kernels)
        m = _Measurement(arch, device, case, times, timing, where, date, seed, what)
        key = (arch, device, case.op, case.dtype, case.params)
        old = measured.get(key)
        if old is None or (m.timing == "graph", m.date) >= (old.timing == "graph", old.date):
            measured[key] = m
    graph_run = bool(data.get("settings", {}).get("graph"))
    return {"path": where, "device": device, "arch": arch, "date": date, "graph": graph_run}


def _timing_name(kernels: list[Mapping[str, Any]]) -> str:
    methods = {e.get("method") or "" for e in kernels}
    if methods == {"cuda-events"}:
        return "events"
    return methods.pop() if len(methods) == 1 else "mixed"


def _platform(arch: str, device: str) -> Any:
    from ..core.platform import make_platform

    try:
        return make_platform(arch, device_name=device)
    except ValueError:
        return None


def _aggregate(measurements: Iterable[_Measurement], notes: list[str]) -> list[OracleEntry]:
    # group -> list of cases, each {kernel: time}
    groups: dict[tuple, list[tuple[dict[str, float], str]]] = {}
    traits_of: dict[tuple, dict[str, Any]] = {}
    for m in measurements:
        per_group: dict[tuple, dict[str, float]] = {}
        for name, t in m.times.items():
            sig, traits = m.calls[name]
            key = (m.arch, m.device, m.op, sig, _trait_key(traits))
            traits_of[key] = traits
            per_group.setdefault(key, {})[name] = t
        for key, times in per_group.items():
            groups.setdefault(key, []).append((times, m.timing))
    out: list[OracleEntry] = []
    for key, cases in groups.items():
        arch, device, op, sig, _ = key
        common = set(cases[0][0])
        for times, _ in cases[1:]:
            common &= set(times)
        if len(common) < 2:
            notes.append(
                f"{device or arch} {op} {'/'.join(sig)} {traits_of[key]}: no ranking "
                f"(kernels measured in all {len(cases)} case(s): {sorted(common) or 'none'})"
            )
            continue
        logs = dict.fromkeys(common, 0.0)
        for times, _ in cases:
            best = min(times[k] for k in common)
            for k in common:
                logs[k] += math.log(times[k] / best)
        scores = {k: round(math.exp(v / len(cases)), 6) for k, v in logs.items()}  # as saved
        timings = {t for _, t in cases}
        timing = timings.pop() if len(timings) == 1 else "mixed"
        out.append(OracleEntry(arch, device, op, sig, traits_of[key], scores, len(cases), timing))
    return out


# ---------------------------------------------------------------------------
# From a case to the call's (signature, traits)


class _Dispatched(Exception):
    """Raised by the capture hook at the op's dispatch, so no kernel runs."""


_capture: contextvars.ContextVar[list | None] = contextvars.ContextVar("tokenspeed_oracle_capture", default=None)


def _hook(op: str, signature: tuple, traits: Any, args: tuple, kwargs: dict) -> None:
    box = _capture.get()
    # Dispatches of other threads, and of sub-ops before the op itself, pass through.
    if box is None or op != box[0]:
        return
    box.append((tuple(signature), dict(traits)))
    raise _Dispatched


@contextlib.contextmanager
def _capturing(op: str) -> Iterator[list]:
    from ..core.profiling import add_dispatch_hook, remove_dispatch_hook

    box: list = [op]
    token = _capture.set(box)
    add_dispatch_hook(_hook)
    try:
        yield box
    finally:
        remove_dispatch_hook(_hook)
        _capture.reset(token)


def _fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    # A shape environment lets data-dependent ops (bincount in the MoE generators) return fake sizes.
    return FakeTensorMode(shape_env=ShapeEnv())


def call_signature(
    case: Any, *, spec: Any = None, platform: Any = None, seed: int = 0
) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The (format signature, complete traits) the public op dispatches for ``case``.

    Args:
        case: a :class:`~tokenspeed_kernel.numerics.cases.Case` (e.g. from a bench report).
        spec: the kernel the call is made for, for ops whose cases adapt the call per
            kernel (MoE weights in a kernel's layout); None for the op's own call.
        platform: the platform to select on for such an adapted call (the measured one).
        seed: the input seed (signatures and traits do not depend on it).

    The inputs are built by the op's shared case generators on fake tensors (no
    memory is allocated, whatever the case's size) and the op runs up to its
    dispatch, where the signature and traits are read; no kernel runs.
    """
    import torch

    from ..core.contracts import get_contract
    from ..core.platform import fake_platform
    from ..numerics.cases import get_op_cases
    from ..numerics.inputs import make_generator

    oc = get_op_cases(case.op)
    dev = torch.device("cpu")
    with contextlib.ExitStack() as stack:
        stack.enter_context(_fake_mode())
        call = oc.make(case, dev, make_generator(dev, case.seed(seed)))
        adapted = oc.for_kernel(dict(call), spec) if spec is not None else None
        if adapted is None:
            # The op's own call; the reference (eligible everywhere) is selected and never run.
            kwargs = {**call, "solution": "reference"}
        else:
            # The call as bench made it for this kernel, selected as on the measured platform.
            kwargs = adapted
            if platform is not None:
                stack.enter_context(fake_platform(platform))
        with _capturing(case.op) as box:
            try:
                oc.fn(**kwargs)
            except _Dispatched:
                pass
    if len(box) < 2:
        raise RuntimeError(f"the public op {case.op} dispatched no {case.op} call")
    sig, traits = box[1]
    return sig, get_contract(case.op).normalize_traits(traits)


def _calls_for_case(
    case: Any, kernels: list[str], platform: Any, seed: int
) -> tuple[dict[str, tuple[tuple[str, ...], dict]], dict[str, str]]:
    from ..core.registry import registry
    from ..numerics.cases import get_op_cases

    oc = get_op_cases(case.op)
    calls: dict[str, tuple[tuple[str, ...], dict]] = {}
    skipped: dict[str, str] = {}
    plain: tuple | str | None = None  # the op's own call, or why it could not be rebuilt
    for name in kernels:
        if oc.for_kernel is not None:
            # The call may be adapted to the kernel (its weight layout): rebuild it per kernel.
            spec = registry.get(name)
            if spec is None:
                skipped[name] = "not registered here, so its call for this op cannot be rebuilt"
                continue
            try:
                calls[name] = call_signature(case, spec=spec, platform=platform, seed=seed)
            except Exception as exc:
                skipped[name] = f"its call could not be rebuilt: {_short(exc)}"
            continue
        if plain is None:
            try:
                plain = call_signature(case, seed=seed)
            except Exception as exc:
                plain = f"its call could not be rebuilt: {_short(exc)}"
        if isinstance(plain, str):
            skipped[name] = plain
        else:
            calls[name] = plain
    return calls, skipped


def _short(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"


# ---------------------------------------------------------------------------
# Activation (used by tokenspeed_kernel.core.selection)


@functools.cache
def _shipped_table(filename: str) -> MeasuredOracle | None:
    try:
        text = resources.files("tokenspeed_kernel").joinpath("data", filename).read_text()
        return MeasuredOracle.from_json(json.loads(text), where=f"tokenspeed_kernel/data/{filename}")
    except Exception as exc:  # a broken shipped table must not break selection
        warnings.warn(
            f"tokenspeed_kernel: shipped oracle table {filename} failed to load and is not used: "
            f"{type(exc).__name__}: {exc}",
            RuntimeWarning,
            stacklevel=2,
        )
        return None


def shipped_oracle(device_name: str) -> MeasuredOracle | None:
    """The table shipped for a device whose name contains a key of :data:`SHIPPED_TABLES`, or None."""
    for key, filename in SHIPPED_TABLES.items():
        if key in device_name:
            return _shipped_table(filename)
    return None


def oracle_for_setting(paths: Sequence[str]) -> MeasuredOracle:
    """The tables ``TOKENSPEED_KERNEL_ORACLE`` names, merged (``default`` = every shipped table)."""
    tables: list[MeasuredOracle] = []
    for p in paths:
        if p == "default":
            tables += [t for t in map(_shipped_table, SHIPPED_TABLES.values()) if t is not None]
            continue
        try:
            tables.append(MeasuredOracle.load(p))
        except FileNotFoundError:
            raise FileNotFoundError(f"TOKENSPEED_KERNEL_ORACLE: no such file {p!r}") from None
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"TOKENSPEED_KERNEL_ORACLE: {p}: {exc}") from None
    return tables[0] if len(tables) == 1 else MeasuredOracle.merge(tables)

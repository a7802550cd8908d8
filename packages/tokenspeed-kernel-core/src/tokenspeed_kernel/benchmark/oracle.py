"""Build measured tables from bench reports (``tokenspeed-kernel oracle build``).

Each case of a report is turned back into the call the public op makes for it
(the shared case generators, on fake tensors: no memory is allocated) and the op
object says what selection sees for it (:meth:`Op.call_key`: format signature,
traits, sizes). A case's time for a kernel is its CUDA-graph median when every
kernel of the case has one (it excludes host overhead), else its plain median;
kernels registered with ``peer=True`` count like any kernel, external peers are
ignored. A kernel's ``eager_us`` (``bench --eager``: the public op forced to it,
calls back to back) gives the group's eager scores the same way, among the
kernels with one in every case of the group. Cases are grouped by (arch, device, op, signature, traits without the
``measured=False`` ones, size buckets); a group's score for a kernel is the
geometric mean over the group's cases of its time over the fastest time in that
case, among the kernels measured in every case of the group. A group with fewer
than two such kernels says nothing about ranking and is dropped. The same case
measured twice (same device) counts once: the CUDA-graph measurement, else the
newer one.

The result is a :class:`~tokenspeed_kernel.core.measured.MeasuredTable`; a vendor
package ships the tables of its devices and registers them from its plugin
(:func:`tokenspeed_kernel.register_measured_table`).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.contracts import get_contract, size_bucket
from ..core.measured import MeasuredEntry, MeasuredTable
from ..numerics.cases import case_call_key

__all__ = ["build_table", "call_key"]


def build_table(reports: Iterable[str | os.PathLike | Mapping[str, Any]]) -> MeasuredTable:
    """A measured table from bench reports (paths to ``bench --json`` files or their parsed JSON).

    Runs on any machine: the calls are rebuilt on fake CPU tensors.
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
    for key, m in list(measured.items()):
        try:
            m.call = call_key(m.case, seed=m.seed)
        except Exception as exc:
            notes.append(f"{m.what}: left out (its call could not be rebuilt: {_short(exc)})")
            del measured[key]
    entries = _aggregate(measured.values(), notes)
    for s in sources:
        s["cases_used"] = sum(1 for m in measured.values() if m.source == s["path"])
    return MeasuredTable(entries, sources=sources, created=time.strftime("%Y-%m-%d %H:%M:%S %Z"), notes=notes)


# ---------------------------------------------------------------------------
# Reading reports


@dataclass
class _Measurement:
    """One case of one report: every kernel's time and its call's (signature, traits)."""

    arch: str
    device: str
    case: Any
    times: dict[str, float]  # kernel -> microseconds
    eager: dict[str, float]  # kernel -> eager public-op microseconds (bench --eager), where measured
    timing: str
    source: str
    date: str
    seed: int
    what: str  # how notes name the case
    #: (signature, traits for the table, buckets) of the case's call.
    call: tuple[tuple[str, ...], dict[str, Any], dict[str, int]] | None = None

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
        eager = {e["name"]: float(e["eager_us"]) for e in kernels if e.get("eager_us")}
        timing = "graph" if graph else _timing_name(kernels)
        m = _Measurement(arch, device, case, times, eager, timing, where, date, seed, what)
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


def _aggregate(measurements: Iterable[_Measurement], notes: list[str]) -> list[MeasuredEntry]:
    groups: dict[tuple, list[tuple[dict[str, float], str, dict[str, float]]]] = {}
    keys: dict[tuple, tuple[dict[str, Any], dict[str, int]]] = {}
    for m in measurements:
        assert m.call is not None
        sig, traits, buckets = m.call
        key = (m.arch, m.device, m.op, sig, tuple(sorted(traits.items())), tuple(sorted(buckets.items())))
        keys[key] = (traits, buckets)
        groups.setdefault(key, []).append((m.times, m.timing, m.eager))
    out: list[MeasuredEntry] = []
    for key, cases in groups.items():
        arch, device, op, sig, _, _ = key
        traits, buckets = keys[key]
        scores = _scores([times for times, _, _ in cases])
        if scores is None:
            common = set.intersection(*(set(times) for times, _, _ in cases))
            notes.append(
                f"{device or arch} {op} {'/'.join(sig)} {traits} {buckets}: no ranking "
                f"(kernels measured in all {len(cases)} case(s): {sorted(common) or 'none'})"
            )
            continue
        timings = {t for _, t, _ in cases}
        timing = timings.pop() if len(timings) == 1 else "mixed"
        eager = _scores([e for _, _, e in cases]) or {}
        out.append(MeasuredEntry(arch, device, op, sig, traits, buckets, scores, len(cases), timing, eager))
    return out


def _scores(cases: list[dict[str, float]]) -> dict[str, float] | None:
    """Per kernel measured in every case: the geometric mean of its time over the case's fastest (None: < 2 such)."""
    common = set.intersection(*(set(times) for times in cases))
    if len(common) < 2:
        return None
    logs = dict.fromkeys(common, 0.0)
    for times in cases:
        best = min(times[k] for k in common)
        for k in common:
            logs[k] += math.log(times[k] / best)
    return {k: round(math.exp(v / len(cases)), 6) for k, v in logs.items()}  # as saved


# ---------------------------------------------------------------------------
# From a case to the call's (signature, traits)


def call_key(case: Any, *, seed: int = 0) -> tuple[tuple[str, ...], dict[str, Any], dict[str, int]]:
    """The key a measured table files ``case`` under: (format signature, traits without the
    ``measured=False`` ones, size buckets by name); see
    :func:`~tokenspeed_kernel.numerics.cases.case_call_key`."""
    signature, traits, sizes = case_call_key(case, seed=seed)
    return signature, get_contract(case.op).measured_traits(traits), {k: size_bucket(v) for k, v in sizes.items()}


def _short(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"

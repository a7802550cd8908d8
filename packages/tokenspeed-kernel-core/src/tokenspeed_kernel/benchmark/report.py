"""Bench outputs: raw JSON, a Markdown table per op, a PNG plot, and a terminal summary."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TextIO

from ..numerics.cases import get_op_cases
from .runner import BenchReport, CaseResult, Entry

__all__ = ["write_json", "write_markdown", "write_plot", "print_summary", "markdown", "plot_available", "PLOT_HINT"]

PLOT_HINT = "the PNG plot needs matplotlib: pip install matplotlib (or tokenspeed-kernel-core[plot])"


def plot_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def write_json(report: BenchReport, path: str) -> None:
    with open(path, "w") as f:
        json.dump(report.to_json(), f, indent=1)


def _metric(op: str) -> str:
    return get_op_cases(op).metric


def _rate(entry: Entry, metric: str) -> float | None:
    return entry.tflops if metric == "tflops" else entry.tbps


def _rate_text(value: float | None, metric: str) -> str:
    if value is None:
        return ""
    return f"{value:.1f} TFLOP/s" if metric == "tflops" else f"{value:.2f} TB/s"


def _case_name(r: CaseResult) -> str:
    name = r.description
    if r.label:
        name = f"{r.label}: {name}"
    if r.count is not None:
        name += f" (x{r.count})"
    return name


def _cell(e: Entry | None, metric: str) -> str:
    if e is None:
        return ""
    if e.status != "ok" or e.timing is None:
        return "skipped" if e.status == "skipped" else "error"
    parts = [f"{e.timing.median_us:.1f} us"]
    rate = _rate_text(_rate(e, metric), metric)
    if rate:
        parts.append(rate)
    if e.pct_ceiling is not None:
        parts.append(f"{e.pct_ceiling:.0f}%")
    if e.graph is not None:
        parts.append(f"graph {e.graph.median_us:.1f} us")
    if e.eager_us is not None:
        parts.append(f"eager {e.eager_us:.1f} us")
    return " · ".join(parts)


def _ops(report: BenchReport) -> dict[str, list[CaseResult]]:
    out: dict[str, list[CaseResult]] = {}
    for r in report.results:
        out.setdefault(r.op, []).append(r)
    return out


def _columns(results: list[CaseResult]) -> list[tuple[str, str]]:
    """(name, kind) per column; kind "peer" for external peers and for kernels registered with peer=True."""
    cols: list[tuple[str, str]] = []
    for r in results:
        for e in r.entries:
            col = (e.name, "peer" if e.peer else e.kind)
            if col not in cols:
                cols.append(col)
    return sorted(cols, key=lambda c: (c[1] == "peer", cols.index(c)))


def markdown(report: BenchReport, *, command: str | None = None) -> str:
    d, c = report.device, report.ceilings
    lines = ["# tokenspeed-kernel bench", ""]
    lines.append(f"- device: {d.get('name', d.get('device'))} ({d.get('platform')}); torch {d.get('torch')}"
                 + (f", triton {d['triton']}" if "triton" in d else "") + f"; {d.get('date')}")  # fmt: skip
    ceil = []
    if c.copy_tbps:
        ceil.append(f"copy {c.copy_tbps:.3g} TB/s")
    if c.bf16_tflops:
        ceil.append(f"matmul {c.bf16_tflops:.3g} TFLOP/s")
    if c.fp8_tflops:
        ceil.append(f"fp8 matmul {c.fp8_tflops:.3g} TFLOP/s")
    lines.append(f"- measured ceilings: {', '.join(ceil) or 'none'}" + (f" ({'; '.join(c.notes)})" if c.notes else ""))
    s = report.settings
    lines.append(
        f"- timing: median of repeats ({'CUDA events, L2 flushed between calls' if s.get('flush_l2') else 'wall clock'}); "
        "cells: median time · rate · % of the ceiling that binds"
        + (" · CUDA-graph replay time" if s.get("graph") else "")
        + (" · eager public call, calls back to back (`--eager`)" if s.get("eager") else "")
    )
    if command:
        lines.append(f"- command: `{command}`")
    lines.append(
        "- regret: the selected kernel's time over the fastest registered kernel's (external peers excluded; "
        "kernels marked (peer) wrap the library users would call instead and count as kernels)"
    )
    if report.unavailable:
        lines.append("- not run here: " + "; ".join(f"{k} ({v})" for k, v in sorted(report.unavailable.items())))
    for op, results in _ops(report).items():
        metric = _metric(op)
        cols = _columns(results)
        lines += ["", f"## {op}", ""]
        header = ["shape", *[f"{n}{' (peer)' if k == 'peer' else ''}" for n, k in cols], "selected", "regret"]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        notes: dict[tuple[str, str], list[str]] = {}
        for r in results:
            row = [_case_name(r)]
            for name, _ in cols:
                e = r.entry(name)
                row.append(_cell(e, metric))
                if e is not None and (e.note or (e.status != "ok" and e.reason)):
                    text = e.note if e.status == "ok" else e.reason
                    notes.setdefault((name, text), []).append(r.label or r.description)
            row += [r.selected or "-", f"{r.regret:.2f}" if r.regret is not None else "-"]
            if r.error:
                notes.setdefault(("", r.error), []).append(r.label or r.description)
            lines.append("| " + " | ".join(x.replace("|", "/") for x in row) + " |")
        if notes:
            lines.append("")
            for (name, text), shapes in notes.items():
                where = "every shape" if len(shapes) == len(results) else ", ".join(shapes)
                lines.append(f"- {name + ': ' if name else ''}{text} ({where})")
    return "\n".join(lines) + "\n"


def write_markdown(report: BenchReport, path: str, *, command: str | None = None) -> None:
    with open(path, "w") as f:
        f.write(markdown(report, command=command))


def write_plot(report: BenchReport, path: str) -> None:
    """One panel per op: the primary rate (TFLOP/s or TB/s) of every kernel and peer per shape."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError(PLOT_HINT) from exc
    ops = _ops(report)
    fig = Figure(figsize=(max(8.0, 1.6 * max((len(v) for v in ops.values()), default=1) + 4), 4.2 * max(len(ops), 1)))
    axes = fig.subplots(max(len(ops), 1), 1, squeeze=False)[:, 0]
    for ax, (op, results) in zip(axes, ops.items()):
        metric = _metric(op)
        cols = _columns(results)
        width = 0.8 / max(len(cols), 1)
        for j, (name, kind) in enumerate(cols):
            xs, ys = [], []
            for i, r in enumerate(results):
                e = r.entry(name)
                v = _rate(e, metric) if e is not None else None
                if v is None and e is not None and e.timing is not None:
                    v = 0.0
                if v is not None:
                    xs.append(i + (j - (len(cols) - 1) / 2) * width)
                    ys.append(v)
            ax.bar(
                xs,
                ys,
                width,
                label=f"{name}{' (peer)' if kind == 'peer' else ''}",
                hatch="//" if kind == "peer" else None,
            )
        ax.set_xticks(range(len(results)))
        ax.set_xticklabels([(r.label or r.description)[:28] for r in results], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("TFLOP/s" if metric == "tflops" else "TB/s")
        ceiling = report.ceilings.bf16_tflops if metric == "tflops" else report.ceilings.copy_tbps
        if ceiling:
            ax.axhline(ceiling, color="gray", linestyle="--", linewidth=0.8, label="measured ceiling")
        ax.set_title(f"{op} ({report.device.get('name', report.device.get('device'))})")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def print_summary(report: BenchReport, stream: TextIO, *, write: Callable[[str], object] | None = None) -> None:
    """A short per-case table: every entry's median and rate, the selection and its regret."""
    w = write or stream.write
    for name, why in sorted(report.unavailable.items()):
        w(f"not run here: {name}: {why}\n")
    for r in report.results:
        metric = _metric(r.op)
        w(f"{r.op} {_case_name(r)}\n")
        if r.error:
            w(f"    ! {r.error}\n")
        for e in r.entries:
            mark = "*" if e.name == r.selected else " "
            if e.timing is None:
                w(f"  {mark} {e.name:<34} {e.status}: {e.reason}\n")
                continue
            t = e.timing
            extra = f"  graph {e.graph.median_us:9.1f} us" if e.graph else ""
            extra += f"  eager {e.eager_us:9.1f} us" if e.eager_us is not None else ""
            pct = f"  {e.pct_ceiling:5.1f}% {e.bound}" if e.pct_ceiling is not None else ""
            peer = "  (peer)" if e.kind == "peer" else ""
            note = f"  [{e.note}]" if e.note else ""
            w(f"  {mark} {e.name:<34} {t.median_us:10.1f} us  p10-p90 {t.p10_us:.1f}-{t.p90_us:.1f}  "
              f"{_rate_text(_rate(e, metric), metric):>14}{pct}{extra}{peer}{note}\n")  # fmt: skip
        regret = f"{r.regret:.2f}" if r.regret is not None else "-"
        w(f"    selected {r.selected or '-'}, fastest {r.fastest or '-'}, regret {regret}\n")

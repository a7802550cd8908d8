"""``bench``: time every registered kernel (and external peers) on each case.

For a case, the inputs come from the shared generators (the ones ``verify``
uses). Each kernel is run once through the public op with ``override=`` (so it
sees exactly the arguments dispatch gives it, weights converted to its layout
where it has a preprocessor); those arguments are recorded and the kernel's
function is then timed directly, so dispatch overhead is not part of the time
(``tests/test_profiling.py`` measures that separately). The kernel selection would
pick for the call is read from the same recorded signature and traits; its
*regret* is its time over the fastest registered kernel's.

With ``eager=True`` (``bench --eager``) each kernel is also timed the way an eager
caller pays for it: the public op forced to the kernel (validation, selection or a
served call, wrapper, launches), ``EAGER_ROUNDS`` rounds of calls back to back and
one synchronisation, the kernels of a case taking turns; the median round's time
per call is the entry's ``eager_us`` (no L2 flush: a call costs the slower of its
host path and its device time). ``oracle build`` turns them into the table's eager
scores, which rank eager calls (``core/selection.py``, "Eager and captured calls").
"""

from __future__ import annotations

import contextlib
import platform as _platform
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch

from ..core.platform import platform_for_device
from ..core.profiling import record_dispatches
from ..core.registry import KernelSpec
from ..core.selection import NoKernelFoundError, OverrideError, select_spec
from ..numerics.cases import Case, Cost, OpCases, PeerSkip, call_for_kernel, get_op_cases, standard_cases
from ..numerics.inputs import make_generator
from ..numerics.runner import default_device, resolve_target
from .ceilings import Ceilings, measure_ceilings
from .progress import Progress
from .timer import Timing, time_fn

__all__ = ["Entry", "CaseResult", "BenchReport", "bench"]

#: rounds of eager timing per kernel and case (``bench --eager``); the median round is kept.
EAGER_ROUNDS = 5


@dataclass
class Entry:
    """One kernel's or peer's numbers on one case."""

    name: str
    kind: str  # "kernel" or "peer"
    solution: str = ""
    status: str = "ok"  # "ok", "skipped", "error"
    reason: str = ""
    note: str = ""
    timing: Timing | None = None
    graph: Timing | None = None
    tflops: float | None = None
    tbps: float | None = None
    pct_ceiling: float | None = None
    bound: str | None = None
    #: a kernel registered with peer=True (a wrapper of the library users would pick instead).
    peer: bool = False
    #: ``bench --eager``: the public op forced to this kernel, per call of calls back to back (module doc).
    eager_us: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "solution": self.solution,
            "status": self.status,
            "reason": self.reason,
            "note": self.note,
            "median_us": self.timing.median_us if self.timing else None,
            "p10_us": self.timing.p10_us if self.timing else None,
            "p90_us": self.timing.p90_us if self.timing else None,
            "repeats": self.timing.repeats if self.timing else None,
            "method": self.timing.method if self.timing else None,
            "graph_median_us": self.graph.median_us if self.graph else None,
            "graph_p10_us": self.graph.p10_us if self.graph else None,
            "graph_p90_us": self.graph.p90_us if self.graph else None,
            "tflops": self.tflops,
            "tbps": self.tbps,
            "pct_ceiling": self.pct_ceiling,
            "bound": self.bound,
            "peer": self.peer,
            "eager_us": self.eager_us,
        }


@dataclass
class CaseResult:
    op: str
    case: Case
    label: str
    description: str
    flops: float = 0.0
    bytes: float = 0.0
    compute: str = "bf16"
    count: int | None = None  # calls of this shape in a replayed capture
    selected: str | None = None
    fastest: str | None = None
    regret: float | None = None
    entries: list[Entry] = field(default_factory=list)
    error: str = ""

    def entry(self, name: str) -> Entry | None:
        return next((e for e in self.entries if e.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "case": self.case.to_json(),
            "label": self.label,
            "description": self.description,
            "flops": self.flops,
            "bytes": self.bytes,
            "compute": self.compute,
            "count": self.count,
            "selected": self.selected,
            "fastest": self.fastest,
            "regret": self.regret,
            "error": self.error,
            "entries": [e.to_json() for e in self.entries],
        }


@dataclass
class BenchReport:
    device: dict[str, Any]
    ceilings: Ceilings
    settings: dict[str, Any]
    results: list[CaseResult] = field(default_factory=list)
    #: kernels that cannot run on this platform at all: name -> reason.
    unavailable: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": 1,
            "device": self.device,
            "ceilings": self.ceilings.to_json(),
            "settings": self.settings,
            "unavailable": dict(self.unavailable),
            "results": [r.to_json() for r in self.results],
        }


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _override_reason(exc: OverrideError, kernel: str) -> str:
    for cand in exc.candidates:
        if cand.name == kernel:
            return cand.reason
    return _short(exc)


def _device_info(dev: torch.device) -> dict[str, Any]:
    plat = platform_for_device(dev)
    info: dict[str, Any] = {
        "device": str(dev),
        "platform": plat.describe(),
        "arch": plat.arch,
        "torch": torch.__version__,
        "python": _platform.python_version(),
        "host": _platform.node(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    if dev.type == "cuda":
        info["name"] = torch.cuda.get_device_name(dev)
        info["cuda"] = torch.version.cuda
    triton = sys.modules.get("triton")
    if triton is not None:
        info["triton"] = getattr(triton, "__version__", "?")
    return info


def _rates(entry: Entry, cost: Cost, ceilings: Ceilings) -> None:
    if entry.timing is None or entry.timing.median_us <= 0:
        return
    seconds = entry.timing.median_us * 1e-6
    entry.tflops = cost.flops / seconds / 1e12 if cost.flops else None
    entry.tbps = cost.bytes / seconds / 1e12 if cost.bytes else None
    fractions = {}
    peak = ceilings.compute_tflops(cost.compute)
    if entry.tflops is not None and peak:
        fractions["compute"] = entry.tflops / peak
    if entry.tbps is not None and ceilings.copy_tbps:
        fractions["memory"] = entry.tbps / ceilings.copy_tbps
    if fractions:
        entry.bound = max(fractions, key=lambda k: fractions[k])
        entry.pct_ceiling = 100.0 * fractions[entry.bound]


def _selected_kernel(oc: OpCases, call: dict[str, Any], device: torch.device) -> str | None:
    """The kernel selection picks for the case's call (signature, traits and size buckets)."""
    try:
        signature, traits, sizes = oc.fn.call_key(**call)
        # (the device-time pick: regret compares device times)
        return select_spec(
            oc.op, signature, traits, sizes=sizes, platform=platform_for_device(device)
        ).for_graph.spec.name
    except NoKernelFoundError:
        return None


def _first_call(calls: list, op: str) -> tuple | None:
    return next((c for c in calls if c[0] == op), None)


def bench(
    target: str | None = None,
    *,
    cases: Iterable[Case] | None = None,
    counts: dict[Case, int] | None = None,
    shape_set: str | None = None,
    dtypes: Sequence[str] | None = None,
    device: torch.device | str | None = None,
    peers: bool = False,
    graph: bool = False,
    eager: bool = False,
    include_reference: bool | None = None,
    ceilings: bool | Ceilings = True,
    seed: int = 0,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    flush_l2: bool = True,
    progress: bool = True,
    stream: TextIO | str | None = "stderr",
) -> BenchReport:
    """Benchmark the kernels matching ``target`` on each case.

    Args:
        target: an op, a kernel or a solution name; None for every op.
        cases: explicit cases (``--shapes``/``--replay``); default the op's bench set.
        counts: call counts per case (a replayed capture), shown in reports.
        shape_set: ``bench-cpu`` / ``bench-gpu`` (default: by device).
        dtypes: restrict the standard sets to these dtypes.
        device: default CUDA if available, else CPU (wall-clock timing).
        peers: also time the external peers of each op.
        graph: also time each kernel and peer under CUDA-graph replay.
        eager: also time each kernel's public call eager, calls back to back (module doc).
        include_reference: time the PyTorch references too (default: on CPU only;
            on a GPU they are slow and never the point).
        ceilings: measure the device ceilings first (or pass measured ones; False: none).
        seed: input generator seed.
        warmup_ms, rep_ms, flush_l2: see :func:`~tokenspeed_kernel.benchmark.timer.time_fn`.
        progress: draw a progress bar on ``stream`` (default ``sys.stderr`` at call time).
    """
    if stream == "stderr":
        stream = sys.stderr
    assert not isinstance(stream, str)
    dev = torch.device(device) if device is not None else default_device()
    if graph and dev.type != "cuda":
        raise ValueError("graph: CUDA-graph timing needs a CUDA device")
    if include_reference is None:
        include_reference = dev.type == "cpu"
    plan = resolve_target(target)
    set_name = shape_set or ("bench-gpu" if dev.type == "cuda" else "bench-cpu")
    explicit = list(cases) if cases is not None else None
    work: list[tuple[OpCases, Case, list[KernelSpec]]] = []
    unavailable: dict[str, str] = {}
    plat = platform_for_device(dev)
    for op, specs in plan.items():
        oc = get_op_cases(op)
        if not include_reference:
            specs = [s for s in specs if s.solution != "reference"]
        for s in specs:
            why = s.capability.reject_reason(plat)
            if why is not None:
                unavailable[s.name] = why
        specs = [s for s in specs if s.name not in unavailable]
        if explicit is not None:
            op_cases = [c for c in explicit if c.op == op]
        else:
            op_cases = standard_cases(op, set_name, dtypes=dtypes, device_type=dev.type)
        work += [(oc, c, specs) for c in op_cases]
    if isinstance(ceilings, Ceilings):
        ceil = ceilings
    elif ceilings:
        if stream is not None and progress:
            stream.write("measuring device ceilings (copy bandwidth, matmul rates)...\n")
        ceil = measure_ceilings(dev)
    else:
        ceil = Ceilings(notes=["not measured"])
    settings = {
        "target": target,
        "shape_set": None if explicit is not None else set_name,
        "peers": peers,
        "graph": graph,
        "eager": eager,
        "include_reference": include_reference,
        "seed": seed,
        "warmup_ms": warmup_ms,
        "rep_ms": rep_ms,
        "flush_l2": flush_l2 and dev.type == "cuda",
    }
    report = BenchReport(_device_info(dev), ceil, settings, unavailable=unavailable)
    total = sum(len(specs) + (len(oc.peers) if peers else 0) for oc, _, specs in work)
    bar = Progress(total, stream=stream, enabled=progress)
    timing = {"warmup_ms": warmup_ms, "rep_ms": rep_ms, "flush_l2": flush_l2}
    for oc, case, specs in work:
        res = _bench_case(oc, case, specs, dev, seed, peers, graph, ceil, timing, bar, eager)
        if counts and case in counts:
            res.count = counts[case]
        report.results.append(res)
    bar.close()
    return report


def _time_entry(entry: Entry, fn, dev: torch.device, graph: bool, timing: dict, context=None) -> None:
    ctx = context() if context is not None else contextlib.nullcontext()
    try:
        with ctx:
            entry.timing = time_fn(fn, device=dev, **timing)
    except Exception as exc:
        entry.status, entry.reason = "error", f"timing failed: {_short(exc)}"
        return
    if graph:
        try:
            with context() if context is not None else contextlib.nullcontext():
                entry.graph = time_fn(fn, device=dev, graph=True, **timing)
        except Exception as exc:
            entry.note = ", ".join(x for x in (entry.note, f"graph capture failed: {_short(exc)}") if x)


def _time_eager(thunks: list[tuple[Entry, Any]], dev: torch.device, rep_ms: float) -> None:
    """``eager_us`` of each entry: EAGER_ROUNDS rounds, the entries taking turns, about ``rep_ms`` a round."""
    from .host import per_call_us

    rounds: list[list[float]] = [[] for _ in thunks]
    failed: set[int] = set()
    for _ in range(EAGER_ROUNDS):
        for i, (entry, fn) in enumerate(thunks):
            if i in failed:
                continue
            est = entry.timing.median_us  # (only timed entries are passed)
            calls = max(20, min(400, int(rep_ms * 1e3 / max(est, 5.0))))
            try:
                rounds[i].append(per_call_us(fn, calls, dev))
            except Exception as exc:
                entry.note = ", ".join(x for x in (entry.note, f"eager timing failed: {_short(exc)}") if x)
                failed.add(i)
    for i, (entry, _) in enumerate(thunks):
        if i not in failed:
            entry.eager_us = sorted(rounds[i])[EAGER_ROUNDS // 2]


def _bench_case(oc, case, specs, dev, seed, peers, graph, ceil, timing, bar, eager=False) -> CaseResult:
    op = oc.op
    desc = case.describe(defaults=oc.defaults)
    res = CaseResult(op, case, case.label, desc)
    try:
        call = oc.make(case, dev, make_generator(dev, case.seed(seed)))
    except Exception as exc:
        res.error = f"input generation failed: {_short(exc)}"
        for spec in specs:
            bar.step(f"{op} {spec.name}")
        return res
    cost: Cost | None = None
    eager_thunks: list[tuple[Entry, Any]] = []
    for spec in specs:
        bar.step(f"{op} {desc[:60]} {spec.name}")
        entry = Entry(spec.name, "kernel", spec.solution, peer=spec.peer)
        res.entries.append(entry)
        try:
            kcall = call_for_kernel(op, dict(call), spec)
            with record_dispatches() as calls:
                result = oc.fn(**kcall)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        except OverrideError as exc:
            entry.status, entry.reason = "skipped", _override_reason(exc, spec.name)
            continue
        except Exception as exc:
            entry.status, entry.reason = "error", f"raised {_short(exc)}"
            continue
        first = _first_call(calls, op)
        if first is None:
            entry.status, entry.reason = "error", "the public op dispatched nothing"
            continue
        _, _, _, args, kwargs = first
        if cost is None:
            try:
                cost = oc.cost(case, call, oc.outputs(kcall, result))
            except Exception as exc:
                res.error = f"cost model failed: {_short(exc)}"
        fn = spec.resolve()
        _time_entry(entry, lambda fn=fn, args=args, kwargs=kwargs: fn(*args, **kwargs), dev, graph, timing)
        if eager and entry.timing is not None:
            eager_thunks.append((entry, lambda kcall=kcall: oc.fn(**kcall)))
    if eager_thunks:
        _time_eager(eager_thunks, dev, timing["rep_ms"])
    if peers:
        for peer in oc.peers:
            bar.step(f"{op} {desc[:60]} {peer.name}")
            entry = Entry(peer.name, "peer", "peer")
            res.entries.append(entry)
            why = peer.available(dev)
            if why is not None:
                entry.status, entry.reason = "skipped", why
                continue
            try:
                pc = peer.prepare(case, call, dev)
            except PeerSkip as exc:
                entry.status, entry.reason = "skipped", str(exc)
                continue
            except Exception as exc:
                entry.status, entry.reason = "error", f"prepare failed: {_short(exc)}"
                continue
            entry.note = pc.note
            _time_entry(entry, pc.fn, dev, graph, timing, pc.context)
    if cost is not None:
        res.flops, res.bytes, res.compute = cost.flops, cost.bytes, cost.compute
        for e in res.entries:
            _rates(e, cost, ceil)
    if any(e.timing is not None for e in res.entries if e.kind == "kernel"):
        res.selected = _selected_kernel(oc, call, dev)
    timed = [e for e in res.entries if e.kind == "kernel" and e.timing is not None]
    if timed:
        best = min(timed, key=lambda e: e.timing.median_us)  # type: ignore[union-attr]
        res.fastest = best.name
        chosen = res.entry(res.selected) if res.selected else None
        if chosen is not None and chosen.timing is not None:
            res.regret = chosen.timing.median_us / best.timing.median_us  # type: ignore[union-attr]
    return res

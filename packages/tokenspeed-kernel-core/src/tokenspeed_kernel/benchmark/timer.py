"""The project's timing harness: CUDA events (optionally CUDA-graph replay) on GPUs, wall clock on CPUs.

``tokenspeed-kernel bench`` (:mod:`.runner`, :mod:`.ceilings`) and the GPU drivers
under ``tools/`` all time through this module. Every result is a :class:`Timing`:
per-call microseconds, the median with the 10th and 90th percentiles of the timed
samples; ``Timing.method`` names how they were taken:

``"cuda-events"`` (:func:`time_fn`)
    One call to compile/warm caches, a short estimate, warm-up for ``warmup_ms``,
    then ``repeats`` timed calls sized to fill ``rep_ms``. Before each timed call a
    buffer twice the size of L2 is zeroed (outside the timed range) so every call
    starts from a cold L2, as in production where the previous layer's work evicted
    this one's data. Each call is bracketed by its own pair of CUDA events. This is
    the method of ``triton.testing.do_bench``. The events time the GPU, but a call
    whose host work (Python wrappers, one launch per kernel, allocations) outlasts
    the GPU work queued before it (the flush) leaves the GPU waiting, and then the
    sample shows host time.
``"cuda-graph"`` (:func:`time_fn` with ``graph=True``)
    ``fn`` captured once in a CUDA graph; each replay is timed as above. No host
    work per kernel, but one graph launch per sample.
``"cuda-graph-batch"`` (:func:`time_fn` with ``graph=True, graph_calls=N``, N > 1)
    ``N`` calls captured in one CUDA graph, each after an in-graph L2 flush, and
    the same graph without the calls (the flushes alone); the two are replayed in
    turn and a sample is ``(replay with the calls - median flush-only replay) / N``.
    GPU time only, from a cold L2: what a CUDA-graph decode step pays for the op.
    It excludes the host's launch overhead, which matters for calls that launch
    several kernels (or a few short ones), and amortises the graph launch over
    ``N`` calls.
``"wall-clock"`` (:func:`time_fn` on a CPU)
    ``time.perf_counter`` around each call, sized like the GPU protocol.

:func:`time_calls` times an exact number of calls, each on its own (the device
synchronised after every one; no estimate, no flush): for long regions such as
a model's prefill or a run of decode steps, whose count the caller fixes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Timing", "time_fn", "time_calls", "percentile"]


@dataclass(frozen=True)
class Timing:
    """Per-call time in microseconds."""

    median_us: float
    p10_us: float
    p90_us: float
    repeats: int
    method: str  # "cuda-events", "cuda-graph", "cuda-graph-batch" or "wall-clock"
    #: the per-call samples behind the summary, in the order they were taken.
    samples_us: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "median_us": self.median_us,
            "p10_us": self.p10_us,
            "p90_us": self.p90_us,
            "repeats": self.repeats,
            "method": self.method,
        }


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile ``q`` in [0, 100] of already sorted values."""
    if not sorted_values:
        return float("nan")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _summary(samples_us: Sequence[float], method: str) -> Timing:
    s = sorted(samples_us)
    return Timing(percentile(s, 50), percentile(s, 10), percentile(s, 90), len(s), method, tuple(samples_us))


def _per_call(replays_us: Sequence[float], baseline_us: Sequence[float], calls: int) -> list[float]:
    """Per-call samples of a batch of ``calls`` calls: each replay less the baseline replays'
    median (the flushes alone; none: nothing to subtract), over ``calls``, never below 0."""
    base = percentile(sorted(baseline_us), 50) if baseline_us else 0.0
    return [max(0.0, (r - base) / calls) for r in replays_us]


def _repeats(est_s: float, warmup_ms: float, rep_ms: float, min_repeats: int, max_repeats: int) -> tuple[int, int]:
    """(warm-up calls, timed calls) for calls of about ``est_s`` seconds."""
    est_s = max(est_s, 1e-7)
    warm = max(1, min(int(warmup_ms / 1e3 / est_s), max_repeats))
    reps = max(min_repeats, min(int(rep_ms / 1e3 / est_s), max_repeats))
    return warm, reps


def _check(warmup_ms: float, rep_ms: float, min_repeats: int, max_repeats: int, graph: bool, graph_calls: int) -> None:
    if warmup_ms < 0 or rep_ms < 0:
        raise ValueError(f"warmup_ms and rep_ms must be >= 0 (got {warmup_ms}, {rep_ms})")
    if min_repeats < 1 or max_repeats < min_repeats:
        raise ValueError(f"need 1 <= min_repeats <= max_repeats (got {min_repeats}, {max_repeats})")
    if graph_calls < 1:
        raise ValueError(f"graph_calls must be >= 1 (got {graph_calls})")
    if graph_calls > 1 and not graph:
        raise ValueError("graph_calls > 1 batches calls in one CUDA graph: it needs graph=True")


# ---------------------------------------------------------------------------- CPU


def _wall_clock(fn: Callable[[], Any], repeats: int, warmup: int) -> Timing:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return _summary(samples, "wall-clock")


def _time_cpu(fn: Callable[[], Any], warmup_ms: float, rep_ms: float, min_repeats: int, max_repeats: int) -> Timing:
    t0 = time.perf_counter()
    fn()
    est = time.perf_counter() - t0
    warm, reps = _repeats(est, warmup_ms, rep_ms, min_repeats, max_repeats)
    return _wall_clock(fn, reps, warm)


# ---------------------------------------------------------------------------- GPU


_flush_buffers: dict[torch.device, torch.Tensor] = {}


def _flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer twice the size of ``device``'s L2: zeroing it evicts whatever L2 held."""
    buf = _flush_buffers.get(device)
    if buf is None:
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        buf = torch.empty(2 * l2, dtype=torch.int8, device=device)
        _flush_buffers[device] = buf
    return buf


def _event() -> Any:
    return torch.cuda.Event(enable_timing=True)


def _estimate_s(work: Callable[[], Any], device: torch.device) -> float:
    """Seconds per call of ``work``: one warm call, then the mean of three."""
    work()
    torch.cuda.synchronize(device)
    start, end = _event(), _event()
    start.record()
    for _ in range(3):
        work()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / 3 / 1e3


def _event_samples(
    works: Sequence[Callable[[], Any]], reps: int, flush: torch.Tensor | None, device: torch.device
) -> list[list[float]]:
    """``reps`` rounds of the ``works`` in turn, each bracketed by its own pair of events (the
    L2 flushed before each, outside the range, when ``flush`` is given); microseconds per work."""
    events = [[(_event(), _event()) for _ in range(reps)] for _ in works]
    for i in range(reps):
        for work, pairs in zip(works, events):
            if flush is not None:
                flush.zero_()
            pairs[i][0].record()
            work()
            pairs[i][1].record()
    torch.cuda.synchronize(device)
    return [[s.elapsed_time(e) * 1e3 for s, e in pairs] for pairs in events]


@contextlib.contextmanager
def _capturing(device: torch.device) -> Iterator[None]:
    """Leave the device idle when a capture fails (e.g. ``fn`` synchronises with the host)."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(device)
        raise


def _warm_on_side_stream(fn: Callable[[], Any], device: torch.device) -> None:
    """Warm-up on a side stream, as CUDA-graph capture requires (lazy init, autotuning, workspaces)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)


def _capture(body: Callable[[], Any]) -> Any:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    return graph


def _capture_graph(fn: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    with _capturing(device):
        _warm_on_side_stream(fn, device)
        graph = _capture(fn)
        torch.cuda.synchronize(device)
    return graph.replay


def _capture_batch(
    fn: Callable[[], Any], device: torch.device, calls: int, flush: torch.Tensor | None
) -> tuple[Callable[[], Any], Callable[[], Any] | None]:
    """(replay of ``calls`` x [flush, fn], replay of ``calls`` x [flush] or None without a flush)."""

    def body(with_fn: bool) -> Callable[[], None]:
        def run() -> None:
            for _ in range(calls):
                if flush is not None:
                    flush.zero_()
                if with_fn:
                    fn()

        return run

    with _capturing(device):
        _warm_on_side_stream(fn, device)
        with_calls = _capture(body(True))
        flushes = _capture(body(False)) if flush is not None else None
        torch.cuda.synchronize(device)
    return with_calls.replay, flushes.replay if flushes is not None else None


def _time_cuda(
    fn: Callable[[], Any],
    device: torch.device,
    warmup_ms: float,
    rep_ms: float,
    min_repeats: int,
    max_repeats: int,
    flush_l2: bool,
    method: str,
) -> Timing:
    warm, reps = _repeats(_estimate_s(fn, device), warmup_ms, rep_ms, min_repeats, max_repeats)
    buf = _flush_buffer(device) if flush_l2 else None
    for _ in range(warm):
        fn()
    [samples] = _event_samples([fn], reps, buf, device)
    return _summary(samples, method)


def _time_cuda_batch(
    fn: Callable[[], Any],
    device: torch.device,
    calls: int,
    warmup_ms: float,
    rep_ms: float,
    min_repeats: int,
    max_repeats: int,
    flush_l2: bool,
) -> Timing:
    buf = _flush_buffer(device) if flush_l2 else None
    with_calls, flushes = _capture_batch(fn, device, calls, buf)
    works = [with_calls] if flushes is None else [with_calls, flushes]

    def round_() -> None:
        for work in works:
            work()

    warm, reps = _repeats(_estimate_s(round_, device), warmup_ms, rep_ms, min_repeats, max_repeats)
    for _ in range(warm):
        round_()
    samples = _event_samples(works, reps, None, device)
    return _summary(_per_call(samples[0], samples[1] if flushes is not None else [], calls), "cuda-graph-batch")


def _cuda_device(device: torch.device) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if device.index is None else device


# ---------------------------------------------------------------------------- public


def time_fn(
    fn: Callable[[], Any],
    *,
    device: torch.device | str = "cpu",
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    min_repeats: int = 5,
    max_repeats: int = 1000,
    flush_l2: bool = True,
    graph: bool = False,
    graph_calls: int = 1,
) -> Timing:
    """Time ``fn()`` (no arguments) on ``device``; see the module docstring for the methods.

    Args:
        fn: the work; its result is ignored.
        device: a CUDA device (CUDA events) or the CPU (``time.perf_counter``).
        warmup_ms, rep_ms: time budgets for the warm-up and the timed calls (or
            graph replays).
        min_repeats, max_repeats: bounds on the number of timed samples.
        flush_l2: start every timed call from a cold L2 by zeroing a 2 x L2 buffer
            before it (GPU only): outside the timed range for events and single-call
            graphs, inside the graph (and subtracted) with ``graph_calls > 1``.
        graph: capture ``fn`` in a CUDA graph and time replays (GPU only); the
            capture raises when ``fn`` cannot be captured (host synchronisation).
        graph_calls: with ``graph``, the number of calls in the graph. 1: one call
            per replay, timed with its graph launch (``"cuda-graph"``). N > 1: N calls,
            each after an in-graph L2 flush, less the same graph of flushes alone,
            over N (``"cuda-graph-batch"``): GPU time only, without host launch
            overhead, for calls that launch several kernels.
    """
    _check(warmup_ms, rep_ms, min_repeats, max_repeats, graph, graph_calls)
    dev = torch.device(device)
    if dev.type != "cuda":
        if graph:
            raise ValueError("graph: CUDA-graph timing needs a CUDA device")
        return _time_cpu(fn, warmup_ms, rep_ms, min_repeats, max_repeats)
    dev = _cuda_device(dev)
    with torch.cuda.device(dev):
        if graph and graph_calls > 1:
            return _time_cuda_batch(fn, dev, graph_calls, warmup_ms, rep_ms, min_repeats, max_repeats, flush_l2)
        work = _capture_graph(fn, dev) if graph else fn
        method = "cuda-graph" if graph else "cuda-events"
        return _time_cuda(work, dev, warmup_ms, rep_ms, min_repeats, max_repeats, flush_l2, method)


def time_calls(fn: Callable[[], Any], *, device: torch.device | str = "cpu", repeats: int, warmup: int = 0) -> Timing:
    """Time exactly ``repeats`` calls of ``fn`` after ``warmup`` untimed ones, each call alone.

    On a GPU every call is bracketed by CUDA events and the device is synchronised
    after it (and before the first), so a call never overlaps the next one's host
    work; on a CPU ``time.perf_counter``. No estimate and no L2 flush: for long
    regions (a model's prefill, a run of decode steps) whose count the caller fixes
    and where every extra call is expensive. ``Timing.samples_us`` holds the calls'
    times in order.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0 (got {repeats}, {warmup})")
    dev = torch.device(device)
    if dev.type != "cuda":
        return _wall_clock(fn, repeats, warmup)
    dev = _cuda_device(dev)
    with torch.cuda.device(dev):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(dev)
        samples = []
        for _ in range(repeats):
            start, end = _event(), _event()
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
    return _summary(samples, "cuda-events")

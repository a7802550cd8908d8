"""Timing one callable: CUDA events (optionally CUDA-graph replay) on GPUs, wall clock on CPUs.

GPU protocol: one call to compile/warm caches, a short estimate, warm-up for
``warmup_ms``, then ``repeats`` timed calls sized to fill ``rep_ms``. Before each
timed call a buffer twice the size of L2 is zeroed (outside the timed range) so
every call starts from a cold L2, as in production where the previous layer's
work evicted this one's data. Each call is bracketed by its own pair of CUDA
events; the summary is the median with the 10th and 90th percentiles.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Timing", "time_fn", "percentile"]


@dataclass(frozen=True)
class Timing:
    """Per-call time in microseconds."""

    median_us: float
    p10_us: float
    p90_us: float
    repeats: int
    method: str  # "cuda-events", "cuda-graph" or "wall-clock"

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


def _summary(samples_us: list[float], method: str) -> Timing:
    s = sorted(samples_us)
    return Timing(percentile(s, 50), percentile(s, 10), percentile(s, 90), len(s), method)


_flush_buffers: dict[torch.device, torch.Tensor] = {}


def _flush_buffer(device: torch.device) -> torch.Tensor:
    buf = _flush_buffers.get(device)
    if buf is None:
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 64 * 2**20)
        buf = torch.empty(2 * l2, dtype=torch.int8, device=device)
        _flush_buffers[device] = buf
    return buf


def _repeats(est_s: float, warmup_ms: float, rep_ms: float, min_repeats: int, max_repeats: int) -> tuple[int, int]:
    est_s = max(est_s, 1e-7)
    warm = max(1, min(int(warmup_ms / 1e3 / est_s), max_repeats))
    reps = max(min_repeats, min(int(rep_ms / 1e3 / est_s), max_repeats))
    return warm, reps


def _time_cpu(fn: Callable[[], Any], warmup_ms: float, rep_ms: float, min_repeats: int, max_repeats: int) -> Timing:
    t0 = time.perf_counter()
    fn()
    est = time.perf_counter() - t0
    warm, reps = _repeats(est, warmup_ms, rep_ms, min_repeats, max_repeats)
    for _ in range(warm):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return _summary(samples, "wall-clock")


def _capture_graph(fn: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        # Warm-up on a side stream, as CUDA-graph capture requires (lazy init, autotuning).
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize(device)
    return graph.replay


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
    fn()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize(device)
    est = start.elapsed_time(end) / 3 / 1e3
    warm, reps = _repeats(est, warmup_ms, rep_ms, min_repeats, max_repeats)
    buf = _flush_buffer(device) if flush_l2 else None
    for _ in range(warm):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if buf is not None:
            buf.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize(device)
    return _summary([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)], method)


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
) -> Timing:
    """Time ``fn()`` (no arguments) on ``device``.

    Args:
        fn: the work; its result is ignored.
        device: a CUDA device (CUDA events) or the CPU (``time.perf_counter``).
        warmup_ms, rep_ms: time budgets for the warm-up and the timed calls.
        min_repeats, max_repeats: bounds on the number of timed calls.
        flush_l2: zero a 2 x L2 buffer before each timed call (GPU only).
        graph: capture ``fn`` once in a CUDA graph and time its replay (GPU only).
    """
    dev = torch.device(device)
    if dev.type == "cuda":
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        work = _capture_graph(fn, dev) if graph else fn
        return _time_cuda(
            work, dev, warmup_ms, rep_ms, min_repeats, max_repeats, flush_l2, "cuda-graph" if graph else "cuda-events"
        )
    if graph:
        raise ValueError("graph: CUDA-graph timing needs a CUDA device")
    return _time_cpu(fn, warmup_ms, rep_ms, min_repeats, max_repeats)

"""Benchmark tooling: time kernels side by side with external peers.

``bench`` (also ``tokenspeed-kernel bench``) times every registered kernel of an
op (CUDA events with an L2 flush between calls on GPUs, optionally under CUDA-graph
replay; wall clock on CPUs) on the op's bench shapes, custom shapes or a shape
capture, models each call's FLOPs and bytes, compares with the device ceilings
measured at the start, names the kernel selection would pick and its regret, and
writes JSON, Markdown and PNG reports.
"""

from __future__ import annotations

from ..numerics.cases import Cost, Peer, PeerCall, PeerSkip
from .ceilings import Ceilings, measure_ceilings
from .runner import BenchReport, CaseResult, Entry, bench
from .timer import Timing, time_fn

__all__ = [
    "bench",
    "BenchReport",
    "CaseResult",
    "Entry",
    "Ceilings",
    "measure_ceilings",
    "Cost",
    "Peer",
    "PeerCall",
    "PeerSkip",
    "Timing",
    "time_fn",
]

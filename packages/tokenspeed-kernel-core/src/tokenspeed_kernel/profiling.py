"""Profiling hooks around every dispatch.

:func:`kernel_scope` names a region ``tokenspeed_kernel::<op>::<kernel>`` in
``torch.profiler`` / Chrome traces (and in Proton when it is installed and
active). When no profiler is running the dispatch path pays one C-level check.

Shape capture (``TOKENSPEED_KERNEL_CAPTURE_SHAPES=path``, or
:func:`start_shape_capture`) records each distinct call once with a count;
``bench --replay path`` replays them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

__all__ = ["kernel_scope", "profiler_active"]

#: True while a torch profiler (or record_function consumer) is collecting.
profiler_active = torch._C._autograd._profiler_enabled


@contextlib.contextmanager
def kernel_scope(op: str, kernel: str) -> Iterator[None]:
    """A named range around one kernel call."""
    name = f"tokenspeed_kernel::{op}::{kernel}"
    with torch.profiler.record_function(name):
        yield

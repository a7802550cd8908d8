"""The one dispatch path every public op goes through.

validate (in the op) -> signature + traits (in the op) -> :func:`run`:
select (cached) -> profiling scope -> kernel call. Nothing here allocates or
synchronises, so a dispatched call can be captured in a CUDA graph.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .profiling import env_capture_hook, kernel_scope, profiler_active
from .selection import Target, select_for_device

__all__ = ["run", "capture_hook"]

#: Set by shape capture and other dispatch observers (see tokenspeed_kernel.core.profiling); None when off.
capture_hook: Any = env_capture_hook()


def run(
    op: str,
    device: torch.device,
    signature: tuple[str, ...],
    traits: Mapping[str, object] | tuple[tuple[str, object], ...],
    solution: Target | None,
    override: Target | None,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """Select the kernel for this call and run it with ``*args, **kwargs``."""
    sel = select_for_device(op, signature, traits, device, solution, override)
    if capture_hook is not None:
        capture_hook(op, signature, traits, args, kwargs)
    if profiler_active():
        with kernel_scope(op, sel.spec.name):
            return sel.fn(*args, **kwargs)
    return sel.fn(*args, **kwargs)

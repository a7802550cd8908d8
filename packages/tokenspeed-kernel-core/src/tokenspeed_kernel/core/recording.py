"""Where a launch-plan recording is open, and how core reaches the recorder (imports nothing).

The recorder lives on the launch path (:mod:`tokenspeed_kernel.launch`, "Launch plans"), which sits above
core; core's prepared calls use it through :func:`install`'s slot, filled when the launch path is imported
(by any package whose kernels launch through it). Paths with device work a recording cannot replay (an
eager CUDA graph, :mod:`tokenspeed_kernel.graphs`) report it with :func:`refuse`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["install", "plans_enabled", "record", "refuse"]

#: ``.recorder``: the recording open on this thread (None when none is).
state = threading.local()
#: recordings open in any thread: while none is, the launch path reads no thread-local state.
active = 0
lock = threading.Lock()
_recorder: Callable[[Callable[..., Any], tuple], tuple] | None = None
_enabled: Callable[[], bool] | None = None
_on: bool | None = None


def install(record: Callable[[Callable[..., Any], tuple], tuple], enabled: Callable[[], bool]) -> None:
    """The launch path's ``record(run, flat) -> (result, plan or None, why not)`` and whether it is on."""
    global _recorder, _enabled, _on
    _recorder, _enabled, _on = record, enabled, None


def plans_enabled() -> bool | None:
    """Whether calls record launch plans in this process; None while no launch path is loaded."""
    global _on
    if _on is None and _enabled is not None:
        _on = bool(_enabled())
    return _on


def record(run: Callable[..., Any], flat: tuple) -> tuple[Any, Any, str]:
    """``run(*flat)`` recorded (:func:`install`'s recorder): ``(result, plan or None, why not)``."""
    assert _recorder is not None, "no launch path is loaded"
    return _recorder(run, flat)


def refuse(why: str) -> None:
    """The open recording of this thread (if any) cannot replay the call: ``why`` says what it saw."""
    rec = getattr(state, "recorder", None)
    if rec is not None:
        rec.refuse(why)

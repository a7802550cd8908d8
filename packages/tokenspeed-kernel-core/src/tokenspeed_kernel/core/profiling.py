"""Profiling hooks around every dispatch, and shape capture.

:func:`kernel_scope` names a region ``tokenspeed_kernel::<op>::<kernel>`` in
``torch.profiler`` / Chrome traces, and in Proton when ``triton.profiler`` has
been imported by the user and a Proton session is on. This module never imports
Triton: a Proton session can only be running if the user imported
``triton.profiler``, so looking it up in ``sys.modules`` is enough. When no
profiler is running the dispatch path pays one :func:`profiler_active` call.

Shape capture (``TOKENSPEED_KERNEL_CAPTURE_SHAPES=path``, or
:func:`capture_shapes` / :func:`start_shape_capture`) records each distinct call
(op, format signature, traits, tensor shapes and dtypes, scalar arguments) once
with a count, keeps at most ``max_entries`` distinct calls (later new ones are
only counted), and writes JSON at exit / on close; ``bench --replay path``
benchmarks exactly those calls. It hooks in through :data:`dispatch_hook`.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .formats import DTYPE_NAMES

__all__ = [
    "kernel_scope",
    "profiler_active",
    "proton_active",
    "ShapeCapture",
    "capture_shapes",
    "start_shape_capture",
    "add_dispatch_hook",
    "remove_dispatch_hook",
    "record_dispatches",
    "env_capture_hook",
    "CAPTURE_ENV",
    "CAPTURE_MAX_ENV",
]

CAPTURE_ENV = "TOKENSPEED_KERNEL_CAPTURE_SHAPES"
CAPTURE_MAX_ENV = "TOKENSPEED_KERNEL_CAPTURE_MAX"
#: 1-D tensors up to this size have their values recorded once per entry (lengths, slots, ...).
SAMPLE_MAX_NUMEL = 4096
_SAMPLED = (torch.int32, torch.int64, torch.float32)

_torch_profiler_enabled = torch._C._autograd._profiler_enabled
_modules = sys.modules
_PROTON_FLAGS = "triton.profiler.flags"


def proton_active() -> bool:
    """True while a Proton session is on (only possible once the user imported ``triton.profiler``)."""
    return _PROTON_FLAGS in _modules and bool(_modules[_PROTON_FLAGS].flags.profiling_on)


def profiler_active() -> bool:
    """True while a torch profiler (or record_function consumer) or a Proton session is collecting.

    On the dispatch path: one C call and one dict lookup when nothing profiles.
    """
    return _torch_profiler_enabled() or (_PROTON_FLAGS in _modules and _modules[_PROTON_FLAGS].flags.profiling_on)


@contextlib.contextmanager
def kernel_scope(op: str, kernel: str) -> Iterator[None]:
    """A named range ``tokenspeed_kernel::<op>::<kernel>`` around one kernel call.

    Args:
        op: the public op's name.
        kernel: the registered kernel's name.
    """
    name = f"tokenspeed_kernel::{op}::{kernel}"
    with torch.profiler.record_function(name):
        if proton_active():
            with sys.modules["triton.profiler"].scope(name):
                yield
        else:
            yield


# ---------------------------------------------------------------------------
# Dispatch hooks: several observers share one hook, which every op call reads.

Hook = Callable[[str, tuple, Any, tuple, dict], None]
_hooks: list[Hook] = []
_hooks_lock = threading.Lock()


def _combined_hook() -> Hook | None:
    hooks = tuple(_hooks)
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]

    def fanout(op: str, signature: tuple, traits: Any, args: tuple, kwargs: dict) -> None:
        for h in hooks:
            h(op, signature, traits, args, kwargs)

    return fanout


def _install() -> None:
    global dispatch_hook
    dispatch_hook = _combined_hook()


def add_dispatch_hook(hook: Hook) -> None:
    """Call ``hook(op, signature, traits, args, kwargs)`` before every dispatched kernel call."""
    with _hooks_lock:
        _hooks.append(hook)
        _install()


def remove_dispatch_hook(hook: Hook) -> None:
    with _hooks_lock:
        if hook in _hooks:
            _hooks.remove(hook)
        _install()


@contextlib.contextmanager
def record_dispatches() -> Iterator[list[tuple[str, tuple, dict, tuple, dict]]]:
    """Collect ``(op, signature, traits, args, kwargs)`` of every dispatch inside the block
    (the exact arguments the selected kernel receives)."""
    calls: list[tuple[str, tuple, dict, tuple, dict]] = []

    def hook(op: str, signature: tuple, traits: Any, args: tuple, kwargs: dict) -> None:
        calls.append((op, signature, dict(traits), args, kwargs))

    add_dispatch_hook(hook)
    try:
        yield calls
    finally:
        remove_dispatch_hook(hook)


# ---------------------------------------------------------------------------
# Shape capture


def _describe(v: Any) -> tuple:
    """A hashable description of one argument: shapes and dtypes of tensors, values of scalars."""
    if isinstance(v, torch.Tensor):
        return ("T", tuple(v.shape), DTYPE_NAMES.get(v.dtype, str(v.dtype)), v.device.type)
    if v is None or isinstance(v, (bool, int, float, str)):
        return ("V", v)
    if isinstance(v, torch.dtype):
        return ("V", DTYPE_NAMES.get(v, str(v)))
    if isinstance(v, (tuple, list)):
        return ("L", tuple(_describe(x) for x in v))
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        # Typed argument objects (MoEWeights, MoEActivation): their fields, by name.
        return ("D", type(v).__name__, tuple((f.name, _describe(getattr(v, f.name))) for f in dataclasses.fields(v)))
    return ("O", type(v).__name__)


def _to_json(d: tuple) -> Any:
    tag = d[0]
    if tag == "T":
        return {"tensor": list(d[1]), "dtype": d[2], "device": d[3]}
    if tag == "V":
        return {"value": d[1]}
    if tag == "L":
        return {"list": [_to_json(x) for x in d[1]]}
    if tag == "D":
        fields = {name: sub[1] if sub[0] == "V" else _to_json(sub) for name, sub in d[2]}
        return {"object": d[1], "fields": fields}
    return {"object": d[1]}


def _can_read_values(t: torch.Tensor) -> bool:
    if t.device.type == "cpu":
        return True
    if t.device.type == "cuda":
        # Reading values syncs the device; never inside a CUDA-graph capture.
        return not torch.cuda.is_current_stream_capturing()
    return False


class ShapeCapture:
    """Records each distinct dispatched call once, with a count, in bounded memory.

    Args:
        path: where :meth:`write` / :meth:`close` put the JSON (None: keep in memory).
        max_entries: distinct calls kept; calls that would add more are counted in
            ``dropped_calls`` and otherwise ignored.
    """

    def __init__(self, path: str | None = None, *, max_entries: int = 4096) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries: expected >= 1, got {max_entries}")
        self.path = path
        self.max_entries = max_entries
        self.total_calls = 0
        self.dropped_calls = 0
        self._entries: dict[tuple, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._active = False

    def __call__(self, op: str, signature: tuple, traits: Any, args: tuple, kwargs: dict) -> None:
        arg_d = tuple(_describe(a) for a in args)
        kw_d = tuple((k, _describe(v)) for k, v in kwargs.items())
        key = (op, tuple(signature), tuple(sorted(dict(traits).items())), arg_d, kw_d)
        with self._lock:
            self.total_calls += 1
            entry = self._entries.get(key)
            if entry is None:
                if len(self._entries) >= self.max_entries:
                    self.dropped_calls += 1
                    return
                entry = {"key": key, "count": 0, "samples": None}
                self._entries[key] = entry
            entry["count"] += 1
            need_samples = entry["samples"] is None
        if need_samples:
            samples = self._samples(args, kwargs)
            if samples is not None:
                entry["samples"] = samples

    @staticmethod
    def _samples(args: tuple, kwargs: dict) -> dict[str, Any] | None:
        """Values of small 1-D integer tensors (sequence lengths, slots, per-row top-k)
        and the range of small 1-D fp32 ones (per-row top-p, temperature), so a replay
        can rebuild the same ragged batch; None if they cannot be read now."""
        out: dict[str, Any] = {}
        items = [(f"args.{i}", a) for i, a in enumerate(args)] + [(f"kwargs.{k}", v) for k, v in kwargs.items()]
        for where, t in items:
            if (
                isinstance(t, torch.Tensor)
                and t.dim() == 1
                and 0 < t.numel() <= SAMPLE_MAX_NUMEL
                and t.dtype in _SAMPLED
            ):
                if not _can_read_values(t):
                    return None
                if t.dtype == torch.float32:
                    out[where] = {"min": float(t.min()), "max": float(t.max())}
                else:
                    out[where] = t.detach().cpu().tolist()
        return out

    def entries(self) -> list[dict[str, Any]]:
        """The distinct calls, most frequent first, as JSON-ready dicts."""
        with self._lock:
            items = list(self._entries.values())
        items.sort(key=lambda e: -e["count"])
        out = []
        for e in items:
            op, sig, traits, args, kwargs = e["key"]
            out.append(
                {
                    "op": op,
                    "signature": list(sig),
                    "traits": dict(traits),
                    "count": e["count"],
                    "args": [_to_json(a) for a in args],
                    "kwargs": {k: _to_json(v) for k, v in kwargs},
                    "samples": e["samples"] or {},
                }
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "format": "tokenspeed_kernel shape capture",
            "version": 1,
            "max_entries": self.max_entries,
            "total_calls": self.total_calls,
            "dropped_calls": self.dropped_calls,
            "entries": self.entries(),
        }

    def write(self, path: str | None = None) -> str | None:
        """Write the JSON to ``path`` (default: the capture's own path); returns the path written."""
        path = path or self.path
        if path is None:
            return None
        data = self.to_json()
        entries = data.pop("entries")
        head = json.dumps(data, indent=1)[:-2]
        body = ",\n".join("  " + json.dumps(e, separators=(",", ":")) for e in entries)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            # One entry per line: readable with grep, and diffable.
            f.write(f'{head},\n "entries": [\n{body}\n ]\n}}\n')
        os.replace(tmp, path)
        return path

    def start(self) -> ShapeCapture:
        if not self._active:
            self._active = True
            add_dispatch_hook(self)
        return self

    def close(self) -> str | None:
        """Stop recording and write the file (if the capture has a path)."""
        if self._active:
            self._active = False
            remove_dispatch_hook(self)
        return self.write()

    def __enter__(self) -> ShapeCapture:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_shape_capture(path: str | None = None, *, max_entries: int = 4096) -> ShapeCapture:
    """Start recording dispatched calls; ``close()`` the result to stop and write ``path``."""
    return ShapeCapture(path, max_entries=max_entries).start()


@contextlib.contextmanager
def capture_shapes(path: str | None = None, *, max_entries: int = 4096) -> Iterator[ShapeCapture]:
    """``with capture_shapes("calls.json") as cap: model(...)``: record, then write on exit."""
    cap = start_shape_capture(path, max_entries=max_entries)
    try:
        yield cap
    finally:
        cap.close()


_env_capture: ShapeCapture | None = None


def env_capture_hook() -> Hook | None:
    """The dispatch hook to start with: a capture writing ``$TOKENSPEED_KERNEL_CAPTURE_SHAPES``
    at exit when that variable is set, else None. Called once, when this module is imported."""
    global _env_capture
    path = os.environ.get(CAPTURE_ENV, "").strip()
    if path and _env_capture is None:
        max_entries = int(os.environ.get(CAPTURE_MAX_ENV, "4096"))
        _env_capture = ShapeCapture(path, max_entries=max_entries)
        _env_capture._active = True
        with _hooks_lock:
            _hooks.append(_env_capture)
        atexit.register(_env_capture.write)
    return _combined_hook()


#: Called as ``hook(op, signature, traits, args, kwargs)`` before every kernel an op runs; None when off.
dispatch_hook: Hook | None = env_capture_hook()

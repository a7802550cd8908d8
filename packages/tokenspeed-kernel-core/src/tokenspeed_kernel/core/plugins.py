"""Plugin discovery through the ``tokenspeed_kernel.plugins`` entry-point group.

Each entry point names a zero-argument ``register()``. Discovery runs once, on the
first selection (or the ``plugins`` CLI), under a lock; a plugin that fails to
load or register is reported by name (a warning, and in :func:`plugin_reports`)
and skipped. ``TOKENSPEED_KERNEL_PLUGINS`` filters what loads: a comma-separated
list of names to allow, or of ``-name`` entries to deny (``-amd,-nvidia``);
``none`` loads no plugin.

The core's own reference kernels load the same way, before any plugin.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from importlib import metadata

from .registry import _current_source, registry

__all__ = ["PLUGIN_GROUP", "PluginReport", "load_plugins", "plugin_reports", "ensure_loaded"]

PLUGIN_GROUP = "tokenspeed_kernel.plugins"


@dataclass
class PluginReport:
    name: str
    target: str
    distribution: str | None
    version: str | None
    status: str  # "loaded" | "failed" | "filtered"
    kernels: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0


_lock = threading.RLock()
_loaded = False
_reports: dict[str, PluginReport] = {}


def _plugin_filter() -> tuple[set[str] | None, set[str]]:
    raw = os.environ.get("TOKENSPEED_KERNEL_PLUGINS", "").strip()
    if not raw:
        return None, set()
    if raw.lower() == "none":
        return set(), set()
    allow: set[str] = set()
    deny: set[str] = set()
    for item in (x.strip() for x in raw.split(",")):
        if not item:
            continue
        (deny if item.startswith("-") else allow).add(item.lstrip("-"))
    return (allow or None), deny


def _run_register(name: str, fn, report: PluginReport) -> None:
    before = {s.name for s in registry.all()}
    token = _current_source.set(name)
    t0 = time.perf_counter()
    try:
        fn()
    finally:
        _current_source.reset(token)
        report.seconds = time.perf_counter() - t0
    report.kernels = sorted({s.name for s in registry.all()} - before)


def _register_core() -> None:
    from ..reference import register as register_reference

    report = PluginReport(
        "core", "tokenspeed_kernel.reference:register", "tokenspeed-kernel-core", _version(), "loaded"
    )
    _run_register("core", register_reference, report)
    _reports["core"] = report


def _version() -> str | None:
    try:
        return metadata.version("tokenspeed-kernel-core")
    except metadata.PackageNotFoundError:
        return None


def load_plugins(*, force: bool = False) -> dict[str, PluginReport]:
    """Register the core's reference kernels and every allowed plugin (once)."""
    global _loaded
    with _lock:
        if _loaded and not force:
            return dict(_reports)
        if "core" not in _reports:
            _register_core()
        allow, deny = _plugin_filter()
        for ep in sorted(metadata.entry_points(group=PLUGIN_GROUP), key=lambda e: e.name):
            if ep.name in _reports and _reports[ep.name].status == "loaded":
                continue
            dist = getattr(ep, "dist", None)
            report = PluginReport(
                name=ep.name,
                target=ep.value,
                distribution=dist.name if dist else None,
                version=dist.version if dist else None,
                status="loaded",
            )
            _reports[ep.name] = report
            if ep.name in deny or (allow is not None and ep.name not in allow):
                report.status = "filtered"
                continue
            try:
                _run_register(ep.name, ep.load(), report)
            except Exception as exc:  # a broken plugin must never take the process down
                report.status = "failed"
                report.error = f"{type(exc).__name__}: {exc}"
                report.kernels = []
                warnings.warn(
                    f"tokenspeed_kernel: plugin {ep.name!r} ({ep.value}) failed and was skipped: {report.error}\n"
                    + "".join(traceback.format_exception_only(exc)).strip(),
                    RuntimeWarning,
                    stacklevel=2,
                )
        _loaded = True
        return dict(_reports)


def ensure_loaded() -> None:
    if not _loaded:
        load_plugins()


def plugin_reports() -> dict[str, PluginReport]:
    ensure_loaded()
    return dict(_reports)


def _reset_for_tests() -> None:
    """Forget every plugin and kernel they registered (tests only)."""
    global _loaded
    with _lock:
        for report in _reports.values():
            for name in report.kernels:
                if registry.get(name) is not None:
                    registry.unregister(name)
        _reports.clear()
        _loaded = False

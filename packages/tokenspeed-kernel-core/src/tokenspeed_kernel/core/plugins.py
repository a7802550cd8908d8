"""Plugin discovery through the ``tokenspeed_kernel.plugins`` entry-point group.

Each entry point names a zero-argument ``register()``. Discovery runs once, on the
first selection (or the ``plugins`` CLI), under a lock. A plugin that fails to
load or register (any exception but ``KeyboardInterrupt``, ``SystemExit``
included) is reported by name (one warning, and in :func:`plugin_reports`) and
skipped, and everything it registered before failing is removed again: a plugin
is in or out, never half. ``TOKENSPEED_KERNEL_PLUGINS`` filters what loads: a
comma-separated list of names to allow, or of ``-name`` entries to deny
(``-amd,-nvidia``); ``none`` loads no plugin; a name no installed plugin has is
warned about.

The core's reference kernels (one per op, from the op objects) load first, the
same way.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from importlib import metadata

from . import measured
from .contracts import all_contracts
from .registry import Priority, _current_source, register_kernel, registry

__all__ = ["PLUGIN_GROUP", "PLUGINS_ENV", "PluginReport", "load_plugins", "plugin_reports", "ensure_loaded"]

PLUGIN_GROUP = "tokenspeed_kernel.plugins"
PLUGINS_ENV = "TOKENSPEED_KERNEL_PLUGINS"


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
    #: measured tables the plugin registered (sources).
    tables: list[str] = field(default_factory=list)


_lock = threading.RLock()
_loaded = False
_reports: dict[str, PluginReport] = {}


def _plugin_filter() -> tuple[set[str] | None, set[str]]:
    raw = os.environ.get(PLUGINS_ENV, "").strip()
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
    """Run a plugin's ``register()``; on failure, remove what it registered and re-raise."""
    before = {s.name for s in registry.all()}
    tables_before = {w for _, w in measured.registered_tables()}
    token = _current_source.set(name)
    t0 = time.perf_counter()
    try:
        fn()
    except BaseException:
        for kernel in {s.name for s in registry.all()} - before:
            registry.unregister(kernel)
        measured._forget_registered({w for _, w in measured.registered_tables()} - tables_before)
        raise
    finally:
        _current_source.reset(token)
        report.seconds = time.perf_counter() - t0
    report.kernels = sorted({s.name for s in registry.all()} - before)
    report.tables = sorted({w for _, w in measured.registered_tables()} - tables_before)


def _register_references() -> None:
    """One ``reference.<op>`` kernel per public op, from the op objects."""
    for op in all_contracts().values():
        ref = op.reference
        register_kernel(
            op.name,
            name=f"reference.{op.name}",
            solution="reference",
            formats=ref.formats,
            traits=ref.traits,
            priority=Priority.REFERENCE,
            tags=ref.tags,
            impl=ref.impl,
            doc=f"PyTorch reference for {op.name}",
        )


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
            report = PluginReport(
                "core", "tokenspeed_kernel.core.op:Op.reference", "tokenspeed-kernel-core", _version(), "loaded"
            )
            _run_register("core", _register_references, report)
            _reports["core"] = report
        allow, deny = _plugin_filter()
        found = sorted(metadata.entry_points(group=PLUGIN_GROUP), key=lambda e: e.name)
        unknown = sorted(((allow or set()) | deny) - {ep.name for ep in found})
        if unknown:
            warnings.warn(
                f"tokenspeed_kernel: {PLUGINS_ENV} names plugin(s) {unknown} that are not installed; "
                f"installed plugins: {', '.join(ep.name for ep in found) or 'none'}",
                RuntimeWarning,
                stacklevel=2,
            )
        for ep in found:
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
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # a broken plugin must never take the process down
                report.status = "failed"
                report.error = f"{type(exc).__name__}: {exc}"
                report.kernels = []
                report.tables = []
                warnings.warn(
                    f"tokenspeed_kernel: plugin {ep.name!r} ({ep.value}) failed and was skipped "
                    f"(nothing it registered is kept): {report.error}",
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
            measured._forget_registered(report.tables)
        _reports.clear()
        _loaded = False

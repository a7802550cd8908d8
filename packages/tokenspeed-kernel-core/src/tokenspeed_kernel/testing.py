"""Helpers for vendor packages' own tests."""

from __future__ import annotations

import json
import sys
from importlib import metadata

from .core.plugins import plugin_reports
from .core.registry import registry

__all__ = ["installed_alone_problems"]

_VENDOR_MODULES = {
    "triton": ("tokenspeed_kernel_triton",),
    "nvidia": ("tokenspeed_kernel_nvidia", "flash_attn_interface", "flashinfer"),
    "amd": ("tokenspeed_kernel_amd", "aiter"),
}
_DISTRIBUTIONS = {
    "triton": "tokenspeed-kernel-triton",
    "nvidia": "tokenspeed-kernel-nvidia",
    "amd": "tokenspeed-kernel-amd",
}


def installed_alone_problems(plugin: str) -> list[str]:
    """Why this environment is not "core + ``plugin``'s wheel and nothing else" (empty: it is).

    Checks: only the core and ``plugin`` are discovered, every registered kernel
    comes from one of them, no other vendor package or library was imported while
    loading, and ``plugin``'s distribution was installed from a wheel (not editable).
    """
    problems = []
    reports = plugin_reports()
    if set(reports) != {"core", plugin}:
        problems.append(f"plugins discovered: {sorted(reports)}, expected ['core', {plugin!r}]")
    if reports.get(plugin) is None or reports[plugin].status != "loaded":
        problems.append(f"plugin {plugin!r} did not load: {reports.get(plugin)}")
    sources = {s.source for s in registry.all()}
    if not sources <= {"core", plugin}:
        problems.append(f"kernels registered by {sorted(sources - {'core', plugin})}")
    for other, modules in _VENDOR_MODULES.items():
        if other == plugin:
            continue
        loaded = [m for m in modules if m in sys.modules]
        if loaded:
            problems.append(f"modules of {other!r} imported: {loaded}")
    if plugin != "triton" and "triton" in sys.modules:
        problems.append("triton was imported by loading the plugins")
    dist = metadata.distribution(_DISTRIBUTIONS[plugin])
    direct = dist.read_text("direct_url.json")
    if direct and json.loads(direct).get("dir_info", {}).get("editable"):
        problems.append(f"{dist.name} is an editable install, not a wheel")
    return problems

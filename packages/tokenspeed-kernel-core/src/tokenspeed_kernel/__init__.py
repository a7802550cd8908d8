"""TokenSpeed-kernel: one kernel boundary for LLM inference engines.

Importing this package imports torch and the core only: no Triton, no vendor
library, no GPU query. Kernels are found through the ``tokenspeed_kernel.plugins``
entry points on the first call that needs a selection.
"""

from __future__ import annotations

from .core.contracts import ANY, Range, Size, all_contracts, get_contract
from .core.measured import MeasuredTable, register_measured_table
from .core.op import Op
from .core.platform import Platform, current_platform, fake_platform, make_platform
from .core.plugins import load_plugins, plugin_reports
from .core.registry import Capability, KernelSpec, Priority, register_kernel, registry, unregister_kernel
from .core.selection import (
    NoKernelFoundError,
    OverrideError,
    clear_selection_cache,
    explain_selection,
    format_explanation,
    kernel_override,
    reload_settings,
    select_kernel,
    select_spec,
    set_selection_oracle,
)
from .core.settings import SettingsError
from .ops import *  # noqa: F403
from .ops import __all__ as _ops_all

__version__ = "0.1.0"

__all__ = [
    *_ops_all,
    "ANY",
    "Range",
    "Size",
    "Op",
    "MeasuredTable",
    "register_measured_table",
    "SettingsError",
    "Capability",
    "KernelSpec",
    "Priority",
    "Platform",
    "NoKernelFoundError",
    "OverrideError",
    "all_contracts",
    "get_contract",
    "current_platform",
    "fake_platform",
    "make_platform",
    "load_plugins",
    "plugin_reports",
    "register_kernel",
    "unregister_kernel",
    "registry",
    "select_kernel",
    "select_spec",
    "explain_selection",
    "format_explanation",
    "kernel_override",
    "reload_settings",
    "clear_selection_cache",
    "set_selection_oracle",
]

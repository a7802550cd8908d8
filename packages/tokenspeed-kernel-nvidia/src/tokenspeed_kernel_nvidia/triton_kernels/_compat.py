"""Compatibility of ``triton_kernels`` (built against TokenSpeed's Triton fork) with upstream Triton 3.6.

Each shim is applied only when the installed Triton lacks the attribute, and
:data:`APPLIED` records which were. None changes what a kernel computes.
"""

from __future__ import annotations

import threading
from types import ModuleType

__all__ = ["APPLIED", "import_triton_kernels"]

#: The shims applied in this process (names), for reports.
APPLIED: list[str] = []
_lock = threading.Lock()
_module: ModuleType | None = None


def _is_hip_arch(arch: str) -> bool:
    from triton.language.target_info import current_target

    target = current_target()
    return target is not None and target.backend == "hip" and target.arch == arch


def is_hip_gfx1250() -> bool:
    return _is_hip_arch("gfx1250")


def is_hip_cdna3() -> bool:
    return _is_hip_arch("gfx942")


def is_hip_cdna4() -> bool:
    return _is_hip_arch("gfx950")


def _target_info_shims() -> None:
    import triton.language.target_info as target_info
    from triton.runtime.jit import constexpr_function

    # Why: triton_kernels.target_info imports these AMD-arch predicates, which upstream 3.6 lacks.
    # (Named functions: constexpr_function reads the source of what it wraps.)
    for fn in (is_hip_gfx1250, is_hip_cdna3, is_hip_cdna4):
        if not hasattr(target_info, fn.__name__):
            setattr(target_info, fn.__name__, constexpr_function(fn))
            APPLIED.append(f"triton.language.target_info.{fn.__name__}")


def _jit_shims() -> None:
    from triton.runtime.jit import JITFunction

    # Why: triton_kernels.specialize copies these source-location fields when it builds the
    # fused-SwiGLU matmul variant; upstream 3.6 never defines (or reads) them.
    for name, default in (("def_file_line_number", 1), ("def_file_col_number", 0)):
        if not hasattr(JITFunction, name):
            setattr(JITFunction, name, default)
            APPLIED.append(f"JITFunction.{name}")


def import_triton_kernels() -> ModuleType:
    """``triton_kernels`` with the shims the installed Triton needs (imported once)."""
    global _module
    with _lock:
        if _module is None:
            _target_info_shims()
            _jit_shims()
            import triton_kernels
            import triton_kernels.matmul
            import triton_kernels.numerics
            import triton_kernels.swiglu
            import triton_kernels.tensor
            import triton_kernels.tensor_details.layout

            _module = triton_kernels
    return _module

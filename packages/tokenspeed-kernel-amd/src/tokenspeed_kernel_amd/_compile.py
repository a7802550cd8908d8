"""Compile a kernel launch for an AMD target with no GPU (CI cross-compilation).

:func:`compile_launch` specialises the arguments of a launch exactly as Triton's
launcher does at run time (pointer alignment, 32-bit buffer range, integers
divisible by 16, constexprs), so what CI compiles is what a GPU would compile.
CPU tensors stand in for device tensors: only their dtype, strides, alignment
and storage size matter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["AmdgcnStats", "compile_launch", "amdgcn_stats"]


def compile_launch(fn: Any, args: tuple, kwargs: dict[str, Any], arch: str) -> Any:
    """Compile ``fn[grid](*args, **kwargs)`` for ``hip:<arch>`` (wave64). Returns the compiled kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("hip", arch, 64)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    if fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        from triton.compiler import ASTSource as Source
    src = Source(fn, signature, constexprs, attrs)
    return triton.compile(src, target=target, options=options.__dict__)


@dataclass(frozen=True)
class AmdgcnStats:
    """What the cross-compilation tests check in a kernel's AMDGCN.

    ``lds_*`` count the direct-to-LDS forms (``buffer_load_dwordx4 ... lds``,
    ``global_load_lds_dwordx4``), which are also counted in ``buffer_loads`` /
    ``global_loads``.
    """

    mfma: frozenset[str]
    buffer_loads: int
    lds_buffer_loads: int
    global_loads: int
    lds_global_loads: int
    vgpr_spills: int
    sgpr_spills: int
    vgprs: int
    agprs: int
    occupancy: int


def amdgcn_stats(asm: str) -> AmdgcnStats:
    """Instruction families and register metadata of one kernel's AMDGCN text."""

    def meta(pattern: str) -> int:
        m = re.search(pattern, asm, re.MULTILINE)
        if m is None:
            raise ValueError(f"AMDGCN text has no match for {pattern!r}")
        return int(m.group(1))

    code = [ln.split("//")[0].strip() for ln in asm.splitlines()]
    code = [ln for ln in code if ln and not ln.startswith(".")]
    buffer_loads = [ln for ln in code if ln.startswith("buffer_load")]
    return AmdgcnStats(
        mfma=frozenset(ln.split()[0] for ln in code if ln.startswith("v_mfma")),
        buffer_loads=len(buffer_loads),
        lds_buffer_loads=sum(1 for ln in buffer_loads if ln.endswith(" lds")),
        global_loads=sum(1 for ln in code if ln.startswith("global_load")),
        lds_global_loads=sum(1 for ln in code if ln.startswith("global_load_lds")),
        # Kernel descriptor metadata (.amdhsa / code object v5) and the assembler's comments.
        vgpr_spills=meta(r"^\s*\.vgpr_spill_count:\s*(\d+)"),
        sgpr_spills=meta(r"^\s*\.sgpr_spill_count:\s*(\d+)"),
        vgprs=meta(r"^; NumVgprs:\s*(\d+)"),
        agprs=meta(r"^; NumAgprs:\s*(\d+)"),
        occupancy=meta(r"^; Occupancy:\s*(\d+)"),
    )

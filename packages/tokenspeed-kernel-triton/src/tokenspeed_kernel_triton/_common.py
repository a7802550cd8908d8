"""Shared pieces of the Triton kernels: capability, registration defaults, cross-compilation."""

from __future__ import annotations

from typing import Any

from tokenspeed_kernel import Capability, Priority

#: Triton kernels run wherever the platform advertises Triton (NVIDIA, AMD, or the
#: CPU under TRITON_INTERPRET=1).
TRITON_CAPABILITY = Capability(features=frozenset({"triton"}))
TRITON_PRIORITY = Priority.PORTABLE

#: Targets every Triton kernel must compile for (checked in CI without a GPU).
CROSS_COMPILE_TARGETS: dict[str, tuple[str, Any, int]] = {
    "sm90": ("cuda", 90, 32),
    "gfx942": ("hip", "gfx942", 64),
    "gfx950": ("hip", "gfx950", 64),
}


def cross_compile(
    fn: Any,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    target: str,
    *,
    num_warps: int = 4,
    num_stages: int = 2,
) -> Any:
    """Compile a ``@triton.jit`` function for ``target`` ("sm90", "gfx942", "gfx950") with no GPU.

    ``signature`` maps every argument name to a Triton type string (``"*bf16"``,
    ``"i32"``, ``"fp32"``, ``"constexpr"``); ``constexprs`` gives the constexpr values.
    Returns the compiled kernel; ``.asm`` holds ``ptx``/``amdgcn`` text.
    """
    import triton
    from triton.backends.compiler import GPUTarget

    backend, arch, warp = CROSS_COMPILE_TARGETS[target]
    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    opts = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(src, target=GPUTarget(backend, arch, warp), options=opts)

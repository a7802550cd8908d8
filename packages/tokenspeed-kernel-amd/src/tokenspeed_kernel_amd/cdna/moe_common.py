"""What the CDNA MoE kernels (:mod:`.moe_decode`, :mod:`.moe_grouped`) take from the arch."""

from __future__ import annotations

from typing import Any

from .arch import CdnaArch

__all__ = ["arch_constexprs"]


def arch_constexprs(arch: CdnaArch) -> tuple[tuple[str, Any], ...]:
    """Constexprs every CDNA MoE kernel receives besides the twin's arguments.

    ``SCALED_MFMA``: the arch has ``v_mfma_scale_f32_*_f8f6f4`` (gfx950): FP8 activations x
    E2M1 weights with E8M0 scales in one instruction. Without it (gfx942) the weights are
    decoded to bf16 in registers for the bf16 MFMA. ``MFMA_VERSION`` / ``K_WIDTH``: as
    :class:`.arch.CdnaArch`; ``ASYNC_COPY``: direct global->LDS copies (gfx950).
    """
    return (
        ("SCALED_MFMA", arch.mfma_version >= 4),
        ("MFMA_VERSION", arch.mfma_version),
        ("K_WIDTH", arch.k_width),
        ("ASYNC_COPY", arch.async_copy),
    )

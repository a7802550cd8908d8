"""What the CDNA MoE kernels (:mod:`.moe_decode`, :mod:`.moe_grouped`) take from the arch."""

from __future__ import annotations

from typing import Any

from .arch import CdnaArch

__all__ = ["decode_constexprs", "grouped_constexprs"]


def decode_constexprs(arch: CdnaArch) -> tuple[tuple[str, Any], ...]:
    """What the decode kernels (:mod:`.moe_decode`) take besides the twin's arguments.

    ``SCALED_MFMA``: the arch has ``v_mfma_scale_f32_*_f8f6f4`` (gfx950). The decode kernels
    use no MFMA; the flag picks their E2M1 decode (gfx950's byte-permute lookup, integer
    arithmetic on gfx942, where ``gl.fp4_to_fp`` does not lower).
    """
    return (("SCALED_MFMA", arch.mfma_version >= 4),)


def grouped_constexprs(arch: CdnaArch) -> tuple[tuple[str, Any], ...]:
    """What the grouped GEMMs (:mod:`.moe_grouped`) take besides the twin's arguments.

    ``SCALED_MFMA``: FP8 activations x E2M1 weights with E8M0 scales in one instruction
    (gfx950); without it (gfx942) the weights are decoded to bf16 in registers for the bf16
    MFMA. ``MFMA_VERSION`` / ``K_WIDTH``: as :class:`.arch.CdnaArch`; ``ASYNC_COPY``: direct
    global->LDS copies (gfx950).
    """
    return (
        *decode_constexprs(arch),
        ("MFMA_VERSION", arch.mfma_version),
        ("K_WIDTH", arch.k_width),
        ("ASYNC_COPY", arch.async_copy),
    )

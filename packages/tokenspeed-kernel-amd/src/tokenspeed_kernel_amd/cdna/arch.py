"""What the CDNA kernels need to know about an arch, as data.

The Gluon kernels in this package are written once and specialised by the
constexprs below; the per-arch modules (``tokenspeed_kernel_amd.gfx942``,
``tokenspeed_kernel_amd.gfx950``) only pick one of these records.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CdnaArch", "GFX942", "GFX950", "ARCHS"]


@dataclass(frozen=True)
class CdnaArch:
    """One CDNA generation.

    Attributes:
        name: LLVM target name (``"gfx942"``).
        mfma_version: ``AMDMFMALayout.version`` (3 = CDNA3, 4 = CDNA4).
        mfma_k32: K of the 32x32 bf16/fp16 MFMA (``v_mfma_f32_32x32x{K}_bf16``).
        mfma_k16: K of the 16x16 bf16/fp16 MFMA (``v_mfma_f32_16x16x{K}_bf16``).
        k_width: 16-bit operand elements one lane feeds one MFMA (4 on CDNA3, 8 on CDNA4).
        async_copy: Gluon exposes direct global->LDS copies (``cdna4.async_copy``).
        lds_bytes: LDS per workgroup.
        default_compute_units: CU count of the flagship part (MI300X / MI355X), used to
            size split-KV grids when no device is at hand (cross-compilation).
    """

    name: str
    mfma_version: int
    mfma_k32: int
    mfma_k16: int
    k_width: int
    async_copy: bool
    lds_bytes: int
    default_compute_units: int


GFX942 = CdnaArch(
    name="gfx942",
    mfma_version=3,
    mfma_k32=8,
    mfma_k16=16,
    k_width=4,
    async_copy=False,
    lds_bytes=64 * 1024,
    default_compute_units=304,
)
GFX950 = CdnaArch(
    name="gfx950",
    mfma_version=4,
    mfma_k32=16,
    mfma_k16=32,
    k_width=8,
    async_copy=True,
    lds_bytes=160 * 1024,
    default_compute_units=256,
)
ARCHS: dict[str, CdnaArch] = {a.name: a for a in (GFX942, GFX950)}

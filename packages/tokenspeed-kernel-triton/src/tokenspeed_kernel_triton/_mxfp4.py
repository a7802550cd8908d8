"""MXFP4 decoding inside Triton kernels (shared by the MoE and dense kernels).

E2M1 codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 (8..15 their negatives); two codes a
byte, the low nibble the even element; one E8M0 scale ``2**(s - 127)`` per 32
values. Decoding happens in registers right after the load, so MXFP4 weights are
never materialised in HBM at higher precision.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e2m1_to_float(code):
    """E2M1 code (integer tensor, 0..15) -> float32 value."""
    mag = code & 7
    exp = (mag >> 1).to(tl.float32)
    mant = (mag & 1).to(tl.float32)
    # mag 0/1 are the zero and subnormal (0.5) codes; above that 2**(e-1) * (1 + m/2).
    normal = tl.exp2(exp - 1.0) * (1.0 + 0.5 * mant)
    value = tl.where(mag < 2, 0.5 * mant, normal)
    return tl.where(code >= 8, -value, value)


@triton.jit
def unpack_mxfp4(packed, scale_exp, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """Decode ``packed uint8 [BLOCK_R, BLOCK_K // 2]`` with ``scale_exp uint8 [BLOCK_R, BLOCK_K // 32]``
    into float32 ``[BLOCK_R, BLOCK_K]`` (values along K, low nibble first)."""
    lo = e2m1_to_float(packed & 15)
    hi = e2m1_to_float(packed >> 4)
    # join puts (lo, hi) pairs on a new minor axis: reshaping interleaves them along K.
    vals = tl.reshape(tl.join(lo, hi), (BLOCK_R, BLOCK_K))
    scale = tl.exp2(scale_exp.to(tl.float32) - 127.0)
    vals = tl.reshape(vals, (BLOCK_R, BLOCK_K // 32, 32)) * scale[:, :, None]
    return tl.reshape(vals, (BLOCK_R, BLOCK_K))

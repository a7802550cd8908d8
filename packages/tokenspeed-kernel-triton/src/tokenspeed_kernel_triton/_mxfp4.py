"""MXFP4 decoding inside Triton kernels: the one decoder of mm, dequantize_mxfp4 and the MoE GEMMs.

E2M1 codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 (8..15 their negatives, 8 is -0); two
codes a byte, the low nibble the even element; one E8M0 scale ``2**(s - 127)`` per 32
values. Decoding happens in registers right after the load, so MXFP4 weights are never
materialised in HBM at higher precision. Every decoder here is exact and matches
``tokenspeed_kernel.reference.quantization.mxfp4_to_float`` bit for bit (-0 included;
scale byte 0 is the subnormal ``2**-127``, 255 gives infinity as ``exp2(128)`` does).

The decode is pure bit arithmetic: a code's sign moved to fp16 bit 15 and its three
exponent/mantissa bits to fp16 bits 11..9 is an fp16 equal to the E2M1 value times
``2**-14`` exactly (code 1, 0.5, lands on the fp16 subnormal ``2**-15``, which the
fp16 -> fp32 conversion keeps). No ``exp2``, no select per value. The scale is then
applied as two multiplies, ``(v * 2**14) * 2**(s - 127)``: the first is exact and the
second is the reference's one rounding; folding them into one ``2**(s - 113)`` would
overflow the exponent field for scale bytes above 240.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: The factor the fp16 bit construction leaves out (its values are E2M1 * 2**-14).
E2M1_REBIAS = tl.constexpr(16384.0)


@triton.jit
def _fp16_bits_to_float(bits):
    """Integer tensor holding fp16 bit patterns in its low 16 bits -> float32."""
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def e8m0_to_float(scale_exp):
    """E8M0 bytes -> float32 ``2**(s - 127)`` built from its exponent bits (exact)."""
    s = scale_exp.to(tl.int32)
    # s = 0 has no normal exponent field: it is the subnormal 2**-127 (mantissa MSB).
    return tl.where(s == 0, 0x00400000, s << 23).to(tl.float32, bitcast=True)


@triton.jit
def unpack_mxfp4(packed, scale_exp, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """Decode ``packed uint8 [BLOCK_R, BLOCK_K // 2]`` with ``scale_exp uint8 [BLOCK_R, BLOCK_K // 32]``
    into float32 ``[BLOCK_R, BLOCK_K]`` (values along K, low nibble first; exact)."""
    p = packed.to(tl.int32)
    lo = _fp16_bits_to_float(((p & 0x07) << 9) | ((p & 0x08) << 12))
    hi = _fp16_bits_to_float(((p & 0x70) << 5) | ((p & 0x80) << 8))
    # join puts (lo, hi) pairs on a new minor axis: reshaping interleaves them along K.
    vals = tl.reshape(tl.join(lo, hi), (BLOCK_R, BLOCK_K // 32, 32))
    # Two multiplies, in this order: the first restores the exact E2M1 value, the second
    # is then the reference's single rounding (a folded 2**(s - 113) would overflow for s > 240).
    vals = (vals * E2M1_REBIAS) * e8m0_to_float(scale_exp)[:, :, None]
    return tl.reshape(vals, (BLOCK_R, BLOCK_K))


@triton.jit
def e2m1_word_planes(words):
    """Int32 code words ``[...]`` (eight codes a word, code j in bits 4j..4j+3, i.e. four
    little-endian bytes) -> eight float32 tensors ``(c0, ..., c7)``: code j's E2M1 value
    times ``2**-14``.

    Codes j and j + 4 sit 16 bits apart, so one mask-and-shift builds both fp16 halves
    of a 32-bit lane: about 2.5 integer operations a value.
    """
    w = words.to(tl.uint32, bitcast=True)
    p04 = ((w & 0x00070007) << 9) | ((w & 0x00080008) << 12)
    p15 = ((w & 0x00700070) << 5) | ((w & 0x00800080) << 8)
    p26 = ((w & 0x07000700) << 1) | ((w & 0x08000800) << 4)
    p37 = ((w >> 3) & 0x0E000E00) | (w & 0x80008000)
    return (
        _fp16_bits_to_float(p04),
        _fp16_bits_to_float(p15),
        _fp16_bits_to_float(p26),
        _fp16_bits_to_float(p37),
        _fp16_bits_to_float(p04 >> 16),
        _fp16_bits_to_float(p15 >> 16),
        _fp16_bits_to_float(p26 >> 16),
        _fp16_bits_to_float(p37 >> 16),
    )


@triton.jit
def e2m1_words_times_2m14(words, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """Int32 code words ``[BLOCK_R, BLOCK_K // 8]`` (the packed bytes read four at a time)
    -> float32 ``[BLOCK_R, BLOCK_K]`` in K order: each E2M1 value times ``2**-14``, unscaled."""
    c0, c1, c2, c3, c4, c5, c6, c7 = e2m1_word_planes(words)
    # Nested joins add three minor axes; the outermost join varies fastest after the
    # reshape, so this nesting flattens to c0, c1, ..., c7 along K.
    vals = tl.join(tl.join(tl.join(c0, c4), tl.join(c2, c6)), tl.join(tl.join(c1, c5), tl.join(c3, c7)))
    return tl.reshape(vals, (BLOCK_R, BLOCK_K))


@triton.jit
def unpack_mxfp4_words(words, scale_exp, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """Decode int32 code words ``[BLOCK_R, BLOCK_K // 8]`` with ``scale_exp uint8 [BLOCK_R,
    BLOCK_K // 32]`` into float32 ``[BLOCK_R, BLOCK_K]`` in K order (exact, as :func:`unpack_mxfp4`)."""
    vals = tl.reshape(e2m1_words_times_2m14(words, BLOCK_R, BLOCK_K), (BLOCK_R, BLOCK_K // 32, 32))
    vals = (vals * E2M1_REBIAS) * e8m0_to_float(scale_exp)[:, :, None]
    return tl.reshape(vals, (BLOCK_R, BLOCK_K))

"""The packed MXFP4 layout of ``hopper.moe_apply_packed``: the canonical codes with the bits of each
32-bit word placed where the bf16 decode wants them.

A canonical code word (4 bytes of a weight row, little endian) holds codes ``j = 0 .. 7`` of 8
consecutive K positions, code ``j`` in bits ``4 j .. 4 j + 3`` (E2M1: mantissa ``m``, exponent
``e0``, ``e1``, sign ``s`` from the low bit up). The canonical decode (:func:`.decode._decode_a`)
pairs codes ``j`` and ``j + 4`` (16 bits apart) and spends a shift, two masks and an integer
multiply on each pair: 17 instructions per word with the four scale multiplies.

This layout keeps every word where it is (same tensor shapes, same scales: rows, K blocks and MX
blocks do not move) and permutes the 32 bits inside it (:data:`BIT_SOURCE`) so that pair ``p`` is
codes ``2 p`` and ``2 p + 1``, K-adjacent, and decodes with fewer instructions into the bf16 pair
``E2M1 * 2**-126`` (magnitude bits at 6..8 and the sign at 15 of each half, ``_BITS``):

- pair 0: ``w & BITS`` (one instruction);
- pair 1: ``rotr(w, 3) & BITS``, pair 2: ``rotr(w, 6) & BITS`` (a funnel shift and a mask);
- pair 3: ``((w & 0x001B001B) * 0x1084) & BITS``: the multiply adds three shifted copies (by 2, 7
  and 12) of the 8 remaining bits, which do not overlap, so no carries; the final mask keeps one
  copy of each bit. (No fourth rotation exists: the bit set of a pair cannot tile a word four
  times.)

12 instructions a word instead of 17 (the sm90 cross-compile of the decode GEMM's K loop: 1018
instructions instead of 1260, ``tools/decode_sass_counts.py --packed``). A bf16x2 register now holds two
K-adjacent values, so the activations' K permutation (:func:`.decode._arrange_b`, the prefill ``kperm``) moves
K-adjacent pairs as units.
The W4A8 decode (a per-byte table) needs canonical nibbles, so ``hopper.moe_apply_w4a8`` keeps the
canonical layout; a layer uses one or the other (``moe_plan`` picks).
"""

from __future__ import annotations

import dataclasses

import torch

from tokenspeed_kernel.ops.moe import MoEWeights

__all__ = ["LAYOUT", "BIT_SOURCE", "PAIR_MASK", "PAIR_MULTIPLIER", "pack_codes", "preprocess_weights"]

#: The layout name (``MoEWeights.layout``): the registered kernel that reads it.
LAYOUT = "hopper.moe_apply_packed"

#: Pair 3's decode: ``((w & PAIR_MASK) * PAIR_MULTIPLIER) & BITS``.
PAIR_MASK = 0x001B001B
PAIR_MULTIPLIER = (1 << 2) + (1 << 7) + (1 << 12)

# The bf16 bit each E2M1 bit of the low code of a pair lands on (m, e0, e1, s); the high code's
# land 16 bits higher.
_TARGET = (6, 7, 8, 15)


def _placement() -> tuple[tuple[int, int], ...]:
    """``(code j, bit b)`` of the canonical word that packed bit ``d`` holds, for ``d = 0 .. 31``."""
    src: dict[int, tuple[int, int]] = {}
    for half in (0, 1):
        for b, t in enumerate(_TARGET):
            t += 16 * half
            src[t] = (half, b)  # pair 0: in place
            src[(t + 3) % 32] = (2 + half, b)  # pair 1: rotr 3 brings bit t + 3 to t
            src[(t + 6) % 32] = (4 + half, b)  # pair 2: rotr 6
    # Pair 3: bit t comes from the copy shifted by 2 (m), 7 (e0, e1) or 12 (s).
    for half in (0, 1):
        for b, (t, shift) in enumerate(zip(_TARGET, (2, 7, 7, 12), strict=True)):
            src[t + 16 * half - shift] = (6 + half, b)
    assert sorted(src) == list(range(32)), "the placement must use every bit once"
    return tuple(src[d] for d in range(32))


#: ``BIT_SOURCE[d] = (j, b)``: packed bit ``d`` of a word is bit ``b`` of its canonical code ``j``.
BIT_SOURCE = _placement()


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """Canonical MXFP4 codes ``uint8 [..., K / 2]`` (``K`` a multiple of 8) -> the packed layout, a new
    tensor of the same shape. Works on any device, one row slab at a time (bounded temporary memory)."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"codes: expected uint8, got {codes.dtype}")
    if codes.dim() < 1 or codes.shape[-1] % 4:
        raise ValueError(f"codes: expected a last dimension divisible by 4 (8 codes a word), got {tuple(codes.shape)}")
    src = codes.contiguous().reshape(-1, codes.shape[-1])
    out = torch.empty_like(src)
    rows = max(1, (1 << 24) // max(1, src.shape[1]))
    for r0 in range(0, src.shape[0], rows):
        w = src[r0 : r0 + rows].view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        packed = torch.zeros_like(w)
        for d, (j, b) in enumerate(BIT_SOURCE):
            packed |= ((w >> (4 * j + b)) & 1) << d
        # back to int32 bits (two's complement) without overflow
        out[r0 : r0 + rows] = (packed - ((packed >> 31) << 32)).to(torch.int32).view(torch.uint8)
    return out.reshape(codes.shape)


def preprocess_weights(weights: MoEWeights) -> MoEWeights:
    """Canonical MXFP4 weights -> the packed layout (new code tensors; scales and biases shared, the
    input is not modified). Gate/up rows keep their order (interleaved or not)."""
    if weights.format != "mxfp4":
        raise ValueError(f"weights: hopper.moe_apply_packed takes mxfp4 weights, got {weights.format!r}")
    if weights.layout != "canonical":
        raise ValueError(f"weights: expected the canonical layout, got {weights.layout!r}")
    weights.validate()
    return dataclasses.replace(weights, w13=pack_codes(weights.w13), w2=pack_codes(weights.w2), layout=LAYOUT, extra=())

"""CUDA-core decode kernels of the MXFP4 MoE for a few tokens: no MMA, every SM full of small programs.

At one token a GPT-OSS layer reads four experts' weights (53 MB in MXFP4) for about 100 M multiply-adds. The MMA decode
kernels of :mod:`.decode` run one-warp programs that walk the whole K range of a 32-row tile; measured, their two GEMMs
take 39 us with the weights already in L2 (host-cost report, session 21) because each program's dependent chain,
not DRAM, sets the pace. These kernels trade the MMA for plain fp32 fused multiply-adds: a value costs a few integer
instructions to decode and one FFMA, and hundreds to thousands of 4-8-warp programs share the SMs. Measured so far
they are slower than the MMA path (host-cost report, session 26; :data:`.layer.GEMV_TILES`), so only ``tiles=`` runs
them.

- **Decode by bit placement, a bf16 pair at a time** (:mod:`.decode`'s, canonical or :mod:`.packed` layout): a mask,
  an integer multiply and a mask place two codes of a 32-bit word as the bf16 pair ``E2M1 * 2**-126``; one
  ``mul.rn.bf16x2`` by the block's ``2**(s - 1)`` gives the exact weights (``TWO_STEP``: by ``2**126`` then
  ``2**(s - 127)``, for scale bytes above 128); a shift or a mask widens each to fp32 for its FFMA.
- **Activations as bf16 pairs.** The activations are read as int32 words, word ``b`` = ``(x[2 b], x[2 b + 1])``:
  four a code word (its 8 K positions), so the activation tiles have the code tile's shape and each half becomes an
  fp32 by a shift or a mask. The two row groups of a program (below) share them in registers.
- **Gate/up** (:func:`moe_gemv` with ``GATE_UP``): program (pair, feature tile) computes ``ROWS / 2`` features'
  gate and up rows (both in the program), adds the bias and writes ``inter[pair] = swiglu(...)`` in bf16.
- **Down**: program (token, row tile) computes the row tile for every slot of the token at once (the slots are the
  tile's first axis), adds the bias, weights each slot by its routing weight, sums the slots and writes the token's
  output rows: the combine is in the GEMM (no fp32 buffer, no third launch, no atomics: deterministic).

- **The K loop is software-pipelined by hand**: a step's code words, scale bytes and activations are loaded before
  the previous step's arithmetic (the loop carries them). This version was not measured on a GPU (session 26 ran
  out of device time; the measured one loaded and computed each step in turn).

Two launches a call. Each waits for the launch before it (``PDL``: programmatic dependent launch, as :mod:`.decode`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .decode import _tl_grid_sync, tl_swiglu
from .packed import PAIR_MASK, PAIR_MULTIPLIER

__all__ = ["moe_gemv"]


_BITS = tl.constexpr(0x81C081C0 - (1 << 32))  # bf16 bits of placed E2M1 codes in both halves (int32)
_TWO_126_X2 = tl.constexpr(0x7E807E80)  # bf16x2 (2**126, 2**126)
_HIGH = tl.constexpr(-65536)  # 0xFFFF0000
_PAIR_MASK = tl.constexpr(PAIR_MASK)
_PAIR_MULTIPLIER = tl.constexpr(PAIR_MULTIPLIER)


@triton.jit
def _bf16x2_mul(a, b, ASM: tl.constexpr):
    """Elementwise ``mul.rn.bf16x2`` of two int32 tensors holding bf16 pairs. Without ``ASM`` (Triton's interpreter
    runs no PTX) the same products in float32, exact for the factors used here (powers of two; the products are
    bf16 values)."""
    if ASM:
        return tl.inline_asm_elementwise("mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.int32,
                                         is_pure=True, pack=1)  # fmt: skip
    else:
        lo = (_lo(a) * _lo(b)).to(tl.int32, bitcast=True)
        hi = (_hi(a) * _hi(b)).to(tl.int32, bitcast=True)
        return ((lo >> 16) & 0xFFFF) | (hi & _HIGH)


@triton.jit
def _lo(v):
    """The low bf16 of int32 pairs as float32."""
    return (v << 16).to(tl.float32, bitcast=True)


@triton.jit
def _hi(v):
    """The high bf16 of int32 pairs as float32."""
    return (v & _HIGH).to(tl.float32, bitcast=True)


@triton.jit
def _load_codes(w_rows, s_rows, ok, m, m_ok, q):
    """The code words ``[rows, NB, 4]`` and scale bytes ``[rows, NB]`` of MX blocks ``m`` of the rows."""
    ok2 = ok[:, None] & m_ok[None, :]
    w = tl.load(w_rows[:, None, None] + (m * 4)[None, :, None] + q[None, None, :], mask=ok2[:, :, None], other=0)
    sc = tl.load(s_rows[:, None] + m[None, :], mask=ok2, other=127).to(tl.int32)
    return w, sc


@triton.jit
def _load_acts(a_rows, slot_ok, m, m_ok, q):
    """Activation words ``4 q + c`` (``c = 0 .. 3``) of MX blocks ``m``, ``[rows, NB, 4]`` each."""
    xa = a_rows[:, None, None] + (m * 16)[None, :, None] + (q * 4)[None, None, :]
    x_ok = (slot_ok[:, None] & m_ok[None, :])[:, :, None]
    x0 = tl.load(xa, mask=x_ok, other=0)
    x1 = tl.load(xa + 1, mask=x_ok, other=0)
    x2 = tl.load(xa + 2, mask=x_ok, other=0)
    x3 = tl.load(xa + 3, mask=x_ok, other=0)
    return x0, x1, x2, x3


@triton.jit
def _block_dot(w, sc, x0, x1, x2, x3, acc, PACKED: tl.constexpr, TWO_STEP: tl.constexpr, ASM: tl.constexpr):
    """``acc += w * x`` for code words ``w`` ``[rows, NB, 4]`` (row, MX block, word) with scale bytes ``sc``
    ``[rows, NB]`` and activation words ``x0 .. x3`` (words ``4 q + c`` of each code word ``q``)."""
    if TWO_STEP:
        b = tl.where(sc == 0, 0x40, sc << 7)
    else:
        b = (sc + 126) << 7
    f = (b | (b << 16))[:, :, None]
    if PACKED:
        # The layout of :mod:`.packed`: plane p holds codes 2 p and 2 p + 1 (activation word 4 q + p).
        r0 = w & _BITS
        r1 = ((w >> 3) & 0x1FFFFFFF | (w << 29)) & _BITS
        r2 = ((w >> 6) & 0x03FFFFFF | (w << 26)) & _BITS
        r3 = ((w & _PAIR_MASK) * _PAIR_MULTIPLIER) & _BITS
    else:
        # Plane p of a word: codes p and p + 4 (K positions 8 q + p and 8 q + p + 4 of the MX block; activation
        # words 4 q + p // 2 and 4 q + 2 + p // 2, half p % 2) as one bf16 pair ``E2M1 * 2**-126``.
        hw = w >> 8
        r0 = ((w & 0x000F000F) * 0x1040) & _BITS
        r1 = ((w & 0x00F000F0) * 0x104) & _BITS
        r2 = ((hw & 0x000F000F) * 0x1040) & _BITS
        r3 = ((hw & 0x00F000F0) * 0x104) & _BITS
    if TWO_STEP:
        two126 = tl.full(w.shape, _TWO_126_X2, tl.int32)
        r0 = _bf16x2_mul(r0, two126, ASM)
        r1 = _bf16x2_mul(r1, two126, ASM)
        r2 = _bf16x2_mul(r2, two126, ASM)
        r3 = _bf16x2_mul(r3, two126, ASM)
    r0 = _bf16x2_mul(r0, f, ASM)
    r1 = _bf16x2_mul(r1, f, ASM)
    r2 = _bf16x2_mul(r2, f, ASM)
    r3 = _bf16x2_mul(r3, f, ASM)
    # The activation halves of each plane's low and high value.
    if PACKED:
        a0, b0, a1, b1, a2, b2, a3, b3 = _lo(x0), _hi(x0), _lo(x1), _hi(x1), _lo(x2), _hi(x2), _lo(x3), _hi(x3)
    else:
        a0, b0, a1, b1, a2, b2, a3, b3 = _lo(x0), _lo(x2), _hi(x0), _hi(x2), _lo(x1), _lo(x3), _hi(x1), _hi(x3)
    acc += _lo(r0) * a0
    acc += _hi(r0) * b0
    acc += _lo(r1) * a1
    acc += _hi(r1) * b1
    acc += _lo(r2) * a2
    acc += _hi(r2) * b2
    acc += _lo(r3) * a3
    acc += _hi(r3) * b3
    return acc


@triton.jit
def moe_gemv(
    a_ptr, stride_a, ids_ptr, tw_ptr, w_ptr, stride_we, s_ptr, stride_se, b_ptr, stride_be, o_ptr, stride_o,
    alpha, limit, up_offset,
    K: tl.constexpr, N: tl.constexpr, SROW: tl.constexpr, TOP_K: tl.constexpr, SLOTS: tl.constexpr,
    ROWS: tl.constexpr, NB: tl.constexpr, GATE_UP: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_LIMIT: tl.constexpr, TWO_STEP: tl.constexpr, PACKED: tl.constexpr = False, PDL: tl.constexpr = False,
    ASM: tl.constexpr = True,
):  # fmt: skip
    """One GEMM of the few-token path; see the module docstring.

    ``a``: the activations as int32 bf16 pairs (``stride_a`` in words): ``x [T, K / 2]`` for gate/up (row = pair //
    TOP_K), ``inter [pairs, K / 2]`` for down (row = pair). ``w``: uint8 codes ``[E, N, K / 2]`` (rows contiguous,
    ``stride_we`` in bytes), ``s``: scale bytes ``[E, N, K / 32]`` (row stride ``SROW``), ``b``: ``[E, N]`` bias.
    Gate/up: grid ``(pairs, cdiv(N / 2, ROWS / 2))``, ``SLOTS = 1``, writes ``o = inter [pairs, N / 2]``. Down: grid
    ``(tokens, cdiv(N, ROWS))``, ``SLOTS`` = ``TOP_K`` rounded up to a power of two, writes ``o = out [T, N]``.
    ``NB``: MX blocks (32 values, 4 code words) of K a program reads per row and loop step. ``ASM``: the scale
    multiply as PTX (False under Triton's interpreter).

    A program's rows come in two groups of ``ROWS / 2`` a slot that share their activations in registers (each
    thread converts an activation word once for both): gate/up, the gate rows and the up rows of ``ROWS / 2``
    features; down, the tile's first and second half.
    """
    _tl_grid_sync(PDL)
    pid0 = tl.program_id(0)
    pid1 = tl.program_id(1)
    HALF: tl.constexpr = ROWS // 2
    rr = tl.arange(0, SLOTS * HALF)  # slot-major
    sl = rr // HALF
    r = rr % HALF
    if GATE_UP:
        pair = pid0 + sl
        slot_ok = sl < 1
        a_row = pair // TOP_K
        jj = pid1 * HALF + r
        if INTERLEAVED:
            row0 = 2 * jj
            row1 = 2 * jj + 1
        else:
            row0 = jj
            row1 = N // 2 + jj
        ok0 = (jj < N // 2) & slot_ok
        ok1 = ok0
    else:
        pair = pid0 * TOP_K + sl
        slot_ok = sl < TOP_K
        a_row = pair
        row0 = pid1 * ROWS + r
        row1 = row0 + HALF
        ok0 = (row0 < N) & slot_ok
        ok1 = (row1 < N) & slot_ok
    e = tl.load(ids_ptr + pair, mask=slot_ok, other=0).to(tl.int64)
    KB: tl.constexpr = K // 32
    mb = tl.arange(0, NB)
    q = tl.arange(0, 4)
    w_base = w_ptr.to(tl.pointer_type(tl.int32)) + e * (stride_we // 4)
    w_rows0 = w_base + row0.to(tl.int64) * (K // 8)  # [SLOTS * HALF], int32 words
    w_rows1 = w_base + row1.to(tl.int64) * (K // 8)
    s_rows0 = s_ptr + e * stride_se + row0.to(tl.int64) * SROW
    s_rows1 = s_ptr + e * stride_se + row1.to(tl.int64) * SROW
    a_rows = a_ptr + a_row.to(tl.int64) * stride_a
    acc0 = tl.zeros([SLOTS * HALF, NB, 4], dtype=tl.float32)
    acc1 = tl.zeros([SLOTS * HALF, NB, 4], dtype=tl.float32)
    # Software pipelined by hand: a step's loads are issued before the previous step's arithmetic (the loop carries
    # them), so every program has a step's bytes in flight while it computes.
    m_ok = mb < KB
    w0, s0 = _load_codes(w_rows0, s_rows0, ok0, mb, m_ok, q)
    w1, s1 = _load_codes(w_rows1, s_rows1, ok1, mb, m_ok, q)
    x0, x1, x2, x3 = _load_acts(a_rows, slot_ok, mb, m_ok, q)
    for k0 in range(NB, KB + NB, NB):
        m = k0 + mb
        m_ok = m < KB  # all false on the last step: its loads are masked off
        w0n, s0n = _load_codes(w_rows0, s_rows0, ok0, m, m_ok, q)
        w1n, s1n = _load_codes(w_rows1, s_rows1, ok1, m, m_ok, q)
        x0n, x1n, x2n, x3n = _load_acts(a_rows, slot_ok, m, m_ok, q)
        acc0 = _block_dot(w0, s0, x0, x1, x2, x3, acc0, PACKED, TWO_STEP, ASM)
        acc1 = _block_dot(w1, s1, x0, x1, x2, x3, acc1, PACKED, TWO_STEP, ASM)
        w0, s0, w1, s1 = w0n, s0n, w1n, s1n
        x0, x1, x2, x3 = x0n, x1n, x2n, x3n
    tot0 = tl.sum(tl.sum(acc0, axis=2), axis=1)  # [SLOTS * HALF]
    tot1 = tl.sum(tl.sum(acc1, axis=2), axis=1)
    if HAS_BIAS:
        tot0 += tl.load(b_ptr + e * stride_be + row0, mask=ok0, other=0.0).to(tl.float32)
        tot1 += tl.load(b_ptr + e * stride_be + row1, mask=ok1, other=0.0).to(tl.float32)
    if GATE_UP:
        h = tl_swiglu(tot0, tot1, alpha, limit, up_offset, HAS_LIMIT)  # gate rows, up rows
        tl.store(o_ptr + pid0.to(tl.int64) * stride_o + jj, h.to(o_ptr.dtype.element_ty), mask=ok0)
    else:
        tw = tl.load(tw_ptr + pair, mask=slot_ok, other=0.0).to(tl.float32)
        y0 = tl.sum(tl.reshape(tl.where(ok0, tot0 * tw, 0.0), [SLOTS, HALF]), axis=0)
        y1 = tl.sum(tl.reshape(tl.where(ok1, tot1 * tw, 0.0), [SLOTS, HALF]), axis=0)
        cols = pid1 * ROWS + tl.arange(0, HALF)
        o_row = o_ptr + pid0.to(tl.int64) * stride_o
        tl.store(o_row + cols, y0.to(o_ptr.dtype.element_ty), mask=cols < N)
        tl.store(o_row + cols + HALF, y1.to(o_ptr.dtype.element_ty), mask=cols + HALF < N)

"""Gated delta rule (Gated DeltaNet): chunked prefill in three kernels and a one-kernel decode step.

Per value head a float32 state ``S [K, V]``; per token ``S <- exp(g) S``, ``u = beta (v - S^T k)``,
``S <- S + k u^T``, ``o = S^T (scale q)`` (``tokenspeed_kernel.ops.linear_attention``). The
prefill uses the chunked WY / UT form of ``tokenspeed_kernel.reference.linear_attention``
(chunks of :data:`CHUNK` tokens; ``G`` the within-chunk cumulative log decay):

(a) ``_gdn_wy_kernel``, grid ``(chunks, HV)``, chunk-parallel: ``G`` (stored, fp32, so the
    other kernels read the same values), ``A = strict_lower(beta_i exp(G_i - G_j) k_i.k_j)``
    as 4 x 4 blocks of 16 x 16, ``T = (I + A)^-1`` in fp32 (forward substitution inside the
    four diagonal blocks, then the off-diagonal blocks by block substitution with fp32
    ``ieee`` dots: a few thousand FMAs a chunk), ``W = T diag(beta exp(G)) K`` and
    ``U' = T diag(beta) V``. The diagonal scalings are folded into T's columns in fp32, and
    ``T diag(.)`` is rounded to the input dtype for the two tensor-core products
    (bf16/fp16 operands, fp32 accumulation); W and U' are stored in the input dtype.
(b) ``_gdn_state_kernel``, grid ``(sequences, HV, V / BV)``, sequential over a sequence's
    chunks: the fp32 state tile ``S [K, BV]`` lives in registers; per chunk it stores
    ``h = S`` (the chunk's initial state, input dtype), ``U = U' - W S`` (overwriting U',
    input dtype) and updates ``S <- exp(G_last) S + K^T (exp(G_last - G) U)``. The two
    products use the input dtype (S and the decayed U rounded to it, fp32 accumulation);
    the state itself is only ever accumulated in fp32. Writes the final states.
(c) ``_gdn_output_kernel``, grid ``(chunks, HV, V / BV)``, chunk-parallel:
    ``O = scale diag(exp(G)) Q h + (scale M o Q K^T) U`` with ``M[i, j] = exp(G_i - G_j)``
    for ``j <= i``; the masked scores are rounded to the input dtype for the second product.

With ``use_qk_l2norm`` the row norms ``rsqrt(sum x^2 + 1e-6)`` are computed in fp32 in every
kernel that reads q or k and applied as fp32 row / column scalings of the products (the
q/k tiles go to the tensor cores unmodified). fp32 inputs run the products in IEEE fp32
(:func:`dot_mode`; plain TF32 missed the ``recurrence`` tolerance on the H200 by 1.1-4.7x,
as did flash-linear-attention's TF32 path).

Varlen without a host sync: chunk ``c`` of sequence ``s`` has the global index
``chunk_first[s] + c`` (``chunk_first`` the exclusive prefix sum of ``cdiv(len, CHUNK)``,
computed by torch ops on the device); the chunk-parallel grids are sized by the upper bound
``T // CHUNK + B`` and each program finds its sequence by a binary search of
``chunk_first`` (``ceil(log2 B)`` scalar loads); programs past the last chunk exit.

Decode (``_gdn_decode_kernel``, grid ``(B, HV, V / BV)``): one pass over the state tile
``[K, BV]`` in fp32 (decay, ``S^T k``, rank-1 update, ``S^T q``), stored back in place: the
state is read and written once. ``state_indices[b] < 0`` writes a zero output row only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.launch import cached, cdiv

from ._host import arch_family

__all__ = [
    "CHUNK",
    "GdnTile",
    "GdnPrefillConfig",
    "GDN_PREFILL_CONFIGS",
    "GDN_DECODE_CONFIGS",
    "gdn_prefill_config",
    "gdn_decode_config",
    "gdn_chunk_prefill",
    "gdn_chunk_prefill_with_config",
    "gdn_decode",
    "gdn_decode_with_config",
    "TRITON_KERNELS",
]

#: Tokens per chunk. The WY kernel's solve is written for 4 sub-blocks of 16 rows, so this
#: is a property of the kernels, not a tuning knob.
CHUNK = 64
_SUB = 16
_L2_EPS = 1e-6


@dataclass(frozen=True)
class GdnTile:
    """One kernel's launch: ``block`` columns per program (or per step), warps, pipeline stages."""

    block: int
    num_warps: int = 4
    num_stages: int = 2


@dataclass(frozen=True)
class GdnPrefillConfig:
    """The three prefill kernels' tiles.

    ``wy.block``: K (and V) columns per step of the WY kernel's loops; ``state.block``: BV,
    the state tile's columns (the sequential kernel's parallelism is ``B * HV * V / BV``);
    ``out.block``: BV of the output kernel (``V / BV`` programs recompute ``Q K^T``).
    """

    wy: GdnTile
    state: GdnTile
    out: GdnTile


# Prefill, by sequence-head pairs (B * HV): (largest pair count, config), the last row a
# catch-all. NVIDIA rows measured on the H200 (below); AMD rows not run, reasoned from the
# sm90 / gfx942 cross-compiles (test_cross_compile_linear_attention: registers, spills).
# - state kernel (the critical path: one dependent step per 64 tokens): Qwen3-Next at one
#   sequence has only 32 pairs, so BV = 32 gives 128 programs for the 132 SMs (4 warps, 142
#   registers, 3 stages prefetching the next chunk's W, U', K and G: ~100 KB of shared
#   memory). With more pairs BV = 64 halves the W and K reloads per state column; its
#   [128, 64] fp32 state needs 8 warps (4 spill on sm90; 8 warps, 2 stages: 182 registers,
#   ~90 KB).
# - WY kernel: a chunk's keys in one step (block = K <= 128); 8 warps (4 warps need 247
#   registers on sm90, one step from spilling).
# - output kernel: V = 128 in one tile (Q K^T once), 8 warps (181 registers, 64 KB).
# AMD (not measured; 64-lane wavefronts, 64 KB of LDS on MI300X): 4 warps, half tiles in
# the WY and output kernels, 2 stages in the state kernel.
GDN_PREFILL_CONFIGS: dict[str, tuple[tuple[int | None, GdnPrefillConfig], ...]] = {
    # H200 (tools/gdn_h200.py sweep, docs/benchmarks/h200-2026-12-01/gdn/call3-gdn_sweep.json): each
    # kernel's tile varied with the others fixed at Qwen3-Next shapes (1x4096 .. 32x512 tokens);
    # 4 warps in the WY and output kernels were the two largest gains (WY: 1762 -> 1340 us at
    # 1x16384; output: 1762 -> 1628 us), the state tiles below were the best of six.
    "nvidia": (
        (64, GdnPrefillConfig(wy=GdnTile(128, 4, 2), state=GdnTile(32, 4, 3), out=GdnTile(128, 4, 2))),
        (None, GdnPrefillConfig(wy=GdnTile(128, 4, 2), state=GdnTile(64, 4, 2), out=GdnTile(128, 4, 2))),
    ),
    "amd": (
        (64, GdnPrefillConfig(wy=GdnTile(64, 4, 1), state=GdnTile(32, 4, 2), out=GdnTile(64, 4, 1))),
        (None, GdnPrefillConfig(wy=GdnTile(64, 4, 1), state=GdnTile(64, 4, 2), out=GdnTile(64, 4, 1))),
    ),
    # Interpreter: 16-column steps, so the CPU tests' K, V = 32 take several K/V blocks.
    "interpret": ((None, GdnPrefillConfig(wy=GdnTile(16), state=GdnTile(16), out=GdnTile(16))),),
}

# Decode, by batch: (largest B, tile over V). UNTUNED on hardware. Memory bound (the state,
# 64 KB fp32 a value head at K = V = 128, is read and written once); a program holds a
# [K, BV] fp32 tile (16 KB at BV = 32: 32 registers a thread at 4 warps). Small batches
# take BV = 32 for B * HV * 4 programs (128 at B = 1, HV = 32), larger ones BV = 64.
GDN_DECODE_CONFIGS: dict[str, tuple[tuple[int | None, GdnTile], ...]] = {
    "nvidia": ((8, GdnTile(32, 4, 1)), (None, GdnTile(64, 4, 1))),
    "amd": ((8, GdnTile(32, 4, 1)), (None, GdnTile(64, 4, 1))),
    "interpret": ((None, GdnTile(16, 1, 1)),),
}


def _lookup(table, n: int, device: torch.device):
    for limit, cfg in table[arch_family(device)]:
        if limit is None or n <= limit:
            return cfg
    raise AssertionError("config table has no catch-all row")


def gdn_prefill_config(pairs: int, device: torch.device) -> GdnPrefillConfig:
    """The prefill config for ``pairs`` = B * HV sequence-head pairs on ``device``'s family."""
    return _lookup(GDN_PREFILL_CONFIGS, pairs, device)


def gdn_decode_config(batch: int, device: torch.device) -> GdnTile:
    """The decode tile for ``batch`` sequences on ``device``'s family."""
    return _lookup(GDN_DECODE_CONFIGS, batch, device)


# -- shared device helpers -------------------------------------------------------------


@triton.jit
def _mm(a, b, DOT_FP32: tl.constexpr):
    """``a @ b`` in fp32 accumulation. ``DOT_FP32`` (see :func:`dot_mode`): 0 the operands'
    own dtype on the tensor cores; 1 upcast to fp32 and IEEE products (fp32 inputs, and
    Triton 3.6's interpreter, which multiplies bf16 storage bits as integers)."""
    if DOT_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _to(x, dt, DOT_FP32: tl.constexpr):
    """``x`` (fp32) rounded to ``dt``, to nearest even. Triton 3.6's interpreter (the
    ``DOT_FP32`` runs) truncates fp32 -> bf16, a bias that adds up along the recurrence:
    there the rounding is done on the bits first (exact then), as the GPU's cvt.rn does."""
    if DOT_FP32:
        if dt == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
            x = bits.to(tl.float32, bitcast=True)
    return x.to(dt)


@triton.jit
def _mm32(a, b):
    """``a @ b`` of fp32 tiles in full fp32 (the triangular solve: tiny, precision matters)."""
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _chunk_span(pid, cu_ptr, cf_ptr, B, T, search_steps, VARLEN: tl.constexpr, CHUNK: tl.constexpr):
    """``(first token, end of its sequence)`` of global chunk ``pid``; first >= end: no such chunk.

    Varlen: the sequence is the last ``s`` with ``chunk_first[s] <= pid`` (binary search;
    the invariant ``chunk_first[lo] <= pid`` holds from ``lo = 0``, and a step with
    ``hi = lo + 1`` leaves both ends alone, so ``ceil(log2 B)`` steps suffice)."""
    if VARLEN:
        lo = pid * 0
        hi = lo + B
        for _ in range(search_steps):
            mid = (lo + hi) // 2
            go = tl.load(cf_ptr + mid) <= pid
            lo = tl.where(go, mid, lo)
            hi = tl.where(go, hi, mid)
        bos = tl.load(cu_ptr + lo)
        eos = tl.load(cu_ptr + lo + 1)
        first = bos + (pid - tl.load(cf_ptr + lo)) * CHUNK
    else:
        first = pid * CHUNK
        eos = T
    return first, eos


@triton.jit
def _row_rnorm(x, L2NORM: tl.constexpr):
    """``rsqrt(sum x^2 + 1e-6)`` per row of ``x`` in fp32 (ones without ``L2NORM``)."""
    if L2NORM:
        xf = x.to(tl.float32)
        return tl.rsqrt(tl.sum(xf * xf, axis=1) + 1e-6)
    else:
        return tl.full((x.shape[0],), 1.0, tl.float32)


@triton.jit
def _row_of(a, i, r):
    """Row ``i`` of the ``[SUB, SUB]`` tile ``a``, as a vector over columns."""
    return tl.sum(tl.where(r[:, None] == i, a, 0.0), axis=0)


@triton.jit
def _invert_unit_lower4(a0, a1, a2, a3, SUB: tl.constexpr):
    """``(I + a)^-1`` of four strictly lower ``[SUB, SUB]`` fp32 tiles, by forward substitution
    (the four independent chains interleaved in one loop): with ``Y = X - I``, row ``i`` is
    ``-a_i - sum_{j<i} a_ij Y_j``; rows 0 and 1 are ``-a``."""
    r = tl.arange(0, SUB)
    y0, y1, y2, y3 = -a0, -a1, -a2, -a3
    for i in range(2, SUB):
        sel = r[:, None] == i
        c0 = -_row_of(a0, i, r)
        c1 = -_row_of(a1, i, r)
        c2 = -_row_of(a2, i, r)
        c3 = -_row_of(a3, i, r)
        y0 = tl.where(sel, (c0 + tl.sum(c0[:, None] * y0, axis=0))[None, :], y0)
        y1 = tl.where(sel, (c1 + tl.sum(c1[:, None] * y1, axis=0))[None, :], y1)
        y2 = tl.where(sel, (c2 + tl.sum(c2[:, None] * y2, axis=0))[None, :], y2)
        y3 = tl.where(sel, (c3 + tl.sum(c3[:, None] * y3, axis=0))[None, :], y3)
    eye = tl.where(r[:, None] == r[None, :], 1.0, 0.0)
    return y0 + eye, y1 + eye, y2 + eye, y3 + eye


@triton.jit
def _decay_block(a, beta_i, g_i, g_j, DIAG: tl.constexpr, SUB: tl.constexpr):
    """``beta_i exp(G_i - G_j) a_ij``; on a diagonal block strictly lower only."""
    if DIAG:
        r = tl.arange(0, SUB)
        lower = r[:, None] > r[None, :]
        d = tl.exp(tl.where(lower, g_i[:, None] - g_j[None, :], float("-inf")))
        return tl.where(lower, a * d * beta_i[:, None], 0.0)
    else:
        return a * tl.exp(g_i[:, None] - g_j[None, :]) * beta_i[:, None]


# -- (a) chunk-parallel: cumulative decay, triangular solve, W and U' ------------------


@triton.jit
def _load_rows(ptr, rows, mask, col_base, cols, stride_t):
    return tl.load(
        ptr + rows.to(tl.int64)[:, None] * stride_t + col_base + cols[None, :], mask=mask[:, None], other=0.0
    )


@triton.jit
def _gdn_wy_kernel(
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    w_ptr,
    u_ptr,
    gcum_ptr,
    cu_ptr,
    cf_ptr,
    T,
    B,
    HV,
    group,
    search_steps,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_gt,
    stride_gh,
    stride_bt,
    stride_bh,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    VARLEN: tl.constexpr,
    L2NORM: tl.constexpr,
    DOT_FP32: tl.constexpr,
    CHUNK: tl.constexpr,
    SUB: tl.constexpr,
):
    pid = tl.program_id(0)
    hv = tl.program_id(1)
    first, eos = _chunk_span(pid, cu_ptr, cf_ptr, B, T, search_steps, VARLEN, CHUNK)
    if first >= eos:
        return
    hk = hv // group
    r = tl.arange(0, SUB)
    rows0 = first + r
    rows1 = rows0 + SUB
    rows2 = rows1 + SUB
    rows3 = rows2 + SUB
    m0 = rows0 < eos
    m1 = rows1 < eos
    m2 = rows2 < eos
    m3 = rows3 < eos

    # Cumulative log decay over the chunk, 16 rows at a time; stored for kernels (b), (c).
    g0 = tl.load(g_ptr + rows0.to(tl.int64) * stride_gt + hv * stride_gh, mask=m0, other=0.0).to(tl.float32)
    g1 = tl.load(g_ptr + rows1.to(tl.int64) * stride_gt + hv * stride_gh, mask=m1, other=0.0).to(tl.float32)
    g2 = tl.load(g_ptr + rows2.to(tl.int64) * stride_gt + hv * stride_gh, mask=m2, other=0.0).to(tl.float32)
    g3 = tl.load(g_ptr + rows3.to(tl.int64) * stride_gt + hv * stride_gh, mask=m3, other=0.0).to(tl.float32)
    G0 = tl.cumsum(g0, axis=0)
    G1 = tl.cumsum(g1, axis=0) + tl.sum(g0, axis=0)
    G2 = tl.cumsum(g2, axis=0) + (tl.sum(g0, axis=0) + tl.sum(g1, axis=0))
    G3 = tl.cumsum(g3, axis=0) + (tl.sum(g0, axis=0) + tl.sum(g1, axis=0) + tl.sum(g2, axis=0))
    gc = gcum_ptr + hv
    tl.store(gc + rows0.to(tl.int64) * HV, G0, mask=m0)
    tl.store(gc + rows1.to(tl.int64) * HV, G1, mask=m1)
    tl.store(gc + rows2.to(tl.int64) * HV, G2, mask=m2)
    tl.store(gc + rows3.to(tl.int64) * HV, G3, mask=m3)
    b0 = tl.load(beta_ptr + rows0.to(tl.int64) * stride_bt + hv * stride_bh, mask=m0, other=0.0).to(tl.float32)
    b1 = tl.load(beta_ptr + rows1.to(tl.int64) * stride_bt + hv * stride_bh, mask=m1, other=0.0).to(tl.float32)
    b2 = tl.load(beta_ptr + rows2.to(tl.int64) * stride_bt + hv * stride_bh, mask=m2, other=0.0).to(tl.float32)
    b3 = tl.load(beta_ptr + rows3.to(tl.int64) * stride_bt + hv * stride_bh, mask=m3, other=0.0).to(tl.float32)

    # The ten lower blocks of K K^T (and the row sums of squares for the L2 norm).
    zero = tl.zeros((SUB, SUB), dtype=tl.float32)
    a00, a10, a11, a20, a21, a22, a30, a31, a32, a33 = zero, zero, zero, zero, zero, zero, zero, zero, zero, zero
    ss0 = tl.zeros((SUB,), dtype=tl.float32)
    ss1, ss2, ss3 = ss0, ss0, ss0
    kb = k_ptr + hk * stride_kh
    for c0 in range(0, K, BK):
        cols = c0 + tl.arange(0, BK)
        k0 = _load_rows(kb, rows0, m0, 0, cols, stride_kt)
        k1 = _load_rows(kb, rows1, m1, 0, cols, stride_kt)
        k2 = _load_rows(kb, rows2, m2, 0, cols, stride_kt)
        k3 = _load_rows(kb, rows3, m3, 0, cols, stride_kt)
        if L2NORM:
            ss0 += tl.sum(k0.to(tl.float32) * k0.to(tl.float32), axis=1)
            ss1 += tl.sum(k1.to(tl.float32) * k1.to(tl.float32), axis=1)
            ss2 += tl.sum(k2.to(tl.float32) * k2.to(tl.float32), axis=1)
            ss3 += tl.sum(k3.to(tl.float32) * k3.to(tl.float32), axis=1)
        k0t = tl.trans(k0)
        k1t = tl.trans(k1)
        k2t = tl.trans(k2)
        a00 += _mm(k0, k0t, DOT_FP32)
        a10 += _mm(k1, k0t, DOT_FP32)
        a11 += _mm(k1, k1t, DOT_FP32)
        a20 += _mm(k2, k0t, DOT_FP32)
        a21 += _mm(k2, k1t, DOT_FP32)
        a22 += _mm(k2, k2t, DOT_FP32)
        a30 += _mm(k3, k0t, DOT_FP32)
        a31 += _mm(k3, k1t, DOT_FP32)
        a32 += _mm(k3, k2t, DOT_FP32)
        a33 += _mm(k3, tl.trans(k3), DOT_FP32)
    if L2NORM:
        rk0 = tl.rsqrt(ss0 + 1e-6)
        rk1 = tl.rsqrt(ss1 + 1e-6)
        rk2 = tl.rsqrt(ss2 + 1e-6)
        rk3 = tl.rsqrt(ss3 + 1e-6)
        a00 = a00 * rk0[:, None] * rk0[None, :]
        a10 = a10 * rk1[:, None] * rk0[None, :]
        a11 = a11 * rk1[:, None] * rk1[None, :]
        a20 = a20 * rk2[:, None] * rk0[None, :]
        a21 = a21 * rk2[:, None] * rk1[None, :]
        a22 = a22 * rk2[:, None] * rk2[None, :]
        a30 = a30 * rk3[:, None] * rk0[None, :]
        a31 = a31 * rk3[:, None] * rk1[None, :]
        a32 = a32 * rk3[:, None] * rk2[None, :]
        a33 = a33 * rk3[:, None] * rk3[None, :]
    else:
        rk0 = tl.full((SUB,), 1.0, tl.float32)
        rk1, rk2, rk3 = rk0, rk0, rk0
    a00 = _decay_block(a00, b0, G0, G0, True, SUB)
    a10 = _decay_block(a10, b1, G1, G0, False, SUB)
    a11 = _decay_block(a11, b1, G1, G1, True, SUB)
    a20 = _decay_block(a20, b2, G2, G0, False, SUB)
    a21 = _decay_block(a21, b2, G2, G1, False, SUB)
    a22 = _decay_block(a22, b2, G2, G2, True, SUB)
    a30 = _decay_block(a30, b3, G3, G0, False, SUB)
    a31 = _decay_block(a31, b3, G3, G1, False, SUB)
    a32 = _decay_block(a32, b3, G3, G2, False, SUB)
    a33 = _decay_block(a33, b3, G3, G3, True, SUB)

    # X = (I + A)^-1: diagonal blocks by substitution, then X_ij = -X_ii sum_{j<=l<i} A_il X_lj.
    x00, x11, x22, x33 = _invert_unit_lower4(a00, a11, a22, a33, SUB)
    x10 = -_mm32(x11, _mm32(a10, x00))
    x21 = -_mm32(x22, _mm32(a21, x11))
    x20 = -_mm32(x22, _mm32(a20, x00) + _mm32(a21, x10))
    x32 = -_mm32(x33, _mm32(a32, x22))
    x31 = -_mm32(x33, _mm32(a31, x11) + _mm32(a32, x21))
    x30 = -_mm32(x33, _mm32(a30, x00) + _mm32(a31, x10) + _mm32(a32, x20))

    # W = X diag(beta exp(G) rk) K: the diagonal folded into X's columns, then rounded.
    dt = w_ptr.dtype.element_ty
    d0 = (b0 * tl.exp(G0) * rk0)[None, :]
    d1 = (b1 * tl.exp(G1) * rk1)[None, :]
    d2 = (b2 * tl.exp(G2) * rk2)[None, :]
    d3 = (b3 * tl.exp(G3) * rk3)[None, :]
    p00, p10, p11 = _to(x00 * d0, dt, DOT_FP32), _to(x10 * d0, dt, DOT_FP32), _to(x11 * d1, dt, DOT_FP32)
    p20, p21, p22 = _to(x20 * d0, dt, DOT_FP32), _to(x21 * d1, dt, DOT_FP32), _to(x22 * d2, dt, DOT_FP32)
    p30, p31, p32, p33 = (
        _to(x30 * d0, dt, DOT_FP32),
        _to(x31 * d1, dt, DOT_FP32),
        _to(x32 * d2, dt, DOT_FP32),
        _to(x33 * d3, dt, DOT_FP32),
    )
    wb = w_ptr + hv * K
    for c0 in range(0, K, BK):
        cols = c0 + tl.arange(0, BK)
        k0 = _load_rows(kb, rows0, m0, 0, cols, stride_kt)
        k1 = _load_rows(kb, rows1, m1, 0, cols, stride_kt)
        k2 = _load_rows(kb, rows2, m2, 0, cols, stride_kt)
        k3 = _load_rows(kb, rows3, m3, 0, cols, stride_kt)
        w0 = _mm(p00, k0, DOT_FP32)
        w1 = _mm(p10, k0, DOT_FP32) + _mm(p11, k1, DOT_FP32)
        w2 = _mm(p20, k0, DOT_FP32) + _mm(p21, k1, DOT_FP32) + _mm(p22, k2, DOT_FP32)
        w3 = _mm(p30, k0, DOT_FP32) + _mm(p31, k1, DOT_FP32) + _mm(p32, k2, DOT_FP32) + _mm(p33, k3, DOT_FP32)
        _store_rows(wb, rows0, m0, cols, HV * K, w0, DOT_FP32)
        _store_rows(wb, rows1, m1, cols, HV * K, w1, DOT_FP32)
        _store_rows(wb, rows2, m2, cols, HV * K, w2, DOT_FP32)
        _store_rows(wb, rows3, m3, cols, HV * K, w3, DOT_FP32)

    # U' = X diag(beta) V.
    e0, e1, e2, e3 = b0[None, :], b1[None, :], b2[None, :], b3[None, :]
    p00, p10, p11 = _to(x00 * e0, dt, DOT_FP32), _to(x10 * e0, dt, DOT_FP32), _to(x11 * e1, dt, DOT_FP32)
    p20, p21, p22 = _to(x20 * e0, dt, DOT_FP32), _to(x21 * e1, dt, DOT_FP32), _to(x22 * e2, dt, DOT_FP32)
    p30, p31, p32, p33 = (
        _to(x30 * e0, dt, DOT_FP32),
        _to(x31 * e1, dt, DOT_FP32),
        _to(x32 * e2, dt, DOT_FP32),
        _to(x33 * e3, dt, DOT_FP32),
    )
    vb = v_ptr + hv * stride_vh
    ub = u_ptr + hv * V
    for c0 in range(0, V, BV):
        cols = c0 + tl.arange(0, BV)
        v0 = _load_rows(vb, rows0, m0, 0, cols, stride_vt)
        v1 = _load_rows(vb, rows1, m1, 0, cols, stride_vt)
        v2 = _load_rows(vb, rows2, m2, 0, cols, stride_vt)
        v3 = _load_rows(vb, rows3, m3, 0, cols, stride_vt)
        u0 = _mm(p00, v0, DOT_FP32)
        u1 = _mm(p10, v0, DOT_FP32) + _mm(p11, v1, DOT_FP32)
        u2 = _mm(p20, v0, DOT_FP32) + _mm(p21, v1, DOT_FP32) + _mm(p22, v2, DOT_FP32)
        u3 = _mm(p30, v0, DOT_FP32) + _mm(p31, v1, DOT_FP32) + _mm(p32, v2, DOT_FP32) + _mm(p33, v3, DOT_FP32)
        _store_rows(ub, rows0, m0, cols, HV * V, u0, DOT_FP32)
        _store_rows(ub, rows1, m1, cols, HV * V, u1, DOT_FP32)
        _store_rows(ub, rows2, m2, cols, HV * V, u2, DOT_FP32)
        _store_rows(ub, rows3, m3, cols, HV * V, u3, DOT_FP32)


@triton.jit
def _store_rows(ptr, rows, mask, cols, stride_t, x, DOT_FP32: tl.constexpr):
    offs = rows.to(tl.int64)[:, None] * stride_t + cols[None, :]
    tl.store(ptr + offs, _to(x, ptr.dtype.element_ty, DOT_FP32), mask=mask[:, None])


# -- (b) sequential over chunks: the state ---------------------------------------------


@triton.jit
def _gdn_state_kernel(
    k_ptr,
    w_ptr,
    u_ptr,
    gcum_ptr,
    h_ptr,
    init_ptr,
    final_ptr,
    cu_ptr,
    cf_ptr,
    T,
    HV,
    group,
    stride_kt,
    stride_kh,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    VARLEN: tl.constexpr,
    HAS_INIT: tl.constexpr,
    STORE_FINAL: tl.constexpr,
    L2NORM: tl.constexpr,
    DOT_FP32: tl.constexpr,
    CHUNK: tl.constexpr,
):
    seq = tl.program_id(0)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    if VARLEN:
        bos = tl.load(cu_ptr + seq)
        eos = tl.load(cu_ptr + seq + 1)
        c_first = tl.load(cf_ptr + seq)
    else:
        bos = 0
        eos = T
        c_first = 0
    hk = hv // group
    offs_k = tl.arange(0, K)
    offs_v = iv * BV + tl.arange(0, BV)
    kv_offs = offs_k[:, None] * V + offs_v[None, :]
    state_base = (seq * HV + hv).to(tl.int64) * (K * V)
    if HAS_INIT:
        s = tl.load(init_ptr + state_base + kv_offs)
    else:
        s = tl.zeros((K, BV), dtype=tl.float32)
    dt = w_ptr.dtype.element_ty
    t_r = tl.arange(0, CHUNK)
    n_chunks = tl.cdiv(eos - bos, CHUNK)
    for c in range(0, n_chunks):
        first = bos + c * CHUNK
        rows = first + t_r
        m = rows < eos
        rows64 = rows.to(tl.int64)
        h_base = ((c_first + c) * HV + hv).to(tl.int64) * (K * V)
        tl.store(h_ptr + h_base + kv_offs, _to(s, h_ptr.dtype.element_ty, DOT_FP32))
        w = tl.load(w_ptr + rows64[:, None] * (HV * K) + hv * K + offs_k[None, :], mask=m[:, None], other=0.0)
        u_offs = rows64[:, None] * (HV * V) + hv * V + offs_v[None, :]
        u = tl.load(u_ptr + u_offs, mask=m[:, None], other=0.0).to(tl.float32)
        u = u - _mm(w, _to(s, dt, DOT_FP32), DOT_FP32)
        tl.store(u_ptr + u_offs, _to(u, dt, DOT_FP32), mask=m[:, None])
        gl = tl.load(gcum_ptr + rows64 * HV + hv, mask=m, other=0.0)
        last = tl.minimum(first + CHUNK, eos) - 1
        g_last = tl.load(gcum_ptr + last.to(tl.int64) * HV + hv)
        k = tl.load(k_ptr + rows64[:, None] * stride_kt + hk * stride_kh + offs_k[None, :], mask=m[:, None], other=0.0)
        scl = tl.where(m, tl.exp(g_last - gl) * _row_rnorm(k, L2NORM), 0.0)
        s = s * tl.exp(g_last) + _mm(tl.trans(k), _to(u * scl[:, None], dt, DOT_FP32), DOT_FP32)
    if STORE_FINAL:
        tl.store(final_ptr + state_base + kv_offs, s)


# -- (c) chunk-parallel: the output ----------------------------------------------------


@triton.jit
def _gdn_output_kernel(
    q_ptr,
    k_ptr,
    u_ptr,
    gcum_ptr,
    h_ptr,
    o_ptr,
    cu_ptr,
    cf_ptr,
    T,
    B,
    HV,
    group,
    search_steps,
    scale,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_ot,
    stride_oh,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    VARLEN: tl.constexpr,
    L2NORM: tl.constexpr,
    DOT_FP32: tl.constexpr,
    CHUNK: tl.constexpr,
):
    pid = tl.program_id(0)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    first, eos = _chunk_span(pid, cu_ptr, cf_ptr, B, T, search_steps, VARLEN, CHUNK)
    if first >= eos:
        return
    hk = hv // group
    rows = first + tl.arange(0, CHUNK)
    m = rows < eos
    rows64 = rows.to(tl.int64)
    offs_k = tl.arange(0, K)
    offs_v = iv * BV + tl.arange(0, BV)
    q = tl.load(q_ptr + rows64[:, None] * stride_qt + hk * stride_qh + offs_k[None, :], mask=m[:, None], other=0.0)
    k = tl.load(k_ptr + rows64[:, None] * stride_kt + hk * stride_kh + offs_k[None, :], mask=m[:, None], other=0.0)
    h_base = (pid * HV + hv).to(tl.int64) * (K * V)
    h = tl.load(h_ptr + h_base + offs_k[:, None] * V + offs_v[None, :])
    gl = tl.load(gcum_ptr + rows64 * HV + hv, mask=m, other=0.0)
    rq = _row_rnorm(q, L2NORM) * scale
    rk = _row_rnorm(k, L2NORM)
    qk = _mm(q, tl.trans(k), DOT_FP32)
    causal = (rows[:, None] >= rows[None, :]) & m[None, :]
    decay = tl.exp(tl.where(causal, gl[:, None] - gl[None, :], float("-inf")))
    att = qk * decay * rq[:, None] * rk[None, :]
    u = tl.load(u_ptr + rows64[:, None] * (HV * V) + hv * V + offs_v[None, :], mask=m[:, None], other=0.0)
    o = _mm(q, h, DOT_FP32) * (rq * tl.exp(gl))[:, None] + _mm(_to(att, u.dtype, DOT_FP32), u, DOT_FP32)
    o_offs = rows64[:, None] * stride_ot + hv * stride_oh + offs_v[None, :]
    tl.store(o_ptr + o_offs, _to(o, o_ptr.dtype.element_ty, DOT_FP32), mask=m[:, None])


# -- decode -----------------------------------------------------------------------------


@triton.jit
def _gdn_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    state_ptr,
    idx_ptr,
    o_ptr,
    HV,
    group,
    scale,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_vb,
    stride_vh,
    stride_gb,
    stride_gh,
    stride_bb,
    stride_bh,
    stride_ob,
    stride_oh,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    HAS_INDICES: tl.constexpr,
    L2NORM: tl.constexpr,
):
    b = tl.program_id(0)
    hv = tl.program_id(1)
    iv = tl.program_id(2)
    offs_k = tl.arange(0, K)
    offs_v = iv * BV + tl.arange(0, BV)
    o_offs = b.to(tl.int64) * stride_ob + hv * stride_oh + offs_v
    if HAS_INDICES:
        slot = tl.load(idx_ptr + b)
    else:
        slot = b
    if slot < 0:
        tl.store(o_ptr + o_offs, tl.zeros((BV,), dtype=o_ptr.dtype.element_ty))
        return
    hk = hv // group
    q = tl.load(q_ptr + b.to(tl.int64) * stride_qb + hk * stride_qh + offs_k).to(tl.float32)
    k = tl.load(k_ptr + b.to(tl.int64) * stride_kb + hk * stride_kh + offs_k).to(tl.float32)
    v = tl.load(v_ptr + b.to(tl.int64) * stride_vb + hv * stride_vh + offs_v).to(tl.float32)
    g = tl.load(g_ptr + b.to(tl.int64) * stride_gb + hv * stride_gh).to(tl.float32)
    beta = tl.load(beta_ptr + b.to(tl.int64) * stride_bb + hv * stride_bh).to(tl.float32)
    if L2NORM:
        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6)
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    s_offs = (slot.to(tl.int64) * HV + hv) * (K * V) + offs_k[:, None] * V + offs_v[None, :]
    s = tl.load(state_ptr + s_offs) * tl.exp(g)
    u = beta * (v - tl.sum(s * k[:, None], axis=0))
    s = s + k[:, None] * u[None, :]
    o = tl.sum(s * (q * scale)[:, None], axis=0)
    tl.store(state_ptr + s_offs, s)
    tl.store(o_ptr + o_offs, o.to(o_ptr.dtype.element_ty))


TRITON_KERNELS = {
    "gdn_wy": _gdn_wy_kernel,
    "gdn_state": _gdn_state_kernel,
    "gdn_output": _gdn_output_kernel,
    "gdn_decode": _gdn_decode_kernel,
}


# -- host ---------------------------------------------------------------------------------


#: ``DOT_FP32`` values of the prefill kernels (see ``_mm``).
DOT_MODES = {"native": 0, "ieee": 1}


def dot_mode(dtype: torch.dtype, device: torch.device) -> int:
    """How the prefill kernels multiply: the operands' dtype on the tensor cores (bf16 / fp16
    on a GPU), or IEEE fp32 (the interpreter, and fp32 inputs everywhere). On the H200 plain
    TF32 missed the ``recurrence`` tolerance by 1.1-4.7x, and 3xTF32 faulted (an illegal
    address at K = V = 16, T = 43: docs/benchmarks/h200-2026-12-01/gdn/); IEEE was within
    1e-5 of the output's rms at every probed shape. It is the slow path (the sm90 build
    spills), kept for callers who pass fp32 to get fp32 results."""
    if device.type == "cpu" or dtype == torch.float32:
        return DOT_MODES["ieee"]
    return DOT_MODES["native"]


def _chunk_first(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``int32 [B+1]``: exclusive prefix sum of each sequence's chunk count (device ops, no sync)."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    counts = torch.div(lengths + (CHUNK - 1), CHUNK, rounding_mode="floor")
    cf = torch.zeros(cu_seqlens.shape[0], dtype=torch.int32, device=cu_seqlens.device)
    torch.cumsum(counts, 0, dtype=torch.int32, out=cf[1:])
    return cf


def gdn_chunk_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    output_final_state: bool,
    use_qk_l2norm: bool,
    out: torch.Tensor | None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule over packed sequences (``tokenspeed_kernel.gdn_chunk_prefill``).

    Args:
        q, k: ``[T, H, K]`` bf16/fp16/fp32, last dim contiguous; K a power of two >= 16.
        v: ``[T, HV, V]``, q's dtype, ``HV`` a multiple of ``H``; V a power of two >= 16.
        g, beta: ``[T, HV]`` log decays / write strengths (any float dtype, used in fp32).
        scale: on q (a float).
        initial_state: ``float32 [B, HV, K, V]`` contiguous, or None (zeros).
        cu_seqlens: ``int32 [B+1]`` or None (one sequence).
        output_final_state: also return the ``float32 [B, HV, K, V]`` final states.
        use_qk_l2norm: L2-normalise q and k (fp32) first.
        out: optional ``[T, HV, V]`` of q's dtype, last dim contiguous.

    Returns:
        ``o`` or ``(o, final_state)``.
    """
    return gdn_chunk_prefill_with_config(
        q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
        output_final_state=output_final_state, use_qk_l2norm=use_qk_l2norm, out=out, config=None,
    )  # fmt: skip


def gdn_chunk_prefill_with_config(
    q, k, v, g, beta, *, scale, initial_state, cu_seqlens, output_final_state, use_qk_l2norm, out,
    config: GdnPrefillConfig | None,
):  # fmt: skip
    """:func:`gdn_chunk_prefill` with an explicit config (None = the table's); for sweeps."""
    t, h, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    device = q.device
    varlen = cu_seqlens is not None
    batch = cu_seqlens.shape[0] - 1 if varlen else 1
    o = out if out is not None else torch.empty((t, hv, dv), dtype=q.dtype, device=device)
    final = torch.empty((batch, hv, dk, dv), dtype=torch.float32, device=device) if output_final_state else None
    if t == 0 or batch == 0:
        if final is not None:
            final.copy_(initial_state) if initial_state is not None else final.zero_()
        return (o, final) if output_final_state else o
    cfg = config if config is not None else gdn_prefill_config(batch * hv, device)
    group = hv // h
    dot_fp32 = dot_mode(q.dtype, device)
    if varlen:
        cu = cu_seqlens
        cf = _chunk_first(cu_seqlens)
        max_chunks = t // CHUNK + batch  # sum cdiv(len, C) <= sum (len // C + 1)
    else:
        cu = cf = None
        max_chunks = cdiv(t, CHUNK)
    search_steps = (batch - 1).bit_length()  # ceil(log2 B)
    w = torch.empty((t, hv, dk), dtype=q.dtype, device=device)
    u = torch.empty((t, hv, dv), dtype=q.dtype, device=device)
    gcum = torch.empty((t, hv), dtype=torch.float32, device=device)
    hbuf = torch.empty((max_chunks, hv, dk, dv), dtype=q.dtype, device=device)

    cached(_gdn_wy_kernel)[(max_chunks, hv)](
        k, v, g, beta, w, u, gcum, cu, cf,
        t, batch, hv, group, search_steps,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
        K=dk, V=dv, BK=min(cfg.wy.block, dk), BV=min(cfg.wy.block, dv), VARLEN=varlen, L2NORM=bool(use_qk_l2norm),
        DOT_FP32=dot_fp32, CHUNK=CHUNK, SUB=_SUB, num_warps=cfg.wy.num_warps, num_stages=cfg.wy.num_stages,
    )  # fmt: skip
    bv = min(cfg.state.block, dv)
    cached(_gdn_state_kernel)[(batch, hv, cdiv(dv, bv))](
        k, w, u, gcum, hbuf, initial_state, final, cu, cf,
        t, hv, group, k.stride(0), k.stride(1),
        K=dk, V=dv, BV=bv, VARLEN=varlen, HAS_INIT=initial_state is not None, STORE_FINAL=final is not None,
        L2NORM=bool(use_qk_l2norm), DOT_FP32=dot_fp32, CHUNK=CHUNK,
        num_warps=cfg.state.num_warps, num_stages=cfg.state.num_stages,
    )  # fmt: skip
    bv = min(cfg.out.block, dv)
    cached(_gdn_output_kernel)[(max_chunks, hv, cdiv(dv, bv))](
        q, k, u, gcum, hbuf, o, cu, cf,
        t, batch, hv, group, search_steps, float(scale),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), o.stride(0), o.stride(1),
        K=dk, V=dv, BV=bv, VARLEN=varlen, L2NORM=bool(use_qk_l2norm), DOT_FP32=dot_fp32, CHUNK=CHUNK,
        num_warps=cfg.out.num_warps, num_stages=cfg.out.num_stages,
    )  # fmt: skip
    return (o, final) if output_final_state else o


def gdn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    scale: float,
    state_indices: torch.Tensor | None,
    use_qk_l2norm: bool,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """One gated-delta-rule step per sequence (``tokenspeed_kernel.gdn_decode``), ``state``
    updated in place.

    Args:
        q, k: ``[B, H, K]``; v: ``[B, HV, V]`` (q's dtype, last dims contiguous).
        g, beta: ``[B, HV]`` (used in fp32).
        state: ``float32 [N, HV, K, V]`` contiguous.
        scale: on q. state_indices: ``int32 [B]`` or None (``state[b]``); < 0: zero row, no state.
        use_qk_l2norm: L2-normalise q and k first. out: optional ``[B, HV, V]``.

    Returns:
        ``o [B, HV, V]``.
    """
    return gdn_decode_with_config(
        q, k, v, g, beta, state, scale=scale, state_indices=state_indices, use_qk_l2norm=use_qk_l2norm, out=out,
        config=None,
    )  # fmt: skip


def gdn_decode_with_config(q, k, v, g, beta, state, *, scale, state_indices, use_qk_l2norm, out,
                           config: GdnTile | None):  # fmt: skip
    """:func:`gdn_decode` with an explicit tile (None = the table's)."""
    batch, h, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    o = out if out is not None else torch.empty((batch, hv, dv), dtype=q.dtype, device=q.device)
    if batch == 0:
        return o
    cfg = config if config is not None else gdn_decode_config(batch, q.device)
    bv = min(cfg.block, dv)
    cached(_gdn_decode_kernel)[(batch, hv, cdiv(dv, bv))](
        q, k, v, g, beta, state, state_indices, o,
        hv, hv // h, float(scale),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        g.stride(0), g.stride(1), beta.stride(0), beta.stride(1), o.stride(0), o.stride(1),
        K=dk, V=dv, BV=bv, HAS_INDICES=state_indices is not None, L2NORM=bool(use_qk_l2norm),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return o

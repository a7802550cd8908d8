"""Portable Triton twin of the CDNA MXFP4 MoE kernels.

Same four kernels, same arguments, same grids and tiles as the Gluon instance
(:mod:`tokenspeed_kernel_amd.cdna.moe_decode`, :mod:`~tokenspeed_kernel_amd.cdna.moe_grouped`):
:mod:`tokenspeed_kernel_amd.moe.fused` plans one launch list and runs it with either
kernel set, so the algorithm that only compiles for gfx950 here runs on any GPU Triton
supports and under ``TRITON_INTERPRET=1``.

Where the Gluon gfx950 kernels feed FP8 activations and packed E2M1 weights with their
E8M0 scales to the scaled MFMA (``v_mfma_scale_f32_*_f8f6f4``), the twin decodes both to
bf16 in registers (exact: every E2M1 value times a power of two and every E4M3 value is a
bf16) and runs a bf16 dot with fp32 accumulation; the products are the same, only the
summation order differs. The decode kernels reduce with FMAs on both.

``DOT_FP32`` (set by the host under ``TRITON_INTERPRET=1``, whose bf16 ``tl.dot`` is wrong
in Triton 3.6) runs the grouped GEMMs' dots on the same bf16-exact values in fp32: the
products are unchanged.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["decode_gate_up", "decode_down", "grouped_gate_up", "grouped_down"]

_FP8_MAX: tl.constexpr = tl.constexpr(448.0)


@triton.jit
def _e2m1(code):
    """E2M1 code (uint8, low 4 bits) -> float32: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}."""
    mag = code & 7
    e = (mag >> 1).to(tl.float32)
    m = (mag & 1).to(tl.float32)
    v = tl.where(e == 0.0, m * 0.5, (1.0 + m * 0.5) * tl.exp2(e - 1.0))
    return tl.where((code & 8) != 0, -v, v)


@triton.jit
def _mxfp4_rows(w_base, s_base, rows, row_ok, k0, stride_wn, stride_sn, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """Rows ``rows`` x K elements ``k0 .. k0 + BLOCK_K`` of one expert's MXFP4 matrix, as
    float32 ``[R, BLOCK_K]``; elements past K (and rows not ``row_ok``) are 0."""
    R: tl.constexpr = rows.shape[0]
    kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    packed = tl.load(w_base + rows[:, None] * stride_wn + kb[None, :], mask=row_ok[:, None] & (kb < K // 2)[None, :],
                     other=0)  # fmt: skip
    vals = tl.reshape(tl.join(_e2m1(packed & 15), _e2m1(packed >> 4)), (R, BLOCK_K))
    ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    # E8M0 0xFF is NaN: padding reads 127 (2^0) so 0 * scale stays 0.
    s = tl.load(s_base + rows[:, None] * stride_sn + ks[None, :], mask=row_ok[:, None] & (ks < K // 32)[None, :],
                other=127)  # fmt: skip
    scale = tl.exp2(s.to(tl.float32) - 127.0)
    return tl.reshape(tl.reshape(vals, (R, BLOCK_K // 32, 32)) * scale[:, :, None], (R, BLOCK_K))


@triton.jit
def _to_fp8(v, scale):
    """``v / scale`` rounded to E4M3 (saturating, to nearest even), returned as float32.

    The rounding is done in fp32 arithmetic before the cast, which is then exact: the
    GPUs' conversions round to nearest even anyway, but Triton 3.6's interpreter
    truncates, and the twin must compute the same values everywhere.
    """
    q = tl.clamp(v / scale, -_FP8_MAX, _FP8_MAX)
    # E4M3 step at q's binade: 2^(e - 3), e >= -6 (the subnormal range shares the step 2^-9).
    e = tl.maximum(((q.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
    step = ((e - 3 + 127) << 23).to(tl.float32, bitcast=True)
    # Adding and subtracting 1.5 * 2^23 rounds |q / step| < 2^22 to an integer, ties to even.
    r = ((q / step + 12582912.0) - 12582912.0) * step
    return r.to(tl.float8e4nv).to(tl.float32)


@triton.jit
def _swiglu(gate, up, alpha, limit, beta, CLAMP: tl.constexpr):
    if CLAMP:
        gate = tl.minimum(gate, limit)
        up = tl.clamp(up, -limit, limit)
    return (up + beta) * gate * tl.sigmoid(alpha * gate)


@triton.jit
def _gate_up_rows(n, INTERLEAVED: tl.constexpr, INTER: tl.constexpr):
    if INTERLEAVED:
        return 2 * n, 2 * n + 1
    return n, n + INTER


@triton.jit
def decode_gate_up(
    x_ptr, logits_ptr, w_ptr, s_ptr, b_ptr, a1_ptr, a2_ptr, ids_ptr, wts_ptr, inter_ptr,
    stride_xt, stride_lt, stride_we, stride_wn, stride_se, stride_sn, stride_be, alpha, limit, beta,
    NUM_EXPERTS: tl.constexpr, EXPERTS_P2: tl.constexpr, TOP_K: tl.constexpr, HIDDEN: tl.constexpr,
    INTER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERLEAVED: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT_FP8: tl.constexpr, CLAMP: tl.constexpr, ROUTE: tl.constexpr, NUM_WARPS: tl.constexpr,
):  # fmt: skip
    """Program (token * k + slot, N block): route the token (``ROUTE``; else read its
    expert from ``ids``), then ``BLOCK_N`` columns of
    ``swiglu(x @ W13[e].T + b13[e])`` for its slot-th expert ``e``."""
    pair = tl.program_id(0)
    t = pair // TOP_K
    slot = pair % TOP_K
    if ROUTE:
        # Routing: k rounds of (max, lowest index reaching it); the softmax over the k chosen.
        e_offs = tl.arange(0, EXPERTS_P2)
        lg = tl.load(logits_ptr + t.to(tl.int64) * stride_lt + e_offs, mask=e_offs < NUM_EXPERTS,
                     other=float("-inf")).to(tl.float32)  # fmt: skip
        top0 = tl.max(lg, axis=0)
        denom = 0.0
        expert = 0
        mine = 0.0
        for s in tl.static_range(TOP_K):
            m = tl.max(lg, axis=0)
            idx = tl.min(tl.where(lg == m, e_offs, EXPERTS_P2), axis=0)
            p = tl.exp(m - top0)
            denom += p
            if s == slot:
                expert = idx
                mine = p
            lg = tl.where(e_offs == idx, float("-inf"), lg)
        if tl.program_id(1) == 0:
            tl.store(ids_ptr + pair, expert)
            tl.store(wts_ptr + pair, mine / denom)
    else:
        expert = tl.load(ids_ptr + pair)

    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < INTER
    g_rows, u_rows = _gate_up_rows(n, INTERLEAVED, INTER)
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    s_base = s_ptr + expert.to(tl.int64) * stride_se
    x_row = x_ptr + t.to(tl.int64) * stride_xt
    if ACT_FP8:
        a1 = tl.load(a1_ptr)
    else:
        a1 = 1.0  # no FP8 activations: the host passes no scale
    acc_g = tl.zeros([BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        xv = tl.load(x_row + k, mask=k < HIDDEN, other=0.0).to(tl.float32)
        if ACT_FP8:
            xv = _to_fp8(xv, a1)
        wg = _mxfp4_rows(w_base, s_base, g_rows, n_ok, k0, stride_wn, stride_sn, HIDDEN, BLOCK_K)
        acc_g += tl.sum(wg * xv[None, :], axis=1)
        wu = _mxfp4_rows(w_base, s_base, u_rows, n_ok, k0, stride_wn, stride_sn, HIDDEN, BLOCK_K)
        acc_u += tl.sum(wu * xv[None, :], axis=1)
    if ACT_FP8:
        acc_g *= a1
        acc_u *= a1
    if HAS_BIAS:
        acc_g += tl.load(b_ptr + expert.to(tl.int64) * stride_be + g_rows, mask=n_ok, other=0.0)
        acc_u += tl.load(b_ptr + expert.to(tl.int64) * stride_be + u_rows, mask=n_ok, other=0.0)
    h = _swiglu(acc_g, acc_u, alpha, limit, beta, CLAMP)
    if ACT_FP8:
        h = _to_fp8(h, tl.load(a2_ptr))
    tl.store(inter_ptr + pair.to(tl.int64) * INTER + n, h.to(inter_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def decode_down(
    inter_ptr, ids_ptr, wts_ptr, w_ptr, s_ptr, b_ptr, a2_ptr, out_ptr,
    stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_ot,
    TOP_K: tl.constexpr, HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT_FP8: tl.constexpr, NUM_WARPS: tl.constexpr,
):  # fmt: skip
    """Program (token, N block): ``sum_s w[t,s] * (h[t,s] @ W2[e_s].T + b2[e_s])`` for
    ``BLOCK_N`` output columns, slots summed in order (deterministic)."""
    t = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < HIDDEN
    if ACT_FP8:
        a2 = tl.load(a2_ptr)
    else:
        a2 = 1.0  # no FP8 activations: the host passes no scale
    out = tl.zeros([BLOCK_N], tl.float32)
    for s in tl.static_range(TOP_K):
        pair = t * TOP_K + s
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        w_base = w_ptr + expert * stride_we
        s_base = s_ptr + expert * stride_se
        acc = tl.zeros([BLOCK_N], tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            hv = tl.load(inter_ptr + pair.to(tl.int64) * INTER + k, mask=k < INTER, other=0.0).to(tl.float32)
            wv = _mxfp4_rows(w_base, s_base, n, n_ok, k0, stride_wn, stride_sn, INTER, BLOCK_K)
            acc += tl.sum(wv * hv[None, :], axis=1)
        if ACT_FP8:
            acc *= a2
        if HAS_BIAS:
            acc += tl.load(b_ptr + expert * stride_be + n, mask=n_ok, other=0.0)
        out += tl.load(wts_ptr + pair) * acc
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + n, out.to(out_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _tile(sorted_ptr, offsets_ptr, tile_expert_ptr, tile_start_ptr, BLOCK_M: tl.constexpr):
    """``(expert, rows, row_ok)`` of this program's tile; expert < 0: no tile."""
    tile = tl.program_id(0)
    expert = tl.load(tile_expert_ptr + tile)
    start = tl.load(tile_start_ptr + tile)
    end = tl.load(offsets_ptr + tl.maximum(expert, 0) + 1)
    rows = start + tl.arange(0, BLOCK_M)
    return expert, rows, rows < end


@triton.jit
def grouped_gate_up(
    x_ptr, sorted_ptr, offsets_ptr, tile_expert_ptr, tile_start_ptr, w_ptr, s_ptr, b_ptr, a1_ptr, a2_ptr, inter_ptr,
    stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_be, alpha, limit, beta,
    TOP_K: tl.constexpr, HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, INTERLEAVED: tl.constexpr, HAS_BIAS: tl.constexpr, ACT_FP8: tl.constexpr,
    CLAMP: tl.constexpr, NUM_WARPS: tl.constexpr, DOT_FP32: tl.constexpr = False,
):  # fmt: skip
    """Program (tile, N block): rows of one expert's tile, gathered from ``x`` by token,
    times ``BLOCK_N`` gate and up columns, SwiGLU; stored in sorted (dispatch) order."""
    expert, rows, row_ok = _tile(sorted_ptr, offsets_ptr, tile_expert_ptr, tile_start_ptr, BLOCK_M)
    # E4M3 and E2M1 x 2^s are exact in bf16; without FP8 activations the dot runs in x's dtype.
    DOT: tl.constexpr = tl.float32 if DOT_FP32 else (tl.bfloat16 if ACT_FP8 else x_ptr.dtype.element_ty)
    if expert >= 0:
        tokens = tl.load(sorted_ptr + rows, mask=row_ok, other=0) // TOP_K
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < INTER
        g_rows, u_rows = _gate_up_rows(n, INTERLEAVED, INTER)
        w_base = w_ptr + expert.to(tl.int64) * stride_we
        s_base = s_ptr + expert.to(tl.int64) * stride_se
        if ACT_FP8:
            a1 = tl.load(a1_ptr)
        else:
            a1 = 1.0  # no FP8 activations: the host passes no scale
        acc_g = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        acc_u = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, HIDDEN, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            xv = tl.load(x_ptr + tokens[:, None].to(tl.int64) * stride_xt + k[None, :],
                         mask=row_ok[:, None] & (k < HIDDEN)[None, :], other=0.0).to(tl.float32)  # fmt: skip
            if ACT_FP8:
                xv = _to_fp8(xv, a1)
            xa = xv.to(DOT)
            wg = _mxfp4_rows(w_base, s_base, g_rows, n_ok, k0, stride_wn, stride_sn, HIDDEN, BLOCK_K)
            acc_g = tl.dot(xa, tl.trans(wg.to(DOT)), acc_g)
            wu = _mxfp4_rows(w_base, s_base, u_rows, n_ok, k0, stride_wn, stride_sn, HIDDEN, BLOCK_K)
            acc_u = tl.dot(xa, tl.trans(wu.to(DOT)), acc_u)
        if ACT_FP8:
            acc_g *= a1
            acc_u *= a1
        if HAS_BIAS:
            acc_g += tl.load(b_ptr + expert.to(tl.int64) * stride_be + g_rows, mask=n_ok, other=0.0)[None, :]
            acc_u += tl.load(b_ptr + expert.to(tl.int64) * stride_be + u_rows, mask=n_ok, other=0.0)[None, :]
        h = _swiglu(acc_g, acc_u, alpha, limit, beta, CLAMP)
        if ACT_FP8:
            h = _to_fp8(h, tl.load(a2_ptr))
        dst = inter_ptr + rows[:, None].to(tl.int64) * INTER + n[None, :]
        tl.store(dst, h.to(inter_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def grouped_down(
    inter_ptr, sorted_ptr, offsets_ptr, tile_expert_ptr, tile_start_ptr, wts_ptr, w_ptr, s_ptr, b_ptr, a2_ptr, y_ptr,
    stride_we, stride_wn, stride_se, stride_sn, stride_be, stride_yt,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACT_FP8: tl.constexpr, NUM_WARPS: tl.constexpr, DOT_FP32: tl.constexpr = False,
):  # fmt: skip
    """Program (tile, N block): ``w * (h @ W2[e].T + b2[e])`` for the tile's rows, scattered
    to their (token * k + slot) rows of ``y`` (float32)."""
    expert, rows, row_ok = _tile(sorted_ptr, offsets_ptr, tile_expert_ptr, tile_start_ptr, BLOCK_M)
    DOT: tl.constexpr = tl.float32 if DOT_FP32 else (tl.bfloat16 if ACT_FP8 else inter_ptr.dtype.element_ty)
    if expert >= 0:
        pairs = tl.load(sorted_ptr + rows, mask=row_ok, other=0)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < HIDDEN
        w_base = w_ptr + expert.to(tl.int64) * stride_we
        s_base = s_ptr + expert.to(tl.int64) * stride_se
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            hv = tl.load(inter_ptr + rows[:, None].to(tl.int64) * INTER + k[None, :],
                         mask=row_ok[:, None] & (k < INTER)[None, :], other=0.0).to(DOT)  # fmt: skip
            wv = _mxfp4_rows(w_base, s_base, n, n_ok, k0, stride_wn, stride_sn, INTER, BLOCK_K)
            acc = tl.dot(hv, tl.trans(wv.to(DOT)), acc)
        if ACT_FP8:
            acc *= tl.load(a2_ptr)
        if HAS_BIAS:
            acc += tl.load(b_ptr + expert.to(tl.int64) * stride_be + n, mask=n_ok, other=0.0)[None, :]
        acc *= tl.load(wts_ptr + pairs, mask=row_ok, other=0.0)[:, None]
        dst = y_ptr + pairs[:, None].to(tl.int64) * stride_yt + n[None, :]
        tl.store(dst, acc, mask=row_ok[:, None] & n_ok[None, :])

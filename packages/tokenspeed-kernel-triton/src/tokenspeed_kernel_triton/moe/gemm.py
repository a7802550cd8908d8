"""Grouped expert GEMMs: gate/up (+ bias + SwiGLU) and down (+ bias + routing weight).

Both GEMMs read the canonical weight layout directly: rows are output features and
the reduction dim is contiguous (``w13 [E, 2I, H]``, ``w2 [E, H, I]``; MXFP4 packs
two codes a byte along it, with one E8M0 scale per 32 values). MXFP4 and FP8 tiles
are decoded in registers right after the load, so no higher-precision copy of the
weights ever exists in memory.

Two ways to give a program its rows:

- grouped (``ROWS`` = 0/1): the (token, slot) pairs are sorted by expert and
  ``expert_offsets`` delimits each expert's rows; row tile ``m`` belongs to the
  expert whose cumulative tile count first exceeds ``m`` (computed in-kernel from
  the offsets, so the grid is sized from shapes alone and nothing syncs);
- tiny (``ROWS`` = 2): no sort; the program of pair ``p`` works only if ``p`` is
  its expert's first pair, then gathers every pair routed to that expert, so each
  expert's weight tile is streamed once for all its tokens (decode).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._mxfp4 import E2M1_REBIAS, e2m1_words_times_2m14, e8m0_to_float, unpack_mxfp4, unpack_mxfp4_words

# Row sources (the ROWS constexpr).
ROWS_SORTED = tl.constexpr(0)  # grouped; A rows are already sorted (moe_experts' hidden, or the intermediate)
ROWS_GATHER = tl.constexpr(1)  # grouped; A row of sorted row r is x[permutation[r] // TOPK]
ROWS_TINY = tl.constexpr(2)  # tiny; rows are flat pair indices p, A row is x[p // TOPK] (gate/up) or inter[p] (down)

# Weight kinds (the W_KIND constexpr).
W_DENSE = tl.constexpr(0)
W_FP8 = tl.constexpr(1)
W_MXFP4 = tl.constexpr(2)

# Channel scales (the SCALE constexpr) of FP8 weights.
SCALE_NONE = tl.constexpr(0)
SCALE_PER_TENSOR = tl.constexpr(1)
SCALE_PER_CHANNEL = tl.constexpr(2)


@triton.jit
def _grouped_tile(pid_m, offsets_ptr, E, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr):
    """Expert and rows of row tile ``pid_m``; the expert is ``E`` past the last tile."""
    eids = tl.arange(0, E_PAD)
    lo = tl.load(offsets_ptr + eids, mask=eids < E, other=0)
    hi = tl.load(offsets_ptr + eids + 1, mask=eids < E, other=0)
    tiles = (hi - lo + BLOCK_M - 1) // BLOCK_M
    ends = tl.cumsum(tiles, 0)
    # Experts whose tiles all end at or before pid_m precede it (empty experts
    # included); padding lanes carry the total, so they only count past the end.
    e = tl.sum((ends <= pid_m).to(tl.int32), 0)
    here = eids == e
    first_tile = tl.sum(tl.where(here, ends - tiles, 0), 0)
    row_lo = tl.sum(tl.where(here, lo, 0), 0)
    row_hi = tl.sum(tl.where(here, hi, 0), 0)
    rows = row_lo + (pid_m - first_tile) * BLOCK_M + tl.arange(0, BLOCK_M)
    return e, rows, rows < row_hi


@triton.jit
def _tiny_members(ids, idx, e, chunk, BLOCK_M: tl.constexpr):
    """Flat indices of the pairs routed to expert ``e``, ranks ``chunk .. chunk + BLOCK_M``."""
    same = ids == e
    rank = tl.cumsum(same.to(tl.int32), 0) - 1 - chunk
    pick = same[:, None] & (rank[:, None] == tl.arange(0, BLOCK_M)[None, :])
    rows = tl.sum(tl.where(pick, idx[:, None], 0), 0)
    return rows, tl.sum(pick.to(tl.int32), 0) > 0


@triton.jit
def _mma_tile(
    a_ptr,
    stride_am,
    a_rows,
    a_valid,
    w_ptr,
    stride_wn,
    scale_ptr,
    stride_scale_n,
    w_rows,
    w_valid,
    K,
    W_KIND: tl.constexpr,
    DECODE: tl.constexpr,
    SWAP_AB: tl.constexpr,
    MMA_FP32: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    STAGES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``A[a_rows, :K] @ W[w_rows, :K].T`` as float32 ``[BLOCK_M, BLOCK_N]``.

    ``w_ptr``/``scale_ptr`` already point at the expert; weight tiles are ``[BLOCK_N,
    BLOCK_K]`` rows of K-contiguous memory, which is also the MMA's preferred
    K-major operand, so the transposes below are free views. Without USE_DOT
    (``BLOCK_M`` = 1, decode) the row is a GEMV on the CUDA/vector cores: any
    register layout works, so weights load as 16-byte vectors straight into the
    decode, products accumulate elementwise and reduce once after the loop.
    """
    if not USE_DOT:
        if W_KIND == W_MXFP4:
            acc = tl.zeros((BLOCK_N, BLOCK_K // 32), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    elif SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Pointers advance by whole tiles, so the compiler keeps the base alignment and
    # the K-contiguous runs vectorise (16-byte loads); with EVEN_K no K mask breaks
    # them either (a runtime K bound makes its constancy along K unknown).
    offs = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None].to(tl.int64) * stride_am + offs[None, :]
    w_rows64 = w_rows[:, None].to(tl.int64)
    # The bit decoder (MMA or GEMV) reads the codes as uint32 words (8 codes each;
    # rows are H/2 bytes, a multiple of 16); the others take them byte by byte.
    WORDS: tl.constexpr = W_KIND == W_MXFP4 and (not USE_DOT or DECODE == "bits")
    W_STEP: tl.constexpr = BLOCK_K // 8 if WORDS else BLOCK_K // 2
    if W_KIND == W_MXFP4:
        if WORDS:
            w_ptrs = w_ptr.to(tl.pointer_type(tl.uint32)) + w_rows64 * (stride_wn // 4)
        else:
            w_ptrs = w_ptr + w_rows64 * stride_wn
        w_ptrs += tl.arange(0, W_STEP)[None, :]
        scale_ptrs = scale_ptr + w_rows64 * stride_scale_n + tl.arange(0, BLOCK_K // 32)[None, :]
    else:
        w_ptrs = w_ptr + w_rows64 * stride_wn + offs[None, :]
    # An explicit stage count also pipelines the GEMV's loads (no tl.dot to key on).
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=a_valid[:, None], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=a_valid[:, None] & (k0 + offs < K)[None, :], other=0.0)
        if W_KIND == W_MXFP4:
            if EVEN_K:
                packed = tl.load(w_ptrs, mask=w_valid[:, None], other=0)
                scale = tl.load(scale_ptrs, mask=w_valid[:, None], other=127)
            else:
                kw = k0 // (BLOCK_K // W_STEP) + tl.arange(0, W_STEP)
                kg = k0 // 32 + tl.arange(0, BLOCK_K // 32)
                packed = tl.load(w_ptrs, mask=w_valid[:, None] & (kw < K // (BLOCK_K // W_STEP))[None, :], other=0)
                scale = tl.load(scale_ptrs, mask=w_valid[:, None] & (kg < K // 32)[None, :], other=127)
            w_ptrs += W_STEP
            scale_ptrs += BLOCK_K // 32
            if not USE_DOT:
                # Sum each 32-value group unscaled, then apply its scale once.
                prod = e2m1_words_times_2m14(packed, BLOCK_N, BLOCK_K) * a.to(tl.float32)
                group = tl.sum(tl.reshape(prod, (BLOCK_N, BLOCK_K // 32, 32)), 2)
                acc += (group * E2M1_REBIAS) * e8m0_to_float(scale)
            elif DECODE == "dot_scaled":
                # Triton lowers this to scaled MMA where the hardware has it (gfx950)
                # and to its own upcast + MMA elsewhere.
                a_fmt: tl.constexpr = "fp16" if a.dtype == tl.float16 else "bf16"
                if SWAP_AB:
                    acc = tl.dot_scaled(packed, scale, "e2m1", tl.trans(a), None, a_fmt, acc)
                else:
                    acc = tl.dot_scaled(a, None, a_fmt, tl.trans(packed), scale, "e2m1", acc)
            else:
                if DECODE == "shared":
                    w = unpack_mxfp4(packed, scale, BLOCK_N, BLOCK_K)
                else:
                    w = unpack_mxfp4_words(packed, scale, BLOCK_N, BLOCK_K)
                w = w.to(a.dtype)
        else:
            if EVEN_K:
                w = tl.load(w_ptrs, mask=w_valid[:, None], other=0.0)
            else:
                w = tl.load(w_ptrs, mask=w_valid[:, None] & (k0 + offs < K)[None, :], other=0.0)
            w_ptrs += BLOCK_K
            if USE_DOT:
                # FP8 (and a dense dtype unlike x's) converts in registers; the FP8 scale
                # is per output row or per tensor, so it is applied once, after the sum.
                w = w.to(a.dtype)
            else:
                acc += w.to(tl.float32) * a.to(tl.float32)
        a_ptrs += BLOCK_K
        if USE_DOT and (DECODE != "dot_scaled" or W_KIND != W_MXFP4):
            if MMA_FP32:
                # Interpreter only: Triton 3.6's interpreter multiplies bf16 storage
                # bits as integers. Both operands hold x-dtype values: fp32 is exact.
                a = a.to(tl.float32)
                w = w.to(tl.float32)
            if SWAP_AB:
                acc = tl.dot(w, tl.trans(a), acc)
            else:
                acc = tl.dot(a, tl.trans(w), acc)
    if not USE_DOT:
        out = tl.reshape(tl.sum(acc, 1), (1, BLOCK_N))
    elif SWAP_AB:
        out = tl.trans(acc)
    else:
        out = acc
    return out


@triton.jit
def _expert_product(
    e, a_ptr, stride_am, a_rows, a_valid, w_ptr, stride_we, stride_wn, scale_ptr, stride_scale_e, stride_scale_n,
    bias_ptr, stride_bias_e, w_rows, w_valid, K,
    W_KIND: tl.constexpr, SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, DECODE: tl.constexpr, SWAP_AB: tl.constexpr,
    MMA_FP32: tl.constexpr, EVEN_K: tl.constexpr, USE_DOT: tl.constexpr, STAGES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Expert ``e``'s ``A[a_rows] @ W[e, w_rows].T`` (:func:`_mma_tile`), times an FP8 weight's
    per-tensor or per-channel scale (constant along K: applied once, here), plus the bias."""
    acc = _mma_tile(
        a_ptr, stride_am, a_rows, a_valid, w_ptr + e.to(tl.int64) * stride_we, stride_wn,
        scale_ptr + e.to(tl.int64) * stride_scale_e, stride_scale_n, w_rows, w_valid, K,
        W_KIND, DECODE, SWAP_AB, MMA_FP32, EVEN_K, USE_DOT, STAGES, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    if SCALE == SCALE_PER_TENSOR:
        acc = acc * tl.load(scale_ptr + e * stride_scale_e)
    elif SCALE == SCALE_PER_CHANNEL:
        acc = acc * tl.load(scale_ptr + e * stride_scale_e + w_rows, mask=w_valid, other=0.0)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + e * stride_bias_e + w_rows, mask=w_valid, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def _gate_up_tile(
    e, rows, valid, pid_n, a_ptr, stride_am, perm_ptr, w_ptr, stride_we, stride_wn,
    scale_ptr, stride_scale_e, stride_scale_n, bias_ptr, stride_bias_e, y_ptr, stride_ym, K, I, alpha, limit, up_offset,
    ROWS: tl.constexpr, TOPK: tl.constexpr, W_KIND: tl.constexpr, SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
    INTERLEAVED: tl.constexpr, HAS_LIMIT: tl.constexpr, DECODE: tl.constexpr, SWAP_AB: tl.constexpr,
    MMA_FP32: tl.constexpr, EVEN_K: tl.constexpr, USE_DOT: tl.constexpr, STAGES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # Tile column c holds intermediate feature j = c // 2, gate if c is even else up;
    # whatever the weight layout, the split below then finds gate and up side by side.
    c = tl.arange(0, BLOCK_N)
    j = pid_n * (BLOCK_N // 2) + c // 2
    if INTERLEAVED:
        w_rows = 2 * j + c % 2
    else:
        w_rows = (c % 2) * I + j
    w_valid = j < I
    if ROWS == ROWS_GATHER:
        a_rows = tl.load(perm_ptr + rows, mask=valid, other=0) // TOPK
    elif ROWS == ROWS_TINY:
        a_rows = rows // TOPK
    else:
        a_rows = rows
    acc = _expert_product(
        e, a_ptr, stride_am, a_rows, valid, w_ptr, stride_we, stride_wn, scale_ptr, stride_scale_e, stride_scale_n,
        bias_ptr, stride_bias_e, w_rows, w_valid, K,
        W_KIND, SCALE, HAS_BIAS, DECODE, SWAP_AB, MMA_FP32, EVEN_K, USE_DOT, STAGES, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    gate, up = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
    if HAS_LIMIT:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    y = (up + up_offset) * gate * tl.sigmoid(alpha * gate)
    cols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
    ptrs = y_ptr + rows[:, None].to(tl.int64) * stride_ym + cols[None, :]
    tl.store(ptrs, y.to(y_ptr.dtype.element_ty), mask=valid[:, None] & (cols < I)[None, :])


@triton.jit
def _down_tile(
    e, rows, valid, pid_n, a_ptr, stride_am, perm_ptr, topk_w_ptr, w_ptr, stride_we, stride_wn,
    scale_ptr, stride_scale_e, stride_scale_n, bias_ptr, stride_bias_e, y_ptr, stride_ym, K, N,
    ROWS: tl.constexpr, ROUTE_WEIGHT: tl.constexpr, W_KIND: tl.constexpr, SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
    DECODE: tl.constexpr, SWAP_AB: tl.constexpr, MMA_FP32: tl.constexpr, EVEN_K: tl.constexpr, USE_DOT: tl.constexpr,
    STAGES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    w_rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w_valid = w_rows < N
    acc = _expert_product(
        e, a_ptr, stride_am, rows, valid, w_ptr, stride_we, stride_wn, scale_ptr, stride_scale_e, stride_scale_n,
        bias_ptr, stride_bias_e, w_rows, w_valid, K,
        W_KIND, SCALE, HAS_BIAS, DECODE, SWAP_AB, MMA_FP32, EVEN_K, USE_DOT, STAGES, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    # The grouped fused path writes each row back at its (token, slot) index, so the
    # combine reads a token's k rows contiguously; the tiny path is already there.
    if ROWS == ROWS_GATHER:
        out_rows = tl.load(perm_ptr + rows, mask=valid, other=0)
    else:
        out_rows = rows
    if ROUTE_WEIGHT:
        acc = acc * tl.load(topk_w_ptr + out_rows, mask=valid, other=0.0)[:, None]
    ptrs = y_ptr + out_rows[:, None].to(tl.int64) * stride_ym + w_rows[None, :]
    tl.store(ptrs, acc.to(y_ptr.dtype.element_ty), mask=valid[:, None] & w_valid[None, :])


@triton.jit
def _grouped_pids(num_tiles_m, num_tiles_n, GROUP_M: tl.constexpr):
    # GROUP_M row tiles sweep every N tile together: their A rows stay in L2 while
    # the weight tiles stream, and consecutive row tiles usually share an expert,
    # so one weight tile serves all of them.
    pid = tl.program_id(0)
    per_group = GROUP_M * num_tiles_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(num_tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


@triton.jit
def _tiny_program(map_ptr, num_pairs, PAIRS_PAD: tl.constexpr):
    """Tiny path: program ``pid`` owns pair ``p = pid % num_pairs`` and N tile ``pid // num_pairs``,
    and works only if ``p`` is the first pair routed to its expert ``e``; it then takes every
    pair of ``e``, BLOCK_M at a time (an expert appears once per token, so one chunk usually
    holds them all; repeated ids in a token spill into further chunks).

    Returns ``(e, pid_n, ids, idx, is_first)``: ``ids`` the expert of every flat pair ``idx``.
    """
    pid = tl.program_id(0)
    pid_p = pid % num_pairs
    pid_n = pid // num_pairs
    idx = tl.arange(0, PAIRS_PAD)
    ids = tl.load(map_ptr + idx, mask=idx < num_pairs, other=-1)
    e = tl.load(map_ptr + pid_p)
    first = tl.min(tl.where(ids == e, idx, PAIRS_PAD), 0)
    return e, pid_n, ids, idx, first == pid_p


@triton.jit
def _grouped_program(
    offsets_ptr, num_tiles_m, num_tiles_n, E, GROUP_M: tl.constexpr, BLOCK_M: tl.constexpr, E_PAD: tl.constexpr
):
    """Grouped path: this program's ``(expert, rows, row mask, N tile)``; the expert is ``E``
    past the last row tile."""
    pid_m, pid_n = _grouped_pids(num_tiles_m, num_tiles_n, GROUP_M)
    e, rows, valid = _grouped_tile(pid_m, offsets_ptr, E, BLOCK_M, E_PAD)
    return e, rows, valid, pid_n


@triton.jit
def moe_gate_up_kernel(
    a_ptr,
    stride_am,
    map_ptr,
    perm_ptr,
    w_ptr,
    stride_we,
    stride_wn,
    scale_ptr,
    stride_scale_e,
    stride_scale_n,
    bias_ptr,
    stride_bias_e,
    y_ptr,
    stride_ym,
    num_pairs,
    num_tiles_m,
    E,
    K,
    I,
    alpha,
    limit,
    up_offset,
    ROWS: tl.constexpr,
    TOPK: tl.constexpr,
    W_KIND: tl.constexpr,
    SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    HAS_LIMIT: tl.constexpr,
    DECODE: tl.constexpr,
    SWAP_AB: tl.constexpr,
    MMA_FP32: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    STAGES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    E_PAD: tl.constexpr,
    PAIRS_PAD: tl.constexpr,
):
    """``y[row] = act(A[row] @ w13[e].T + b13[e])`` for every row of every expert.

    ``map_ptr``: ``expert_offsets int32 [E+1]`` (grouped) or the flat ``topk_ids
    int32 [T*k]`` (tiny). ``y [rows, I]``: sorted rows (grouped) or flat pair
    order (tiny).
    """
    num_tiles_n = tl.cdiv(I, BLOCK_N // 2)
    if ROWS == ROWS_TINY:
        e, pid_n, ids, idx, is_first = _tiny_program(map_ptr, num_pairs, PAIRS_PAD)
        if is_first:
            for chunk in range(0, tl.sum((ids == e).to(tl.int32), 0), BLOCK_M):
                rows, valid = _tiny_members(ids, idx, e, chunk, BLOCK_M)
                _gate_up_tile(
                    e, rows, valid, pid_n, a_ptr, stride_am, perm_ptr, w_ptr, stride_we, stride_wn,
                    scale_ptr, stride_scale_e, stride_scale_n, bias_ptr, stride_bias_e, y_ptr, stride_ym, K, I, alpha, limit, up_offset,
                    ROWS, TOPK, W_KIND, SCALE, HAS_BIAS, INTERLEAVED, HAS_LIMIT, DECODE, SWAP_AB,
                    MMA_FP32, EVEN_K, USE_DOT, STAGES, BLOCK_M, BLOCK_N, BLOCK_K,
                )  # fmt: skip
    else:
        e, rows, valid, pid_n = _grouped_program(map_ptr, num_tiles_m, num_tiles_n, E, GROUP_M, BLOCK_M, E_PAD)
        if e < E:
            _gate_up_tile(
                e, rows, valid, pid_n, a_ptr, stride_am, perm_ptr, w_ptr, stride_we, stride_wn,
                scale_ptr, stride_scale_e, stride_scale_n, bias_ptr, stride_bias_e, y_ptr, stride_ym, K, I, alpha, limit, up_offset,
                ROWS, TOPK, W_KIND, SCALE, HAS_BIAS, INTERLEAVED, HAS_LIMIT, DECODE, SWAP_AB,
                MMA_FP32, EVEN_K, USE_DOT, STAGES, BLOCK_M, BLOCK_N, BLOCK_K,
            )  # fmt: skip


@triton.jit
def moe_down_kernel(
    a_ptr,
    stride_am,
    map_ptr,
    perm_ptr,
    topk_w_ptr,
    w_ptr,
    stride_we,
    stride_wn,
    scale_ptr,
    stride_scale_e,
    stride_scale_n,
    bias_ptr,
    stride_bias_e,
    y_ptr,
    stride_ym,
    num_pairs,
    num_tiles_m,
    E,
    K,
    N,
    ROWS: tl.constexpr,
    ROUTE_WEIGHT: tl.constexpr,
    W_KIND: tl.constexpr,
    SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    DECODE: tl.constexpr,
    SWAP_AB: tl.constexpr,
    MMA_FP32: tl.constexpr,
    EVEN_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    STAGES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    E_PAD: tl.constexpr,
    PAIRS_PAD: tl.constexpr,
):
    """``y[out_row] = (A[row] @ w2[e].T + b2[e]) * (routing weight if ROUTE_WEIGHT)``.

    ``A [rows, I]`` holds sorted rows (grouped) or flat pair rows (tiny); ``y [rows,
    H]`` is written in sorted order (moe_experts) or flat pair order (fused path).
    """
    num_tiles_n = tl.cdiv(N, BLOCK_N)
    if ROWS == ROWS_TINY:
        e, pid_n, ids, idx, is_first = _tiny_program(map_ptr, num_pairs, PAIRS_PAD)
        if is_first:
            for chunk in range(0, tl.sum((ids == e).to(tl.int32), 0), BLOCK_M):
                rows, valid = _tiny_members(ids, idx, e, chunk, BLOCK_M)
                _down_tile(
                    e, rows, valid, pid_n, a_ptr, stride_am, perm_ptr, topk_w_ptr, w_ptr, stride_we, stride_wn,
                    scale_ptr, stride_scale_e, stride_scale_n, bias_ptr, stride_bias_e, y_ptr, stride_ym, K, N,
                    ROWS, ROUTE_WEIGHT, W_KIND, SCALE, HAS_BIAS, DECODE, SWAP_AB, MMA_FP32, EVEN_K, USE_DOT, STAGES, BLOCK_M, BLOCK_N, BLOCK_K,
                )  # fmt: skip
    else:
        e, rows, valid, pid_n = _grouped_program(map_ptr, num_tiles_m, num_tiles_n, E, GROUP_M, BLOCK_M, E_PAD)
        if e < E:
            _down_tile(
                e, rows, valid, pid_n, a_ptr, stride_am, perm_ptr, topk_w_ptr, w_ptr, stride_we, stride_wn,
                scale_ptr, stride_scale_e, stride_scale_n, bias_ptr, stride_bias_e, y_ptr, stride_ym, K, N,
                ROWS, ROUTE_WEIGHT, W_KIND, SCALE, HAS_BIAS, DECODE, SWAP_AB, MMA_FP32, EVEN_K, USE_DOT, STAGES, BLOCK_M, BLOCK_N, BLOCK_K,
            )  # fmt: skip

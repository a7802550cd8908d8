"""Gluon attention kernels for CDNA3 (gfx942) and CDNA4 (gfx950), one source for both.

``mha_prefill``: packed varlen flash attention. One program owns one KV head and a
tile of ``BLOCK_M`` rows that packs ``BLOCK_M // G`` query tokens times the ``G``
query heads sharing that KV head (GQA group in the tile), so every K/V block that
is brought on chip serves the whole group. ``S = Q K^T`` and ``O += P V`` run on
the 32x32 MFMA (``v_mfma_f32_32x32x16_bf16`` on gfx950, ``..._32x32x8_bf16`` on
gfx942). Blocks outside the causal / sliding-window band are never visited;
blocks fully inside it run without any mask arithmetic.

``mha_decode_with_kvcache``: split-KV flash decoding over the paged NHD cache. One
program owns (sequence, KV head, split); its ``G`` query heads are the M rows of a
16x16 MFMA tile. Splits write normalised partial outputs and base-2 log-sum-exps;
a merge kernel combines them and adds the sink logit exactly once. With a single
split the attention kernel finishes the rows itself (sinks included).

Memory traffic uses AMD buffer loads (scalar base in SGPRs + 32-bit offsets; the
scalar base is re-derived per tile in 64-bit arithmetic so tensors larger than
2 GiB stay addressable). On gfx950 K/V tiles go straight from global memory to LDS
(``buffer_load ... lds``, double-buffered); gfx942 has no such copy in Gluon, so
the next tile is prefetched into registers while the current one is consumed.

Numerics follow ``tokenspeed_kernel.ops.attention``: fp32 scores and accumulators,
softmax in base 2 with the scale folded in, ``P`` rounded to the input dtype for
the second MFMA, sinks only in the denominator, zero output and ``-inf`` lse for a
row that sees no key and has no sink.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .._launch import KernelLaunch, next_pow2
from .arch import CdnaArch

__all__ = ["mha_prefill", "mha_decode_with_kvcache", "prefill_launch", "decode_launch", "KernelLaunch"]

# log2(e) and ln(2): the softmax runs in base 2 (exp2 is the native instruction).
_LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
_LN2: gl.constexpr = gl.constexpr(0.6931471805599453)

# Where K/V tiles come from (``KV_MODE``): 0 contiguous rows [total_k, Hkv, D] (prefill);
# paged NHD cache: 1 the tile lies in one page (scalar buffer base per tile, any cache
# size), 2 the tile spans pages and 32-bit offsets from the cache base reach every page
# (cache < 2 GiB), 3 spans pages of a larger cache (64-bit per-row pointers).
KV_CONTIGUOUS: gl.constexpr = gl.constexpr(0)
KV_ONE_PAGE: gl.constexpr = gl.constexpr(1)
KV_PAGES_32BIT: gl.constexpr = gl.constexpr(2)
KV_PAGES_64BIT: gl.constexpr = gl.constexpr(3)


# ---------------------------------------------------------------------------
# Device helpers shared by prefill and decode


@gluon.jit
def _kv_blocks(pos_lo, pos_hi, seqlen_k, window_left, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr,
               WINDOW: gl.constexpr):  # fmt: skip
    """Key blocks for queries at positions ``[pos_lo, pos_hi]``: ``(n_lo, n_hi, f_lo, f_hi)``.

    Blocks ``[n_lo, n_hi)`` hold every visible key (blocks outside the causal /
    window band are never visited); blocks ``[f_lo, f_hi)`` are visible to every row,
    so they run without masks. Blocks are ``BLOCK_N``-aligned from key 0.
    """
    kv_end = seqlen_k
    full_end = seqlen_k
    if CAUSAL:
        kv_end = gl.minimum(kv_end, pos_hi + 1)
        full_end = gl.minimum(full_end, pos_lo + 1)
    kv_begin = pos_lo * 0
    full_begin = kv_begin
    if WINDOW:
        kv_begin = gl.maximum(pos_lo - window_left, 0)
        full_begin = gl.maximum(pos_hi - window_left, 0)
    n_lo = kv_begin // BLOCK_N
    n_hi = gl.maximum((gl.maximum(kv_end, 0) + BLOCK_N - 1) // BLOCK_N, n_lo)
    f_lo = gl.minimum(gl.maximum((full_begin + BLOCK_N - 1) // BLOCK_N, n_lo), n_hi)
    f_hi = gl.minimum(gl.maximum(gl.maximum(full_end, 0) // BLOCK_N, f_lo), n_hi)
    return n_lo, n_hi, f_lo, f_hi


@gluon.jit
def _visible_keys(row_pos, seqlen_k, window_left, CAUSAL: gl.constexpr, WINDOW: gl.constexpr):
    """Per row at position ``row_pos``: ``(first visible key, number of visible keys >= 0)``."""
    hi = gl.full(row_pos.shape, 0, gl.int32, row_pos.type.layout) + seqlen_k
    if CAUSAL:
        hi = gl.minimum(hi, row_pos + 1)
    lo = gl.zeros_like(row_pos)
    if WINDOW:
        lo = gl.maximum(row_pos - window_left, 0)
    return lo, gl.maximum(hi - lo, 0)


@gluon.jit
def _attend_block(q, k_tile, v_tile, state, key0, visible, scales, MASKED: gl.constexpr, SOFTCAP: gl.constexpr,
                  ASYNC: gl.constexpr):  # fmt: skip
    """One online-softmax step of ``state = (acc, m, l)`` over the keys ``key0 ..``.

    ``q``: [BLOCK_M, D] MFMA A operand. ``k_tile``/``v_tile``: [BLOCK_N, D] in LDS.
    ``acc`` [BLOCK_M, D] fp32 and the base-2 running max ``m`` / sum ``l`` [BLOCK_M]
    live in the MFMA accumulator layout. ``visible = (lo, cnt)``: row r sees keys
    ``lo[r] .. lo[r] + cnt[r] - 1`` (read only when ``MASKED``). ``scales =
    (softmax_scale, logit_cap)``.
    """
    acc, m_i, l_i = state
    lo, cnt = visible
    softmax_scale, logit_cap = scales
    dot_a: gl.constexpr = q.type.layout
    mma: gl.constexpr = dot_a.parent
    dot_b: gl.constexpr = gl.DotOperandLayout(1, mma, dot_a.k_width)
    BLOCK_N: gl.constexpr = k_tile.shape[0]
    # K^T is a transposed view of the row-major tile: each lane reads k_width
    # consecutive head-dim elements of one key, one vector LDS read.
    if ASYNC:
        # The tile came from direct-to-LDS copies the caller waited for; the relaxed
        # load keeps LLVM from adding a vmcnt(0) wait here, which would also wait for
        # the next tile's copy that is meant to overlap this compute.
        k = gl.amd.cdna4.async_copy.load_shared_relaxed(k_tile.permute([1, 0]), dot_b)
    else:
        k = k_tile.permute([1, 0]).load(dot_b)
    s = gl.amd.cdna3.mfma(q, k, gl.zeros([q.shape[0], BLOCK_N], gl.float32, mma))
    if SOFTCAP:
        # cap * tanh(x / cap) with tanh(y) = 1 - 2 / (e^{2y} + 1) (no tanh builtin).
        y = s * (softmax_scale / logit_cap)
        s = (1.0 - 2.0 / (gl.exp2(y * (2.0 * _LOG2E)) + 1.0)) * (logit_cap * _LOG2E)
    else:
        s = s * (softmax_scale * _LOG2E)
    if MASKED:
        # One unsigned compare per element (lo <= key < lo + cnt): compare results live
        # in SGPR pairs, and three compares per element ran the kernel out of SGPRs.
        cols = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))
        rel = (cols[None, :] - lo[:, None]).to(gl.uint32, bitcast=True)
        s = gl.where(rel < cnt[:, None].to(gl.uint32, bitcast=True), s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    m_base = m_new
    if MASKED:
        # A row that has seen no key yet keeps m = -inf; subtracting 0 instead makes
        # exp2 give 0 rather than NaN (-inf - -inf).
        m_base = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2(s - m_base[:, None])
    alpha = gl.exp2(m_i - m_base)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    acc = acc * alpha[:, None]
    if ASYNC:
        v = gl.amd.cdna4.async_copy.load_shared_relaxed(v_tile, dot_b)
    else:
        v = v_tile.load(dot_b)
    # P is rounded to the input dtype for the second MFMA (as FlashAttention does).
    acc = gl.amd.cdna3.mfma(gl.convert_layout(p.to(v.dtype), dot_a), v, acc)
    return acc, m_new, l_i


@gluon.jit
def _attend(q, k_tile, v_tile, state, blk, full, visible, scales, SOFTCAP: gl.constexpr, ASYNC: gl.constexpr):
    """:func:`_attend_block` for block ``blk``, without masks inside ``full = (f_lo, f_hi)``."""
    f_lo, f_hi = full
    key0 = blk * k_tile.shape[0]
    # A uniform scalar branch: both variants are compiled, each block runs one.
    if (blk < f_lo) | (blk >= f_hi):
        state = _attend_block(q, k_tile, v_tile, state, key0, visible, scales, True, SOFTCAP, ASYNC)
    else:
        state = _attend_block(q, k_tile, v_tile, state, key0, visible, scales, False, SOFTCAP, ASYNC)
    return state


@gluon.jit
def _fetch_kv(src, pt_row, key0, seqlen_k, dst, ASYNC: gl.constexpr, KV_MODE: gl.constexpr,
              PAGE_SIZE: gl.constexpr, LAYOUT: gl.constexpr):  # fmt: skip
    """Keys ``key0 .. key0 + BLOCK_N`` of one KV head: copied into ``dst`` (LDS) when
    ``ASYNC``, else returned in registers (``LAYOUT``).

    ``src = (head_ptr, row_stride, page_stride)``; ``pt_row`` is the sequence's page
    table row (paged modes). Keys past ``seqlen_k`` (>= 1) re-read key ``seqlen_k - 1``
    instead of being masked: their page table entries may be garbage, and a masked
    lane of a direct-to-LDS copy writes nothing, leaving stale LDS (possibly NaN bit
    patterns; 0 * NaN would poison P V). The softmax masks those keys out anyway.
    """
    head_ptr, row_stride, page_stride = src
    BLOCK_N: gl.constexpr = dst.shape[dst.rank - 2]
    HEAD_DIM: gl.constexpr = dst.shape[dst.rank - 1]
    keys = gl.minimum(key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, LAYOUT)), seqlen_k - 1)
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, LAYOUT))
    if KV_MODE == KV_PAGES_64BIT:
        page = gl.amd.cdna3.buffer_load(pt_row, keys // PAGE_SIZE)
        row = page.to(gl.int64) * page_stride + (keys % PAGE_SIZE).to(gl.int64) * row_stride
        ptrs = head_ptr + (row[:, None] + cols[None, :])
        if ASYNC:
            gl.amd.cdna4.async_copy.global_load_to_shared(dst, ptrs)
            result = dst
        else:
            result = gl.load(ptrs)
    else:
        if KV_MODE == KV_PAGES_32BIT:
            page = gl.amd.cdna3.buffer_load(pt_row, keys // PAGE_SIZE)
            base = head_ptr
            offs = (page * page_stride + (keys % PAGE_SIZE) * row_stride)[:, None] + cols[None, :]
        else:
            # Scalar (SGPR) 64-bit base per tile + small 32-bit offsets.
            if KV_MODE == KV_CONTIGUOUS:
                base = head_ptr + key0.to(gl.int64) * row_stride
            else:
                page = gl.load(pt_row + key0 // PAGE_SIZE)
                base = head_ptr + page.to(gl.int64) * page_stride + (key0 % PAGE_SIZE).to(gl.int64) * row_stride
            offs = (keys - key0)[:, None] * row_stride + cols[None, :]
        if ASYNC:
            gl.amd.cdna4.async_copy.buffer_load_to_shared(dst, base, offs)
            result = dst
        else:
            result = gl.amd.cdna3.buffer_load(base, offs)
    return result


@gluon.jit
def _attention_loop(q_smem, k_src, v_src, pt_row, seqlen_k, blocks, visible, scales, DOT_A: gl.constexpr,
                    IO: gl.constexpr, SMEM: gl.constexpr, SOFTCAP: gl.constexpr, ASYNC: gl.constexpr,
                    KV_MODE: gl.constexpr, PAGE_SIZE: gl.constexpr, BLOCK_N: gl.constexpr):  # fmt: skip
    """Flash-attention main loop over key blocks ``blocks = (n_lo, n_hi, f_lo, f_hi)``.

    ``q_smem`` holds the [BLOCK_M, D] query tile (copy in flight when ``ASYNC``, stored
    otherwise). Returns ``(acc, m, l)``.
    """
    n_lo, n_hi, f_lo, f_hi = blocks
    dtype: gl.constexpr = q_smem.dtype
    BLOCK_M: gl.constexpr = q_smem.shape[0]
    HEAD_DIM: gl.constexpr = q_smem.shape[1]
    mma: gl.constexpr = DOT_A.parent
    state = (
        gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, mma),
        gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, mma)),
        gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, mma)),
    )
    if ASYNC:
        acp: gl.constexpr = gl.amd.cdna4.async_copy
        # Double buffer in LDS: block j+1 is copied global -> LDS while block j is used.
        k_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HEAD_DIM], SMEM)
        v_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HEAD_DIM], SMEM)
        if n_lo < n_hi:
            _fetch_kv(k_src, pt_row, n_lo * BLOCK_N, seqlen_k, k_smem.index(0), True, KV_MODE, PAGE_SIZE, IO)
            _fetch_kv(v_src, pt_row, n_lo * BLOCK_N, seqlen_k, v_smem.index(0), True, KV_MODE, PAGE_SIZE, IO)
        acp.commit_group()
        acp.wait_group(0)
        gl.thread_barrier()
        q = acp.load_shared_relaxed(q_smem, DOT_A)
        for blk in range(n_lo, n_hi):
            buf = (blk - n_lo) % 2
            acp.wait_group(0)
            # After this barrier every warp's copy of block blk has landed and every warp
            # has finished with the other buffer (block blk-1), which is refilled next.
            gl.thread_barrier()
            if blk + 1 < n_hi:
                key1 = (blk + 1) * BLOCK_N
                _fetch_kv(k_src, pt_row, key1, seqlen_k, k_smem.index(1 - buf), True, KV_MODE, PAGE_SIZE, IO)
                _fetch_kv(v_src, pt_row, key1, seqlen_k, v_smem.index(1 - buf), True, KV_MODE, PAGE_SIZE, IO)
            acp.commit_group()
            state = _attend(q, k_smem.index(buf), v_smem.index(buf), state, blk, (f_lo, f_hi), visible, scales,
                            SOFTCAP, True)  # fmt: skip
    else:
        # No direct-to-LDS copy in Gluon for CDNA3: registers hold block j+1 (buffer
        # loads in flight) while block j is consumed from LDS.
        q = q_smem.load(DOT_A)
        k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], SMEM)
        # V is the B operand of P V, read along keys; CDNA3 has no transposing LDS read
        # (gfx950's ds_read_b64_tr_b16), so V is stored key-contiguous instead. The
        # transpose then costs 2-byte LDS writes once per element rather than 2-byte
        # reads in every warp (each warp reads all of V), and frees ~70 VGPRs.
        V_SMEM: gl.constexpr = gl.PaddedSharedLayout.with_identity_for([[BLOCK_N, 8]], [BLOCK_N, HEAD_DIM], [0, 1])
        v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], V_SMEM)
        k_next = gl.zeros([BLOCK_N, HEAD_DIM], dtype, IO)
        v_next = gl.zeros([BLOCK_N, HEAD_DIM], dtype, IO)
        # Fetches sit under scalar branches: an empty range, or the step past the last
        # block, must not look up a page beyond the sequence.
        if n_lo < n_hi:
            k_next = _fetch_kv(k_src, pt_row, n_lo * BLOCK_N, seqlen_k, k_smem, False, KV_MODE, PAGE_SIZE, IO)
            v_next = _fetch_kv(v_src, pt_row, n_lo * BLOCK_N, seqlen_k, v_smem, False, KV_MODE, PAGE_SIZE, IO)
        for blk in range(n_lo, n_hi):
            gl.thread_barrier()
            k_smem.store(k_next)
            v_smem.store(v_next)
            gl.thread_barrier()
            if blk + 1 < n_hi:
                key1 = (blk + 1) * BLOCK_N
                k_next = _fetch_kv(k_src, pt_row, key1, seqlen_k, k_smem, False, KV_MODE, PAGE_SIZE, IO)
                v_next = _fetch_kv(v_src, pt_row, key1, seqlen_k, v_smem, False, KV_MODE, PAGE_SIZE, IO)
            state = _attend(q, k_smem, v_smem, state, blk, (f_lo, f_hi), visible, scales, SOFTCAP, False)
    return state


@gluon.jit
def _finish_rows(state, sink_ptr, head_idx, head_ok, HAS_SINKS: gl.constexpr):
    """Add the sink logit to the denominator and normalise ``state = (acc, m, l)``.

    Returns ``(out fp32, lse natural log)``; a row with an empty denominator gives
    zeros and ``-inf``.
    """
    acc, m_i, l_i = state
    if HAS_SINKS:
        sink = gl.load(sink_ptr + head_idx, mask=head_ok, other=0.0) * _LOG2E
        m_fin = gl.maximum(m_i, sink)
        alpha = gl.exp2(m_i - m_fin)
        l_i = l_i * alpha + gl.exp2(sink - m_fin)
        acc = acc * alpha[:, None]
        m_i = m_fin
    has_mass = l_i > 0.0
    safe_l = gl.where(has_mass, l_i, 1.0)
    out = acc * gl.where(has_mass, 1.0 / safe_l, 0.0)[:, None]
    lse = gl.where(has_mass, (m_i + gl.log2(safe_l)) * _LN2, float("-inf"))
    return out, lse


# ---------------------------------------------------------------------------
# Kernels


@gluon.jit(do_not_specialize=["window_left"])
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, sink_ptr, cu_q_ptr, cu_k_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    num_q_heads, num_q_tiles, window_left, softmax_scale, logit_cap,
    HEAD_DIM: gl.constexpr, GROUP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    CAUSAL: gl.constexpr, WINDOW: gl.constexpr, HAS_SINKS: gl.constexpr, SOFTCAP: gl.constexpr,
    RETURN_LSE: gl.constexpr, MFMA_VERSION: gl.constexpr, MFMA_K: gl.constexpr, K_WIDTH: gl.constexpr,
    ASYNC_COPY: gl.constexpr, NUM_WARPS: gl.constexpr,
):  # fmt: skip
    # 32x32 MFMA, one warp per 32 rows; every warp reads the whole K/V block. With
    # transposed=True a lane holds consecutive *columns* of one row, so row max / sum
    # reduce mostly in-thread and P becomes the A operand of P V with lane swaps.
    MMA: gl.constexpr = gl.amd.AMDMFMALayout(
        version=MFMA_VERSION, instr_shape=[32, 32, MFMA_K], transposed=True, warps_per_cta=[NUM_WARPS, 1]
    )
    DOT_A: gl.constexpr = gl.DotOperandLayout(0, MMA, K_WIDTH)
    IO: gl.constexpr = gl.BlockedLayout([1, 8], [64 // (HEAD_DIM // 8), HEAD_DIM // 8], [NUM_WARPS, 1], [1, 0])
    SMEM: gl.constexpr = gl.PaddedSharedLayout.with_identity_for([[HEAD_DIM, 8]], [BLOCK_N, HEAD_DIM], [1, 0])
    Q_SMEM: gl.constexpr = gl.PaddedSharedLayout.with_identity_for([[HEAD_DIM, 8]], [BLOCK_M, HEAD_DIM], [1, 0])
    BLOCK_Q: gl.constexpr = BLOCK_M // GROUP
    dtype: gl.constexpr = q_ptr.dtype.element_ty

    batch = gl.program_id(1)
    kv_head = gl.program_id(2)
    # Longest causal tiles (last queries) first.
    t0 = (num_q_tiles - 1 - gl.program_id(0)) * BLOCK_Q
    q_start = gl.load(cu_q_ptr + batch)
    seqlen_q = gl.load(cu_q_ptr + batch + 1) - q_start
    k_start = gl.load(cu_k_ptr + batch)
    seqlen_k = gl.load(cu_k_ptr + batch + 1) - k_start
    if t0 < seqlen_q:
        # Tile row r is query token t0 + r // GROUP of head kv_head * GROUP + r % GROUP:
        # the whole GQA group shares each K/V block brought on chip.
        q_base = q_ptr + (q_start + t0).to(gl.int64) * stride_qt + (kv_head * GROUP).to(gl.int64) * stride_qh
        r_io = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, IO))
        d_io = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, IO))
        # Padding rows (past seqlen_q) re-read the last token (see _fetch_kv); never stored.
        q_tok = gl.minimum(r_io // GROUP, seqlen_q - t0 - 1)
        q_offs = q_tok[:, None] * stride_qt + (r_io % GROUP)[:, None] * stride_qh + d_io[None, :]
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], Q_SMEM)
        if ASYNC_COPY:
            gl.amd.cdna4.async_copy.buffer_load_to_shared(q_smem, q_base, q_offs)
        else:
            q_smem.store(gl.amd.cdna3.buffer_load(q_base, q_offs))

        r_mm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, MMA))
        offset = seqlen_k - seqlen_q  # bottom-right aligned causal mask
        visible = _visible_keys(offset + t0 + r_mm // GROUP, seqlen_k, window_left, CAUSAL, WINDOW)
        pos_hi = offset + gl.minimum(t0 + BLOCK_Q, seqlen_q) - 1
        blocks = _kv_blocks(offset + t0, pos_hi, seqlen_k, window_left, BLOCK_N, CAUSAL, WINDOW)
        k_src = (k_ptr + k_start.to(gl.int64) * stride_kt + kv_head.to(gl.int64) * stride_kh, stride_kt, 0)
        v_src = (v_ptr + k_start.to(gl.int64) * stride_vt + kv_head.to(gl.int64) * stride_vh, stride_vt, 0)
        state = _attention_loop(q_smem, k_src, v_src, cu_k_ptr, seqlen_k, blocks, visible, (softmax_scale, logit_cap),
                                DOT_A, IO, SMEM, SOFTCAP, ASYNC_COPY, KV_CONTIGUOUS, 1, BLOCK_N)  # fmt: skip

        head = r_mm % GROUP
        row_ok = (t0 + r_mm // GROUP) < seqlen_q
        out, lse = _finish_rows(state, sink_ptr, kv_head * GROUP + head, row_ok, HAS_SINKS)
        o_base = o_ptr + (q_start + t0).to(gl.int64) * stride_ot + (kv_head * GROUP).to(gl.int64) * stride_oh
        o_offs = (r_io // GROUP)[:, None] * stride_ot + (r_io % GROUP)[:, None] * stride_oh + d_io[None, :]
        o_ok = (t0 + r_io // GROUP) < seqlen_q
        gl.amd.cdna3.buffer_store(gl.convert_layout(out.to(dtype), IO), o_base, o_offs, mask=o_ok[:, None])
        if RETURN_LSE:
            lse_base = lse_ptr + (q_start + t0).to(gl.int64) * num_q_heads + kv_head * GROUP
            gl.amd.cdna3.buffer_store(lse, lse_base, (r_mm // GROUP) * num_q_heads + head, mask=row_ok)


@gluon.jit(do_not_specialize=["window_left"])
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, pt_ptr, seqlens_ptr, o_ptr, lse_ptr, sink_ptr, part_o_ptr, part_lse_ptr,
    stride_qb, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh,
    stride_pt, stride_ob, stride_oh, num_q_heads, window_left, softmax_scale, logit_cap,
    HEAD_DIM: gl.constexpr, GROUP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    PAGE_SIZE: gl.constexpr, KV_MODE: gl.constexpr, NUM_SPLITS: gl.constexpr,
    WINDOW: gl.constexpr, HAS_SINKS: gl.constexpr, SOFTCAP: gl.constexpr, RETURN_LSE: gl.constexpr,
    MFMA_VERSION: gl.constexpr, MFMA_K: gl.constexpr, K_WIDTH: gl.constexpr, ASYNC_COPY: gl.constexpr,
    NUM_WARPS: gl.constexpr,
):  # fmt: skip
    # The GROUP query heads of one KV head are the M rows (padded to >= 16) of a 16x16
    # MFMA; warps split N (keys for S, head dim for O), so no warp repeats K/V work.
    MMA: gl.constexpr = gl.amd.AMDMFMALayout(
        version=MFMA_VERSION, instr_shape=[16, 16, MFMA_K], transposed=True, warps_per_cta=[1, NUM_WARPS]
    )
    DOT_A: gl.constexpr = gl.DotOperandLayout(0, MMA, K_WIDTH)
    IO: gl.constexpr = gl.BlockedLayout([1, 8], [64 // (HEAD_DIM // 8), HEAD_DIM // 8], [NUM_WARPS, 1], [1, 0])
    SMEM: gl.constexpr = gl.PaddedSharedLayout.with_identity_for([[HEAD_DIM, 8]], [BLOCK_N, HEAD_DIM], [1, 0])
    Q_SMEM: gl.constexpr = gl.PaddedSharedLayout.with_identity_for([[HEAD_DIM, 8]], [BLOCK_M, HEAD_DIM], [1, 0])
    dtype: gl.constexpr = q_ptr.dtype.element_ty

    batch = gl.program_id(0)
    kv_head = gl.program_id(1)
    split = gl.program_id(2)
    seqlen_k = gl.load(seqlens_ptr + batch)
    # The query is the newest cached token: causal is implied, the window trims the front.
    n_lo, n_hi, f_lo, f_hi = _kv_blocks(seqlen_k - 1, seqlen_k - 1, seqlen_k, window_left, BLOCK_N, True, WINDOW)
    per_split = (n_hi - n_lo + NUM_SPLITS - 1) // NUM_SPLITS
    s_lo = gl.minimum(n_lo + split * per_split, n_hi)
    s_hi = gl.minimum(s_lo + per_split, n_hi)

    r_io = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, IO))
    d_io = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, IO))
    q_ok = r_io < GROUP
    q_base = q_ptr + batch.to(gl.int64) * stride_qb + (kv_head * GROUP).to(gl.int64) * stride_qh
    q_tile = gl.amd.cdna3.buffer_load(q_base, r_io[:, None] * stride_qh + d_io[None, :], mask=q_ok[:, None], other=0.0)
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], Q_SMEM, q_tile)

    r_mm = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, MMA))
    row_pos = gl.full([BLOCK_M], 0, gl.int32, gl.SliceLayout(1, MMA)) + (seqlen_k - 1)
    visible = _visible_keys(row_pos, seqlen_k, window_left, True, WINDOW)
    k_src = (k_ptr + kv_head.to(gl.int64) * stride_kh, stride_kt, stride_kp)
    v_src = (v_ptr + kv_head.to(gl.int64) * stride_vh, stride_vt, stride_vp)
    pt_row = pt_ptr + batch.to(gl.int64) * stride_pt
    state = _attention_loop(q_smem, k_src, v_src, pt_row, seqlen_k, (s_lo, s_hi, f_lo, f_hi), visible,
                            (softmax_scale, logit_cap), DOT_A, IO, SMEM, SOFTCAP, ASYNC_COPY, KV_MODE, PAGE_SIZE,
                            BLOCK_N)  # fmt: skip

    row_ok = r_mm < GROUP
    q_head = kv_head * GROUP + r_mm
    if NUM_SPLITS == 1:
        out, lse = _finish_rows(state, sink_ptr, q_head, row_ok, HAS_SINKS)
        o_base = o_ptr + batch.to(gl.int64) * stride_ob + (kv_head * GROUP).to(gl.int64) * stride_oh
        o_offs = r_io[:, None] * stride_oh + d_io[None, :]
        gl.amd.cdna3.buffer_store(gl.convert_layout(out.to(dtype), IO), o_base, o_offs, mask=q_ok[:, None])
        if RETURN_LSE:
            gl.amd.cdna3.buffer_store(lse, lse_ptr + batch.to(gl.int64) * num_q_heads, q_head, mask=row_ok)
    else:
        # This split's normalised output and base-2 lse, without the sink (the merge adds
        # it once). Partials are [B, Hq, NUM_SPLITS, D] and [B, Hq, NUM_SPLITS] fp32.
        out, lse = _finish_rows(state, sink_ptr, q_head, row_ok, False)
        part = (batch * num_q_heads + kv_head * GROUP).to(gl.int64) * NUM_SPLITS + split
        po_offs = r_io[:, None] * (NUM_SPLITS * HEAD_DIM) + d_io[None, :]
        gl.amd.cdna3.buffer_store(gl.convert_layout(out, IO), part_o_ptr + part * HEAD_DIM, po_offs, mask=q_ok[:, None])
        gl.amd.cdna3.buffer_store(lse * _LOG2E, part_lse_ptr + part, r_mm * NUM_SPLITS, mask=row_ok)


@gluon.jit
def _decode_merge_kernel(
    part_o_ptr, part_lse_ptr, sink_ptr, o_ptr, lse_ptr, stride_ob, stride_oh, num_q_heads,
    HEAD_DIM: gl.constexpr, NUM_SPLITS: gl.constexpr, SPLITS_P2: gl.constexpr, HAS_SINKS: gl.constexpr,
    RETURN_LSE: gl.constexpr, NUM_WARPS: gl.constexpr,
):  # fmt: skip
    """out[b, h] = sum_s w_s o_s / (sum_s w_s + 2^sink), w_s = 2^lse_s (all shifted by the
    max): each split's normalised output re-weighted by its share of the softmax mass,
    the sink counted once."""
    LAYOUT: gl.constexpr = gl.BlockedLayout([1, 4], [64 // (HEAD_DIM // 4), HEAD_DIM // 4], [NUM_WARPS, 1], [1, 0])
    batch = gl.program_id(0)
    head = gl.program_id(1)
    row = (batch * num_q_heads + head).to(gl.int64) * NUM_SPLITS
    s = gl.arange(0, SPLITS_P2, layout=gl.SliceLayout(1, LAYOUT))
    d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, LAYOUT))
    s_ok = s < NUM_SPLITS
    lse_s = gl.amd.cdna3.buffer_load(part_lse_ptr + row, s, mask=s_ok, other=float("-inf"))
    m = gl.max(lse_s, axis=0)
    if HAS_SINKS:
        sink = gl.load(sink_ptr + head) * _LOG2E
        m = gl.maximum(m, sink)
    m = gl.where(m == float("-inf"), 0.0, m)
    w = gl.exp2(lse_s - m)
    denom = gl.sum(w, axis=0)
    if HAS_SINKS:
        denom = denom + gl.exp2(sink - m)
    o_s = gl.amd.cdna3.buffer_load(part_o_ptr + row * HEAD_DIM, s[:, None] * HEAD_DIM + d[None, :], mask=s_ok[:, None])
    safe = gl.where(denom > 0.0, denom, 1.0)
    out = gl.sum(o_s * w[:, None], axis=0) * gl.where(denom > 0.0, 1.0 / safe, 0.0)
    o_base = o_ptr + batch.to(gl.int64) * stride_ob + head.to(gl.int64) * stride_oh
    gl.amd.cdna3.buffer_store(out.to(o_ptr.dtype.element_ty), o_base, d)
    if RETURN_LSE:
        lse = gl.where(denom > 0.0, (m + gl.log2(safe)) * _LN2, float("-inf"))
        gl.store(lse_ptr + batch.to(gl.int64) * num_q_heads + head, lse)


# ---------------------------------------------------------------------------
# Host side: launch plans (also used by the cross-compilation tests) and the ops


#: Tile configuration by head dim: (BLOCK_M, BLOCK_N, num_warps). BLOCK_M = 128 rows of
#: (token, head) pairs over 4 warps, 64-key blocks. Not yet tuned on hardware.
_PREFILL_TILES = {64: (128, 64, 4), 128: (128, 64, 4)}
#: Decode: 64-key blocks, 4 warps splitting the keys (S) and the head dim (O).
_DECODE_BLOCK_N = 64
_DECODE_WARPS = 4
#: Aim for this many decode programs per CU before splitting the KV range further.
_DECODE_PROGRAMS_PER_CU = 2
_DECODE_MAX_SPLITS = 64


def _lds_copy_ok(arch: CdnaArch, *tensors: torch.Tensor) -> bool:
    """Whether the direct-to-LDS copies can be used for tiles of ``tensors``.

    Each lane copies 16 bytes, so the compiler must prove 16-byte alignment: base
    pointers aligned to 16 bytes and every stride but the last a multiple of 16
    elements (Triton's launcher only records divisibility by 16). Anything else
    (e.g. a head dim padded to an odd size) takes the register-staged path.
    """
    return arch.async_copy and all(
        t.data_ptr() % 16 == 0 and all(s % 16 == 0 for s in t.stride()[:-1]) for t in tensors
    )


def prefill_launch(
    arch: CdnaArch,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    *,
    causal: bool,
    window_left: int,
    sinks: torch.Tensor | None,
    softmax_scale: float,
    logit_cap: float,
    out: torch.Tensor,
    lse: torch.Tensor | None,
) -> KernelLaunch:
    """The launch :func:`mha_prefill` makes (no allocation, no device sync)."""
    _, hq, d = q.shape
    hkv = k.shape[1]
    group = hq // hkv
    block_m, block_n, warps = _PREFILL_TILES[d]
    block_q = block_m // group
    batch = cu_seqlens_q.shape[0] - 1
    tiles = max(1, -(-max_seqlen_q // block_q))
    args = (
        q, k, v, out, lse, sinks, cu_seqlens_q, cu_seqlens_k,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        hq, tiles, window_left, float(softmax_scale), float(logit_cap),
    )  # fmt: skip
    kwargs = dict(
        HEAD_DIM=d, GROUP=group, BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=bool(causal), WINDOW=window_left >= 0,
        HAS_SINKS=sinks is not None, SOFTCAP=logit_cap > 0, RETURN_LSE=lse is not None,
        MFMA_VERSION=arch.mfma_version, MFMA_K=arch.mfma_k32, K_WIDTH=arch.k_width,
        ASYNC_COPY=_lds_copy_ok(arch, q, k, v),
        NUM_WARPS=warps, num_warps=warps,
    )  # fmt: skip
    return KernelLaunch(_prefill_kernel, (tiles, batch, hkv), args, kwargs)


def mha_prefill(
    arch: CdnaArch,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = True,
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    logit_cap: float = 0.0,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen attention for ``arch``; arguments as ``tokenspeed_kernel.mha_prefill``.

    Args:
        arch: the CDNA target (:data:`~tokenspeed_kernel_amd.cdna.arch.GFX942` / ``GFX950``).
        q: ``[total_q, Hq, D]`` bf16/fp16, D in (64, 128), last dim contiguous.
        k, v: ``[total_k, Hkv, D]`` like ``q``; ``Hq / Hkv`` a power of two <= 16.
        cu_seqlens_q, cu_seqlens_k: ``int32 [B+1]``.
        max_seqlen_q, max_seqlen_k: host ints bounding the lengths.
        causal, window_left, sinks (``float32 [Hq]``), softmax_scale (None: ``D**-0.5``),
        logit_cap, return_lse, out: as the public op.

    Returns:
        ``out [total_q, Hq, D]``, or ``(out, lse float32 [total_q, Hq])``.
    """
    del max_seqlen_k  # the grid is sized by the queries; key ranges are read on device
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    if out is None:
        out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if return_lse else None
    if q.shape[0] and max_seqlen_q > 0:
        prefill_launch(
            arch, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, causal=causal, window_left=window_left,
            sinks=sinks, softmax_scale=scale, logit_cap=logit_cap, out=out, lse=lse,
        )()  # fmt: skip
    return (out, lse) if return_lse else out


_cu_counts: dict[int, int] = {}


def _compute_units(arch: CdnaArch, device: torch.device) -> int:
    if device.type != "cuda":
        return arch.default_compute_units
    index = device.index if device.index is not None else torch.cuda.current_device()
    units = _cu_counts.get(index)
    if units is None:
        units = torch.cuda.get_device_properties(index).multi_processor_count
        _cu_counts[index] = units
    return units


def decode_num_splits(arch: CdnaArch, batch: int, kv_heads: int, max_keys: int, window_left: int, cus: int) -> int:
    """How many KV splits a decode launch uses: enough programs to fill the CUs, never
    more splits than key blocks. Depends on shapes only (CUDA-graph safe)."""
    if window_left >= 0:
        max_keys = min(max_keys, window_left + 1)
    blocks = max(1, -(-max_keys // _DECODE_BLOCK_N) + (1 if window_left >= 0 else 0))
    want = -(-(_DECODE_PROGRAMS_PER_CU * cus) // max(1, batch * kv_heads))
    return max(1, min(want, blocks, _DECODE_MAX_SPLITS))


def decode_launch(
    arch: CdnaArch,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    window_left: int,
    sinks: torch.Tensor | None,
    softmax_scale: float,
    logit_cap: float,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    num_splits: int,
    part_out: torch.Tensor | None,
    part_lse: torch.Tensor | None,
) -> list[KernelLaunch]:
    """The launches :func:`mha_decode_with_kvcache` makes (attention, then the merge if split)."""
    batch, hq, d = q.shape
    _, page_size, hkv, _ = k_cache.shape
    group = hq // hkv
    block_m = max(16, next_pow2(group))
    if page_size % _DECODE_BLOCK_N == 0:
        kv_mode = KV_ONE_PAGE.value
    elif max(k_cache.numel(), v_cache.numel()) * k_cache.element_size() < 2**31:
        kv_mode = KV_PAGES_32BIT.value
    else:
        kv_mode = KV_PAGES_64BIT.value
    args = (
        q, k_cache, v_cache, page_table, cache_seqlens, out, lse, sinks, part_out, part_lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), page_table.stride(0), out.stride(0), out.stride(1),
        hq, window_left, float(softmax_scale), float(logit_cap),
    )  # fmt: skip
    kwargs = dict(
        HEAD_DIM=d, GROUP=group, BLOCK_M=block_m, BLOCK_N=_DECODE_BLOCK_N, PAGE_SIZE=page_size, KV_MODE=kv_mode,
        NUM_SPLITS=num_splits, WINDOW=window_left >= 0, HAS_SINKS=sinks is not None, SOFTCAP=logit_cap > 0,
        RETURN_LSE=lse is not None, MFMA_VERSION=arch.mfma_version, MFMA_K=arch.mfma_k16, K_WIDTH=arch.k_width,
        ASYNC_COPY=_lds_copy_ok(arch, k_cache, v_cache), NUM_WARPS=_DECODE_WARPS, num_warps=_DECODE_WARPS,
    )  # fmt: skip
    launches = [KernelLaunch(_decode_kernel, (batch, hkv, num_splits), args, kwargs)]
    if num_splits > 1:
        merge_args = (part_out, part_lse, sinks, out, lse, out.stride(0), out.stride(1), hq)
        merge_kwargs = dict(
            HEAD_DIM=d, NUM_SPLITS=num_splits, SPLITS_P2=next_pow2(num_splits), HAS_SINKS=sinks is not None,
            RETURN_LSE=lse is not None, NUM_WARPS=1, num_warps=1,
        )  # fmt: skip
        launches.append(KernelLaunch(_decode_merge_kernel, (batch, hq), merge_args, merge_kwargs))
    return launches


def mha_decode_with_kvcache(
    arch: CdnaArch,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    logit_cap: float = 0.0,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Paged decode attention for ``arch``; arguments as ``tokenspeed_kernel.mha_decode_with_kvcache``.

    Args:
        arch: the CDNA target.
        q: ``[B, Hq, D]`` bf16/fp16, D in (64, 128).
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]`` (NHD), q's dtype; ``Hq / Hkv <= 64``.
        page_table: ``int32 [B, max_pages]``; cache_seqlens: ``int32 [B]`` (>= 1).
        window_left, sinks (``float32 [Hq]``), softmax_scale, logit_cap, return_lse, out:
            as the public op.

    Returns:
        ``out [B, Hq, D]``, or ``(out, lse float32 [B, Hq])``.
    """
    batch, hq, d = q.shape
    hkv = k_cache.shape[2]
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    if out is None:
        out = torch.empty_like(q)
    lse = torch.empty((batch, hq), dtype=torch.float32, device=q.device) if return_lse else None
    if batch == 0:
        return (out, lse) if return_lse else out
    max_keys = page_table.shape[1] * k_cache.shape[1]
    splits = decode_num_splits(arch, batch, hkv, max_keys, window_left, _compute_units(arch, q.device))
    part_out = part_lse = None
    if splits > 1:
        part_out = torch.empty((batch, hq, splits, d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((batch, hq, splits), dtype=torch.float32, device=q.device)
    for launch in decode_launch(
        arch, q, k_cache, v_cache, page_table, cache_seqlens, window_left=window_left, sinks=sinks,
        softmax_scale=scale, logit_cap=logit_cap, out=out, lse=lse, num_splits=splits, part_out=part_out,
        part_lse=part_lse,
    ):  # fmt: skip
        launch()
    return (out, lse) if return_lse else out

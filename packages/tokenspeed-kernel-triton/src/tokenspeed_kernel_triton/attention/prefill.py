"""Varlen causal/windowed attention with GQA-packed tiles (``mha_prefill``).

One kernel serves ``mha_prefill`` (contiguous packed K/V) and
``mha_extend_with_kvcache`` (paged NHD cache, see ``extend.py``): only the address
of a key row differs (``PAGED``).

Tile layout: a program owns one KV head and ``BLOCK_M`` rows, each row a (query
token, query head of that KV head's group) pair, token-major. The K/V block loaded
for an inner step is therefore shared by every query head of the group (GPT-OSS: 8
heads, so a 128-row tile is 16 tokens x 8 heads), which divides K/V traffic by the
group size and keeps the causal diagonal and the sliding window narrow in tokens.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.launch import cached, cdiv

from ._shared import (
    LN2,
    LOG2E,
    add_sink,
    kv_row_offsets,
    mma,
    normalize,
    online_softmax_step,
    score_scales,
    scores_log2,
)
from .configs import prefill_config

__all__ = ["mha_prefill", "launch_attention_kernel"]

_LAUNCH_OPTIONS = ("num_warps", "num_stages", "waves_per_eu", "matrix_instr_nonkdim", "kpack")


@triton.jit
def _attend_block(
    acc,
    l_i,
    m_i,
    q,
    pos,
    start_n,
    k_base,
    v_base,
    kv_start,
    kv_len,
    key_lo,
    page_row_ptr,
    stride_k_page,
    stride_k_tok,
    stride_v_page,
    stride_v_tok,
    window_left,
    qk_scale,
    cap_scale,
    cap_log2,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_CAP: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
    DOT_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    # Edge blocks load only keys some row can see: below the window (key_lo) an engine may
    # already have freed the page, and past kv_len the page is unwritten (or absent).
    in_range = (offs_n < kv_len) & (offs_n >= key_lo)
    k_off, v_off = kv_row_offsets(
        offs_n, kv_start, page_row_ptr, stride_k_page, stride_k_tok, stride_v_page, stride_v_tok, in_range,
        PAGED, PAGE_SIZE, MASKED,
    )  # fmt: skip
    # Interior blocks (MASKED=False) lie wholly inside every row's visible range and
    # inside the sequence: no bounds mask on the loads, no score mask.
    if MASKED:
        k = tl.load(k_base + k_off[:, None] + offs_d[None, :], mask=in_range[:, None], other=0.0)
    else:
        k = tl.load(k_base + k_off[:, None] + offs_d[None, :])
    qk = mma(q, tl.trans(k), None, DOT_FP32, DOT_PRECISION)
    s = scores_log2(qk, qk_scale, cap_scale, cap_log2, HAS_CAP)
    if MASKED:
        visible = in_range[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= pos[:, None])
        if HAS_WINDOW:
            visible = visible & (offs_n[None, :] >= pos[:, None] - window_left)
        s = tl.where(visible, s, float("-inf"))
        v = tl.load(v_base + v_off[:, None] + offs_d[None, :], mask=in_range[:, None], other=0.0)
    else:
        v = tl.load(v_base + v_off[:, None] + offs_d[None, :])
    return online_softmax_step(acc, l_i, m_i, s, v, MASKED, DOT_FP32, DOT_PRECISION)


@triton.jit
def attention_kernel(
    Q,
    K,
    V,
    Out,
    Lse,
    Sinks,
    CuSeqlensQ,
    CuSeqlensK,
    CacheSeqlens,
    PageTable,
    stride_q_tok,
    stride_q_head,
    stride_o_tok,
    stride_o_head,
    stride_lse_tok,
    stride_k_page,
    stride_k_tok,
    stride_k_head,
    stride_v_page,
    stride_v_tok,
    stride_v_head,
    stride_pt_seq,
    qk_scale,
    cap_scale,
    cap_log2,
    window_left,
    num_head_chunks,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    HEADS_PER_TILE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_CAP: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    DOT_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Grid: (query tiles of the longest sequence, KV heads x head chunks, sequences)."""
    TOKENS: tl.constexpr = BLOCK_M // HEADS_PER_TILE
    # Under a causal mask the last tiles of a sequence see the most keys: launching
    # them first shortens the tail of the wave.
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    pid_h = tl.program_id(1)
    seq = tl.program_id(2)
    kv_head = pid_h // num_head_chunks
    chunk = pid_h - kv_head * num_head_chunks

    q_start = tl.load(CuSeqlensQ + seq)
    q_len = tl.load(CuSeqlensQ + seq + 1) - q_start
    t0 = tile * TOKENS
    if t0 >= q_len:
        return
    if PAGED:
        kv_start = 0
        kv_len = tl.load(CacheSeqlens + seq)
        page_row_ptr = PageTable + seq.to(tl.int64) * stride_pt_seq
    else:
        kv_start = tl.load(CuSeqlensK + seq)
        kv_len = tl.load(CuSeqlensK + seq + 1) - kv_start
        page_row_ptr = PageTable

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    tok = t0 + offs_m // HEADS_PER_TILE
    head_in_group = chunk * HEADS_PER_TILE + offs_m % HEADS_PER_TILE
    row_valid = (offs_m < TOKENS * HEADS_PER_TILE) & (tok < q_len) & (head_in_group < GROUP)
    head = kv_head * GROUP + head_in_group
    q_row = (q_start + tok).to(tl.int64)
    q = tl.load(
        Q + q_row[:, None] * stride_q_tok + head[:, None] * stride_q_head + offs_d[None, :],
        mask=row_valid[:, None],
        other=0.0,
    )
    # Bottom-right alignment: query i of Lq sits at key position Lk - Lq + i.
    pos = kv_len - q_len + tok
    p_min = kv_len - q_len + t0
    p_max = kv_len - q_len + tl.minimum(t0 + TOKENS, q_len) - 1

    # Key range any row of the tile can see: [lo, hi). Blocks outside it are never
    # loaded (this is what makes a 128-key window cost O(window), not O(seqlen)).
    if CAUSAL:
        hi = tl.maximum(tl.minimum(kv_len, p_max + 1), 0)
    else:
        hi = kv_len
    if HAS_WINDOW:
        key_lo = tl.maximum(p_min - window_left, 0)
    else:
        key_lo = 0
    lo = (key_lo // BLOCK_N) * BLOCK_N
    # Interior [full_lo, full_hi): keys every row of the tile sees, so no mask. All
    # operands are clamped to >= 0 first (integer division of negatives differs
    # between compiled code and the interpreter).
    if HAS_WINDOW:
        full_lo = tl.cdiv(tl.maximum(p_max - window_left, 0), BLOCK_N) * BLOCK_N
    else:
        full_lo = lo
    if CAUSAL:
        full_hi = (tl.maximum(tl.minimum(p_min + 1, kv_len), 0) // BLOCK_N) * BLOCK_N
    else:
        full_hi = (kv_len // BLOCK_N) * BLOCK_N
    full_lo = tl.minimum(full_lo, hi)
    full_hi = tl.maximum(tl.minimum(full_hi, hi), full_lo)
    # Edge blocks needing the mask: [lo, full_lo) and [full_hi, hi).
    n_left = tl.cdiv(full_lo - lo, BLOCK_N)
    n_right = tl.cdiv(hi - full_hi, BLOCK_N)

    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    k_base = K + kv_head * stride_k_head
    v_base = V + kv_head * stride_v_head

    for start_n in tl.range(full_lo, full_hi, BLOCK_N):
        acc, l_i, m_i = _attend_block(
            acc, l_i, m_i, q, pos, start_n, k_base, v_base, kv_start, kv_len, key_lo, page_row_ptr,
            stride_k_page, stride_k_tok, stride_v_page, stride_v_tok, window_left, qk_scale, cap_scale, cap_log2,
            HEAD_DIM, BLOCK_N, CAUSAL, HAS_WINDOW, HAS_CAP, PAGED, PAGE_SIZE, False, DOT_FP32, DOT_PRECISION,
        )  # fmt: skip
    for i in tl.range(0, n_left + n_right):
        start_n = tl.where(i < n_left, lo + i * BLOCK_N, full_hi + (i - n_left) * BLOCK_N)
        acc, l_i, m_i = _attend_block(
            acc, l_i, m_i, q, pos, start_n, k_base, v_base, kv_start, kv_len, key_lo, page_row_ptr,
            stride_k_page, stride_k_tok, stride_v_page, stride_v_tok, window_left, qk_scale, cap_scale, cap_log2,
            HEAD_DIM, BLOCK_N, CAUSAL, HAS_WINDOW, HAS_CAP, PAGED, PAGE_SIZE, True, DOT_FP32, DOT_PRECISION,
        )  # fmt: skip

    if HAS_SINKS:
        # The sink joins the denominator once, after every key block.
        sink = tl.load(Sinks + head, mask=row_valid, other=float("-inf")) * LOG2E
        acc, l_i, m_i = add_sink(acc, l_i, m_i, sink)
    out, lse2 = normalize(acc, l_i, m_i)
    tl.store(
        Out + q_row[:, None] * stride_o_tok + head[:, None] * stride_o_head + offs_d[None, :],
        out.to(Out.dtype.element_ty),
        mask=row_valid[:, None],
    )
    if RETURN_LSE:
        tl.store(Lse + q_row * stride_lse_tok + head, lse2 * LN2, mask=row_valid)


def launch_options(config: dict[str, Any]) -> dict[str, Any]:
    """The Triton launch options of a config entry (tile sizes are kernel constexprs)."""
    return {k: config[k] for k in _LAUNCH_OPTIONS if k in config}


def dot_precision(dtype: torch.dtype) -> str | None:
    # fp32 inputs would otherwise run as TF32 on NVIDIA; bf16/fp16 need no override.
    return "ieee" if dtype == torch.float32 else None


def launch_attention_kernel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    sinks: torch.Tensor | None,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    page_table: torch.Tensor | None,
    max_seqlen_q: int,
    *,
    causal: bool,
    window_left: int,
    softmax_scale: float,
    logit_cap: float,
    config: dict[str, Any],
) -> None:
    """Launch :func:`attention_kernel`; paged when ``page_table`` is given (k, v are caches)."""
    paged = page_table is not None
    _, hq, head_dim = q.shape
    hkv = k.shape[2] if paged else k.shape[1]
    group = hq // hkv
    batch = cu_seqlens_q.shape[0] - 1
    block_m, block_n = config["BLOCK_M"], config["BLOCK_N"]
    heads_per_tile = min(group, block_m)
    num_head_chunks = cdiv(group, heads_per_tile)
    tokens_per_tile = block_m // heads_per_tile
    grid = (cdiv(max_seqlen_q, tokens_per_tile), hkv * num_head_chunks, batch)
    if min(grid) <= 0:
        return
    if paged:
        k_strides = (k.stride(0), k.stride(1), k.stride(2))
        v_strides = (v.stride(0), v.stride(1), v.stride(2))
        page_size, stride_pt = k.shape[1], page_table.stride(0)
    else:
        k_strides = (0, k.stride(0), k.stride(1))
        v_strides = (0, v.stride(0), v.stride(1))
        page_size, stride_pt = 1, 0
    qk_scale, cap_scale, cap_log2 = score_scales(softmax_scale, logit_cap)
    cached(attention_kernel)[grid](
        q, k, v, out, lse, sinks, cu_seqlens_q, cu_seqlens_k, cache_seqlens, page_table,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), lse.stride(0) if lse is not None else 0,
        *k_strides, *v_strides, stride_pt,
        qk_scale, cap_scale, cap_log2, max(window_left, 0), num_head_chunks,
        HEAD_DIM=head_dim, GROUP=group, HEADS_PER_TILE=heads_per_tile, BLOCK_M=block_m, BLOCK_N=block_n,
        CAUSAL=bool(causal), HAS_WINDOW=window_left >= 0, HAS_SINKS=sinks is not None, HAS_CAP=logit_cap > 0,
        RETURN_LSE=lse is not None, PAGED=paged, PAGE_SIZE=page_size,
        DOT_FP32=bool(config.get("DOT_FP32", False)), DOT_PRECISION=dot_precision(q.dtype),
        **launch_options(config),
    )  # fmt: skip


def mha_prefill(
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
    config: dict[str, Any] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Packed varlen attention over fresh K/V (semantics: ``tokenspeed_kernel.mha_prefill``).

    Args:
        q: ``[total_q, Hq, D]`` bf16/fp16/fp32, last dim contiguous; D a power of two in 16..256.
        k, v: ``[total_k, Hkv, D]``, q's dtype; ``Hkv`` divides ``Hq``.
        cu_seqlens_q, cu_seqlens_k: ``int32 [B+1]`` prefix sums of the sequence lengths.
        max_seqlen_q: host int >= every query length (sizes the grid, no device sync).
        max_seqlen_k: host int bounding the key lengths (unused: loop bounds come from
            ``cu_seqlens_k`` on the device).
        causal: bottom-right aligned causal mask.
        window_left: -1, or keys ``[p - window_left, p]`` only; blocks outside are skipped.
        sinks: ``float32 [Hq]`` or None; softmax_scale: float (None: ``1/sqrt(D)``).
        logit_cap: ``> 0`` applies ``cap * tanh(s / cap)``.
        return_lse: also return ``float32 [total_q, Hq]`` natural-log LSE (sinks included).
        out: optional ``[total_q, Hq, D]`` output of q's dtype.
        config: tile configuration overriding ``configs.PREFILL_CONFIGS`` (benchmark sweeps).

    Returns:
        ``out`` or ``(out, lse)``.
    """
    del max_seqlen_k
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    if out is None:
        out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if return_lse else None
    if q.shape[0] > 0:
        launch_attention_kernel(
            q, k, v, out, lse, sinks, cu_seqlens_q, cu_seqlens_k, None, None, max_seqlen_q,
            causal=causal, window_left=window_left, softmax_scale=float(softmax_scale), logit_cap=float(logit_cap),
            config=config or prefill_config(q.device, q.shape[-1]),
        )  # fmt: skip
    return (out, lse) if return_lse else out

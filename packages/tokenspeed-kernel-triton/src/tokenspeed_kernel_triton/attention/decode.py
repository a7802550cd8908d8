"""Split-KV decode over the paged KV cache (``mha_decode_with_kvcache``).

Decode is a stream over K/V: one query token per sequence, so the work per
(sequence, KV head) is too small to fill the GPU at small batch. The key range of
each sequence is cut into ``num_splits`` parts that run as separate programs; each
writes a partial (normalised output, log2 LSE) and counts its arrival on a counter of
the stream (``tokenspeed_kernel.launch.stream_counters``), and the last split of a
(sequence, head program) to arrive combines them and adds the sink once: one launch.
``num_splits`` depends on shapes only (batch, heads, page-table width, window, SM
count), never on ``cache_seqlens`` values, so the launch needs no host sync and is
CUDA-graph capturable. With one split the kernel writes the final output directly
(no partials, no counter).

Each program owns one KV head and all query heads of its group (padded to 16 rows
for the MMA), so every K/V byte is read from memory once per decode step.

``mha_decode_append_kvcache`` launches the same program with the new token's K/V
(``decode_append_kernel``: nine more arguments, which the plain decode's kernel does
not take): it writes them into the cache and uses them from registers.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2, stream_counters, stream_scratch

from ..rope import angles_at, rotated_rows
from ._shared import LN2, LOG2E, add_sink, mma, normalize, online_softmax_step, score_scales
from ._shared import scores_log2 as _scores_log2
from .configs import decode_config
from .prefill import dot_precision, launch_options

__all__ = ["mha_decode_with_kvcache", "mha_decode_append_kvcache", "choose_num_splits"]


@triton.jit
def _partial_lse(Partials, num_heads, num_splits, HEAD_DIM: tl.constexpr):
    """Where the split LSEs start in ``Partials``: after the ``[B, Hq, S, D]`` outputs (both grids have one
    program per sequence along axis 0, so B is their size)."""
    return Partials + tl.num_programs(0).to(tl.int64) * num_heads * num_splits * HEAD_DIM


@triton.jit
def _decode_program(
    Q,
    KCache,
    VCache,
    PageTable,
    CacheSeqlens,
    Sinks,
    Out,
    Lse,
    Partials,
    Counters,
    stride_q_seq,
    stride_q_head,
    stride_o_seq,
    stride_o_head,
    stride_lse_seq,
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
    num_heads,
    num_head_chunks,
    num_splits,
    KNew,
    VNew,
    CosSin,
    stride_kn_seq,
    stride_kn_head,
    stride_vn_seq,
    stride_vn_head,
    stride_cs,
    rot_dim,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    HEADS_PER_TILE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_CAP: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    DIRECT: tl.constexpr,
    BLOCK_S: tl.constexpr,
    DOT_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    APPEND: tl.constexpr,
    ROTARY: tl.constexpr,
    GPTJ: tl.constexpr,
):
    """One program of :func:`decode_split_kernel` (``APPEND`` False) or :func:`decode_append_kernel` (module doc).

    ``APPEND``: the new token's key and value (``KNew``, ``VNew``: ``[B, Hkv, D]``) belong at position ``p = L - 1``;
    with ``ROTARY`` q and the new key are rotated at ``p`` first (``CosSin``, ``apply_rotary``'s numerics). The
    program whose key range holds ``p`` uses them from registers (its cache loads skip that row, so no program reads
    it from memory) and, for the first head chunk, writes them into the cache.

    ``DIRECT`` (one split): write the final output (sink included) and LSE. Otherwise
    write into ``Partials`` (fp32, the stream's scratch) the outputs ``[B, Hq, S, D]``
    (normalised), then the LSEs ``[B, Hq, S]`` (log2 units, -inf for an empty split), and count
    the arrival on ``Counters`` (int32 ``[B, head programs]``, zero on entry and left zero): the
    last split of a (sequence, head program) to arrive merges them (``BLOCK_S``: splits, padded).
    """
    seq = tl.program_id(0)
    pid_h = tl.program_id(1)
    split = tl.program_id(2)
    kv_head = pid_h // num_head_chunks
    chunk = pid_h - kv_head * num_head_chunks

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, HEAD_DIM)
    head_in_group = chunk * HEADS_PER_TILE + offs_h
    row_valid = (offs_h < HEADS_PER_TILE) & (head_in_group < GROUP)
    head = kv_head * GROUP + head_in_group
    seq64 = seq.to(tl.int64)
    # The query sits at position L - 1. Keys [lo, L) are visible; pages before lo are
    # never touched, so a windowed layer reads O(window) bytes whatever L is.
    seq_len = tl.load(CacheSeqlens + seq)
    pos = seq_len - 1
    if ROTARY:
        _, partner, sign, rotated, cos, sin = angles_at(CosSin, pos, rot_dim, stride_cs, GPTJ, HEAD_DIM)
        q = rotated_rows(Q + seq64 * stride_q_seq, head, row_valid, stride_q_head, offs_d, partner, HEAD_DIM,
                         rotated, cos, sin, sign)  # fmt: skip
    else:
        q = tl.load(
            Q + seq64 * stride_q_seq + head[:, None] * stride_q_head + offs_d[None, :],
            mask=row_valid[:, None],
            other=0.0,
        )
    if APPEND:
        # The new key and value, [1, D] in the cache's dtype (the rotated key rounded to k's dtype first).
        kv_row = kv_head + tl.arange(0, 1)
        if ROTARY:
            k_new = rotated_rows(KNew + seq64 * stride_kn_seq, kv_row, kv_row >= 0, stride_kn_head, offs_d, partner,
                                 HEAD_DIM, rotated, cos, sin, sign)  # fmt: skip
        else:
            k_new = tl.load(KNew + seq64 * stride_kn_seq + kv_row[:, None] * stride_kn_head + offs_d[None, :])
        k_new = k_new.to(KCache.dtype.element_ty)
        v_new = tl.load(VNew + seq64 * stride_vn_seq + kv_row[:, None] * stride_vn_head + offs_d[None, :])
        v_new = v_new.to(VCache.dtype.element_ty)
    if HAS_WINDOW:
        lo = tl.maximum(seq_len - 1 - window_left, 0)
    else:
        lo = 0
    lo_block = (lo // BLOCK_N) * BLOCK_N
    num_blocks = tl.cdiv(tl.maximum(seq_len - lo_block, 0), BLOCK_N)
    blocks_per_split = tl.cdiv(num_blocks, num_splits)
    start = lo_block + split * blocks_per_split * BLOCK_N
    end = tl.minimum(start + blocks_per_split * BLOCK_N, seq_len)

    page_row_ptr = PageTable + seq64 * stride_pt_seq
    k_base = KCache + kv_head * stride_k_head
    v_base = VCache + kv_head * stride_v_head
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    if APPEND:
        if (pos >= start) & (pos < end) & (chunk == 0):  # this program's range holds p: the cache gets the row
            new_page = tl.load(page_row_ptr + pos // PAGE_SIZE).to(tl.int64)
            new_row = pos % PAGE_SIZE
            tl.store(k_base + new_page * stride_k_page + new_row * stride_k_tok + offs_d[None, :], k_new)
            tl.store(v_base + new_page * stride_v_page + new_row * stride_v_tok + offs_d[None, :], v_new)
    for start_n in tl.range(start, end, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # Keys outside [lo, end) are neither loaded nor their page ids read: pages below the
        # window may already be freed by the engine, pages past the end are unwritten.
        in_range = (offs_n < end) & (offs_n >= lo)
        load_ok = in_range
        if APPEND:
            load_ok = in_range & (offs_n != pos)  # the new row comes from registers
        # One page-id gather per key: works for every power-of-two page size, whether a
        # block spans many small pages or sits inside one large page.
        page = tl.load(page_row_ptr + offs_n // PAGE_SIZE, mask=load_ok, other=0).to(tl.int64)
        row = offs_n % PAGE_SIZE
        k = tl.load(
            k_base + (page * stride_k_page + row * stride_k_tok)[:, None] + offs_d[None, :],
            mask=load_ok[:, None],
            other=0.0,
        )
        v = tl.load(
            v_base + (page * stride_v_page + row * stride_v_tok)[:, None] + offs_d[None, :],
            mask=load_ok[:, None],
            other=0.0,
        )
        if APPEND:
            is_new = (offs_n == pos)[:, None]
            k = tl.where(is_new, k_new, k)
            v = tl.where(is_new, v_new, v)
        qk = mma(q, tl.trans(k), None, DOT_FP32, DOT_PRECISION)
        s = _scores_log2(qk, qk_scale, cap_scale, cap_log2, HAS_CAP)
        # Every row is the same query position, so the mask is per key only.
        s = tl.where(in_range[None, :], s, float("-inf"))
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, True, DOT_FP32, DOT_PRECISION)

    if DIRECT:
        if HAS_SINKS:
            sink = tl.load(Sinks + head, mask=row_valid, other=float("-inf")) * LOG2E
            acc, l_i, m_i = add_sink(acc, l_i, m_i, sink)
        out, lse2 = normalize(acc, l_i, m_i)
        tl.store(
            Out + seq64 * stride_o_seq + head[:, None] * stride_o_head + offs_d[None, :],
            out.to(Out.dtype.element_ty),
            mask=row_valid[:, None],
        )
        if RETURN_LSE:
            tl.store(Lse + seq64 * stride_lse_seq + head, lse2 * LN2, mask=row_valid)
    else:
        # Partials are written even for an empty split (zeros, -inf) so the merge never
        # reads uninitialised memory.
        out, lse2 = normalize(acc, l_i, m_i)
        part = (seq64 * num_heads + head) * num_splits + split
        tl.store(Partials + part[:, None] * HEAD_DIM + offs_d[None, :], out, mask=row_valid[:, None])
        tl.store(_partial_lse(Partials, num_heads, num_splits, HEAD_DIM) + part, lse2, mask=row_valid)
        # Publish this program's partials (a CTA barrier, then a release at GPU scope) and count them: the
        # program that brings the counter to num_splits zeroes it and merges (no program ever waits).
        tl.debug_barrier()
        counter = Counters + seq64 * tl.num_programs(1) + pid_h
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == num_splits - 1:
            tl.store(counter, 0)  # every split of this launch has arrived: zero for the next one
            tl.debug_barrier()
            _merge_splits(Partials, Sinks, Out, Lse, seq64, head, row_valid, num_heads, num_splits, stride_o_seq,
                          stride_o_head, stride_lse_seq, HEAD_DIM, BLOCK_H, BLOCK_S, HAS_SINKS, RETURN_LSE)  # fmt: skip


@triton.jit
def decode_split_kernel(
    Q,
    KCache,
    VCache,
    PageTable,
    CacheSeqlens,
    Sinks,
    Out,
    Lse,
    Partials,
    Counters,
    stride_q_seq,
    stride_q_head,
    stride_o_seq,
    stride_o_head,
    stride_lse_seq,
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
    num_heads,
    num_head_chunks,
    num_splits,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    HEADS_PER_TILE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_CAP: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    DIRECT: tl.constexpr,
    BLOCK_S: tl.constexpr,
    DOT_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """Grid: (sequences, KV heads x head chunks, splits): :func:`_decode_program`, the plain decode (the new token's
    K/V already in the cache)."""
    _decode_program(
        Q, KCache, VCache, PageTable, CacheSeqlens, Sinks, Out, Lse, Partials, Counters, stride_q_seq, stride_q_head,
        stride_o_seq, stride_o_head, stride_lse_seq, stride_k_page, stride_k_tok, stride_k_head, stride_v_page,
        stride_v_tok, stride_v_head, stride_pt_seq, qk_scale, cap_scale, cap_log2, window_left, num_heads,
        num_head_chunks, num_splits,
        Q, Q, Q, 0, 0, 0, 0, 0, 0,  # (no new token: never read)
        HEAD_DIM, GROUP, HEADS_PER_TILE, BLOCK_H, BLOCK_N, PAGE_SIZE, HAS_WINDOW, HAS_SINKS, HAS_CAP, RETURN_LSE,
        DIRECT, BLOCK_S, DOT_FP32, DOT_PRECISION,
        False, False, False,
    )  # fmt: skip


@triton.jit
def decode_append_kernel(
    Q,
    KCache,
    VCache,
    PageTable,
    CacheSeqlens,
    Sinks,
    Out,
    Lse,
    Partials,
    Counters,
    stride_q_seq,
    stride_q_head,
    stride_o_seq,
    stride_o_head,
    stride_lse_seq,
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
    num_heads,
    num_head_chunks,
    num_splits,
    KNew,
    VNew,
    CosSin,
    stride_kn_seq,
    stride_kn_head,
    stride_vn_seq,
    stride_vn_head,
    stride_cs,
    rot_dim,
    HEAD_DIM: tl.constexpr,
    GROUP: tl.constexpr,
    HEADS_PER_TILE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_CAP: tl.constexpr,
    RETURN_LSE: tl.constexpr,
    DIRECT: tl.constexpr,
    BLOCK_S: tl.constexpr,
    DOT_FP32: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    ROTARY: tl.constexpr,
    GPTJ: tl.constexpr,
):
    """Grid as :func:`decode_split_kernel`: :func:`_decode_program` writing the new token's K/V (rotated with q when
    ``ROTARY``) into the cache first (``mha_decode_append_kvcache``)."""
    _decode_program(
        Q, KCache, VCache, PageTable, CacheSeqlens, Sinks, Out, Lse, Partials, Counters, stride_q_seq, stride_q_head,
        stride_o_seq, stride_o_head, stride_lse_seq, stride_k_page, stride_k_tok, stride_k_head, stride_v_page,
        stride_v_tok, stride_v_head, stride_pt_seq, qk_scale, cap_scale, cap_log2, window_left, num_heads,
        num_head_chunks, num_splits,
        KNew, VNew, CosSin, stride_kn_seq, stride_kn_head, stride_vn_seq, stride_vn_head, stride_cs, rot_dim,
        HEAD_DIM, GROUP, HEADS_PER_TILE, BLOCK_H, BLOCK_N, PAGE_SIZE, HAS_WINDOW, HAS_SINKS, HAS_CAP, RETURN_LSE,
        DIRECT, BLOCK_S, DOT_FP32, DOT_PRECISION,
        True, ROTARY, GPTJ,
    )  # fmt: skip


@triton.jit
def _merge_splits(
    Partials,
    Sinks,
    Out,
    Lse,
    seq,
    head,
    head_valid,
    num_heads,
    num_splits,
    stride_o_seq,
    stride_o_head,
    stride_lse_seq,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    RETURN_LSE: tl.constexpr,
):
    """Combine the splits' partials of sequence ``seq``, heads ``head``, and add the sink once. The partials
    were written by other programs: they are read from L2 (``.cg``), past this SM's L1."""
    PartialLse = _partial_lse(Partials, num_heads, num_splits, HEAD_DIM)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    part_row = (seq * num_heads + head) * num_splits
    lse_tile = tl.load(
        PartialLse + part_row[:, None] + offs_s[None, :],
        mask=head_valid[:, None] & (offs_s[None, :] < num_splits),
        other=float("-inf"),
        cache_modifier=".cg",
    )
    m = tl.max(lse_tile, 1)
    if HAS_SINKS:
        sink = tl.load(Sinks + head, mask=head_valid, other=float("-inf")) * LOG2E
        m = tl.maximum(m, sink)
    m_use = tl.where(m == float("-inf"), 0.0, m)
    denom = tl.sum(tl.math.exp2(lse_tile - m_use[:, None]), 1)
    if HAS_SINKS:
        denom += tl.math.exp2(sink - m_use)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], dtype=tl.float32)
    for s in tl.range(0, num_splits):
        lse_s = tl.load(PartialLse + part_row + s, mask=head_valid, other=float("-inf"), cache_modifier=".cg")
        o = tl.load(
            Partials + (part_row + s)[:, None] * HEAD_DIM + offs_d[None, :],
            mask=head_valid[:, None],
            other=0.0,
            cache_modifier=".cg",
        )
        acc += tl.math.exp2(lse_s - m_use)[:, None] * o
    has = denom > 0.0
    denom_safe = tl.where(has, denom, 1.0)
    out = acc / denom_safe[:, None]
    tl.store(
        Out + seq * stride_o_seq + head[:, None] * stride_o_head + offs_d[None, :],
        out.to(Out.dtype.element_ty),
        mask=head_valid[:, None],
    )
    if RETURN_LSE:
        lse = tl.where(has, (m_use + tl.math.log2(denom_safe)) * LN2, float("-inf"))
        tl.store(Lse + seq * stride_lse_seq + head, lse, mask=head_valid)


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_num_splits(
    batch: int, head_programs: int, max_keys: int, device: torch.device, config: dict[str, Any]
) -> int:
    """Splits per (sequence, head program): enough programs to fill ``ctas_per_sm`` per SM,
    but no split shorter than ``min_tokens_per_split`` keys of the longest possible sequence.

    ``max_keys`` is a shape-derived bound (page-table width x page size, or the window),
    so the result never depends on device data.
    """
    num_sms = config["num_sms"] if "num_sms" in config else _num_sms(device)
    base = max(1, batch * head_programs)
    wanted = cdiv(num_sms * config["ctas_per_sm"], base)
    by_length = max(1, max_keys // config["min_tokens_per_split"])
    return max(1, min(wanted, by_length, config["max_splits"]))


def mha_decode_with_kvcache(
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
    plan: Any = None,
    config: dict[str, Any] | None = None,
    num_splits: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """One query token per sequence over the paged cache (semantics: ``tokenspeed_kernel.mha_decode_with_kvcache``).

    Args:
        q: ``[B, Hq, D]`` bf16/fp16/fp32, last dim contiguous; D a power of two in 16..256.
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]`` (NHD), q's dtype; page_size a
            power of two in 1..256.
        page_table: ``int32 [B, max_pages]``; cache_seqlens: ``int32 [B]``; the query sits at
            position ``cache_seqlens[b] - 1``.
        window_left: -1, or keys ``[p - window_left, p]`` only (pages outside are skipped).
        sinks: ``float32 [Hq]`` or None; softmax_scale: float (None: ``1/sqrt(D)``).
        logit_cap: ``> 0`` applies ``cap * tanh(s / cap)``.
        return_lse: also return ``float32 [B, Hq]`` natural-log LSE (sinks included).
        out: optional ``[B, Hq, D]`` output of q's dtype.
        plan: the batch's ``tokenspeed_kernel.AttentionPlan`` or None. With one, the split
            count follows the longest sequence (rounded up to a power of two) instead of the
            page table's capacity. (The split partials live in the stream's scratch with or
            without one: a call allocates its outputs only.)
        config: overrides ``configs.DECODE_CONFIGS`` (benchmark sweeps).
        num_splits: overrides :func:`choose_num_splits` (tests, sweeps).

    Returns:
        ``out`` or ``(out, lse)``.
    """
    return _decode(
        q, k_cache, v_cache, page_table, cache_seqlens, window_left, sinks, softmax_scale, logit_cap, return_lse,
        out, plan, config, num_splits, None,
    )  # fmt: skip


def mha_decode_append_kvcache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    cos_sin_cache: torch.Tensor | None = None,
    style: str = "neox",
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    logit_cap: float = 0.0,
    out: torch.Tensor | None = None,
    plan: Any = None,
    config: dict[str, Any] | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """:func:`mha_decode_with_kvcache` whose new token's key and value are given and written into the cache by the
    same launch, q and k rotated first with ``cos_sin_cache`` (semantics: ``tokenspeed_kernel.
    mha_decode_append_kvcache``).

    Args:
        q: ``[B, Hq, D]``; k, v: ``[B, Hkv, D]``, q's dtype, last dim contiguous.
        cos_sin_cache: ``float32 [max_position, R]`` (``apply_rotary``'s), or None: no rotation; style: its pairing.
        Other arguments as :func:`mha_decode_with_kvcache`.

    Returns:
        ``out``.
    """
    rot = cos_sin_cache.shape[1] if cos_sin_cache is not None else 0
    append = (k, v, cos_sin_cache, style, rot)
    return _decode(
        q, k_cache, v_cache, page_table, cache_seqlens, window_left, sinks, softmax_scale, logit_cap, False,
        out, plan, config, num_splits, append,
    )  # fmt: skip


def _decode(
    q, k_cache, v_cache, page_table, cache_seqlens, window_left, sinks, softmax_scale, logit_cap, return_lse, out, plan,
    config, num_splits, append,
):  # fmt: skip
    """One launch of the decode kernel; ``append``: None, or ``(k, v, cos_sin_cache or None, style, rotary dim)``."""
    key = None
    # The longest sequence, rounded up to a power of two (a bounded number of launch plans).
    longest = None if plan is None else next_power_of_2(max(1, plan.max_cache_seqlen))
    flags = None if append is None else (append[2] is not None, append[3])
    if config is None:
        # What _decode_plan reads: shapes, dtype, device, flags (strides are passed at the launch).
        key = (
            q.shape, k_cache.shape, page_table.shape[1], q.dtype, q.device,
            window_left, sinks is None, softmax_scale, logit_cap, return_lse, num_splits, longest, flags,
        )  # fmt: skip
        launch = _PLANS.get(key)
    if key is None or launch is None:
        launch = _decode_plan(q, k_cache, page_table, window_left, sinks, softmax_scale, logit_cap, return_lse,
                              config, num_splits, longest, flags)  # fmt: skip
        if key is not None:
            if len(_PLANS) >= _MAX_PLANS:  # shapes that vary per call (page-table widths): start over
                _PLANS.clear()
            _PLANS[key] = launch
    batch, hq = q.shape[0], q.shape[1]
    if out is None:
        out = torch.empty_like(q)
    lse = torch.empty((batch, hq), dtype=torch.float32, device=q.device) if return_lse else None
    if batch == 0:
        return (out, lse) if return_lse else out
    grid, scalars, kwargs, n_partials, n_counters = launch
    if n_partials is None:
        partials = counters = None
    else:
        # Written and merged by this launch: the stream's scratch (no allocation a call, and a launch plan replays it).
        partials = stream_scratch(q.device, n_partials)
        counters = stream_counters(q.device, n_counters)
    if append is None:
        new = ()
    else:
        k, v, cos_sin, _, rot = append
        cs = cos_sin if cos_sin is not None else q
        new = (k, v, cs, k.stride(0), k.stride(1), v.stride(0), v.stride(1), cs.stride(0), rot)
    lse_stride = lse.stride(0) if lse is not None else 0
    kernel = _DECODE_SPLIT if append is None else _DECODE_APPEND
    kernel[grid](
        q, k_cache, v_cache, page_table, cache_seqlens, sinks, out, lse, partials, counters,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), lse_stride,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2),
        page_table.stride(0), *scalars, *new, **kwargs,
    )  # fmt: skip
    return (out, lse) if return_lse else out


#: launch plans by call shape and flags (host cost: the arithmetic below runs once per shape).
_PLANS: dict = {}
_MAX_PLANS = 1024
_DECODE_SPLIT = cached(decode_split_kernel)
_DECODE_APPEND = cached(decode_append_kernel)


def _decode_plan(
    q, k_cache, page_table, window_left, sinks, softmax_scale, logit_cap, return_lse, config, num_splits, longest=None,
    append=None,
):  # fmt: skip
    """(grid, trailing scalars, kwargs, partials' fp32 elements or None, counters or None) of one decode call shape;
    ``longest``: a bound on the longest sequence (an attention plan's), else the page table's capacity; ``append``:
    None, or (rotary, style) of an appending call."""
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    batch, hq, head_dim = q.shape
    _, page_size, hkv, _ = k_cache.shape
    group = hq // hkv
    cfg = config or decode_config(q.device, head_dim)
    heads_per_tile = min(group, cfg["max_heads_per_tile"])
    num_head_chunks = cdiv(group, heads_per_tile)
    # tl.dot needs at least 16 rows; padding rows load no query and store nothing.
    block_h = max(16, next_power_of_2(heads_per_tile))
    max_keys = page_table.shape[1] * page_size
    if longest is not None:
        max_keys = min(max_keys, longest)
    if window_left >= 0:
        max_keys = min(max_keys, window_left + 1)
    if num_splits is None:
        num_splits = choose_num_splits(batch, hkv * num_head_chunks, max_keys, q.device, cfg)
    direct = num_splits == 1
    qk_scale, cap_scale, cap_log2 = score_scales(float(softmax_scale), float(logit_cap))
    scalars = (qk_scale, cap_scale, cap_log2, max(window_left, 0), hq, num_head_chunks, num_splits)
    kwargs = dict(
        HEAD_DIM=head_dim, GROUP=group, HEADS_PER_TILE=heads_per_tile, BLOCK_H=block_h, BLOCK_N=cfg["BLOCK_N"],
        PAGE_SIZE=page_size, HAS_WINDOW=window_left >= 0, HAS_SINKS=sinks is not None, HAS_CAP=logit_cap > 0,
        RETURN_LSE=return_lse, DIRECT=direct, BLOCK_S=next_power_of_2(num_splits),
        DOT_FP32=bool(cfg.get("DOT_FP32", False)), DOT_PRECISION=dot_precision(q.dtype), **launch_options(cfg),
    )  # fmt: skip
    if append is not None:
        kwargs.update(ROTARY=append[0], GPTJ=append[1] == "gptj")
    # The split partials, one fp32 buffer: outputs [B, Hq, splits, D], then LSEs [B, Hq, splits] (_partial_lse).
    n_partials = None if direct else batch * hq * num_splits * (head_dim + 1)
    counters = None if direct else batch * hkv * num_head_chunks  # one per (sequence, head program)
    return (batch, hkv * num_head_chunks, num_splits), scalars, kwargs, n_partials, counters

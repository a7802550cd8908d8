"""Pieces shared by the Triton attention kernels: score transform, online softmax, epilogue.

Scores are kept in the log2 domain (``score * log2(e)``) so every exponential is an
``exp2``; the epilogue turns the log-sum-exp back into natural log.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


def score_scales(softmax_scale: float, logit_cap: float) -> tuple[float, float, float]:
    """Kernel scalars: ``qk_scale`` (no cap), ``cap_scale`` and ``cap_log2`` (with cap).

    Without a cap the log2-domain score is ``qk * qk_scale``; with one it is
    ``tanh(qk * cap_scale) * cap_log2`` = ``cap * tanh(qk * scale / cap) * log2(e)``.
    """
    log2e = LOG2E.value
    if logit_cap > 0:
        return softmax_scale * log2e, softmax_scale / logit_cap, logit_cap * log2e
    return softmax_scale * log2e, 0.0, 0.0


@triton.jit
def tanh_fp32(x):
    # No portable tanh in tl.math (libdevice is NVIDIA-only): 1 - 2 / (exp(2x) + 1)
    # saturates correctly to +-1 for large |x| (exp2 -> inf or 0).
    e = tl.math.exp2(x * (2.0 * LOG2E))
    return 1.0 - 2.0 / (e + 1.0)


@triton.jit
def scores_log2(qk, qk_scale, cap_scale, cap_log2, HAS_CAP: tl.constexpr):
    """fp32 ``q.k`` -> log2-domain scores (scaled, soft-capped when ``HAS_CAP``)."""
    if HAS_CAP:
        return tanh_fp32(qk * cap_scale) * cap_log2
    else:
        return qk * qk_scale


@triton.jit
def mma(a, b, acc, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``a @ b (+ acc)`` in fp32. ``DOT_FP32`` upcasts the operands first: Triton 3.6's
    interpreter multiplies bf16 storage bits as integers, so CPU runs need it (exact
    either way: bf16/fp16 products are exact in fp32)."""
    if DOT_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def online_softmax_step(
    acc, l_i, m_i, s, v, MAY_BE_EMPTY: tl.constexpr, DOT_FP32: tl.constexpr, DOT_PRECISION: tl.constexpr
):
    """Fold one block of log2 scores ``s [M, N]`` and values ``v [N, D]`` into (acc, l, m).

    ``MAY_BE_EMPTY``: the block has masked (-inf) scores, so a row may have seen no key
    yet; its running max stays -inf and exp2 must not see ``-inf - -inf``.
    """
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if MAY_BE_EMPTY:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    # P goes back to the K/V dtype so the second product runs on the tensor cores too
    # (FlashAttention-2's choice); accumulation stays fp32.
    acc = mma(p.to(v.dtype), v, acc, DOT_FP32, DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def add_sink(acc, l_i, m_i, sink_log2):
    """Add ``exp2(sink_log2)`` to the denominator of every row (after all keys)."""
    m_f = tl.maximum(m_i, sink_log2)
    m_use = tl.where(m_f == float("-inf"), 0.0, m_f)
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.math.exp2(sink_log2 - m_use)
    acc = acc * alpha[:, None]
    return acc, l_i, m_f


@triton.jit
def normalize(acc, l_i, m_i):
    """(acc / l, lse in log2 units); a row with an empty denominator gives 0 and -inf."""
    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse2 = tl.where(has, m_i + tl.math.log2(l_safe), float("-inf"))
    return out, lse2


@triton.jit
def kv_row_offsets(
    offs_n,
    kv_start,
    page_row_ptr,
    stride_k_page,
    stride_k_tok,
    stride_v_page,
    stride_v_tok,
    mask,
    PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
):
    """int64 element offsets of K and V rows for key positions ``offs_n``.

    Paged (NHD cache): key j lives in page ``page_table[b, j // PAGE_SIZE]``, row
    ``j % PAGE_SIZE``; PAGE_SIZE is a power of two so both are shifts/masks. The page
    id gather is per key, so any page size works with any BLOCK_N.
    """
    if PAGED:
        if MASKED:
            page = tl.load(page_row_ptr + offs_n // PAGE_SIZE, mask=mask, other=0).to(tl.int64)
        else:
            page = tl.load(page_row_ptr + offs_n // PAGE_SIZE).to(tl.int64)
        row = offs_n % PAGE_SIZE
        return page * stride_k_page + row * stride_k_tok, page * stride_v_page + row * stride_v_tok
    else:
        tok = (kv_start + offs_n).to(tl.int64)
        return tok * stride_k_tok, tok * stride_v_tok

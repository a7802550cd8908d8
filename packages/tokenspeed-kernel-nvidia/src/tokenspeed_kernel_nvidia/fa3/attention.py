"""FlashAttention-3 (``tokenspeed-fa3``, import ``flash_attn_interface``) wrappers.

Each function takes the kernel arguments of the matching public op. The library's
forward op is called directly (no autograd Function), with ``out=`` passed
through so the call allocates nothing the caller provided.

Sinks: this FA3 build takes them in the dtype of q ("sinks must have dtype
bfloat16" for a bf16 q); our contract's float32 sinks are rounded to that dtype
(exact for GPT-OSS, whose checkpoint stores them in bf16). On the H200 the rounded
sinks moved the log-sum-exp by up to 5e-3 against the reference (the output stayed
within tolerance), so the registration does not offer ``return_lse``.

Layout notes: FA3's log-sum-exp is ``[Hq, total_q]`` for varlen calls and
``[B, Hq, 1]`` for one-token decode; we return ``[total_q, Hq]`` / ``[B, Hq]``
views of it.
"""

from __future__ import annotations

import torch
from flash_attn_interface import _flash_attn_forward


def _sinks(sinks: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
    return None if sinks is None else sinks.to(q.dtype)


def _window(causal: bool, window_left: int) -> tuple[int, int]:
    return (window_left, 0 if causal else -1)


def mha_prefill(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    *, causal, window_left, sinks, softmax_scale, logit_cap, return_lse, out,
):  # fmt: skip
    left, right = _window(causal, window_left)
    o, lse, *_ = _flash_attn_forward(
        q, k, v, None, None, None, out,
        cu_seqlens_q, cu_seqlens_k, None, None, None, max_seqlen_q, max_seqlen_k,
        None, None, None, None, None, None, None, None, None,
        softmax_scale, causal=causal, window_size_left=left, window_size_right=right,
        softcap=logit_cap, num_splits=1, sinks=_sinks(sinks, q),
    )  # fmt: skip
    return (o, lse.t()) if return_lse else o


def _paged(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, causal, window_left, sinks,
           softmax_scale, logit_cap, out):  # fmt: skip
    left, right = _window(causal, window_left)
    o, lse, *_ = _flash_attn_forward(
        q, k_cache, v_cache, None, None, None, out,
        cu_seqlens_q, None, None, None, cache_seqlens, max_seqlen_q, None,
        page_table, None, None, None, None, None, None, None, None,
        softmax_scale, causal=causal, window_size_left=left, window_size_right=right,
        softcap=logit_cap, num_splits=0, sinks=_sinks(sinks, q),
    )  # fmt: skip
    return o, lse


def mha_extend_with_kvcache(
    q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q,
    *, causal, window_left, sinks, softmax_scale, logit_cap, return_lse, out,
):  # fmt: skip
    o, lse = _paged(q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, causal, window_left,
                    sinks, softmax_scale, logit_cap, out)  # fmt: skip
    return (o, lse.t()) if return_lse else o


def mha_decode_with_kvcache(
    q, k_cache, v_cache, page_table, cache_seqlens,
    *, window_left, sinks, softmax_scale, logit_cap, return_lse, out,
):  # fmt: skip
    # One query per sequence: FA3's batched layout [B, 1, Hq, D] is a view of ours.
    o4 = None if out is None else out.unsqueeze(1)
    o, lse = _paged(q.unsqueeze(1), k_cache, v_cache, page_table, cache_seqlens, None, None, True, window_left,
                    sinks, softmax_scale, logit_cap, o4)  # fmt: skip
    o = o.squeeze(1) if out is None else out
    return (o, lse.squeeze(-1)) if return_lse else o

"""Chunked prefill over the paged KV cache (``mha_extend_with_kvcache``).

The prefill kernel with paged key addressing: query ``i`` of sequence ``b`` sits at
``cache_seqlens[b] - q_len_b + i``, which is exactly prefill's bottom-right
alignment with ``Lk = cache_seqlens[b]``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .configs import extend_config
from .prefill import launch_attention_kernel

__all__ = ["mha_extend_with_kvcache"]


def mha_extend_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_q: int,
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
    """Multi-token queries over the paged cache (semantics: ``tokenspeed_kernel.mha_extend_with_kvcache``).

    Args:
        q: ``[total_q, Hq, D]`` bf16/fp16/fp32 packed by ``cu_seqlens_q int32 [B+1]``.
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]`` (NHD), q's dtype; page_size a
            power of two in 1..256.
        page_table: ``int32 [B, max_pages]``; cache_seqlens: ``int32 [B]``, new tokens included.
        max_seqlen_q: host int >= every query length.
        causal, window_left, sinks, softmax_scale, logit_cap, return_lse, out: as
            :func:`tokenspeed_kernel_triton.attention.prefill.mha_prefill`.
        config: tile configuration overriding ``configs.EXTEND_CONFIGS``.

    Returns:
        ``out`` or ``(out, lse)`` with lse ``float32 [total_q, Hq]``.
    """
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    if out is None:
        out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if return_lse else None
    if q.shape[0] > 0:
        launch_attention_kernel(
            q, k_cache, v_cache, out, lse, sinks, cu_seqlens_q, None, cache_seqlens, page_table, max_seqlen_q,
            causal=causal, window_left=window_left, softmax_scale=float(softmax_scale), logit_cap=float(logit_cap),
            config=config or extend_config(q.device, q.shape[-1]),
        )  # fmt: skip
    return (out, lse) if return_lse else out

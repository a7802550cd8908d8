"""AITER paged decode attention behind ``tokenspeed_kernel.mha_decode_with_kvcache``'s arguments."""

from __future__ import annotations

import torch

__all__ = ["mha_decode_with_kvcache"]

#: Keys per AITER partition (its split-KV unit); page sizes must divide it.
_PARTITION = 256
_unit_scales: dict[torch.device, torch.Tensor] = {}


def _unit_scale(device: torch.device) -> torch.Tensor:
    scale = _unit_scales.get(device)
    if scale is None:
        scale = torch.ones(1, dtype=torch.float32, device=device)
        _unit_scales[device] = scale
    return scale


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
) -> torch.Tensor:
    """Paged decode through ``torch.ops.aiter.paged_attention_v1`` (NHD cache layout).

    Args:
        q: ``[B, Hq, D]`` bf16/fp16.
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]`` in q's dtype.
        page_table: ``int32 [B, max_pages]``; cache_seqlens: ``int32 [B]``.
        softmax_scale: None means ``D**-0.5``; logit_cap: ``> 0`` soft-caps scores.
        window_left, sinks, return_lse: only -1 / None / False (AITER's paged kernel has
            no sinks and returns no lse; this wrapper does not map windows).
        out: optional ``[B, Hq, D]``.
    """
    if window_left >= 0 or sinks is not None or return_lse:
        raise ValueError("aiter.mha_decode_with_kvcache: window_left, sinks and return_lse are not supported")
    import aiter  # noqa: F401  (registers torch.ops.aiter.*)

    batch, hq, d = q.shape
    page_size = k_cache.shape[1]
    scale = softmax_scale if softmax_scale is not None else d**-0.5
    # Host-side bound on the context (no device sync): every page the table can name.
    max_context = page_table.shape[1] * page_size
    partitions = -(-max_context // _PARTITION)
    q = q.contiguous()
    result = out if out is not None and out.is_contiguous() else torch.empty_like(q)
    # One buffer for the partial outputs (out dtype) and two fp32 [B, Hq, partitions]
    # arrays (exp sums, max logits), as AITER's paged kernels expect.
    workspace = torch.empty(
        batch * hq * partitions * d * q.element_size() + 2 * batch * hq * partitions * 4,
        dtype=torch.uint8,
        device=q.device,
    )
    one = _unit_scale(q.device)
    torch.ops.aiter.paged_attention_v1(
        result, workspace, q, k_cache, v_cache, float(scale), page_table, None, cache_seqlens, max_context, None,
        "auto", "NHD", float(logit_cap), one, one, None, _PARTITION,
    )  # fmt: skip
    if out is not None and result is not out:
        out.copy_(result)
        result = out
    return result

"""Write new K/V rows into the paged cache by slot (``kvcache_store``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2

from .configs import store_config

__all__ = ["kvcache_store"]


@triton.jit
def kvcache_store_kernel(
    K,
    V,
    KCache,
    VCache,
    SlotMapping,
    stride_k_tok,
    stride_k_head,
    stride_v_tok,
    stride_v_head,
    stride_kc_page,
    stride_kc_tok,
    stride_kc_head,
    stride_vc_page,
    stride_vc_tok,
    stride_vc_head,
    num_heads,
    page_size,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Grid: (tokens, head blocks). One program copies ``BLOCK_H`` heads of one token."""
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(SlotMapping + tok).to(tl.int64)
    # Negative slots are padding: nothing is written (no host-side filtering needed).
    if slot < 0:
        return
    page = slot // page_size
    row = slot - page * page_size
    head = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (head < num_heads)[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(K + tok * stride_k_tok + head[:, None] * stride_k_head + offs_d[None, :], mask=mask)
    v = tl.load(V + tok * stride_v_tok + head[:, None] * stride_v_head + offs_d[None, :], mask=mask)
    dst_k = KCache + page * stride_kc_page + row * stride_kc_tok + head[:, None] * stride_kc_head + offs_d[None, :]
    dst_v = VCache + page * stride_vc_page + row * stride_vc_tok + head[:, None] * stride_vc_head + offs_d[None, :]
    tl.store(dst_k, k.to(KCache.dtype.element_ty), mask=mask)
    tl.store(dst_v, v.to(VCache.dtype.element_ty), mask=mask)


def kvcache_store(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``k, v`` into the paged caches in place (semantics: ``tokenspeed_kernel.kvcache_store``).

    Args:
        k, v: ``[T, Hkv, D]`` bf16/fp16/fp32, last dim contiguous.
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]`` bf16/fp16/fp32 (values are cast).
        slot_mapping: ``int32/int64 [T]``; token t goes to page ``slot // page_size``, row
            ``slot % page_size``; a negative slot writes nothing.
    """
    num_tokens = k.shape[0]
    _, page_size, num_heads, head_dim = k_cache.shape
    if num_tokens == 0 or num_heads == 0:
        return
    cfg = store_config(k.device)
    block_d = next_power_of_2(head_dim)
    block_h = max(1, min(next_power_of_2(num_heads), cfg["elements_per_program"] // block_d))
    cached(kvcache_store_kernel)[(num_tokens, cdiv(num_heads, block_h))](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        num_heads, page_size, HEAD_DIM=head_dim, BLOCK_H=block_h, BLOCK_D=block_d, num_warps=cfg["num_warps"],
    )  # fmt: skip

"""Fused softmax top-k routing (``moe_route``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2

from .configs import ROUTE_BLOCK_T, family_of

__all__ = ["moe_route"]


@triton.jit
def _route_kernel(
    logits_ptr, stride_lt, w_ptr, ids_ptr, T, E, TOPK: tl.constexpr, RENORMALIZE: tl.constexpr,
    BLOCK_T: tl.constexpr, E_PAD: tl.constexpr, TOPK_PAD: tl.constexpr,
):  # fmt: skip
    """One program routes BLOCK_T tokens; each token's logits sit in one row of registers."""
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    eids = tl.arange(0, E_PAD)
    t_ok = tokens < T
    e_ok = eids < E
    x = tl.load(
        logits_ptr + tokens[:, None].to(tl.int64) * stride_lt + eids[None, :],
        mask=t_ok[:, None] & e_ok[None, :], other=-float("inf"),
    ).to(tl.float32)  # fmt: skip
    # Rows past T become zeros, so their (never stored) math stays finite.
    x = tl.where(t_ok[:, None], x, 0.0)
    # `free` rather than overwriting chosen logits with -inf keeps real -inf logits
    # selectable, and padding lanes never are.
    free = tl.broadcast_to(e_ok[None, :], (BLOCK_T, E_PAD))
    row_max = tl.max(x, 1)
    denom = tl.zeros((BLOCK_T,), dtype=tl.float32)
    if not RENORMALIZE:
        denom = tl.sum(tl.where(e_ok[None, :], tl.exp(x - row_max[:, None]), 0.0), 1)
    slots = tl.arange(0, TOPK_PAD)
    top_vals = tl.full((BLOCK_T, TOPK_PAD), -float("inf"), dtype=tl.float32)
    top_ids = tl.zeros((BLOCK_T, TOPK_PAD), dtype=tl.int32)
    for s in tl.static_range(TOPK):
        m = tl.max(tl.where(free, x, -float("inf")), 1)
        # Lowest free index holding the maximum: ties go to the lower expert.
        pick = tl.min(tl.where(free & (x == m[:, None]), eids[None, :], E_PAD), 1)
        free = free & (eids[None, :] != pick[:, None])
        top_vals = tl.where(slots[None, :] == s, m[:, None], top_vals)
        top_ids = tl.where(slots[None, :] == s, pick[:, None], top_ids)
    # The first pick is the row maximum, so one shift serves both softmaxes.
    if RENORMALIZE:
        p = tl.exp(top_vals - row_max[:, None])
        w = p / tl.sum(p, 1)[:, None]
    else:
        w = tl.exp(top_vals - row_max[:, None]) / denom[:, None]
    out = tokens[:, None] * TOPK + slots[None, :]
    ok = t_ok[:, None] & (slots < TOPK)[None, :]
    tl.store(w_ptr + out, w, mask=ok)
    tl.store(ids_ptr + out, top_ids, mask=ok)


def moe_route(
    router_logits: torch.Tensor, top_k: int, *, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing in one kernel.

    Args:
        router_logits: ``[T, E]`` bf16/fp16/fp32.
        top_k: experts per token, ``1 <= top_k <= E``.
        renormalize: weights are the softmax over the top-k logits; otherwise the
            full softmax's probabilities of the chosen experts.

    Returns:
        ``topk_weights float32 [T, top_k]`` (descending), ``topk_ids int32 [T, top_k]``;
        ties go to the lower expert index.
    """
    if router_logits.stride(-1) != 1:
        router_logits = router_logits.contiguous()
    t, e = router_logits.shape
    dev = router_logits.device
    weights = torch.empty((t, top_k), dtype=torch.float32, device=dev)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=dev)
    if t:
        block_t = ROUTE_BLOCK_T[family_of(dev)]
        cached(_route_kernel)[(cdiv(t, block_t),)](
            router_logits, router_logits.stride(0), weights, ids, t, e,
            TOPK=top_k, RENORMALIZE=renormalize, BLOCK_T=block_t, E_PAD=next_power_of_2(e),
            TOPK_PAD=next_power_of_2(top_k),
        )  # fmt: skip
    return weights, ids

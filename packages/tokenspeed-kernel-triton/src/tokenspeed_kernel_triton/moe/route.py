"""Fused softmax top-k routing (``moe_route``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2

from .configs import GATE_TILES, ROUTE_BLOCK_T, family_of, lookup

__all__ = ["moe_route", "moe_gate"]


@triton.jit
def _topk_store(
    x, tokens, t_ok, eids, e_ok, w_ptr, ids_ptr, TOPK: tl.constexpr, RENORMALIZE: tl.constexpr,
    BLOCK_T: tl.constexpr, E_PAD: tl.constexpr, TOPK_PAD: tl.constexpr,
):  # fmt: skip
    """Softmax top-k of the fp32 logits ``x [BLOCK_T, E_PAD]`` (padding lanes masked by ``e_ok``, rows past T by
    ``t_ok``), stored as ``TOPK`` weights and ids per token."""
    # Rows past T become zeros, so their (never stored) math stays finite.
    x = tl.where(t_ok[:, None], x, 0.0)
    # `free` rather than overwriting chosen logits with -inf keeps real -inf logits
    # selectable, and padding lanes never are.
    free = tl.broadcast_to(e_ok[None, :], (BLOCK_T, E_PAD))
    row_max = tl.max(tl.where(e_ok[None, :], x, -float("inf")), 1)
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
    _topk_store(x, tokens, t_ok, eids, e_ok, w_ptr, ids_ptr, TOPK, RENORMALIZE, BLOCK_T, E_PAD, TOPK_PAD)


@triton.jit
def _gate_kernel(
    x_ptr, stride_xt, wr_ptr, br_ptr, w_ptr, ids_ptr, T, E, H,
    HAS_BIAS: tl.constexpr, TOPK: tl.constexpr, RENORMALIZE: tl.constexpr, DOT: tl.constexpr,
    DOT_FP32: tl.constexpr, BLOCK_T: tl.constexpr, E_PAD: tl.constexpr, TOPK_PAD: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """The router (``moe_gate``): one program computes BLOCK_T tokens' logits over every expert (fp32 sums of
    BLOCK_K-wide products, tensor cores when DOT; DOT_FP32 upcasts the operands first, for the interpreter: exact
    either way), rounds them to x's dtype as ``mm`` returns them, and routes."""
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    eids = tl.arange(0, E_PAD)
    t_ok = tokens < T
    e_ok = eids < E
    x_rows = x_ptr + tokens[:, None].to(tl.int64) * stride_xt
    w_rows = wr_ptr + eids[:, None].to(tl.int64) * H
    if DOT:
        acc = tl.zeros((BLOCK_T, E_PAD), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < H
            a = tl.load(x_rows + ks[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_rows + ks[None, :], mask=e_ok[:, None] & k_ok[None, :], other=0.0)
            if DOT_FP32:  # Triton 3.6's interpreter multiplies bf16 storage bits as integers
                acc = tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")
    else:
        # Products accumulated lane by lane, reduced once at the end: the loop is loads and FMAs only, so its loads
        # overlap (one program reads the whole router; a reduction per step serialised them).
        acc3 = tl.zeros((BLOCK_T, E_PAD, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < H
            a = tl.load(x_rows + ks[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_rows + ks[None, :], mask=e_ok[:, None] & k_ok[None, :], other=0.0)
            acc3 += a.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
        acc = tl.sum(acc3, axis=2)
    if HAS_BIAS:
        acc += tl.load(br_ptr + eids, mask=e_ok, other=0.0).to(tl.float32)[None, :]
    logits = acc.to(x_ptr.dtype.element_ty).to(tl.float32)
    _topk_store(logits, tokens, t_ok, eids, e_ok, w_ptr, ids_ptr, TOPK, RENORMALIZE, BLOCK_T, E_PAD, TOPK_PAD)


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


def moe_gate(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, top_k: int, *, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """The router's linear layer and softmax top-k routing in one kernel (semantics: ``tokenspeed_kernel.moe_gate``).

    Args:
        x: ``[T, H]`` bf16/fp16/fp32, last dim contiguous.
        weight: ``[E, H]`` contiguous, ``x``'s dtype; bias: ``[E]`` or None.
        top_k, renormalize: as :func:`moe_route`.

    Returns:
        ``topk_weights float32 [T, top_k]`` (descending), ``topk_ids int32 [T, top_k]``.
    """
    t, h = x.shape
    e = weight.shape[0]
    dev = x.device
    weights = torch.empty((t, top_k), dtype=torch.float32, device=dev)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=dev)
    if t:
        family = family_of(dev)
        block_t, block_k, dot = lookup(GATE_TILES[family], t)
        e_pad = max(16, next_power_of_2(e)) if dot else next_power_of_2(e)
        if not dot:  # the accumulators stay in registers: at most 8192 a program (32 a thread at 8 warps)
            block_k = max(16, min(block_k, 8192 // (block_t * e_pad)))
        cached(_gate_kernel)[(cdiv(t, block_t),)](
            x, x.stride(0), weight, bias, weights, ids, t, e, h,
            HAS_BIAS=bias is not None, TOPK=top_k, RENORMALIZE=renormalize, DOT=dot, DOT_FP32=family == "interpret",
            BLOCK_T=block_t, E_PAD=e_pad, TOPK_PAD=next_power_of_2(top_k), BLOCK_K=block_k, num_warps=8,
        )  # fmt: skip
    return weights, ids

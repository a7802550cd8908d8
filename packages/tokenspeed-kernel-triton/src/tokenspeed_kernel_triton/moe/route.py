"""Fused softmax top-k routing (``moe_route``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2, stream_counters, stream_scratch

from ..rmsnorm import stream_rows
from .configs import GATE_TILES, NORM_TILE, ROUTE_BLOCK_T, family_of, lookup

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
def _normed_chunk(
    x_ptr, r_ptr, nw_ptr, h_ptr, s_ptr, rows, t_ok, store_ok, ks, H, stride_xt, stride_rt, stride_ht, stride_st, rstd,
    HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    """A chunk of the norm's output ``h = s * rstd * norm_weight`` (fp32, cast once to x's dtype, as ``rmsnorm``),
    ``s`` recomputed from x (+ residual) as the first pass did; where ``store_ok`` (one program of a token block),
    ``h`` (and the stream ``s``) stored. Returns ``h``."""
    s = stream_rows(x_ptr, r_ptr, rows, t_ok, ks, H, stride_xt, stride_rt, HAS_RESIDUAL)
    nw = tl.load(nw_ptr + ks, mask=ks < H, other=0.0).to(tl.float32)
    h = (s.to(tl.float32) * rstd[:, None] * nw[None, :]).to(x_ptr.dtype.element_ty)
    mask = (t_ok & store_ok)[:, None] & (ks < H)[None, :]
    tl.store(h_ptr + rows[:, None] * stride_ht + ks[None, :], h, mask=mask)
    if HAS_RESIDUAL:
        tl.store(s_ptr + rows[:, None] * stride_st + ks[None, :], s, mask=mask)
    return h


@triton.jit
def _gate_kernel(
    x_ptr, stride_xt, wr_ptr, br_ptr, w_ptr, ids_ptr, T, E, H,
    r_ptr, stride_rt, nw_ptr, h_ptr, stride_ht, s_ptr, stride_st, eps, part_ptr, counter_ptr,
    HAS_BIAS: tl.constexpr, TOPK: tl.constexpr, RENORMALIZE: tl.constexpr, DOT: tl.constexpr,
    DOT_FP32: tl.constexpr, BLOCK_T: tl.constexpr, E_PAD: tl.constexpr, TOPK_PAD: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_NORM: tl.constexpr = False, HAS_RESIDUAL: tl.constexpr = False, NORM_BLOCK: tl.constexpr = 16,
    E_BLOCK: tl.constexpr = 0,
):  # fmt: skip
    """The router (``moe_gate``): BLOCK_T tokens' logits (fp32 sums of BLOCK_K-wide products, tensor cores when
    DOT; DOT_FP32 upcasts the operands first, for the interpreter: exact either way), rounded to x's dtype as ``mm``
    returns them, then routed.

    E_BLOCK = 0: one program computes every expert's logits and routes. E_BLOCK > 0 (CUDA-core sums only): the
    experts are split, E_BLOCK a program (grid axis 1), so a few tokens' router is read by E_PAD / E_BLOCK programs
    at once instead of one; each program stores its logits in ``part_ptr`` (per token block, [BLOCK_T, E_PAD] fp32)
    and counts itself in the block's counter; the last to arrive zeroes the counter and routes (no program waits).

    HAS_NORM: the router reads ``h = rmsnorm(x [+ residual])`` instead of x (``rmsnorm``'s numerics): a first pass
    over the row, NORM_BLOCK wide (the whole row at decode sizes: its loads in flight at once), sums the squares;
    the GEMM's loop normalises each chunk it reads, and the first program of a token block stores it to ``h`` (and
    the stream ``s = x + residual`` with HAS_RESIDUAL). Every program holds whole rows: none waits for another."""
    E_PROG: tl.constexpr = E_PAD if E_BLOCK == 0 else E_BLOCK
    block = tl.program_id(0)
    split = tl.program_id(1)
    tokens = block * BLOCK_T + tl.arange(0, BLOCK_T)
    eids = split * E_PROG + tl.arange(0, E_PROG)
    t_ok = tokens < T
    e_ok = eids < E
    first = split == 0
    rows = tokens.to(tl.int64)
    x_rows = x_ptr + rows[:, None] * stride_xt
    w_rows = wr_ptr + eids[:, None].to(tl.int64) * H
    rstd = tl.zeros((BLOCK_T,), dtype=tl.float32)
    if HAS_NORM:
        sq = tl.zeros((BLOCK_T, NORM_BLOCK), dtype=tl.float32)
        for k0 in range(0, H, NORM_BLOCK):
            s = stream_rows(x_ptr, r_ptr, rows, t_ok, k0 + tl.arange(0, NORM_BLOCK), H, stride_xt, stride_rt,
                            HAS_RESIDUAL).to(tl.float32)  # fmt: skip
            sq += s * s
        rstd = tl.rsqrt(tl.sum(sq, axis=1) / H + eps)
    if DOT:
        acc = tl.zeros((BLOCK_T, E_PROG), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < H
            if HAS_NORM:
                a = _normed_chunk(x_ptr, r_ptr, nw_ptr, h_ptr, s_ptr, rows, t_ok, first, ks, H, stride_xt, stride_rt,
                                  stride_ht, stride_st, rstd, HAS_RESIDUAL)  # fmt: skip
            else:
                a = tl.load(x_rows + ks[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_rows + ks[None, :], mask=e_ok[:, None] & k_ok[None, :], other=0.0)
            if DOT_FP32:  # Triton 3.6's interpreter multiplies bf16 storage bits as integers
                acc = tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, tl.trans(w), acc, input_precision="ieee")
    else:
        # Products accumulated lane by lane, reduced once at the end: the loop is loads and FMAs only, so its loads
        # overlap (a reduction per step serialised them).
        acc3 = tl.zeros((BLOCK_T, E_PROG, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < H
            if HAS_NORM:
                a = _normed_chunk(x_ptr, r_ptr, nw_ptr, h_ptr, s_ptr, rows, t_ok, first, ks, H, stride_xt, stride_rt,
                                  stride_ht, stride_st, rstd, HAS_RESIDUAL)  # fmt: skip
            else:
                a = tl.load(x_rows + ks[None, :], mask=t_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_rows + ks[None, :], mask=e_ok[:, None] & k_ok[None, :], other=0.0)
            acc3 += a.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
        acc = tl.sum(acc3, axis=2)
    if HAS_BIAS:
        acc += tl.load(br_ptr + eids, mask=e_ok, other=0.0).to(tl.float32)[None, :]
    logits = acc.to(x_ptr.dtype.element_ty).to(tl.float32)
    if E_BLOCK == 0:
        _topk_store(logits, tokens, t_ok, eids, e_ok, w_ptr, ids_ptr, TOPK, RENORMALIZE, BLOCK_T, E_PAD, TOPK_PAD)
    else:
        slots = tl.arange(0, BLOCK_T)[:, None] * E_PAD
        part = part_ptr + block.to(tl.int64) * (BLOCK_T * E_PAD)
        tl.store(part + slots + eids[None, :], logits)
        # Publish the logits (a CTA barrier, then a release at GPU scope) and count them: the program that brings the
        # block's counter to the number of splits zeroes it and routes the block's tokens.
        tl.debug_barrier()
        counter = counter_ptr + block
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == E_PAD // E_BLOCK - 1:
            tl.store(counter, 0)  # every split has arrived: zero for the next launch
            tl.debug_barrier()
            # (names of their own: a variable the branch shares with the code above must keep its type)
            all_e = tl.arange(0, E_PAD)
            every = tl.load(part + slots + all_e[None, :], cache_modifier=".cg")
            _topk_store(every, tokens, t_ok, all_e, all_e < E, w_ptr, ids_ptr, TOPK, RENORMALIZE, BLOCK_T, E_PAD,
                        TOPK_PAD)  # fmt: skip


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
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    top_k: int,
    *,
    renormalize: bool = True,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float | None = None,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """The router's linear layer and softmax top-k routing in one kernel (semantics: ``tokenspeed_kernel.moe_gate``).

    Args:
        x: ``[T, H]`` bf16/fp16/fp32, last dim contiguous.
        weight: ``[E, H]`` contiguous, ``x``'s dtype; bias: ``[E]`` or None.
        top_k, renormalize: as :func:`moe_route`.
        norm_weight, norm_eps: the router reads ``h = rmsnorm(x, norm_weight, norm_eps)`` (``[H]``), also returned.
        residual: with ``norm_weight``, ``[T, H]`` like ``x``: the norm is of the stream ``s = x + residual``
            (rounded to ``x``'s dtype), also returned.

    Returns:
        ``topk_weights float32 [T, top_k]`` (descending), ``topk_ids int32 [T, top_k]``; then ``h`` with
        ``norm_weight``, then ``s`` with ``residual``.
    """
    t, h = x.shape
    e = weight.shape[0]
    dev = x.device
    weights = torch.empty((t, top_k), dtype=torch.float32, device=dev)
    ids = torch.empty((t, top_k), dtype=torch.int32, device=dev)
    normed = stream = None
    if norm_weight is not None:
        normed = torch.empty((t, h), dtype=x.dtype, device=dev)
        if residual is not None:
            stream = torch.empty((t, h), dtype=x.dtype, device=dev)
    if t:
        family = family_of(dev)
        block_t, block_k, dot, e_block = lookup(GATE_TILES[family], t)
        e_pad = max(16, next_power_of_2(e)) if dot else next_power_of_2(e)
        # The experts split across programs (CUDA-core sums only), where that makes more than one.
        e_block = e_block if not dot and e_block and e_block < e_pad else 0
        if not dot:  # the accumulators stay in registers: at most 8192 a program (32 a thread at 8 warps)
            block_k = max(16, min(block_k, 8192 // (block_t * (e_block or e_pad))))
        blocks = cdiv(t, block_t)
        if e_block:  # the splits' logits and arrival counters: the stream's (nothing allocated)
            part, counters = stream_scratch(dev, blocks * block_t * e_pad), stream_counters(dev, blocks)
        else:
            part = counters = weights  # (unused)
        norm = normed is not None
        res = stream is not None
        # The norm's first pass: the whole row in one tile where it fits the registers (decode: its loads in flight
        # at once; with a 256-wide loop a one-token call took 14.5 us in a CUDA graph on an H100, 9.6 without the
        # norm: session 23), else BLOCK_K-wide steps.
        norm_block = next_power_of_2(h) if block_t * next_power_of_2(h) <= NORM_TILE[family] else block_k
        cached(_gate_kernel)[(blocks, e_pad // e_block if e_block else 1)](
            x, x.stride(0), weight, bias, weights, ids, t, e, h,
            residual if res else x, residual.stride(0) if res else 0, norm_weight if norm else x,
            normed if norm else x, h if norm else 0, stream if res else x, h if res else 0,
            float(norm_eps) if norm else 0.0, part, counters,
            HAS_BIAS=bias is not None, TOPK=top_k, RENORMALIZE=renormalize, DOT=dot, DOT_FP32=family == "interpret",
            BLOCK_T=block_t, E_PAD=e_pad, TOPK_PAD=next_power_of_2(top_k), BLOCK_K=block_k, HAS_NORM=norm,
            HAS_RESIDUAL=res, NORM_BLOCK=norm_block if norm else 16, E_BLOCK=e_block, num_warps=8,
        )  # fmt: skip
    if normed is None:
        return weights, ids
    return (weights, ids, normed) if stream is None else (weights, ids, normed, stream)

"""Weighted sum of each token's expert rows (``moe_combine``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.launch import cached, cdiv

from .configs import COMBINE_BLOCK_H, family_of

__all__ = ["moe_combine", "sum_slots"]

_INVERT_BLOCK = 1024


@triton.jit
def _invert_kernel(perm_ptr, inv_ptr, n, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = rows < n
    tl.store(inv_ptr + tl.load(perm_ptr + rows, mask=ok, other=0), rows, mask=ok)


@triton.jit
def _combine_kernel(
    src_ptr, stride_sm, row_of_ptr, w_ptr, out_ptr, stride_om, H,
    TOPK: tl.constexpr, GATHER: tl.constexpr, WEIGHTED: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    """``out[t] = sum_s w[t, s] * src[row(t, s)]`` in float32; ``row(t, s)`` is ``t * k + s``
    unless GATHER (then ``row_of[t * k + s]``)."""
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = cols < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for s in tl.static_range(TOPK):
        flat = t * TOPK + s
        if GATHER:
            row = tl.load(row_of_ptr + flat)
        else:
            row = flat
        v = tl.load(src_ptr + row.to(tl.int64) * stride_sm + cols, mask=ok, other=0.0).to(tl.float32)
        if WEIGHTED:
            v = v * tl.load(w_ptr + flat)
        acc += v
    tl.store(out_ptr + t.to(tl.int64) * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


def sum_slots(src: torch.Tensor, top_k: int, out: torch.Tensor) -> torch.Tensor:
    """``out[t] = sum_s src[t * k + s]`` (the routing weights are already in ``src``).

    Args:
        src: ``[T*k, H]`` rows in flat (token, slot) order, last dim contiguous.
        top_k: ``k``.
        out: ``[T, H]``, last dim contiguous.
    """
    t, h = out.shape
    if t and h:
        block_h = COMBINE_BLOCK_H[family_of(out.device)]
        cached(_combine_kernel)[(t, cdiv(h, block_h))](
            src, src.stride(0), src, src, out, out.stride(0), h,
            TOPK=top_k, GATHER=False, WEIGHTED=False, BLOCK_H=block_h,
        )  # fmt: skip
    return out


def moe_combine(
    expert_out: torch.Tensor,
    permutation: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[t] = sum_s topk_weights[t, s] * expert_out[row of (t, s)]``, summed in float32.

    Args:
        expert_out: ``[T*k, H]`` rows in dispatch (sorted) order.
        permutation: ``int32 [T*k]`` from ``moe_dispatch`` (sorted row -> flat pair).
        topk_weights: ``float32 [T, k]``.
        out: optional ``[T, H]`` of ``expert_out``'s dtype.
    """
    t, k = topk_weights.shape
    h = expert_out.shape[1]
    if expert_out.stride(-1) != 1:
        expert_out = expert_out.contiguous()
    topk_weights = topk_weights.contiguous()
    permutation = permutation.contiguous()
    result = (
        out
        if out is not None and out.stride(-1) == 1
        else torch.empty((t, h), dtype=expert_out.dtype, device=expert_out.device)
    )
    if t and h:
        block_h = COMBINE_BLOCK_H[family_of(expert_out.device)]
        row_of = torch.empty_like(permutation)
        cached(_invert_kernel)[(cdiv(t * k, _INVERT_BLOCK),)](permutation, row_of, t * k, BLOCK=_INVERT_BLOCK)
        cached(_combine_kernel)[(t, cdiv(h, block_h))](
            expert_out, expert_out.stride(0), row_of, topk_weights, result, result.stride(0), h,
            TOPK=k, GATHER=True, WEIGHTED=True, BLOCK_H=block_h,
        )  # fmt: skip
    if out is not None and result is not out:
        out.copy_(result)
        return out
    return result

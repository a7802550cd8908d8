"""Token sort by expert (``moe_dispatch``), without a host synchronisation.

Every output is sized from shapes alone (``T * k`` rows, ``E + 1`` offsets), so the
whole path can be captured in a CUDA graph. The sort is stable: the rows of one
expert keep the flat ``(token * k + slot)`` order.

Small problems are sorted by one program (one launch). Larger ones take three:
per-block expert counts, one program scanning those counts into each block's
starting row per expert, then per-block placement.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2
from tokenspeed_kernel.ops.moe import MoEDispatchResult

from .configs import GATHER_BLOCK, SORT_BLOCK, SORT_SCAN_TILE, SORT_SINGLE_PROGRAM_MAX_PAIRS, family_of

__all__ = ["moe_dispatch", "sort_pairs"]


@triton.jit
def _place_block(ids_ptr, perm_ptr, start, num_pairs, base, BLOCK: tl.constexpr, E_PAD: tl.constexpr):
    """Write the flat index of pairs ``start .. start + BLOCK`` at their sorted row.

    ``base [E_PAD]``: the first free row of each expert. Returns this block's
    per-expert counts.
    """
    idx = start + tl.arange(0, BLOCK)
    ok = idx < num_pairs
    ids = tl.load(ids_ptr + idx, mask=ok, other=-1)
    onehot = (ids[:, None] == tl.arange(0, E_PAD)[None, :]).to(tl.int32)
    # Exclusive running count down the block: earlier pairs of the same expert.
    before = tl.cumsum(onehot, 0) - onehot
    row = tl.sum(onehot * (before + base[None, :]), 1)
    tl.store(perm_ptr + row, idx, mask=ok)
    return tl.sum(onehot, 0)


@triton.jit
def _sort_single_kernel(ids_ptr, offsets_ptr, perm_ptr, num_pairs, E, BLOCK: tl.constexpr, E_PAD: tl.constexpr):
    eids = tl.arange(0, E_PAD)
    counts = tl.zeros((E_PAD,), dtype=tl.int32)
    for start in range(0, num_pairs, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        ids = tl.load(ids_ptr + idx, mask=idx < num_pairs, other=-1)
        counts += tl.sum((ids[:, None] == eids[None, :]).to(tl.int32), 0)
    base = tl.cumsum(counts, 0) - counts
    tl.store(offsets_ptr + eids, base, mask=eids < E)
    tl.store(offsets_ptr + E, num_pairs)
    for start in range(0, num_pairs, BLOCK):
        base += _place_block(ids_ptr, perm_ptr, start, num_pairs, base, BLOCK, E_PAD)


@triton.jit
def _count_kernel(ids_ptr, counts_ptr, num_pairs, BLOCK: tl.constexpr, E_PAD: tl.constexpr):
    b = tl.program_id(0)
    idx = b * BLOCK + tl.arange(0, BLOCK)
    ids = tl.load(ids_ptr + idx, mask=idx < num_pairs, other=-1)
    eids = tl.arange(0, E_PAD)
    tl.store(counts_ptr + b * E_PAD + eids, tl.sum((ids[:, None] == eids[None, :]).to(tl.int32), 0))


@triton.jit
def _scan_kernel(counts_ptr, offsets_ptr, num_blocks, num_pairs, E, CHUNK: tl.constexpr, E_PAD: tl.constexpr):
    """One program: expert offsets, then each block's first row per expert (in place).

    Blocks are scanned CHUNK at a time as [CHUNK, E_PAD] tiles, so even 16K tokens
    (512 blocks) take a few dozen iterations, not one dependent load per block.
    """
    eids = tl.arange(0, E_PAD)
    bids = tl.arange(0, CHUNK)
    totals = tl.zeros((E_PAD,), dtype=tl.int32)
    for b0 in range(0, num_blocks, CHUNK):
        ptrs = counts_ptr + (b0 + bids)[:, None] * E_PAD + eids[None, :]
        totals += tl.sum(tl.load(ptrs, mask=(b0 + bids < num_blocks)[:, None], other=0), 0)
    running = tl.cumsum(totals, 0) - totals
    tl.store(offsets_ptr + eids, running, mask=eids < E)
    tl.store(offsets_ptr + E, num_pairs)
    for b0 in range(0, num_blocks, CHUNK):
        ptrs = counts_ptr + (b0 + bids)[:, None] * E_PAD + eids[None, :]
        ok = (b0 + bids < num_blocks)[:, None]
        c = tl.load(ptrs, mask=ok, other=0)
        tl.store(ptrs, tl.cumsum(c, 0) - c + running[None, :], mask=ok)
        running += tl.sum(c, 0)


@triton.jit
def _place_kernel(ids_ptr, base_ptr, perm_ptr, num_pairs, BLOCK: tl.constexpr, E_PAD: tl.constexpr):
    b = tl.program_id(0)
    base = tl.load(base_ptr + b * E_PAD + tl.arange(0, E_PAD))
    _place_block(ids_ptr, perm_ptr, b * BLOCK, num_pairs, base, BLOCK, E_PAD)


@triton.jit
def _gather_rows_kernel(
    x_ptr,
    stride_xm,
    perm_ptr,
    out_ptr,
    stride_om,
    num_rows,
    H,
    TOPK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = rows < num_rows
    tokens = tl.load(perm_ptr + rows, mask=ok, other=0) // TOPK
    mask = ok[:, None] & (cols < H)[None, :]
    vals = tl.load(x_ptr + tokens[:, None].to(tl.int64) * stride_xm + cols[None, :], mask=mask)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :], vals, mask=mask)


def sort_pairs(topk_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable sort of the flat (token, slot) pairs by expert.

    Args:
        topk_ids: ``int32 [T, k]`` contiguous, values in ``[0, E)``.
        num_experts: ``E``.

    Returns:
        ``(expert_offsets int32 [E+1], permutation int32 [T*k])``: sorted row ``r`` is
        flat pair ``permutation[r]``.
    """
    num_pairs = topk_ids.numel()
    dev = topk_ids.device
    offsets = torch.empty(num_experts + 1, dtype=torch.int32, device=dev)
    perm = torch.empty(num_pairs, dtype=torch.int32, device=dev)
    if num_pairs == 0:
        offsets.zero_()
        return offsets, perm
    e_pad = next_power_of_2(num_experts)
    family = family_of(dev)
    block = SORT_BLOCK[family]
    if num_pairs <= SORT_SINGLE_PROGRAM_MAX_PAIRS[family]:
        cached(_sort_single_kernel)[(1,)](topk_ids, offsets, perm, num_pairs, num_experts, BLOCK=block, E_PAD=e_pad)
        return offsets, perm
    num_blocks = cdiv(num_pairs, block)
    counts = torch.empty((num_blocks, e_pad), dtype=torch.int32, device=dev)
    cached(_count_kernel)[(num_blocks,)](topk_ids, counts, num_pairs, BLOCK=block, E_PAD=e_pad)
    cached(_scan_kernel)[(1,)](
        counts, offsets, num_blocks, num_pairs, num_experts, CHUNK=max(1, SORT_SCAN_TILE[family] // e_pad), E_PAD=e_pad
    )
    cached(_place_kernel)[(num_blocks,)](topk_ids, counts, perm, num_pairs, BLOCK=block, E_PAD=e_pad)
    return offsets, perm


def moe_dispatch(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int) -> MoEDispatchResult:
    """Group the ``T * k`` (token, slot) pairs by expert (token order within an expert).

    Args:
        x: ``[T, H]`` bf16/fp16/fp32 hidden states.
        topk_ids: ``int32 [T, k]`` contiguous.
        num_experts: ``E``.

    Returns:
        :class:`MoEDispatchResult`: ``hidden [T*k, H]`` (x's dtype),
        ``expert_offsets int32 [E+1]``, ``permutation int32 [T*k]``.
    """
    if x.stride(-1) != 1:
        x = x.contiguous()
    offsets, perm = sort_pairs(topk_ids, num_experts)
    rows, h = perm.numel(), x.shape[1]
    hidden = torch.empty((rows, h), dtype=x.dtype, device=x.device)
    if rows and h:
        block_r, block_h = GATHER_BLOCK[family_of(x.device)]
        grid = (cdiv(rows, block_r), cdiv(h, block_h))
        cached(_gather_rows_kernel)[grid](
            x, x.stride(0), perm, hidden, hidden.stride(0), rows, h,
            TOPK=topk_ids.shape[1], BLOCK_R=block_r, BLOCK_H=block_h,
        )  # fmt: skip
    return MoEDispatchResult(hidden=hidden, expert_offsets=offsets, permutation=perm)

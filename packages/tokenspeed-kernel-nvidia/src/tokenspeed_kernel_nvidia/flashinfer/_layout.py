"""Pure-torch conversions to FlashInfer's metadata and weight layouts (no FlashInfer import; CPU-testable)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from tokenspeed_kernel.ops.moe import MoEWeights

__all__ = ["MOE_ALIGN", "PaddedMoE", "moe_padded", "paged_metadata"]

#: FlashInfer's SM90 mixed-input GEMM folds scales per 64 rows x 128 columns.
MOE_ALIGN = 128


def paged_metadata(
    lens: torch.Tensor, page_size: int, max_pages: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Our ``cache_seqlens`` (host) -> FlashInfer's CSR page metadata.

    Args:
        lens: host ``int [B]`` tokens per sequence.
        page_size: tokens per page.
        max_pages: columns of ``page_table [B, max_pages]``.

    Returns:
        ``indptr int32 [B+1]`` (pages per sequence, prefix-summed), ``last_page_len
        int32 [B]`` (tokens in the last page; 0 for an empty sequence, which FlashInfer
        counts as length 0) and ``flat int64 [indptr[-1]]``: ``b * max_pages + j`` for
        page ``j`` of sequence ``b``, the positions of the used entries of a row-major
        ``page_table``.
    """
    lens = lens.to(torch.int64)
    pages = (lens + page_size - 1) // page_size
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int64)
    torch.cumsum(pages, 0, out=indptr[1:])
    total = int(indptr[-1])
    rows = torch.repeat_interleave(torch.arange(lens.numel()), pages)
    cols = torch.arange(total) - torch.repeat_interleave(indptr[:-1], pages)
    last = lens - (pages - 1).clamp(min=0) * page_size
    return indptr.to(torch.int32), last.to(torch.int32), rows * max_pages + cols


class PaddedMoE(NamedTuple):
    """Canonical MXFP4 weights reordered to ``[up; gate]`` rows and zero-padded to multiples of 128."""

    w13: torch.Tensor  # uint8 [E, 2Ip, Hp/2]
    w13_scale: torch.Tensor  # uint8 [E, 2Ip, Hp/32]
    w2: torch.Tensor  # uint8 [E, Hp, Ip/2]
    w2_scale: torch.Tensor  # uint8 [E, Hp, Ip/32]
    w13_bias: torch.Tensor | None  # bf16 [E, 2Ip]
    w2_bias: torch.Tensor | None  # bf16 [E, Hp]
    hidden: int
    intermediate: int


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _gate_up(t: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Split rows ``[E, 2I, ...]`` into (gate, up)."""
    if interleaved:
        return t[:, 0::2], t[:, 1::2]
    half = t.shape[1] // 2
    return t[:, :half], t[:, half:]


def _stack_padded(
    parts: list[torch.Tensor], rows: int, cols: int, fill: int | float, dtype: torch.dtype
) -> torch.Tensor:
    """Stack ``parts`` (each ``[E, r, c]``, or ``[E, r]`` with ``cols`` unused) along rows, each padded to ``rows`` x ``cols``."""
    e = parts[0].shape[0]
    vector = parts[0].dim() == 2
    shape = (e, rows * len(parts)) if vector else (e, rows * len(parts), cols)
    out = torch.full(shape, fill, dtype=dtype, device=parts[0].device)
    for n, p in enumerate(parts):
        if vector:
            out[:, n * rows : n * rows + p.shape[1]] = p
        else:
            out[:, n * rows : n * rows + p.shape[1], : p.shape[2]] = p
    return out


def moe_padded(weights: MoEWeights) -> PaddedMoE:
    """Reorder gate/up to FlashInfer's ``[up; gate]`` and zero-pad H and I to multiples of 128.

    Padded codes are 0 (+0.0) with scale byte 127 (1.0) and zero bias, so padded
    intermediate channels compute ``act(gate=0, up=0) = 0`` and padded hidden
    channels meet zero inputs: the padding contributes exact zeros.
    """
    i, h = weights.intermediate, weights.hidden
    hp, ip = _round_up(h, MOE_ALIGN), _round_up(i, MOE_ALIGN)
    inter = weights.gate_up_interleaved
    gate, up = _gate_up(weights.w13, inter)
    gate_s, up_s = _gate_up(weights.w13_scale, inter)
    w13 = _stack_padded([up, gate], ip, hp // 2, 0, torch.uint8)
    s13 = _stack_padded([up_s, gate_s], ip, hp // 32, 127, torch.uint8)
    w2 = _stack_padded([weights.w2], hp, ip // 2, 0, torch.uint8)
    s2 = _stack_padded([weights.w2_scale], hp, ip // 32, 127, torch.uint8)
    b13 = b2 = None
    if weights.w13_bias is not None or weights.w2_bias is not None:
        # The kernel takes both biases or neither, in the output dtype (bf16).
        dev, e = weights.w13.device, weights.num_experts
        w13_bias = weights.w13_bias if weights.w13_bias is not None else torch.zeros(e, 2 * i, device=dev)
        w2_bias = weights.w2_bias if weights.w2_bias is not None else torch.zeros(e, h, device=dev)
        gate_b, up_b = _gate_up(w13_bias.to(torch.bfloat16), inter)
        b13 = _stack_padded([up_b, gate_b], ip, 0, 0.0, torch.bfloat16)
        b2 = _stack_padded([w2_bias.to(torch.bfloat16)], hp, 0, 0.0, torch.bfloat16)
    return PaddedMoE(w13, s13, w2, s2, b13, b2, h, i)

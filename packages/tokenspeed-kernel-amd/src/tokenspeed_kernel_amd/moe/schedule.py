"""The MXFP4 MoE's blocking and block schedule, as data and torch code shared by every
instance of the algorithm: the Gluon kernels for gfx950 / gfx942
(:mod:`tokenspeed_kernel_amd.cdna.moe_decode`, :mod:`~tokenspeed_kernel_amd.cdna.moe_grouped`)
and their portable Triton twin (:mod:`tokenspeed_kernel_amd.moe.twin`). The host code
(:mod:`tokenspeed_kernel_amd.moe.fused`) plans one launch list from these and hands it
the kernel set of the target, so the twin that runs on an NVIDIA GPU and under the
interpreter executes the same tiles, grids and schedule as the Gluon instance that is
only compiled.

Two paths:

- **decode** (``T <= DECODE_MAX_TOKENS``): two launches. The first routes (softmax top-k
  of the token's logits, recomputed by every program: 128 logits are cheaper than a
  launch) and computes one ``BLOCK_N`` slice of the gate/up GEMM for one (token, slot)
  with SwiGLU in the epilogue; the second computes one ``BLOCK_N`` slice of the down GEMM
  for one token over all its ``k`` experts and sums them with the routing weights in a
  fixed order (deterministic). A grid-wide dependency (the down GEMM needs every column
  of the first) is why there are two launches, not one.
- **grouped** (larger T): routing and the block schedule in torch (below; no host
  sync, CUDA-graph safe), then a ragged grouped gate/up GEMM over ``(tile, N block)``
  that gathers the tokens' rows, a grouped down GEMM that scatters routing-weighted rows
  back to (token, slot) order, and a sum over the ``k`` slots.

The tile table was not measured on an AMD GPU (none was available): its ``BLOCK_M``
follows the mean rows per expert so that a tile is rarely more than half padding, and
``BLOCK_N`` / ``BLOCK_K`` are the scaled-MFMA shapes (16x16x128 / 32x32x64 f8f6f4 on
gfx950). The twin's H200 timings (``docs/benchmarks/``) measure the same tiles on a
different GPU, which says nothing about their optimality on MI355X.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "MoeTiles",
    "DECODE_MAX_TOKENS",
    "GROUPED_TILES",
    "DECODE_TILES",
    "choose_tiles",
    "route",
    "Schedule",
    "build_schedule",
    "max_tiles",
]

#: Token counts up to this run the decode path (two launches, routing fused in).
DECODE_MAX_TOKENS = 8


@dataclass(frozen=True)
class MoeTiles:
    """One launch configuration of the MoE.

    Attributes:
        path: ``"decode"`` or ``"grouped"``.
        block_m: rows (dispatched (token, expert) pairs) per tile (grouped path; 1 for decode).
        block_n1: output columns of the gate/up GEMM per program (each of gate and up).
        block_n2: output columns of the down GEMM per program.
        block_k: K elements per step of both GEMMs (a multiple of 32, the MX block).
        num_warps: warps per program.
    """

    path: str
    block_m: int
    block_n1: int
    block_n2: int
    block_k: int
    num_warps: int


#: Decode path: a gate/up program owns ``block_n1`` columns of one (token, slot); with
#: I = 2880 that is 90 programs per slot, 360 for GPT-OSS's top-4 at one token; a down
#: program owns ``block_n2`` columns of one token (all k slots): 180 at one token. Both
#: fill most of the 256 CUs of an MI355X (and the 132 SMs of the H200 the twin is timed on).
DECODE_TILES = MoeTiles("decode", 1, 32, 16, 128, 4)

#: Grouped path, by the mean rows per expert ``T * k / E`` (upper bound inclusive).
GROUPED_TILES: tuple[tuple[float, MoeTiles], ...] = (
    (16.0, MoeTiles("grouped", 16, 128, 128, 128, 4)),
    (48.0, MoeTiles("grouped", 32, 128, 128, 128, 4)),
    (96.0, MoeTiles("grouped", 64, 128, 128, 128, 4)),
    (float("inf"), MoeTiles("grouped", 128, 128, 128, 64, 8)),
)


def choose_tiles(tokens: int, num_experts: int, top_k: int, *, decode: bool = True) -> MoeTiles:
    """The tiles for ``tokens`` routed to ``top_k`` of ``num_experts`` experts.

    ``decode=False`` forces the grouped path (vLLM's ``enable_warp_decode=False``).
    Depends on shapes only, so a CUDA graph captured for a token count replays the
    same launches.
    """
    if decode and tokens <= DECODE_MAX_TOKENS:
        return DECODE_TILES
    mean_rows = tokens * top_k / num_experts
    for bound, tiles in GROUPED_TILES:
        if mean_rows <= bound:
            return tiles
    raise AssertionError("unreachable: the last bound is inf")


def route(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing, renormalised over the k chosen: ``(weights float32 [T, k],
    ids int32 [T, k])``, ties to the lower expert (as ``tokenspeed_kernel.moe_route``).

    The decode kernels compute the same in their prologue.
    """
    logits = router_logits.to(torch.float32)
    top, ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    return torch.softmax(top[:, :top_k], dim=-1), ids[:, :top_k].to(torch.int32)


def max_tiles(rows: int, num_experts: int, block_m: int) -> int:
    """An upper bound of the tiles any routing of ``rows`` pairs needs: every expert
    can end in a partial tile. The grid is sized by it (no host sync); programs past
    the real tile count exit at once."""
    return -(-rows // block_m) + min(num_experts, rows)


@dataclass(frozen=True)
class Schedule:
    """Where each grouped-GEMM program works (all int32 device tensors).

    Attributes:
        sorted_rows: ``[T*k]`` the (token * k + slot) pairs grouped by expert, token order
            within an expert (``sorted_rows // k`` is the token).
        expert_offsets: ``[E+1]`` start of each expert's rows in ``sorted_rows``.
        tile_expert: ``[max_tiles]`` the expert of tile i, ``-1`` past the last tile.
        tile_start: ``[max_tiles]`` the first row (index into ``sorted_rows``) of tile i.
    """

    sorted_rows: torch.Tensor
    expert_offsets: torch.Tensor
    tile_expert: torch.Tensor
    tile_start: torch.Tensor


def build_schedule(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> Schedule:
    """The block schedule for this routing: one tile per ``block_m`` rows of each expert,
    so the work follows the real expert distribution (an expert without rows gets no
    tile, a hot expert as many as it needs). Torch ops on the device, no host sync."""
    rows = topk_ids.numel()
    dev = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    sorted_rows = torch.sort(flat, stable=True).indices.to(torch.int32)
    # scatter_add, not bincount: bincount sizes its output from the data (a host sync).
    counts = torch.zeros(num_experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    offsets = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev)
    offsets[1:] = torch.cumsum(counts, 0)
    tiles = (counts + block_m - 1) // block_m
    tile_end = torch.cumsum(tiles, 0)
    n = max_tiles(rows, num_experts, block_m)
    idx = torch.arange(n, dtype=torch.int64, device=dev)
    expert = torch.searchsorted(tile_end, idx, right=True)
    valid = expert < num_experts
    expert_c = expert.clamp(max=num_experts - 1)
    local = idx - (tile_end[expert_c] - tiles[expert_c])
    start = offsets[expert_c] + local * block_m
    return Schedule(
        sorted_rows=sorted_rows,
        expert_offsets=offsets.to(torch.int32),
        tile_expert=torch.where(valid, expert_c, -1).to(torch.int32),
        tile_start=torch.where(valid, start, 0).to(torch.int32),
    )

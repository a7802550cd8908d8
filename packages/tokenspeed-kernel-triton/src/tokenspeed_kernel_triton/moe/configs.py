"""Tile configurations and path thresholds of the Triton MoE kernels, as data.

Every table is keyed by arch family: ``"nvidia"``, ``"amd"`` and ``"interpret"``
(CPU tensors under ``TRITON_INTERPRET=1``, where the interpreter's cost is per
program and per op, so fewer, larger tiles are faster). Each entry is a tuple of
``(max_size, value)`` rows; the first row whose ``max_size`` is ``None`` or
``>= size`` wins.

Where measured: the NVIDIA rows for MXFP4 weights (tiny and grouped paths) were picked from
sweeps on an H200 at the GPT-OSS-120B layer (``tools/bench_triton_moe.py --sweep-only
--sweep-tokens 1,8,32`` and ``128,512,4096,16384``: each GEMM timed alone per tile config,
CUDA graphs, L2 flushed; ``docs/benchmarks/h200-2026-12-01/triton-moe-sweep/``). Everything else has not been timed
on hardware: it is a starting point (nothing has run on an AMD GPU). The starting points
follow from the shapes: at GPT-OSS sizes (H = I = 2880,
E = 128, top-4) decode is bound by streaming MXFP4 weights, so the tiny path uses
narrow N tiles (many programs, each streaming one expert's tile once) and swaps
the MMA operands so the few tokens sit on the MMA's N side; prefill is bound by the
MMA, so the grouped path uses 64-128 row tiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._host import arch_family

__all__ = [
    "GemmConfig",
    "APPLY_PATH",
    "TINY_GEMM",
    "GROUPED_GEMM",
    "SORT_SINGLE_PROGRAM_MAX_PAIRS",
    "SORT_BLOCK",
    "SORT_SCAN_TILE",
    "ROUTE_BLOCK_T",
    "GATE_TILES",
    "NORM_TILE",
    "GATHER_BLOCK",
    "COMBINE_BLOCK_H",
    "family_of",
    "lookup",
    "apply_path",
    "gemm_config",
]


@dataclass(frozen=True)
class GemmConfig:
    """One grouped-GEMM launch configuration.

    ``block_m``: rows (token-expert pairs) per tile; ignored by the tiny path, which
    sizes it from the token count. ``block_n``: output features per tile (for the
    gate/up GEMM: gate and up rows together, so ``block_n / 2`` activations).
    ``block_k``: reduction step. ``group_m``: M tiles that sweep all N tiles together
    (keeps their rows in L2). ``swap_ab``: compute ``W @ X^T`` so the weight tile is
    the MMA's M operand (a few tokens then fill the N side, the 16-wide minimum,
    rather than padding M to 16 or 64). ``decode``: MXFP4 decoding, by the decoders of
    :mod:`tokenspeed_kernel_triton._mxfp4`: ``"bits"`` (codes read as int32 words,
    eight a word), ``"shared"`` (codes read byte by byte) or ``"dot_scaled"``
    (``tl.dot_scaled``; GPU only, the interpreter lacks it). ``use_dot``: False makes
    the tiny path a GEMV (one token row at a time on the vector units, no MMA and no
    shared-memory staging: for one token per expert, i.e. decode at batch 1).
    """

    block_m: int = 64
    block_n: int = 64
    block_k: int = 64
    group_m: int = 8
    swap_ab: bool = False
    decode: str = "bits"
    use_dot: bool = True
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        if self.decode not in ("bits", "shared", "dot_scaled"):
            raise ValueError(f"decode: expected 'bits', 'shared' or 'dot_scaled', got {self.decode!r}")
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name}: expected a power of two >= 16, got {v}")
        if self.block_k < 32:
            raise ValueError("block_k: MXFP4 scales cover 32 values, so block_k must be >= 32")


#: moe_apply's path by token count. "tiny": no sort; one program per (expert, N tile)
#: streams that expert's weights once for every token routed to it (decode).
#: "grouped": sort the pairs by expert, then grouped GEMMs over row tiles (prefill).
#: The tiny path's row tile holds every token of one expert (at most T), so its
#: bound is also its largest row tile.
APPLY_PATH: dict[str, tuple[tuple[int | None, str], ...]] = {
    "nvidia": ((32, "tiny"), (None, "grouped")),
    "amd": ((32, "tiny"), (None, "grouped")),
    "interpret": ((8, "tiny"), (None, "grouped")),
}

#: Largest number of (token, slot) pairs sorted by one program (one launch instead of
#: three; above it a count / scan / scatter pipeline spreads the work).
SORT_SINGLE_PROGRAM_MAX_PAIRS: dict[str, int] = {"nvidia": 1024, "amd": 1024, "interpret": 64}
#: Pairs per program of the multi-program sort (a [block, E] one-hot lives in registers).
SORT_BLOCK: dict[str, int] = {"nvidia": 128, "amd": 128, "interpret": 32}
#: Elements of the [blocks, E] count tile the one-program scan reads per step.
SORT_SCAN_TILE: dict[str, int] = {"nvidia": 4096, "amd": 4096, "interpret": 8}
#: Memory-bound helpers: tokens per routing program (a [tokens, E] tile of logits),
#: (rows, hidden columns) per row-gather program, hidden columns per combine program.
ROUTE_BLOCK_T: dict[str, int] = {"nvidia": 16, "amd": 16, "interpret": 16}
#: ``moe_gate`` by token count: ``(block_t, block_k, dot, e_block)``, tokens per program, the K step, whether the
#: logits go through tensor cores (``tl.dot``, 16 tokens and more) or fp32 products accumulated on the CUDA cores
#: (few tokens), and the experts per program on the CUDA cores (0: all in one). A decode step's router (``W_r``,
#: 184 KB at GPT-OSS-20B's sizes) read by one program took 9.6 us in a CUDA graph on an H100 (session 23): its
#: loads wait on one SM's memory pipeline. Split four experts a program, 8 programs read it at 20B's 32 experts
#: and 32 at 120B's 128 (the last to finish routes). On an H200 (session 25, ``tools/gate_tile_probe.py``, flushed
#: graphs) one token's router took 6.6 us split against 15.4 in one program at 32 experts (7.8 against 42.8 at 128;
#: with the norm 9.1 / 9.8 against 21.0 / 64.2), and 8 tokens 8.9 against 15.4. Up to 8 tokens, a program a token
#: with a 2048 K step was faster still on an H100 (call 2: 6.4 / 6.4 / 6.5 us at 1 / 2 / 8 tokens, 32 experts,
#: against 6.5 / 8.9 / 8.9 for the rows before; 7.4 / 7.4 / 7.9 at 128; with the norm 8.0-8.1 against 9.0-12.7).
#: AMD keeps session 24's rows (no AMD GPU to measure). 8 warps; the CUDA-core rows keep ``block_t * experts a
#: program * block_k`` accumulators at 8192 (capped in the wrapper).
GATE_TILES: dict[str, tuple[tuple[int | None, tuple[int, int, bool, int]], ...]] = {
    "nvidia": ((8, (1, 2048, False, 4)), (15, (2, 512, False, 4)), (None, (16, 64, True, 0))),
    "amd": ((1, (1, 1024, False, 4)), (15, (2, 512, False, 4)), (None, (16, 64, True, 0))),
    "interpret": ((4, (2, 32, False, 4)), (None, (16, 32, True, 0))),
}
#: moe_gate's norm (norm_weight=): the most elements (tokens x the row's power of two) its first pass holds in one
#: tile; 8192 at 8 warps is 32 a thread. Wider rows or more tokens step through the row BLOCK_K at a time. The
#: interpreter's is small, so its tests take both paths.
NORM_TILE: dict[str, int] = {"nvidia": 8192, "amd": 8192, "interpret": 128}
GATHER_BLOCK: dict[str, tuple[int, int]] = {"nvidia": (16, 512), "amd": (16, 512), "interpret": (16, 512)}
COMBINE_BLOCK_H: dict[str, int] = {"nvidia": 1024, "amd": 1024, "interpret": 1024}

_G = GemmConfig
# GPT-OSS has H = I = 2880 = 45 * 64: block_k 64 divides every reduction, so the K
# loop needs no mask and weight rows load as 16-byte vectors; block_k 128 would
# leave a masked tail whose unknown constancy makes loads narrow. Deeper pipelines
# (num_stages) then keep enough weight bytes in flight for decode.

#: Tiny path, by weight kind ("mxfp4" or "dense": bf16/fp16/fp8) and GEMM ("gate_up",
#: "down"); keyed by tokens. block_m is set at launch (16 or the next power of two
#: of the token count; 1 for use_dot=False).
TINY_GEMM: dict[str, dict[str, dict[str, tuple[tuple[int | None, GemmConfig], ...]]]] = {
    # Hopper, MXFP4: measured (module doc; --sweep-tokens 1,8,32). The GEMV (no MMA, no shared-memory
    # staging) beats every MMA variant at 1, 8 and 32 tokens, though its PTX has more instructions per
    # weight value (276 for 2048 values per 128 threads, against 250 for the mma.sync tile that was
    # here). us per GEMM at 1 / 8 / 32 tokens: gate/up 37.3 / 170.1 / 610.9 (the MMA tile, n64:
    # 46.8-49.3 / 232-234 / 824-854); down 27.6 (n16) / 101.5 / 338.3 (the MMA tile, n32: 34.8-35.2 /
    # 159-168 / 577-598).
    "nvidia": {
        "mxfp4": {
            "gate_up": ((None, _G(block_n=64, block_k=64, use_dot=False, num_warps=4, num_stages=3)),),
            "down": (
                (1, _G(block_n=16, block_k=64, use_dot=False, num_warps=4, num_stages=3)),
                (None, _G(block_n=64, block_k=64, use_dot=False, num_warps=4, num_stages=3)),
            ),
        },
        # Dense weights (not measured): with 16 token rows tl.dot lowers to mma.sync (wgmma wants 64),
        # so the operands need no swap.
        "dense": {
            "gate_up": ((None, _G(block_n=64, block_k=64, num_warps=4, num_stages=4)),),
            "down": ((None, _G(block_n=32, block_k=64, num_warps=4, num_stages=4)),),
        },
    },
    "amd": {
        "mxfp4": {
            "gate_up": ((None, _G(block_n=64, block_k=64, swap_ab=True, num_warps=4, num_stages=2)),),
            "down": ((None, _G(block_n=32, block_k=64, swap_ab=True, num_warps=4, num_stages=2)),),
        },
        "dense": {
            "gate_up": ((None, _G(block_n=64, block_k=64, swap_ab=True, num_warps=4, num_stages=2)),),
            "down": ((None, _G(block_n=32, block_k=64, swap_ab=True, num_warps=4, num_stages=2)),),
        },
    },
    "interpret": {
        kind: {
            "gate_up": ((None, _G(block_n=128, block_k=64, num_stages=1)),),
            "down": ((None, _G(block_n=64, block_k=64, num_stages=1)),),
        }
        for kind in ("mxfp4", "dense")
    },
}

#: Grouped path, keyed by the number of (token, slot) pairs. Up to a few hundred
#: pairs most experts hold a handful of rows: 16-row tiles with swapped operands;
#: above, 64 / 128-row tiles make the MMA the bound.
GROUPED_GEMM: dict[str, dict[str, dict[str, tuple[tuple[int | None, GemmConfig], ...]]]] = {
    "nvidia": {
        # Measured (module doc), us per GEMM at 128 / 512 / 4096 / 16384 tokens (512 ... 65536 pairs).
        # gate_up: 64-row tiles with 4 warps win from 2048 pairs on (2302 vs 3264 us for the earlier
        # 128-row, 8-warp tile at 4096 tokens; 7581 vs 9471 at 16384); 3 stages beat 4 (989 vs 1112 at 512).
        # down: 128-row tiles from 16384 pairs (1107 vs 1154 us at 4096 tokens, 3140 vs 3825 at 16384).
        "mxfp4": {
            "gate_up": (
                (512, _G(block_m=16, block_n=128, block_k=64, swap_ab=True, num_warps=4, num_stages=3)),  # 774
                (None, _G(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=3)),  # 989 / 2302 / 7581
            ),
            "down": (
                (512, _G(block_m=16, block_n=64, block_k=64, swap_ab=True, num_warps=4, num_stages=3)),  # 421
                (4096, _G(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=3)),  # 506
                (None, _G(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)),  # 1108 / 3140
            ),
        },
        "dense": {  # not measured
            gemm: (
                (512, _G(block_m=16, block_n=64, block_k=64, swap_ab=True, num_warps=4, num_stages=4)),
                (4096, _G(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=4)),
                (None, _G(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)),
            )
            for gemm in ("gate_up", "down")
        },
    },
    "amd": {
        kind: {
            gemm: (
                (512, _G(block_m=16, block_n=64, block_k=64, swap_ab=True, num_warps=4, num_stages=2)),
                (None, _G(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=2)),
            )
            for gemm in ("gate_up", "down")
        }
        for kind in ("mxfp4", "dense")
    },
    "interpret": {
        kind: {
            "gate_up": ((None, _G(block_m=16, block_n=128, block_k=64, num_stages=1)),),
            "down": ((None, _G(block_m=16, block_n=64, block_k=64, num_stages=1)),),
        }
        for kind in ("mxfp4", "dense")
    },
}


def family_of(device: torch.device) -> str:
    """The arch family of a torch device: ``"nvidia"``, ``"amd"`` or ``"interpret"``."""
    return arch_family(device)


def lookup(rows: tuple[tuple[int | None, object], ...], size: int) -> object:
    """The value of the first row whose bound is ``None`` or ``>= size``."""
    for bound, value in rows:
        if bound is None or size <= bound:
            return value
    return rows[-1][1]


def apply_path(family: str, tokens: int) -> str:
    """``"tiny"`` or ``"grouped"`` for a moe_apply call of ``tokens`` tokens."""
    return str(lookup(APPLY_PATH[family], tokens))


def gemm_config(family: str, path: str, weight_kind: str, gemm: str, size: int) -> GemmConfig:
    """The tile config for one GEMM (``path`` "tiny": ``size`` = tokens, else pairs)."""
    table = TINY_GEMM if path == "tiny" else GROUPED_GEMM
    cfg = lookup(table[family][weight_kind][gemm], size)
    assert isinstance(cfg, GemmConfig)
    return cfg

"""Tile configurations of the dense Triton kernels, as data: per op, per arch family.

Families: ``"nvidia"`` (CUDA devices), ``"amd"`` (ROCm devices) and ``"interpret"``
(CPU tensors under ``TRITON_INTERPRET=1``, sized for test speed, not performance).
Every table carries a note saying where its numbers were measured; a kernel reads
its config through :func:`arch_family` and the op's table, never from constants
scattered in the code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "FAMILIES",
    "MEASURED",
    "MMConfig",
    "RowConfig",
    "SampleConfig",
    "MM_CONFIGS",
    "RMSNORM_CONFIGS",
    "ROW_CONFIGS",
    "SAMPLE_CONFIGS",
    "arch_family",
    "mm_config",
    "rmsnorm_config",
    "row_config",
    "sample_config",
]

FAMILIES = ("nvidia", "amd", "interpret")

#: Where each family's numbers come from. Update the line when a table is tuned.
MEASURED: dict[str, str] = {
    "nvidia": (
        "H200, 2026-11-30, do_bench: mm decode rows (M <= 16: no split-K / GEMV, measured slower under "
        "do_bench; M <= 64 MXFP4 split-K measured faster) and rmsnorm at > 8192 rows; the other rows "
        "(prefill mm stages, rmsnorm <= 8192 rows, sampler) reasoned from Hopper practice, see the notes "
        "at each table"
    ),
    "amd": "not yet measured on hardware (starting points from CDNA3 Triton practice)",
    "interpret": "sized for TRITON_INTERPRET test speed on CPU; not a performance config",
}


def arch_family(device: torch.device) -> str:
    """``"interpret"`` for CPU tensors, else ``"amd"`` on ROCm builds of torch, else ``"nvidia"``."""
    if device.type == "cpu":
        return "interpret"
    return "amd" if torch.version.hip else "nvidia"


@dataclass(frozen=True)
class MMConfig:
    """One GEMM tile: ``BLOCK_M x BLOCK_N`` outputs per program, ``BLOCK_K`` per step.

    ``group_m``: programs are walked in column groups of this many row tiles so
    that neighbouring programs share B tiles in L2. ``dot_in_fp32``: upcast both
    operands to fp32 before ``tl.dot`` (the interpreter multiplies bf16 storage as
    raw integers, so its config needs this; GPUs never do). ``fp8_imprecise_acc``:
    how many K elements Hopper's fp8 wgmma may sum in its reduced-precision
    accumulator before promoting to fp32 (None = Triton's default, i.e. never).
    ``split_k``: at most this many K slices (fp32 partials, then an ordered reduction);
    ``split_target``: use only as many slices as it takes for the output tiles times the
    slices to reach this many programs (0 = always ``split_k``). ``gemv``: MXFP4 weights
    only, the MMA-free GEMV kernel for a handful of rows (``block_m`` = rows per program).
    ``launch``: extra backend launch options (e.g. AMD ``waves_per_eu``).
    """

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    dot_in_fp32: bool = False
    fp8_imprecise_acc: int | None = None
    split_k: int = 1
    split_target: int = 0
    gemv: bool = False
    launch: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RowConfig:
    """A row-wise kernel: ``block`` elements of the row per step, ``rows`` rows per program.
    ``two_tiles`` (rmsnorm): hold a whole row as two power-of-two tiles instead of one."""

    block: int
    num_warps: int = 4
    rows: int = 1
    two_tiles: bool = False
    launch: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SampleConfig:
    """Sampler: each program of a full pass owns ``block * steps`` vocabulary entries of
    one row; ``cap``: candidates a single program sorts to finish a row (the top-k set, or
    the entries left around the top-p threshold); ``probes``: thresholds per pass of the
    exact per-row search used when more than ``cap`` entries tie around the threshold."""

    block: int
    steps: int
    cap: int
    probes: int = 16
    num_warps: int = 8


# mm: per family, per operand kind, (largest M, config) rows tried in order; the
# last row has M = None (any). Kinds: "16bit" (bf16/fp16), "fp32", "fp8"
# (per-tensor/row scales), "fp8_block128" (BLOCK_K must divide 128), "mxfp4"
# (BLOCK_K a multiple of 32).
#
# Small M is weight-streaming bound and short of programs: GPT-OSS's QKV projection
# (N = 5120) is 320 tiles of 16, its O projection (N = 2880) 180, on 132 SMs, each tile
# walking all of K. Split-K (split_k / split_target, ~4 programs per SM) multiplies the
# programs in flight; MXFP4 decode also spends ALU time per weight value, which split-K
# spreads over more SMs. ``gemv=True`` rows (MXFP4, a few rows) take the MMA-free GEMV.
#
# NVIDIA (H200), measured 2026-11-30 with do_bench (--quick bench): bf16 mm 0.53-0.75x
# cuBLAS, fp8 0.39-0.59x; at M <= 16, split-K (bf16/fp8) and the GEMV + split-K (MXFP4)
# measured 2-4x slower than the plain tiles, so those rows are plain again. do_bench
# times a Python call: the split paths' extra launch and allocation add CPU time that
# can exceed the L2-flush memset do_bench queues first, so part of that gap may be host
# overhead a CUDA-graph decode step does not pay; the bench's "graph us" column and
# --sweep (graph-timed, split-K and GEMV configs included) tell. Reasoned, not measured:
# prefill bf16 128x256x64 with 4 stages (4 x 48 KB of smem, under the 227 KB; wgmma
# m64n256 per warpgroup, 8 warps); fp8 128x256x128 with 4 stages (4 x 48 KB).
_NV_FP8_ACC = 128
_SPLIT_TARGET = 4 * 132  # programs: about four per H200 SM
MM_CONFIGS: dict[str, dict[str, tuple[tuple[int | None, MMConfig], ...]]] = {
    "nvidia": {
        "16bit": (
            # M <= 16 bf16/fp16: no split-K. Measured on the H200 (2026-11-30, --quick): qkv M=1
            # 30.8 us without split-K, 115.3 us with split_k=4.
            (16, MMConfig(16, 16, 256, num_warps=4, num_stages=4)),
            (64, MMConfig(64, 64, 64, num_warps=4, num_stages=4)),
            (256, MMConfig(128, 128, 64, num_warps=8, num_stages=3)),
            (None, MMConfig(128, 256, 64, num_warps=8, num_stages=4)),
        ),
        "fp32": ((None, MMConfig(64, 64, 32, num_warps=4, num_stages=3)),),
        "fp8": (
            # fp8 M <= 16: no split-K (H200: o M=1 28.6 us without, 105 us with split_k=4).
            (16, MMConfig(16, 16, 256, num_warps=4, num_stages=4, fp8_imprecise_acc=_NV_FP8_ACC)),
            (64, MMConfig(64, 64, 128, num_warps=4, num_stages=4, fp8_imprecise_acc=_NV_FP8_ACC)),
            (None, MMConfig(128, 256, 128, num_warps=8, num_stages=4, fp8_imprecise_acc=_NV_FP8_ACC)),
        ),
        "fp8_block128": (
            # no split-K at M <= 16, as the measured bf16/fp8 rows (not measured here)
            (16, MMConfig(16, 32, 128, num_warps=4, num_stages=4)),
            (64, MMConfig(64, 64, 128, num_warps=4, num_stages=4)),
            # 128x128: the per-step partial product doubles the accumulator registers
            (None, MMConfig(128, 128, 128, num_warps=8, num_stages=3)),
        ),
        "mxfp4": (
            # MXFP4 M <= 16: the call-2 tile (H200: qkv M=1 46.5 us; the GEMV + split_k=8 row
            # measured 92.1 us). M <= 64 keeps split_k=4 (qkv M=64 63.7 -> 40.1 us).
            (16, MMConfig(16, 32, 256, num_warps=4, num_stages=4)),
            (64, MMConfig(64, 64, 128, num_warps=4, num_stages=4, split_k=4, split_target=_SPLIT_TARGET)),
            (None, MMConfig(128, 128, 128, num_warps=8, num_stages=3)),
        ),
    },
    # Sized so that neither gfx942 nor gfx950 spills VGPRs (checked by the cross-compile
    # test); 256-wide tiles spilled 100+ VGPRs on both. gfx942 has no OCP fp8 MFMA, so
    # its fp8 tiles also pay for the conversion to fp16 in registers. Not measured on
    # hardware; split-K on the decode rows as on NVIDIA (MI300X/MI355X: 304/256 CUs).
    "amd": {
        "16bit": (
            (16, MMConfig(16, 64, 128, num_warps=4, num_stages=2, split_k=4, split_target=4 * 304)),
            (64, MMConfig(64, 64, 64, num_warps=4, num_stages=2)),
            (None, MMConfig(128, 128, 64, num_warps=8, num_stages=2)),
        ),
        "fp32": ((None, MMConfig(64, 64, 32, num_warps=4, num_stages=2)),),
        "fp8": (
            (16, MMConfig(16, 64, 64, num_warps=4, num_stages=2, split_k=4, split_target=4 * 304)),
            (64, MMConfig(64, 64, 64, num_warps=4, num_stages=2)),
            (None, MMConfig(128, 64, 64, num_warps=4, num_stages=2)),
        ),
        "fp8_block128": (
            (16, MMConfig(16, 64, 64, num_warps=4, num_stages=2, split_k=4, split_target=4 * 304)),
            (None, MMConfig(64, 64, 64, num_warps=4, num_stages=2)),
        ),
        "mxfp4": (
            (4, MMConfig(4, 64, 256, num_warps=4, num_stages=1, gemv=True, split_k=8, split_target=4 * 304)),
            (16, MMConfig(16, 64, 128, num_warps=4, num_stages=2, split_k=8, split_target=4 * 304)),
            (64, MMConfig(64, 64, 64, num_warps=4, num_stages=2, split_k=4, split_target=4 * 304)),
            (None, MMConfig(128, 128, 64, num_warps=8, num_stages=2)),
        ),
    },
    # Small tiles so the tests exercise several programs, K tails, wrap-around rows,
    # split-K (two slices at M <= 2) and the MXFP4 GEMV.
    "interpret": {
        "16bit": (
            (2, MMConfig(16, 16, 32, group_m=2, dot_in_fp32=True, split_k=2)),
            (None, MMConfig(16, 16, 32, group_m=2, dot_in_fp32=True)),
        ),
        "fp32": ((None, MMConfig(16, 16, 32, group_m=2, dot_in_fp32=True)),),
        "fp8": ((None, MMConfig(16, 16, 32, group_m=2, dot_in_fp32=True)),),
        "fp8_block128": ((None, MMConfig(16, 16, 32, group_m=2, dot_in_fp32=True)),),
        "mxfp4": (
            (2, MMConfig(2, 16, 64, gemv=True, split_k=2)),
            (None, MMConfig(16, 16, 64, group_m=2, dot_in_fp32=True)),
        ),
    },
}

# rmsnorm, by row count: (largest row count, config), the last row catch-all. "block" is
# the widest row kept whole in registers (one read of x); longer rows take two passes.
# A GPT-OSS row (2880 bf16) is 360 16-byte vectors: one 4096-lane tile, or with
# ``two_tiles`` a 2048 + 1024-lane pair (a quarter fewer registers, but two reductions).
# H200, do_bench (2026-11-30), TB/s plain / with residual:
#   1 row per program, 8 warps, one tile:      4096 rows 2.52 / 2.30, 16384 rows 3.79 / 3.93
#   (this table's previous version) <= 8192 rows: 2 rows / 4 warps, two tiles: 4096 rows
#   2.59 / 2.84; more: 1 row / 8 warps, two tiles: 16384 rows 3.07 / 3.87
# so: 2 rows / 4 warps / two tiles up to 8192 rows (the residual case gained 23 %), one
# tile at 1 row / 8 warps above (two tiles lost 20 % there, plain). 4096 rows stays under
# the 3.6 TB/s target; the bench's copy-of-the-same-bytes and graph columns show how much
# of that is do_bench's fixed cost at 47 MB. Decode (<= 256 rows, reasoned): latency
# bound, one row over 8 warps, one tile (one reduction). --sweep times rows x warps.
RMSNORM_CONFIGS: dict[str, tuple[tuple[int | None, RowConfig], ...]] = {
    "nvidia": (
        (256, RowConfig(block=4096, num_warps=8, rows=1)),
        (8192, RowConfig(block=4096, num_warps=4, rows=2, two_tiles=True)),
        (None, RowConfig(block=4096, num_warps=8, rows=1)),
    ),
    # AMD (not measured): 64-lane wavefronts, so 4 warps is 256 lanes, like 8 NVIDIA warps.
    "amd": (
        (256, RowConfig(block=4096, num_warps=4, rows=1)),
        (8192, RowConfig(block=4096, num_warps=4, rows=2, two_tiles=True)),
        (None, RowConfig(block=4096, num_warps=4, rows=1)),
    ),
    "interpret": (
        (4, RowConfig(block=64, rows=2)),
        (None, RowConfig(block=64, rows=2, two_tiles=True)),
    ),
}

# Row-wise kernels: "block" is the widest row chunk a program holds at once.
ROW_CONFIGS: dict[str, dict[str, RowConfig]] = {
    "swiglu": {
        "nvidia": RowConfig(block=1024, num_warps=4),
        "amd": RowConfig(block=1024, num_warps=4),
        "interpret": RowConfig(block=16),
    },
    # rows = heads per program; block = head_dim rounded up (set per call).
    "apply_rotary": {
        "nvidia": RowConfig(block=0, rows=16, num_warps=4),
        "amd": RowConfig(block=0, rows=16, num_warps=4),
        "interpret": RowConfig(block=0, rows=2),
    },
    # quantize_fp8 per-token / per-tensor: block = K chunk; rows = rows per program.
    "quantize_fp8": {
        "nvidia": RowConfig(block=4096, num_warps=8),
        "amd": RowConfig(block=4096, num_warps=8),
        "interpret": RowConfig(block=32, rows=2),
    },
    # quantize_fp8 block128: rows = 128-blocks per program (of one row).
    "quantize_fp8_block128": {
        "nvidia": RowConfig(block=128, rows=8, num_warps=4),
        "amd": RowConfig(block=128, rows=8, num_warps=4),
        "interpret": RowConfig(block=128, rows=2),
    },
    # MXFP4: rows = 32-value groups per program.
    "quantize_mxfp4": {
        "nvidia": RowConfig(block=32, rows=64, num_warps=4),
        "amd": RowConfig(block=32, rows=64, num_warps=4),
        "interpret": RowConfig(block=32, rows=2),
    },
    "dequantize_mxfp4": {
        "nvidia": RowConfig(block=1024, rows=4, num_warps=4),
        "amd": RowConfig(block=1024, rows=4, num_warps=4),
        "interpret": RowConfig(block=64, rows=2),
    },
    # argmax: block = elements per step; rows = steps per chunk of stage one (a
    # chunk is block * rows logits; 201088 / 4096 -> 50 chunks per row).
    "argmax": {
        "nvidia": RowConfig(block=1024, rows=4, num_warps=4),
        "amd": RowConfig(block=1024, rows=4, num_warps=4),
        "interpret": RowConfig(block=128, rows=2),
    },
}

# Sampler: 8192 entries per program puts a 64 x 201088 batch on 1600 programs (~12 per
# H200 SM) with 16-byte loads (8 bf16 per thread per step at 8 warps); 1024 candidates
# cover top-k up to ~1000 and the entries left in the top-p interval after three
# 256-bucket narrowing passes. Reasoned, not yet measured (the previous one-program-per-row
# search took 5.3 ms at 64 x 201088 on the H200). The interpreter's tiny chunks and cap
# send test rows through every path (several chunks, overflowing candidate sets).
SAMPLE_CONFIGS: dict[str, SampleConfig] = {
    "nvidia": SampleConfig(block=2048, steps=4, cap=1024, probes=16, num_warps=8),
    "amd": SampleConfig(block=2048, steps=4, cap=1024, probes=16, num_warps=8),
    "interpret": SampleConfig(block=256, steps=2, cap=16, probes=8, num_warps=4),
}


def mm_config(kind: str, m: int, device: torch.device, *, gemv: bool = True) -> MMConfig:
    """The GEMM tile for operand ``kind`` at ``m`` rows on ``device``'s family
    (``gemv=False``: skip GEMV rows, for MXFP4 codes the GEMV cannot read)."""
    for max_m, cfg in MM_CONFIGS[arch_family(device)][kind]:
        if (max_m is None or m <= max_m) and (gemv or not cfg.gemv):
            return cfg
    raise AssertionError(f"mm config table for {kind!r} has no catch-all row")


def rmsnorm_config(n_rows: int, device: torch.device) -> RowConfig:
    """The rmsnorm config for ``n_rows`` rows on ``device``'s family."""
    for max_rows, cfg in RMSNORM_CONFIGS[arch_family(device)]:
        if max_rows is None or n_rows <= max_rows:
            return cfg
    raise AssertionError("rmsnorm config table has no catch-all row")


def row_config(op: str, device: torch.device) -> RowConfig:
    return ROW_CONFIGS[op][arch_family(device)]


def sample_config(device: torch.device) -> SampleConfig:
    return SAMPLE_CONFIGS[arch_family(device)]

"""Tile configurations of the Triton attention kernels, as data.

One table per op and arch family (``"nvidia"``, ``"amd"``, ``"interpret"`` for
Triton's CPU interpreter). Prefill/extend tables are keyed by head_dim; a missing
head_dim falls back to the nearest smaller key (or the smallest). Every entry is a
plain dict so a benchmark sweep can try others without editing kernels
(``tools/bench_triton_attention.py --sweep``), and the winners are pasted here.

Meaning of the keys:

- ``BLOCK_M``: rows of a prefill tile. Rows are (query token, query head of the KV
  head's group) pairs, so a tile holds ``BLOCK_M // group`` tokens and every query
  head of the group shares one K/V load.
- ``BLOCK_N``: keys per inner-loop step (prefill/extend and decode).
- ``num_warps``, ``num_stages``: Triton launch options (``num_stages`` is the
  software-pipelining depth of the K/V loop).
- ``waves_per_eu``: AMD occupancy hint (ignored elsewhere).
- ``DOT_FP32``: upcast MMA operands to fp32 (interpreter only: Triton 3.6's
  interpreter multiplies bf16 storage bits as integers).
- decode ``max_heads_per_tile``: query heads of one group handled by one program;
  larger groups are split over several programs.
- decode split-KV: ``ctas_per_sm`` (programs wanted per SM/CU before splitting
  stops), ``min_tokens_per_split`` (a split never gets fewer keys than this, so the
  merge stays cheap), ``max_splits``; ``num_sms`` is only used where the device
  cannot be queried (the interpreter).

Provenance: unless an entry says otherwise, it has NOT yet been measured on
hardware; values are starting points from the usual FlashAttention-in-Triton
choices (128-row tiles, 64-key steps, 3-stage pipelines on Hopper, 1-2 stages on
CDNA).
"""

from __future__ import annotations

from typing import Any

import torch

from .._host import arch_family

__all__ = [
    "PREFILL_CONFIGS",
    "EXTEND_CONFIGS",
    "DECODE_CONFIGS",
    "STORE_CONFIGS",
    "arch_family",
    "prefill_config",
    "extend_config",
    "decode_config",
    "store_config",
]

Config = dict[str, Any]

#: mha_prefill: arch family -> head_dim -> config.
PREFILL_CONFIGS: dict[str, dict[int, Config]] = {
    "nvidia": {
        # Not yet measured on hardware (H200 sweep pending: tools/bench_triton_attention.py --sweep).
        16: {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3},
        128: {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3},
        256: {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2},
    },
    "amd": {
        # Not timed on hardware (no MI300/MI355 available to this project yet). 8 warps at
        # head_dim <= 128 because the gfx942/gfx950 cross-compile of the head_dim-64,
        # group-8 kernel needs ~200 VGPRs at 8 warps (2 waves/SIMD) against ~290 at 4
        # (1 wave), with no spills either way.
        16: {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2},
        256: {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 1},
    },
    "interpret": {
        # Small tiles so CPU tests cross block, window and causal boundaries on tiny shapes.
        16: {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1, "DOT_FP32": True},
    },
}

#: mha_extend_with_kvcache: the prefill kernel with paged K/V loads. Starts as a copy of
#: the prefill table (not yet measured separately on hardware).
EXTEND_CONFIGS: dict[str, dict[int, Config]] = {
    family: {head_dim: dict(cfg) for head_dim, cfg in table.items()} for family, table in PREFILL_CONFIGS.items()
}

#: mha_decode_with_kvcache: arch family -> head_dim -> config (split-KV + merge).
DECODE_CONFIGS: dict[str, dict[int, Config]] = {
    "nvidia": {
        # Not yet measured on hardware.
        16: {
            "BLOCK_N": 64,
            "num_warps": 4,
            "num_stages": 3,
            "max_heads_per_tile": 16,
            "ctas_per_sm": 4,
            "min_tokens_per_split": 256,
            "max_splits": 64,
        },
        256: {
            "BLOCK_N": 32,
            "num_warps": 4,
            "num_stages": 2,
            "max_heads_per_tile": 16,
            "ctas_per_sm": 4,
            "min_tokens_per_split": 256,
            "max_splits": 64,
        },
    },
    "amd": {
        # Not yet measured on hardware.
        16: {
            "BLOCK_N": 64,
            "num_warps": 4,
            "num_stages": 2,
            "waves_per_eu": 2,
            "max_heads_per_tile": 16,
            "ctas_per_sm": 4,
            "min_tokens_per_split": 256,
            "max_splits": 64,
        },
        256: {
            "BLOCK_N": 32,
            "num_warps": 4,
            "num_stages": 1,
            "waves_per_eu": 2,
            "max_heads_per_tile": 16,
            "ctas_per_sm": 4,
            "min_tokens_per_split": 256,
            "max_splits": 64,
        },
    },
    "interpret": {
        # num_sms/min_tokens_per_split small so tiny test contexts still split.
        16: {
            "BLOCK_N": 16,
            "num_warps": 4,
            "num_stages": 1,
            "max_heads_per_tile": 16,
            "ctas_per_sm": 2,
            "min_tokens_per_split": 16,
            "max_splits": 4,
            "num_sms": 2,
            "DOT_FP32": True,
        },
    },
}

#: kvcache_store: elements (heads x head_dim) copied per program.
STORE_CONFIGS: dict[str, Config] = {
    "nvidia": {"elements_per_program": 2048, "num_warps": 4},  # not yet measured on hardware
    "amd": {"elements_per_program": 2048, "num_warps": 4},  # not yet measured on hardware
    "interpret": {"elements_per_program": 4096, "num_warps": 4},
}


def _by_head_dim(table: dict[int, Config], head_dim: int) -> Config:
    keys = sorted(table)
    best = keys[0]
    for k in keys:
        if k <= head_dim:
            best = k
    return dict(table[best])


def prefill_config(device: torch.device, head_dim: int) -> Config:
    return _by_head_dim(PREFILL_CONFIGS[arch_family(device)], head_dim)


def extend_config(device: torch.device, head_dim: int) -> Config:
    return _by_head_dim(EXTEND_CONFIGS[arch_family(device)], head_dim)


def decode_config(device: torch.device, head_dim: int) -> Config:
    return _by_head_dim(DECODE_CONFIGS[arch_family(device)], head_dim)


def store_config(device: torch.device) -> Config:
    return dict(STORE_CONFIGS[arch_family(device)])

"""Host-side launch planning of the attention kernels (grids, splits, cache addressing), CPU only."""

from __future__ import annotations

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel_amd.cdna.arch import GFX942, GFX950
from tokenspeed_kernel_amd.cdna.attention import decode_num_splits


def test_prefill_grid_packs_the_gqa_group_into_the_tile(recorded_launches):
    # GPT-OSS: 64 query heads over 8 KV heads -> 128-row tiles of 16 tokens x 8 heads.
    cu = torch.tensor([0, 100, 133], dtype=torch.int32)
    q = torch.randn(133, 64, 64, dtype=torch.bfloat16)
    k = torch.randn(133, 8, 64, dtype=torch.bfloat16)
    with tk.fake_platform("gfx950"):
        out = tk.mha_prefill(q, k, k, cu, cu, 100, 100, window_left=127, sinks=torch.zeros(64))
    [launch] = recorded_launches
    assert launch.grid == (7, 2, 8)  # ceil(100 / 16) query tiles, 2 sequences, 8 KV heads
    assert launch.kwargs["BLOCK_M"] == 128 and launch.kwargs["GROUP"] == 8
    assert launch.kwargs["WINDOW"] and launch.kwargs["HAS_SINKS"] and launch.kwargs["CAUSAL"]
    assert launch.kwargs["ASYNC_COPY"] and launch.kwargs["MFMA_VERSION"] == 4
    assert launch.args[3] is out  # the kernel writes the tensor the op returns


@pytest.mark.parametrize(
    "arch,batch,kv_heads,max_keys,window_left,expected",
    [
        (GFX950, 1, 8, 8192, -1, 64),  # 2 programs per CU on 256 CUs: 512 / 8 heads, capped at 64
        (GFX950, 1, 8, 8192, 127, 3),  # a 128-key window touches at most 3 blocks of 64
        (GFX950, 64, 8, 2048, -1, 1),  # 512 programs already fill the GPU
        (GFX950, 4, 8, 2048, -1, 16),
        (GFX942, 4, 8, 2048, -1, 19),  # 304 CUs: ceil(608 / 32)
        (GFX950, 1, 8, 100, -1, 2),  # never more splits than key blocks
    ],
)
def test_decode_splits_depend_on_shapes_only(arch, batch, kv_heads, max_keys, window_left, expected):
    cus = arch.default_compute_units
    assert decode_num_splits(arch, batch, kv_heads, max_keys, window_left, cus) == expected


@pytest.mark.parametrize("page_size,kv_mode", [(16, 2), (64, 1), (256, 1), (1, 2), (48, 2)])
def test_decode_cache_addressing_mode(recorded_launches, page_size, kv_mode):
    # Tiles of 64 keys: inside one page when 64 divides the page size, else gathered.
    q = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    cache = torch.randn(4096 // page_size + 1, page_size, 1, 64, dtype=torch.bfloat16)
    table = torch.zeros(2, 4096 // page_size, dtype=torch.int32)
    with tk.fake_platform("gfx942"):
        tk.mha_decode_with_kvcache(q, cache, cache, table, torch.tensor([5, 4000], dtype=torch.int32))
    assert recorded_launches[0].kwargs["KV_MODE"] == kv_mode
    assert recorded_launches[0].kwargs["ASYNC_COPY"] is False
    assert recorded_launches[0].kwargs["PAGE_SIZE"] == page_size

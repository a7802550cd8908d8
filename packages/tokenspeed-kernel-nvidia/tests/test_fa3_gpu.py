"""FA3 wrappers against the PyTorch reference at GPT-OSS shapes (H200)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.reference import attention as ref

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("flash_attn_interface") is None, reason="tokenspeed-fa3 absent"),
]
HQ, HKV, D = 64, 8, 64


def _close(a, b, what):
    err = (a.float() - b.float()).abs().max().item()
    assert err < 2e-2, f"{what}: max abs error {err}"


def _packed(lens, h, dev="cuda"):
    return torch.randn(sum(lens), h, D, device=dev, dtype=torch.bfloat16)


@pytest.mark.parametrize("window_left", [-1, 127])
@pytest.mark.parametrize("lens", [[1024], [300, 1, 777, 129]])
def test_prefill_matches_reference(lens, window_left):
    torch.manual_seed(0)
    q, k, v = _packed(lens, HQ), _packed(lens, HKV), _packed(lens, HKV)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    sinks = torch.randn(HQ, device="cuda", dtype=torch.float32)
    args = (q, k, v, cu, cu, max(lens), max(lens))
    kw = dict(window_left=window_left, sinks=sinks)
    _close(tk.mha_prefill(*args, **kw, solution="fa3"), tk.mha_prefill(*args, **kw, solution="reference"), "out")


def _paged_cache(lens, page_size):
    pages_per = [-(-n // page_size) for n in lens]
    total = sum(pages_per) + 3
    perm = torch.randperm(total, device="cuda")
    k_cache = torch.randn(total, page_size, HKV, D, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    table = torch.zeros(len(lens), max(pages_per), dtype=torch.int32, device="cuda")
    at = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = perm[at : at + n].int()
        at += n
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return k_cache, v_cache, table, seqlens


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("window_left", [-1, 127])
def test_decode_matches_reference(page_size, window_left):
    torch.manual_seed(1)
    lens = [1, 200, 1000, 4097]
    k_cache, v_cache, table, seqlens = _paged_cache(lens, page_size)
    q = torch.randn(len(lens), HQ, D, device="cuda", dtype=torch.bfloat16)
    sinks = torch.randn(HQ, device="cuda")
    kw = dict(window_left=window_left, sinks=sinks)
    out = tk.mha_decode_with_kvcache(q, k_cache, v_cache, table, seqlens, **kw, solution="fa3")
    _close(out, tk.mha_decode_with_kvcache(q, k_cache, v_cache, table, seqlens, **kw, solution="reference"), "out")


def test_lse_is_not_offered():
    """FA3 rounds sinks to the q dtype; calls asking for lse are routed elsewhere."""
    cands = tk.explain_selection("mha_prefill", ("bf16", "bf16"), {"head_dim": 64, "gqa_group": 8, "return_lse": True},
                                 platform=tk.current_platform())  # fmt: skip
    assert next(c for c in cands if c.name == "fa3.mha_prefill").reason == "trait return_lse=True (supports False)"


@pytest.mark.parametrize("page_size", [16])
def test_extend_matches_reference(page_size):
    torch.manual_seed(2)
    lens = [100, 700, 33]
    qlens = [5, 300, 33]
    k_cache, v_cache, table, seqlens = _paged_cache(lens, page_size)
    q = _packed(qlens, HQ)
    cu = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    sinks = torch.randn(HQ, device="cuda")
    args = (q, k_cache, v_cache, table, seqlens, cu, max(qlens))
    kw = dict(window_left=127, sinks=sinks)
    _close(
        tk.mha_extend_with_kvcache(*args, **kw, solution="fa3"),
        tk.mha_extend_with_kvcache(*args, **kw, solution="reference"),
        "out",
    )


def test_selection_picks_fa3_on_h200():
    q = torch.randn(8, HQ, D, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor([0, 8], dtype=torch.int32, device="cuda")
    sel = tk.select_spec("mha_prefill", ("bf16", "bf16"), {"head_dim": 64, "gqa_group": 8, "sinks": True, "window": True},
                         platform=tk.current_platform())  # fmt: skip
    assert sel.spec.solution in ("fa3", "triton", "gluon")
    del q, cu
    assert ref  # the reference module imports on GPU machines too

"""The Gluon kernels against the PyTorch reference, on an AMD GPU (gfx942 / gfx950).

Gluon has no CPU interpreter, so these are the only numerics tests of this package
and they skip everywhere else (CUDA machines included). Until they have run on an
AMD GPU the kernels stay registered with ``hardware_validated=False``.

Tolerances: bf16/fp16 outputs at a few output ulps (P is rounded to the input dtype
before the second MFMA, as FlashAttention does); the fp32 LSE tightly.
"""

from __future__ import annotations

from importlib import import_module

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.reference import attention as ref_attention
from tokenspeed_kernel.reference import norm as ref_norm


def _amd_arch() -> str | None:
    if not torch.cuda.is_available() or not torch.version.hip:
        return None
    arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    return arch if arch in ("gfx942", "gfx950") else None


ARCH = _amd_arch()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(ARCH is None, reason="needs an AMD gfx942 / gfx950 GPU")]
_TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2}
_LSE_TOL = 1e-3


def _attention():
    return import_module(f"tokenspeed_kernel_amd.{ARCH}.attention")


def _close(out, expected, dtype):
    torch.testing.assert_close(out.float(), expected.float(), atol=_TOL[dtype], rtol=_TOL[dtype])


def _close_lse(lse, expected):
    assert torch.equal(torch.isneginf(lse), torch.isneginf(expected))
    finite = torch.isfinite(expected)
    torch.testing.assert_close(lse[finite], expected[finite], atol=_LSE_TOL, rtol=_LSE_TOL)


@pytest.mark.parametrize(
    "dtype,head_dim,hq,hkv,q_lens,k_lens,kw",
    [
        # GPT-OSS sliding layer: window 128 keys, sinks, group of 8.
        (torch.bfloat16, 64, 64, 8, [1, 300, 1029], [1, 300, 1029], dict(window_left=127, sinks=True)),
        # GPT-OSS full layer, plus a chunk whose queries sit at the end of longer keys.
        (torch.bfloat16, 64, 64, 8, [700, 65], [700, 513], dict(sinks=True, return_lse=True)),
        (torch.float16, 128, 8, 2, [130, 77], [200, 77], dict(causal=False, logit_cap=30.0, return_lse=True)),
        (torch.bfloat16, 128, 16, 1, [333], [333], dict(window_left=40, return_lse=True)),
        # More queries than keys: the first queries see nothing (zeros, lse -inf).
        (torch.float16, 64, 4, 4, [90], [50], dict(return_lse=True)),
    ],
)
def test_prefill_matches_reference(dtype, head_dim, hq, hkv, q_lens, k_lens, kw):
    torch.manual_seed(0)
    dev = "cuda"
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    q = torch.randn(sum(q_lens), hq, head_dim, dtype=dtype, device=dev)
    k = torch.randn(sum(k_lens), hkv, head_dim, dtype=dtype, device=dev)
    v = torch.randn(sum(k_lens), hkv, head_dim, dtype=dtype, device=dev)
    kw = dict(kw)
    if kw.pop("sinks", False):
        kw["sinks"] = torch.randn(hq, device=dev)
    scale = head_dim**-0.5
    args = (q, k, v, cu_q, cu_k, max(q_lens), max(k_lens))
    got = _attention().mha_prefill(*args, softmax_scale=scale, **kw)
    want = ref_attention.mha_prefill(*args, softmax_scale=scale, **{"causal": True, "window_left": -1, **kw})
    if kw.get("return_lse"):
        _close(got[0], want[0], dtype)
        _close_lse(got[1], want[1])
    else:
        _close(got, want, dtype)


@pytest.mark.parametrize(
    "dtype,head_dim,hq,hkv,page_size,lens,kw",
    [
        (torch.bfloat16, 64, 64, 8, 16, [1, 127, 128, 129, 3000], dict(window_left=127, sinks=True)),
        (torch.bfloat16, 64, 64, 8, 16, [5000, 17], dict(sinks=True, return_lse=True)),
        (torch.float16, 128, 32, 8, 64, [64, 1000], dict(logit_cap=30.0, return_lse=True)),
        (torch.bfloat16, 64, 6, 1, 1, [77, 300], dict(window_left=10)),
    ],
)
def test_decode_matches_reference(dtype, head_dim, hq, hkv, page_size, lens, kw):
    torch.manual_seed(0)
    dev = "cuda"
    batch = len(lens)
    max_pages = -(-max(lens) // page_size) + 1
    num_pages = batch * max_pages + 3
    k_cache = torch.randn(num_pages, page_size, hkv, head_dim, dtype=dtype, device=dev)
    v_cache = torch.randn_like(k_cache)
    page_table = torch.randperm(num_pages, device=dev)[: batch * max_pages].view(batch, max_pages).int()
    cache_seqlens = torch.tensor(lens, dtype=torch.int32, device=dev)
    q = torch.randn(batch, hq, head_dim, dtype=dtype, device=dev)
    kw = dict(kw)
    if kw.pop("sinks", False):
        kw["sinks"] = torch.randn(hq, device=dev)
    args = (q, k_cache, v_cache, page_table, cache_seqlens)
    got = _attention().mha_decode_with_kvcache(*args, softmax_scale=head_dim**-0.5, **kw)
    want = ref_attention.mha_decode_with_kvcache(*args, softmax_scale=head_dim**-0.5, **{"window_left": -1, **kw})
    if kw.get("return_lse"):
        _close(got[0], want[0], dtype)
        _close_lse(got[1], want[1])
    else:
        _close(got, want, dtype)


@pytest.mark.parametrize("dtype,hidden,residual", [(torch.bfloat16, 2880, True), (torch.float32, 64, False),
                                                   (torch.float16, 20000, True)])  # fmt: skip
def test_rmsnorm_matches_reference(dtype, hidden, residual):
    torch.manual_seed(0)
    x = torch.randn(37, hidden, dtype=dtype, device="cuda")
    w = torch.randn(hidden, device="cuda")
    r = torch.randn_like(x) if residual else None
    got = import_module(f"tokenspeed_kernel_amd.{ARCH}.norm").rmsnorm(x, w, 1e-5, residual=r)
    want = ref_norm.rmsnorm(x, w, 1e-5, residual=r)
    if residual:
        assert torch.equal(got[1], want[1])  # x + residual, rounded once: exact
        got, want = got[0], want[0]
    tol = 1e-5 if dtype == torch.float32 else _TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_public_op_selects_the_gluon_kernel():
    q = torch.randn(10, 64, 64, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(10, 8, 64, dtype=torch.bfloat16, device="cuda")
    cu = torch.tensor([0, 10], dtype=torch.int32, device="cuda")
    traits = {"head_dim": 64, "gqa_group": 8, "window": True, "sinks": True}
    chosen = [c.name for c in tk.explain_selection("mha_prefill", ("bf16", "bf16"), traits) if c.selected]
    assert chosen == [f"amd.{ARCH}.mha_prefill"]
    out = tk.mha_prefill(q, k, k, cu, cu, 10, 10, window_left=127, sinks=torch.zeros(64, device="cuda"))
    assert out.shape == q.shape

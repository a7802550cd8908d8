"""cuBLAS mm wrappers against the reference at GPT-OSS shapes (H200)."""

from __future__ import annotations

import pytest
import torch

import tokenspeed_kernel as tk

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("m", [1, 64, 4096])
@pytest.mark.parametrize(("n", "k"), [(5120, 2880), (2880, 4096)])
def test_bf16_matches_reference(m, n, k):
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = tk.mm(a, b, bias, solution="cublas")
    ref = tk.mm(a, b, bias, out_dtype=torch.float32, solution="reference")
    torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("gran", ["per_tensor", "per_token"])
@pytest.mark.parametrize("m", [1, 64, 4096])
def test_fp8_matches_reference(m, gran):
    torch.manual_seed(0)
    n, k = 5120, 2880
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(n, k, device="cuda") * k**-0.5
    qa, sa = tk.quantize_fp8(a, granularity=gran, solution="reference")
    qb, sb = tk.quantize_fp8(b, granularity=gran, solution="reference")
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = tk.mm(qa, qb, bias, a_scale=sa, b_scale=sb, solution="cublas")
    ref = tk.mm(qa, qb, bias, a_scale=sa, b_scale=sb, out_dtype=torch.float32, solution="reference")
    torch.testing.assert_close(y.float(), ref, atol=3e-2, rtol=2e-2)


@pytest.mark.parametrize("m", [1, 64])
def test_dense_linear_path_equals_addmm_bitwise(m):
    """Without ``out=`` the wrapper calls ``F.linear`` (one C++ call); it must be the same cuBLAS product as
    ``addmm(bias, a, b.t())`` / ``mm(a, b.t())``, which the ``out=`` path still calls."""
    from tokenspeed_kernel_nvidia.cublas.gemm import mm_dense

    torch.manual_seed(0)
    a = torch.randn(m, 2880, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(5120, 2880, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(5120, device="cuda", dtype=torch.bfloat16)
    kw = dict(a_scale=None, b_scale=None, out_dtype=torch.bfloat16)
    assert torch.equal(mm_dense(a, b, bias, out=None, **kw), torch.addmm(bias, a, b.t()))
    assert torch.equal(mm_dense(a, b, None, out=None, **kw), torch.mm(a, b.t()))
    out = torch.empty(m, 5120, device="cuda", dtype=torch.bfloat16)
    assert mm_dense(a, b, bias, out=out, **kw) is out and torch.equal(out, torch.addmm(bias, a, b.t()))
    assert torch.equal(mm_dense(a, b, bias.float(), out=None, **kw), torch.addmm(bias, a, b.t()))

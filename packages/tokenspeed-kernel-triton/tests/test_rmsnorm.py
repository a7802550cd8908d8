"""Triton ``rmsnorm`` (+ fused residual) through the public API.

Selection must pick the Triton kernel; results are checked against an independent
float64 formula and ``tokenspeed_kernel.reference``. The CPU shapes take the one-tile,
two-tile and two-pass paths of the interpreter config; the ``gpu``-marked test runs
GPT-OSS rows (2880) at decode and prefill token counts.
"""

from __future__ import annotations

import pytest
import torch
from _checks import ULP, assert_close, assert_triton

import tokenspeed_kernel as tk
from tokenspeed_kernel.core.formats import DTYPE_NAMES
from tokenspeed_kernel.reference import norm as ref_norm

pytestmark = pytest.mark.usefixtures("triton_on_gpu")


def _rmsnorm64(x, weight, eps):
    x64 = x.to(torch.float64)
    return x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.to(torch.float64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "shape",
    [(3, 5, 48), (3, 40), (2, 64), (4, 200)],
    ids=["one-pass-two-tiles", "one-pass", "one-pass-pow2", "two-pass"],
)
@pytest.mark.parametrize("residual", [False, True])
def test_rmsnorm(device, dtype, shape, residual):
    g = torch.Generator().manual_seed(len(shape) + residual)
    x = (torch.randn(shape, generator=g) * 3).to(dtype).to(device)
    weight = torch.randn(shape[-1], generator=g).to(device)  # fp32 weight, multiplied in fp32
    res = torch.randn(shape, generator=g).to(dtype).to(device) if residual else None
    assert_triton("rmsnorm", (DTYPE_NAMES[dtype],), {"fused_residual": residual}, x.device)
    got = tk.rmsnorm(x, weight, 1e-5, residual=res)
    if residual:
        y, s = got
        s_exact = x.double() + res.double()
        # s is rounded once to x's dtype
        assert ((s.double() - s_exact).abs() <= s_exact.abs() * ULP[dtype] + 1e-30).all()
        if not (x.device.type == "cpu" and dtype == torch.bfloat16):  # the interpreter truncates to bf16
            assert torch.equal(s, ref_norm.rmsnorm(x, weight, 1e-5, residual=res)[1])
        base = s
    else:
        y = got
        base = x
    assert y.dtype == dtype and y.shape == x.shape
    expected = _rmsnorm64(base.cpu(), weight.cpu(), 1e-5)
    assert_close(y.cpu(), expected, dtype)
    ref = ref_norm.rmsnorm(base, weight, 1e-5)
    assert_close(y.cpu(), ref.cpu(), dtype)


def test_rmsnorm_out_strided(device):
    x = torch.randn(6, 40).to(device)
    weight = torch.rand(40).to(device) + 0.5
    buffer = torch.zeros(6, 50, device=device)
    out = buffer[:, 5:45]
    y = tk.rmsnorm(x, weight, 1e-6, out=out)
    assert y.data_ptr() == out.data_ptr()
    assert_close(out.cpu(), _rmsnorm64(x.cpu(), weight.cpu(), 1e-6), torch.float32)
    assert bool((buffer[:, :5] == 0).all()) and bool((buffer[:, 45:] == 0).all())


# -- GPU, GPT-OSS shapes -------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("tokens", [1, 4096, 16384])
@pytest.mark.parametrize("residual", [False, True])
def test_rmsnorm_gpt_oss_gpu(tokens, residual):
    torch.manual_seed(0)
    x = torch.randn(tokens, 2880, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(2880, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(x) if residual else None
    assert_triton("rmsnorm", ("bf16",), {"fused_residual": residual}, x.device)
    got = tk.rmsnorm(x, weight, 1e-5, residual=res)
    want = ref_norm.rmsnorm(x, weight, 1e-5, residual=res)
    if residual:
        assert torch.equal(got[1], want[1])
        got, want = got[0], want[0]
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=1e-2)

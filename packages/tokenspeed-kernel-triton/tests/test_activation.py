"""Triton ``swiglu`` (GPT-OSS: clamp, up offset, interleaved or halves) and ``silu_and_mul`` through the public API.

Selection must pick the Triton kernel; results are checked against an independent
float64 formula and ``tokenspeed_kernel.reference``; the ``gpu``-marked test runs
GPT-OSS's 2 x 2880 rows.
"""

from __future__ import annotations

import pytest
import torch
from _checks import assert_close, assert_triton

import tokenspeed_kernel as tk
from tokenspeed_kernel.core.formats import DTYPE_NAMES
from tokenspeed_kernel.reference import activation as ref_activation

pytestmark = pytest.mark.usefixtures("triton_on_gpu")


def _swiglu64(x, alpha, limit, up_offset, interleaved):
    x64 = x.to(torch.float64)
    gate, up = (x64[..., 0::2], x64[..., 1::2]) if interleaved else x64.chunk(2, dim=-1)
    if limit is not None:
        gate = gate.clamp(max=limit)
        up = up.clamp(-limit, limit)
    return (up + up_offset) * gate / (1 + torch.exp(-alpha * gate))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize(("alpha", "limit", "up_offset"), [(1.702, 7.0, 1.0), (1.0, None, 0.0)])
def test_swiglu(device, dtype, interleaved, alpha, limit, up_offset):
    # I = 40 spans several interpreter blocks (16) with a tail; values up to ~12 hit the clamp.
    g = torch.Generator().manual_seed(int(interleaved) + 2 * (limit is None))
    x = (torch.randn(2, 3, 80, generator=g) * 4).to(dtype).to(device)
    assert_triton("swiglu", (DTYPE_NAMES[dtype],), {"interleaved": interleaved, "clamp": limit is not None}, x.device)
    y = tk.swiglu(x, alpha=alpha, limit=limit, up_offset=up_offset, interleaved=interleaved)
    assert y.shape == (2, 3, 40) and y.dtype == dtype
    expected = _swiglu64(x.cpu(), alpha, limit, up_offset, interleaved)
    assert_close(y.cpu(), expected, dtype)
    ref = ref_activation.swiglu(x, alpha=alpha, limit=limit, up_offset=up_offset, interleaved=interleaved, out=None)
    assert_close(y.cpu(), ref.cpu(), dtype)


def test_silu_and_mul(device):
    x = (torch.randn(5, 2 * 24, generator=torch.Generator().manual_seed(3)) * 3).to(torch.bfloat16).to(device)
    assert_triton("silu_and_mul", ("bf16",), {}, x.device)
    out = torch.empty(5, 24, dtype=torch.bfloat16, device=device)
    y = tk.silu_and_mul(x, out=out)
    assert y.data_ptr() == out.data_ptr()
    gate, up = x.cpu().double().chunk(2, dim=-1)
    assert_close(y.cpu(), gate * torch.sigmoid(gate) * up, torch.bfloat16)
    assert_close(y.cpu(), ref_activation.silu_and_mul(x, out=None).cpu(), torch.bfloat16)


# -- GPU, GPT-OSS shapes -------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("interleaved", [True, False])
def test_swiglu_gpt_oss_gpu(interleaved):
    torch.manual_seed(0)
    x = torch.randn(256, 2 * 2880, device="cuda", dtype=torch.bfloat16) * 4
    y = tk.swiglu(x, interleaved=interleaved)
    ref = ref_activation.swiglu(x, alpha=1.702, limit=7.0, up_offset=1.0, interleaved=interleaved, out=None)
    torch.testing.assert_close(y.float(), ref.float(), atol=2e-2, rtol=1e-2)

"""Triton ``apply_rotary`` (neox / gpt-j pairing, partial rotary) through the public API.

Selection must pick the Triton kernel; q and k are views into one packed QKV row, as an
engine passes them, and must not change. Results are checked against an independent
float64 formula and ``tokenspeed_kernel.reference``; the ``gpu``-marked test runs
GPT-OSS's 64 q / 8 kv heads of 64.
"""

from __future__ import annotations

import pytest
import torch
from _checks import assert_close, assert_triton

import tokenspeed_kernel as tk
from tokenspeed_kernel.core.formats import DTYPE_NAMES
from tokenspeed_kernel.reference import rope as ref_rope

pytestmark = pytest.mark.usefixtures("triton_on_gpu")


def _rotary64(x, cos_sin, positions, style):
    rot = cos_sin.shape[1]
    half = rot // 2
    angles = cos_sin.to(torch.float64)[positions.long()]
    cos, sin = angles[:, None, :half], angles[:, None, half:]
    y = x.to(torch.float64).clone()
    if style == "neox":
        i1, i2 = torch.arange(half), torch.arange(half) + half
    else:
        i1, i2 = torch.arange(half) * 2, torch.arange(half) * 2 + 1
    x1, x2 = y[..., i1].clone(), y[..., i2].clone()
    y[..., i1] = x1 * cos - x2 * sin
    y[..., i2] = x2 * cos + x1 * sin
    return y


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("rot", [24, 16], ids=["full", "partial"])
def test_apply_rotary(device, dtype, style, rot):
    # head_dim 24 (not a power of two), 4 q heads and 2 kv heads; q and k are views
    # into one packed qkv projection, as an engine passes them.
    t, hq, hk, d = 5, 4, 2, 24
    g = torch.Generator().manual_seed(rot + (style == "gptj"))
    qkv = torch.randn(t, (hq + 2 * hk) * d, generator=g).to(dtype).to(device)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)
    theta = torch.rand(64, rot // 2, generator=g) * 6.3
    cos_sin = torch.cat((theta.cos(), theta.sin()), dim=1).mul(1.1).to(device)  # YaRN-like scaled table
    positions = torch.randint(0, 64, (t,), generator=g, dtype=torch.int32).to(device)
    q_before, k_before = q.clone(), k.clone()
    assert_triton("apply_rotary", (DTYPE_NAMES[dtype],), {"style": style, "partial": rot < d}, q.device)
    q2, k2 = tk.apply_rotary(q, k, cos_sin, positions, style=style)
    assert torch.equal(q, q_before) and torch.equal(k, k_before), "inputs must not change"
    for got, src in ((q2, q), (k2, k)):
        assert got.shape == src.shape and got.dtype == dtype
        assert_close(got.cpu(), _rotary64(src.cpu(), cos_sin.cpu(), positions.cpu(), style), dtype)
        assert torch.equal(got[..., rot:].cpu(), src[..., rot:].cpu()), "dims past R pass through"
    rq, rk = ref_rope.apply_rotary(q, k, cos_sin, positions.long(), style=style)
    assert_close(q2.cpu(), rq.cpu(), dtype)
    assert_close(k2.cpu(), rk.cpu(), dtype)


# -- GPU, GPT-OSS shapes -------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.gpu
@gpu
def test_rotary_gpt_oss_gpu():
    torch.manual_seed(0)
    q = torch.randn(300, 64, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(300, 8, 64, device="cuda", dtype=torch.bfloat16)
    theta = torch.rand(4096, 32, device="cuda") * 6.3
    cos_sin = torch.cat((theta.cos(), theta.sin()), dim=1)
    pos = torch.randint(0, 4096, (300,), device="cuda")
    q2, k2 = tk.apply_rotary(q, k, cos_sin, pos)
    rq, rk = ref_rope.apply_rotary(q, k, cos_sin, pos, style="neox")
    torch.testing.assert_close(q2.float(), rq.float(), atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(k2.float(), rk.float(), atol=2e-2, rtol=1e-2)

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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_apply_rotary_and_store(device, dtype, style):
    """q rotated as apply_rotary does; the rotated k (rounded to its dtype) and v land in the cache rows of their
    slots and nothing else changes; a negative slot writes nothing. q, k, v are views into one packed row."""
    t, hq, hk, d, rot, ps, pages = 6, 4, 2, 24, 16, 4, 5
    g = torch.Generator().manual_seed(7 + (style == "gptj"))
    qkv = torch.randn(t, (hq + 2 * hk) * d, generator=g).to(dtype).to(device)
    q = qkv[:, : hq * d].view(t, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(t, hk, d)
    v = qkv[:, (hq + hk) * d :].view(t, hk, d)
    theta = torch.rand(64, rot // 2, generator=g) * 6.3
    cos_sin = torch.cat((theta.cos(), theta.sin()), dim=1).to(device)
    positions = torch.randint(0, 64, (t,), generator=g).to(device)
    slots = torch.randperm(pages * ps, generator=g)[:t]
    slots[2] = -1  # padding
    slots = slots.to(device)
    k_cache = torch.randn(pages, ps, hk, d, generator=g).to(dtype).to(device)
    v_cache = torch.randn(pages, ps, hk, d, generator=g).to(dtype).to(device)
    k_before, v_before, qkv_before = k_cache.clone(), v_cache.clone(), qkv.clone()
    assert_triton("apply_rotary_and_store", (DTYPE_NAMES[dtype],) * 2, {"style": style, "partial": True}, q.device)
    q2 = tk.apply_rotary_and_store(q, k, v, cos_sin, positions, k_cache, v_cache, slots, style=style)
    assert torch.equal(qkv, qkv_before), "inputs must not change"
    assert q2.shape == q.shape and q2.dtype == dtype
    assert_close(q2.cpu(), _rotary64(q.cpu(), cos_sin.cpu(), positions.cpu(), style), dtype)
    k64 = _rotary64(k.cpu(), cos_sin.cpu(), positions.cpu(), style)
    written = torch.zeros(pages * ps, dtype=torch.bool)
    for i, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        written[s] = True
        page, row = divmod(s, ps)
        assert_close(k_cache[page, row].cpu(), k64[i], dtype)
        assert torch.equal(v_cache[page, row].cpu(), v[i].cpu())
    keep = ~written.view(pages, ps)
    assert torch.equal(k_cache.cpu()[keep], k_before.cpu()[keep]) and torch.equal(
        v_cache.cpu()[keep], v_before.cpu()[keep]
    )
    # The same bits as the two ops it fuses.
    rq, rk = tk.apply_rotary(q, k, cos_sin, positions, style=style)
    k_sep, v_sep = k_before.clone(), v_before.clone()
    tk.kvcache_store(rk, v, k_sep, v_sep, slots)
    assert torch.equal(q2.cpu(), rq.cpu())
    assert torch.equal(k_cache.cpu(), k_sep.cpu()) and torch.equal(v_cache.cpu(), v_sep.cpu())


@pytest.mark.gpu
@gpu
def test_rotary_and_store_gpt_oss_gpu():
    torch.manual_seed(0)
    t = 64
    qkv = torch.randn(t, 80 * 64, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.view(t, 80, 64).split([64, 8, 8], dim=1)
    theta = torch.rand(4096, 32, device="cuda") * 6.3
    cos_sin = torch.cat((theta.cos(), theta.sin()), dim=1)
    pos = torch.randint(0, 4096, (t,), device="cuda")
    slots = torch.randperm(256 * 16, device="cuda")[:t]
    caches = [torch.randn(256, 16, 8, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    sep = [c.clone() for c in caches]
    q2 = tk.apply_rotary_and_store(q, k, v, cos_sin, pos, *caches, slots)
    rq, rk = tk.apply_rotary(q, k, cos_sin, pos)
    tk.kvcache_store(rk, v, *sep, slots)
    assert torch.equal(q2, rq) and torch.equal(caches[0], sep[0]) and torch.equal(caches[1], sep[1])

"""Triton quantization kernels through the public API: bit-exact with the reference.

FP8 and MXFP4 outputs are compared as raw bytes with
``tokenspeed_kernel.reference.quantization`` and checked against independent
formulations written here (torch's own e4m3 conversion, a brute-force nearest
E2M1 search); representable values must round-trip exactly.
"""

from __future__ import annotations

import pytest
import torch
from _checks import E2M1, assert_triton

import tokenspeed_kernel as tk
from tokenspeed_kernel.core.formats import DTYPE_NAMES
from tokenspeed_kernel.reference import quantization as ref

_ALL_E4M3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
_ALL_E4M3 = _ALL_E4M3[~_ALL_E4M3.isnan()]  # 254 finite codes, +-0 included


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8).cpu()


# -- FP8 --------------------------------------------------------------------------


def test_fp8_static_scale_1_matches_torch_on_the_grid_and_its_midpoints(device):
    # Every e4m3 value, every midpoint between neighbours (ties to even), +-0 and values
    # that round to -0: bytes must equal torch's own RNE conversion and the reference.
    grid = _ALL_E4M3.unique().sort().values
    mids = (grid[1:] + grid[:-1]) / 2
    x = torch.cat((_ALL_E4M3, mids, -mids, torch.tensor([-0.0, -1e-9, 1e-9, 1000.0, -1000.0])))
    x = x.reshape(1, -1).to(device)
    one = torch.ones(1, device=device)
    assert_triton("quantize_fp8", ("fp32",), {"granularity": "per_tensor", "static": True}, x.device)
    q, s = tk.quantize_fp8(x, granularity="per_tensor", scale=one)
    assert s is one
    expected = x.cpu().clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(_bytes(q), _bytes(expected))
    assert torch.equal(_bytes(q), _bytes(ref.quantize_fp8(x, granularity="per_tensor", scale=one)[0]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("granularity", ["per_tensor", "per_token", "block128"])
def test_fp8_dynamic_bit_exact(device, dtype, granularity):
    # K = 300: three 1x128 blocks, the last partial; row 2 is all zero (scale 1); M = 5
    # rows over several per-tensor partial programs.
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(5, 300, generator=g) * torch.logspace(-3, 2, 300)).to(dtype)
    x[2] = 0
    x = x.to(device)
    assert_triton("quantize_fp8", (DTYPE_NAMES[dtype],), {"granularity": granularity, "static": False}, x.device)
    q, s = tk.quantize_fp8(x, granularity=granularity)
    rq, rs = ref.quantize_fp8(x, granularity=granularity, scale=None)
    assert s.shape == rs.shape and s.dtype == torch.float32
    assert torch.equal(s, rs)
    assert torch.equal(_bytes(q), _bytes(rq))
    # independent check of the scales: amax / 448 per group, 1 for zero groups
    xf = x.cpu().float().abs()
    groups = {"per_tensor": xf.reshape(1, 1, -1), "per_token": xf.reshape(5, 1, -1)}.get(granularity)
    if groups is None:
        groups = torch.nn.functional.pad(xf, (0, 84)).reshape(5, 3, 128)
    amax = groups.amax(-1).reshape(s.shape)
    assert torch.equal(s.cpu(), torch.where(amax > 0, amax / 448.0, torch.ones_like(amax)))


def _bf16_ties_row(amax: float, g: torch.Generator) -> torch.Tensor:
    """128 bf16 values with |x| <= amax (amax itself included), including every one whose
    e4m3 code changes when the scale is amax * fl32(1/448) instead of amax / 448, or when
    x is multiplied by fl32(1 / scale) instead of divided by the scale."""
    every = torch.arange(1, 0x7F80, dtype=torch.int16).view(torch.bfloat16).float()
    every = every[every <= amax]
    exact = torch.tensor([amax / 448.0])

    def codes(v: torch.Tensor) -> torch.Tensor:
        return v.to(torch.float8_e4m3fn).view(torch.uint8)

    want = codes(every / exact)
    flips = every[(want != codes(every / (torch.tensor([amax]) * (1 / 448.0)))) | (want != codes(every * (1 / exact)))]
    fill = every[torch.randint(0, every.numel(), (128,), generator=g)]
    row = torch.cat((torch.tensor([amax]), flips, fill))[:128]
    sign = torch.where(torch.rand(128, generator=g) < 0.5, -1.0, 1.0)
    sign[0] = 1.0
    return (row * sign).to(torch.bfloat16)


@pytest.mark.parametrize("granularity", ["per_tensor", "per_token", "block128"])
def test_fp8_scale_is_a_true_division_bf16_ties(device, granularity):
    # bf16 data puts many x / scale exactly on e4m3 midpoints, so a scale one ulp off
    # (amax * fl32(1/448), what dividing a CUDA tensor by a Python float computes) flips
    # their codes. These amax values are ones where the two scales differ; each row (and
    # each 128-block) holds its amax, so every group's scale is amax / 448.
    g = torch.Generator().manual_seed(17)
    amaxes = (0.5390625, 0.65625, 3.25, 24.5)
    for a in amaxes:
        assert a / 448.0 != float(torch.tensor([a]) * torch.tensor(1 / 448.0)), "amax must separate the formulas"
    rows = [_bf16_ties_row(a, g) for a in amaxes]
    if granularity == "per_tensor":
        x = torch.cat(rows).reshape(1, -1)  # one group, amax 24.5
    elif granularity == "per_token":
        x = torch.stack(rows)
    else:
        x = torch.cat(rows).reshape(2, 256)  # four 1x128 blocks
    x = x.to(device)
    q, s = tk.quantize_fp8(x, granularity=granularity)
    xf = x.cpu().double()
    amax = {"per_tensor": xf.abs().amax().reshape(1), "per_token": xf.abs().amax(1, keepdim=True)}.get(
        granularity, xf.abs().reshape(2, 2, 128).amax(-1)
    )
    want_s = (amax / 448.0).float()  # fp64 quotient rounded once: the correctly rounded fp32 division
    assert torch.equal(s.cpu(), want_s)
    per_elem = want_s.double().repeat_interleave(128, dim=1) if granularity == "block128" else want_s.double()
    want_q = (xf / per_elem).float().clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(_bytes(q), _bytes(want_q))
    assert torch.equal(_bytes(q), _bytes(ref.quantize_fp8(x, granularity=granularity, scale=None)[0]))
    # the input discriminates: the reciprocal scale, or multiplying x by 1 / scale, gives other codes
    recip_s = (amax.float() * torch.tensor(1 / 448.0)).double()
    recip_s = recip_s.repeat_interleave(128, dim=1) if granularity == "block128" else recip_s
    assert not torch.equal(_bytes((xf / recip_s).float().to(torch.float8_e4m3fn)), _bytes(want_q))
    by_recip = (xf.float() * (1 / per_elem).float()).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert not torch.equal(_bytes(by_recip), _bytes(want_q))


def test_fp8_round_trip_exact_on_representable_values(device):
    # Rows of e4m3 values times a power of two, each row holding +-448 * 2^j: the
    # per-token scale is exactly 2^j, so dequantising gives the input back bit for bit.
    g = torch.Generator().manual_seed(11)
    codes = _ALL_E4M3[torch.randint(0, _ALL_E4M3.numel(), (4, 64), generator=g)]
    codes[:, 0] = torch.tensor([448.0, -448.0, 448.0, -448.0])
    x = (codes * torch.tensor([[2.0**-10], [1.0], [2.0**5], [2.0**-3]])).to(device)
    q, s = tk.quantize_fp8(x, granularity="per_token")
    assert torch.equal(s.cpu().flatten(), torch.tensor([2.0**-10, 1.0, 2.0**5, 2.0**-3]))
    assert torch.equal(q.float() * s, x)


# -- MXFP4 ---------------------------------------------------------------------------


def _nearest_e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """Brute force: the E2M1 magnitude nearest |v| (ties to the even code, 6 saturating),
    with v's sign bit."""
    a = v.abs().to(torch.float64).unsqueeze(-1)
    dist = (a - E2M1).abs()
    best = dist.min(-1, keepdim=True).values
    # among equally near codes prefer the even one
    tie_break = torch.where(dist == best, torch.arange(8) % 2, 9)
    mag = tie_break.argmin(-1)
    return mag | (torch.signbit(v).long() << 3)


def _decode(blocks: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int64 [..., K], scale float64 [..., K/32])."""
    codes = torch.stack((blocks & 15, blocks >> 4), dim=-1).flatten(-2).long()
    return codes, torch.pow(2.0, scales.to(torch.float64) - 127)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_mxfp4_quantize_bit_exact(device, dtype):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 128, generator=g) * torch.logspace(-3, 3, 128)
    x[0, 0, :32] = 0.0  # all-zero group: scale byte 127, zero codes
    x[0, 1, :32] = -0.0  # -0 -> code 8
    x[0, 2, 32:64] = torch.tensor([4.0, 5.0, 3.5, 2.5, 1.75, 1.25, 0.75, 0.25] * 4)  # exact E2M1 midpoints
    x[1, 0, 64:96] = -x[1, 0, 64:96].abs() * 1e-3  # tiny negatives next to a large one -> -0
    x[1, 0, 64] = -7.0
    if dtype == torch.float32:
        x[1, 1, :32] = torch.randn(32, generator=g) * 1e-40  # subnormal amax: scale byte clamps to 0
    x = x.to(dtype).to(device)
    assert_triton("quantize_mxfp4", (DTYPE_NAMES[dtype],), {}, x.device)
    blocks, scales = tk.quantize_mxfp4(x)
    rb, rs = ref.quantize_mxfp4(x)
    assert blocks.shape == (2, 3, 64) and scales.shape == (2, 3, 4)
    assert torch.equal(blocks.cpu(), rb.cpu()) and torch.equal(scales.cpu(), rs.cpu())
    assert int(scales[0, 0, 0]) == 127 and bool((blocks[0, 1, :16] == 0x88).all())
    # independent: floor(log2(amax)) - 2 + 127 from float64, nearest E2M1 by brute force
    xf = x.cpu().to(torch.float64).reshape(2, 3, 4, 32)
    amax = xf.abs().amax(-1)
    want_scale = (torch.floor(torch.log2(amax)) - 2 + 127).clamp(0, 254).nan_to_num(127.0)
    want_scale = torch.where(amax == 0, 127.0, want_scale)
    assert torch.equal(scales.cpu().to(torch.float64), want_scale)
    codes, scale = _decode(blocks.cpu(), scales.cpu())
    want = _nearest_e2m1_codes((xf / scale.unsqueeze(-1)).reshape(2, 3, 128))
    assert torch.equal(codes, want)


def test_mxfp4_round_trip_exact(device):
    # Random codes and scales, each group holding a magnitude-4 or -6 code: the
    # quantizer recovers the same scale, so dequantize -> quantize returns the bytes.
    g = torch.Generator().manual_seed(9)
    blocks = torch.randint(0, 256, (6, 48), generator=g, dtype=torch.uint8)
    blocks[:, ::16] = (blocks[:, ::16] & 0xF0) | torch.where(torch.rand(6, 3, generator=g) < 0.5, 7, 14).to(torch.uint8)
    # -0 codes (8) included: the decoder keeps the sign bit, so they re-quantize to 8.
    blocks[:, 1] = 0x88
    scales = torch.randint(100, 150, (6, 3), generator=g, dtype=torch.uint8)
    blocks, scales = blocks.to(device), scales.to(device)
    assert_triton("dequantize_mxfp4", ("mxfp4", "fp32"), {}, blocks.device)
    x = tk.dequantize_mxfp4(blocks, scales, dtype=torch.float32)
    b2, s2 = tk.quantize_mxfp4(x)
    assert torch.equal(b2, blocks) and torch.equal(s2, scales)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # 6 * 2**127 is inf in fp32
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_mxfp4_dequantize(device, dtype):
    g = torch.Generator().manual_seed(4)
    blocks = torch.randint(0, 256, (3, 2, 80), generator=g, dtype=torch.uint8)  # K = 160: 5 groups
    scales = torch.randint(115, 135, (3, 2, 5), generator=g, dtype=torch.uint8)
    blocks[0, 0, :8] = torch.tensor([0x08, 0x80, 0x88, 0x18, 0x81, 0x0F, 0xF0, 0x00], dtype=torch.uint8)  # -0 codes
    if dtype == torch.float32:
        # the E8M0 extremes: 0 is the subnormal 2**-127, 255 is exp2(128) = inf (as the
        # reference); that group gets non-zero codes only (0 * inf would be NaN); 250 and
        # 254 lie past 240, where one folded 2**(s - 113) would overflow
        scales[0, 0, :2] = torch.tensor([0, 255], dtype=torch.uint8)
        blocks[0, 0, 16:32] |= 0x11
        scales[0, 1, :2] = torch.tensor([250, 254], dtype=torch.uint8)
    assert_triton("dequantize_mxfp4", ("mxfp4", DTYPE_NAMES[dtype]), {}, torch.device(device))
    y = tk.dequantize_mxfp4(blocks.to(device), scales.to(device), dtype=dtype)
    assert y.shape == (3, 2, 160) and y.dtype == dtype
    codes, scale = _decode(blocks, scales)
    scale = scale.float().double()  # the scale is an fp32 number: byte 255 is 2**128 = inf
    want = E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0).double() * scale.repeat_interleave(32, -1)
    got = y.cpu().to(torch.float64)
    assert torch.equal(got, want.to(dtype).to(torch.float64))  # exact in every output dtype
    assert torch.equal(torch.signbit(got), torch.signbit(want)), "-0 codes decode to -0.0"
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(y.cpu().view(bits), ref.dequantize_mxfp4(blocks, scales, dtype=dtype).view(bits))


# -- GPU -------------------------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("granularity", ["per_tensor", "per_token", "block128"])
def test_fp8_gpt_oss_gpu(granularity):
    torch.manual_seed(0)
    x = torch.randn(4096, 2880, device="cuda", dtype=torch.bfloat16) * 3
    q, s = tk.quantize_fp8(x, granularity=granularity)
    rq, rs = ref.quantize_fp8(x, granularity=granularity, scale=None)
    assert torch.equal(s, rs)
    assert torch.equal(q.view(torch.uint8), rq.view(torch.uint8))
    # the reference computes the same bytes on the CPU (its scale is a true division on both)
    cq, cs = ref.quantize_fp8(x.cpu(), granularity=granularity, scale=None)
    assert torch.equal(s.cpu(), cs)
    assert torch.equal(q.view(torch.uint8).cpu(), cq.view(torch.uint8))


@pytest.mark.gpu
@gpu
def test_mxfp4_gpt_oss_gpu():
    torch.manual_seed(0)
    w = torch.randn(5760, 2880, device="cuda", dtype=torch.bfloat16) * 0.02
    blocks, scales = tk.quantize_mxfp4(w)
    rb, rs = ref.quantize_mxfp4(w)
    assert torch.equal(blocks, rb) and torch.equal(scales, rs)
    assert torch.equal(tk.dequantize_mxfp4(blocks, scales), ref.dequantize_mxfp4(blocks, scales, dtype=torch.bfloat16))

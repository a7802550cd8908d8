"""Reference FP8 / MXFP4 quantization against formulations written from the spec."""

from __future__ import annotations

import math

import pytest
import torch

import tokenspeed_kernel as tk

REF = "reference"


def e2m1_value(code: int) -> float:
    """E2M1 from its bits: sign (bit 3), exponent (bits 2-1, bias 1), mantissa (bit 0); exponent 0 is subnormal."""
    sign = -1.0 if code & 8 else 1.0
    exp, man = (code >> 1) & 3, code & 1
    mag = 0.5 * man if exp == 0 else 2.0 ** (exp - 1) * (1.0 + 0.5 * man)
    return sign * mag


E2M1 = [e2m1_value(c) for c in range(16)]


def decode_by_hand(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Byte-by-byte MXFP4 decoder in float64 (low nibble = even element, scale 2**(s-127) per 32 values)."""
    flat_b = blocks.reshape(-1, blocks.shape[-1]).tolist()
    flat_s = scales.reshape(-1, scales.shape[-1]).tolist()
    rows = []
    for row_b, row_s in zip(flat_b, flat_s):
        vals = []
        for i, byte in enumerate(row_b):
            scale = 2.0 ** (row_s[(2 * i) // 32] - 127)
            vals += [E2M1[byte % 16] * scale, E2M1[byte // 16] * scale]
        rows.append(vals)
    return torch.tensor(rows, dtype=torch.float64).reshape(*blocks.shape[:-1], 2 * blocks.shape[-1])


def test_e2m1_table_matches_the_bit_layout():
    from tokenspeed_kernel.reference.quantization import E2M1_VALUES, e2m1_table

    assert E2M1 == [0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6]
    assert list(E2M1_VALUES) == E2M1
    assert e2m1_table().tolist() == E2M1


def test_dequantize_hand_computed_bytes():
    # One row of 64 values = 32 bytes, two scale groups.
    blocks = torch.zeros(1, 32, dtype=torch.uint8)
    blocks[0, 0] = 0x21  # low 1 -> +0.5 (element 0), high 2 -> +1.0 (element 1)
    blocks[0, 1] = 0xF7  # low 7 -> +6 (element 2), high 15 -> -6 (element 3)
    blocks[0, 2] = 0x8A  # low 10 -> -1.0 (element 4), high 8 -> -0 (element 5)
    blocks[0, 15] = 0x53  # low 3 -> +1.5 (element 30), high 5 -> +3 (element 31)
    blocks[0, 16] = 0xC6  # second group: low 6 -> +4, high 12 -> -2; scale 2**(125-127) = 1/4
    scales = torch.tensor([[128, 125]], dtype=torch.uint8)  # group 0 scale 2, group 1 scale 1/4
    expected = torch.zeros(1, 64)
    expected[0, :6] = torch.tensor([1.0, 2.0, 12.0, -12.0, -2.0, 0.0])
    expected[0, 30:32] = torch.tensor([3.0, 6.0])
    expected[0, 32:34] = torch.tensor([1.0, -0.5])
    got = tk.dequantize_mxfp4(blocks, scales, dtype=torch.float32, solution=REF)
    assert torch.equal(got, expected)
    assert torch.signbit(got[0, 5])  # code 8 is -0
    from tokenspeed_kernel.reference.quantization import mxfp4_to_float

    assert torch.equal(mxfp4_to_float(blocks, scales), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_matches_hand_decoder_on_random_bytes(dtype):
    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 2, 48), dtype=torch.uint8, generator=g)
    # fp16 covers only 2**-24 .. 65504; keep its scales inside that range.
    lo, hi = (115, 135) if dtype == torch.float16 else (0, 255)
    scales = torch.randint(lo, hi, (3, 2, 3), dtype=torch.uint8, generator=g)
    got = tk.dequantize_mxfp4(blocks, scales, dtype=dtype, solution=REF)
    assert got.dtype == dtype and got.shape == (3, 2, 96)
    assert torch.equal(got, decode_by_hand(blocks, scales).to(dtype))


def quantize_block_by_hand(vals: list[float]) -> tuple[list[int], int]:
    """Spec: s = floor(log2(amax)) - 2 + 127 clamped to [0, 254] (all-zero: 127); nearest E2M1 code, ties to even code."""
    amax = max(abs(v) for v in vals)
    if amax == 0:
        s = 127
    else:
        s = min(max(math.frexp(amax)[1] - 1 - 2 + 127, 0), 254)
    scale = 2.0 ** (s - 127)
    codes = []
    for v in vals:
        a = abs(v) / scale
        best = min(range(8), key=lambda c: (abs(E2M1[c] - a), c % 2))  # nearest, then even code
        codes.append(best | (8 if math.copysign(1.0, v) < 0 else 0))
    return codes, s


def test_quantize_hand_computed_block():
    # amax 6 -> floor(log2 6) = 2 -> scale byte 127 (scale 1): values are rounded as they are.
    vals = [6.0, 5.0, 3.5, 2.5, 1.75, 1.25, 0.75, 0.25, -0.3, -5.5, 0.0, -0.0, 2.9, 0.1, -4.0, 1.5]
    vals += [0.0] * 16
    blocks, scales = tk.quantize_mxfp4(torch.tensor([vals]), solution=REF)
    assert scales.tolist() == [[127]]
    # 6->7(6); 5 tie 4|6 -> code 6 (4); 3.5 tie 3|4 -> 6 (4); 2.5 tie 2|3 -> 4 (2); 1.75 tie 1.5|2 -> 4 (2);
    # 1.25 tie 1|1.5 -> 2 (1); 0.75 tie 0.5|1 -> 2 (1); 0.25 tie 0|0.5 -> 0; -0.3 -> -0.5 (9); -5.5 -> -6 (15);
    # 0 -> 0; -0.0 -> -0 (8); 2.9 -> 3 (5); 0.1 -> 0; -4 -> 14; 1.5 -> 3.
    codes = [7, 6, 6, 4, 4, 2, 2, 0, 9, 15, 0, 8, 5, 0, 14, 3] + [0] * 16
    expected = [codes[i] | (codes[i + 1] << 4) for i in range(0, 32, 2)]
    assert blocks.tolist() == [expected]
    assert quantize_block_by_hand(vals) == (codes, 127)


def test_quantize_scale_choice_and_saturation():
    # amax 7.9 -> floor(log2) = 2 -> scale 1: 7.9 saturates to 6 (code 7); -7 to -6 (code 15).
    x = torch.zeros(3, 32)
    x[0, :3] = torch.tensor([7.9, -7.0, 1.0])
    # amax 8 -> floor(log2) = 3 -> scale byte 128 (scale 2): 8 -> 4 (code 6), 3 -> 1.5 (code 3).
    x[1, :2] = torch.tensor([8.0, 3.0])
    # amax 1000 -> floor(log2) = 9 -> byte 134 (scale 128): 1000/128 = 7.8 -> 6 (saturated), 64/128 -> 0.5.
    x[2, :2] = torch.tensor([1000.0, 64.0])
    blocks, scales = tk.quantize_mxfp4(x, solution=REF)
    assert scales[:, 0].tolist() == [127, 128, 134]
    assert blocks[0, :2].tolist() == [7 | (15 << 4), 2]
    assert blocks[1, 0].item() == 6 | (3 << 4)
    assert blocks[2, 0].item() == 7 | (1 << 4)
    deq = tk.dequantize_mxfp4(blocks, scales, dtype=torch.float32, solution=REF)
    assert deq[2, :2].tolist() == [768.0, 64.0]


def test_quantize_zero_and_tiny_blocks():
    x = torch.zeros(2, 64)
    x[1, 32] = 2.0**-130  # floor(log2) - 2 = -132 is below E8M0's range: the byte clamps to 0 (scale 2**-127)
    x[1, 33] = -(2.0**-131)
    blocks, scales = tk.quantize_mxfp4(x, solution=REF)
    assert scales.tolist() == [[127, 127], [127, 0]]
    # 2**-130 / 2**-127 = 1/8 rounds to 0; the negative one keeps its sign bit (code 8 = -0).
    assert blocks[1, 16].item() == 0 | (8 << 4)
    assert int(blocks.count_nonzero()) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_of_representable_values_is_exact(dtype):
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (4, 8, 64), generator=g)
    # Each 32-value group holds a magnitude-4 or -6 code, so its amax lies in [4, 8) * scale and the
    # quantizer must pick the same scale byte back.
    codes[..., ::32] = torch.randint(6, 8, (4, 8, 2), generator=g) | (torch.randint(0, 2, (4, 8, 2), generator=g) << 3)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    lo, hi = (110, 135) if dtype == torch.float16 else (2, 250)
    scales = torch.randint(lo, hi, (4, 8, 2), dtype=torch.uint8, generator=g)
    x = tk.dequantize_mxfp4(blocks, scales, dtype=dtype, solution=REF)
    b2, s2 = tk.quantize_mxfp4(x, solution=REF)
    assert torch.equal(s2, scales)
    assert torch.equal(b2, blocks)  # bit-exact, -0 (code 8) included
    assert torch.equal(tk.dequantize_mxfp4(b2, s2, dtype=dtype, solution=REF), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_random_data_is_rounded_to_the_nearest_value(dtype):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(16, 128, generator=g) * torch.exp2(torch.randint(-8, 8, (16, 1), generator=g).float())).to(dtype)
    blocks, scales = tk.quantize_mxfp4(x, solution=REF)
    deq = tk.dequantize_mxfp4(blocks, scales, dtype=torch.float32, solution=REF).double()
    xd = x.double()
    # The scale byte from the spec, per block, computed with Python's frexp.
    amax = xd.reshape(16, 4, 32).abs().amax(-1)
    want_s = [[math.frexp(a)[1] - 1 - 2 + 127 for a in row] for row in amax.tolist()]
    assert scales.tolist() == want_s
    scale = torch.exp2(scales.double() - 127).repeat_interleave(32, dim=1)
    v = (xd / scale).abs()
    # Half the E2M1 step at v's magnitude (steps 0.5 below 2, 1 in [2, 4), 2 in [4, 6]); beyond 6: saturation.
    half_step = torch.where(v < 2, 0.25, torch.where(v < 4, 0.5, 1.0))
    bound = torch.where(v <= 6, half_step, v - 6) * scale
    err = (deq - xd).abs()
    assert bool((err <= bound).all())
    # Stronger: no E2M1 value at this scale is nearer than the chosen one.
    grid = torch.tensor(E2M1[:8], dtype=torch.float64)
    nearest = (v.unsqueeze(-1) - grid).abs().amin(-1) * scale
    assert torch.equal(err, nearest)
    assert bool((torch.sign(deq) * torch.sign(xd) >= 0).all())


def test_hand_quantizer_agrees_on_random_blocks():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 64, generator=g) * 3
    blocks, scales = tk.quantize_mxfp4(x, solution=REF)
    for r in range(4):
        for blk in range(2):
            codes, s = quantize_block_by_hand(x[r, 32 * blk : 32 * blk + 32].tolist())
            assert scales[r, blk].item() == s
            got = blocks[r, 16 * blk : 16 * blk + 16].tolist()
            assert got == [codes[i] | (codes[i + 1] << 4) for i in range(0, 32, 2)]


def test_mxfp4_validation_names_the_argument():
    with pytest.raises(ValueError, match="^x:.*divisible by 32"):
        tk.quantize_mxfp4(torch.randn(2, 48))
    with pytest.raises(TypeError, match="^x:"):
        tk.quantize_mxfp4(torch.randn(2, 32).double())
    with pytest.raises(ValueError, match="^blocks:.*divisible by 16"):
        tk.dequantize_mxfp4(torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="^scales:.*shape"):
        tk.dequantize_mxfp4(torch.zeros(2, 32, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.uint8))
    with pytest.raises(TypeError, match="^dtype:"):
        tk.dequantize_mxfp4(
            torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.uint8), dtype=torch.int8
        )


# ---------------------------------------------------------------------------------------------- FP8


def fp8_by_formula(x: torch.Tensor, scale_per_elem: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale_per_elem).clamp(-448, 448).to(torch.float8_e4m3fn)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fp8_per_tensor(dtype):
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(5, 70, generator=g) * 10).to(dtype)
    q, s = tk.quantize_fp8(x, granularity="per_tensor", solution=REF)
    amax = x.float().abs().max()
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == (1,)
    assert s.item() == (amax / 448).item()
    assert torch.equal(q.view(torch.uint8), fp8_by_formula(x, s).view(torch.uint8))
    # The largest magnitude maps to the largest finite e4m3 value; everything is within e4m3's half step.
    assert q.float().abs().max().item() == 448.0
    deq = q.float() * s
    assert bool(((deq - x.float()).abs() <= 2.0**-4 * x.float().abs() + 2.0**-10 * s).all())


def test_fp8_per_token_with_a_zero_row():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 33, generator=g) * torch.tensor([[1.0], [0.0], [300.0], [1e-3]])
    q, s = tk.quantize_fp8(x, granularity="per_token", solution=REF)
    assert s.shape == (4, 1)
    want = x.abs().amax(1, keepdim=True) / 448
    want[1] = 1.0
    assert torch.equal(s, want)
    assert torch.equal(q.view(torch.uint8), fp8_by_formula(x, want).view(torch.uint8))
    assert bool((q[1].float() == 0).all())
    assert torch.equal(q.float().abs().amax(1), torch.tensor([448.0, 0.0, 448.0, 448.0]))


@pytest.mark.parametrize("k", [200, 128, 5])
def test_fp8_block128_partial_last_block(k):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(3, k, generator=g).to(torch.bfloat16)
    x[2, : min(k, 128)] = 0  # an all-zero block gets scale 1
    q, s = tk.quantize_fp8(x, granularity="block128", solution=REF)
    nb = -(-k // 128)
    assert s.shape == (3, nb)
    for r in range(3):
        for b in range(nb):
            cols = x[r, 128 * b : min(k, 128 * b + 128)].float()
            want = cols.abs().max() / 448 if bool(cols.any()) else torch.tensor(1.0)
            assert s[r, b].item() == want.item()
            got = q[r, 128 * b : min(k, 128 * b + 128)]
            assert torch.equal(got.view(torch.uint8), fp8_by_formula(cols, s[r, b]).view(torch.uint8))
    assert s[2, 0].item() == 1.0


def test_fp8_static_scale_saturates():
    x = torch.tensor([[1.0, -2.0, 1000.0, -1000.0, 0.3]])
    scale = torch.tensor([0.5])
    q, s = tk.quantize_fp8(x, granularity="per_tensor", scale=scale, solution=REF)
    assert torch.equal(s, scale)
    # 1000 / 0.5 = 2000 saturates at 448; 0.3 / 0.5 = 0.6 rounds to e4m3's nearest (0.625 = 5 * 2**-3).
    assert q.float().tolist() == [[2.0, -4.0, 448.0, -448.0, 0.625]]


def test_fp8_validation_names_the_argument():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="^granularity:"):
        tk.quantize_fp8(x, granularity="per_channel")
    with pytest.raises(ValueError, match="^scale:"):
        tk.quantize_fp8(x, granularity="per_token", scale=torch.ones(1))
    with pytest.raises(TypeError, match="^scale:"):
        tk.quantize_fp8(x, granularity="per_tensor", scale=torch.ones(1, dtype=torch.float16))
    with pytest.raises(ValueError, match="^x:"):
        tk.quantize_fp8(torch.randn(2, 3, 4))

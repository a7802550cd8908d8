"""Reference mm, swiglu, silu_and_mul and apply_rotary against independent float64 formulations.

Every numerics test goes through the public op forced onto the reference kernel, so
the argument plumbing (public op -> dispatch -> reference) is covered too.
"""

from __future__ import annotations

import math

import pytest
import torch

import tokenspeed_kernel as tk

REF = "reference"
FP8 = torch.float8_e4m3fn


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _assert_rounded_close(actual: torch.Tensor, exact: torch.Tensor) -> None:
    """``actual`` (low precision) equals the float64 ``exact`` rounded to ``actual``'s dtype, to one ulp."""
    assert actual.dtype != torch.float64
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual.double(), exact, rtol=1e-5, atol=1e-5)
        return
    ulp = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[actual.dtype]
    torch.testing.assert_close(actual.double(), exact.to(actual.dtype).double(), rtol=ulp, atol=1e-3)


# ---------------------------------------------------------------------------
# mm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_bias", [False, True])
def test_mm_dense_matches_float64(dtype, with_bias):
    g = _gen(1)
    m, n, k = 5, 9, 67
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(n, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    exact = a.double() @ b.double().T
    if with_bias:
        exact = exact + bias.double()
    got = tk.mm(a, b, bias, override=REF)
    assert got.dtype == dtype and got.shape == (m, n)
    _assert_rounded_close(got, exact)
    # fp32 output: the fp32 accumulation itself, far tighter than any rounding to dtype.
    got32 = tk.mm(a, b, bias, out_dtype=torch.float32, override=REF)
    torch.testing.assert_close(got32.double(), exact, rtol=1e-5, atol=1e-5)


def test_mm_fp32_accumulation_not_input_dtype():
    # 256 products of 1 with a large head: a bf16 accumulator would stall at 256
    # (bf16's ulp there is 2), the fp32 one reaches the exact sum.
    k = 512
    a = torch.ones(1, k, dtype=torch.bfloat16)
    b = torch.ones(1, k, dtype=torch.bfloat16)
    b[0, 0] = 256.0
    got = tk.mm(a, b, out_dtype=torch.float32, override=REF)
    assert got.item() == 256.0 + (k - 1)


def test_mm_out_and_out_dtype():
    g = _gen(2)
    a = torch.randn(3, 32, generator=g, dtype=torch.bfloat16)
    b = torch.randn(4, 32, generator=g, dtype=torch.bfloat16)
    out = torch.empty(3, 4, dtype=torch.float16)
    got = tk.mm(a, b, out_dtype=torch.float16, out=out, override=REF)
    assert got is out
    _assert_rounded_close(out, a.double() @ b.double().T)


def _fp8_operand(rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    return (torch.randn(rows, cols, generator=g) * 40).clamp(-448, 448).to(FP8)


def _scale_for(granularity: str, rows: int, cols: int, *, weight: bool, g: torch.Generator) -> torch.Tensor:
    kb = math.ceil(cols / 128)
    shape = {
        "per_tensor": (1,),
        "per_token": (rows, 1),
        "per_channel": (rows, 1),
        "block128": (math.ceil(rows / 128), kb) if weight else (rows, kb),
    }[granularity]
    return torch.rand(shape, generator=g) * 0.02 + 0.001


def _dequant_fp8_f64(q: torch.Tensor, scale: torch.Tensor, granularity: str, *, weight: bool) -> torch.Tensor:
    """Element (i, j) times the scale that covers it, written with explicit block indices."""
    rows, cols = q.shape
    s = scale.double()
    i = torch.arange(rows).unsqueeze(1).expand(rows, cols)
    j = torch.arange(cols).unsqueeze(0).expand(rows, cols)
    if granularity == "per_tensor":
        per_elem = s.reshape(()).expand(rows, cols)
    elif granularity in ("per_token", "per_channel"):
        per_elem = s[:, 0][i]
    elif weight:
        per_elem = s[i // 128, j // 128]
    else:
        per_elem = s[i, j // 128]
    return q.double() * per_elem


@pytest.mark.parametrize(
    "a_gran,b_gran",
    [
        ("per_tensor", "per_tensor"),
        ("per_token", "per_channel"),
        ("block128", "block128"),
        ("per_token", "block128"),
        ("block128", "per_tensor"),
    ],
)
def test_mm_fp8_matches_dequantized_float64(a_gran, b_gran):
    # N and K are not multiples of 128 so the last blocks are partial.
    g = _gen(3)
    m, n, k = 3, 150, 300
    a = _fp8_operand(m, k, g)
    b = _fp8_operand(n, k, g)
    a_scale = _scale_for(a_gran, m, k, weight=False, g=g)
    b_scale = _scale_for(b_gran, n, k, weight=True, g=g)
    bias = torch.randn(n, generator=g)
    exact = _dequant_fp8_f64(a, a_scale, a_gran, weight=False) @ _dequant_fp8_f64(b, b_scale, b_gran, weight=True).T
    exact = exact + bias.double()
    got = tk.mm(a, b, bias, a_scale=a_scale, b_scale=b_scale, out_dtype=torch.float32, override=REF)
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-4)
    default = tk.mm(a, b, bias, a_scale=a_scale, b_scale=b_scale, override=REF)
    assert default.dtype == torch.bfloat16
    _assert_rounded_close(default, exact)


def _e2m1_f64(code: int) -> float:
    sign = -1.0 if code & 0x8 else 1.0
    exponent = (code >> 1) & 0x3
    mantissa = code & 0x1
    if exponent == 0:
        return sign * 0.5 * mantissa
    return sign * 2.0 ** (exponent - 1) * (1.0 + 0.5 * mantissa)


def _mxfp4_dequant_f64(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    rows, half = blocks.shape
    out = torch.empty(rows, 2 * half, dtype=torch.float64)
    for r in range(rows):
        for c in range(half):
            byte = int(blocks[r, c])
            for e, code in ((2 * c, byte & 0xF), (2 * c + 1, byte >> 4)):
                out[r, e] = math.ldexp(_e2m1_f64(code), int(scales[r, e // 32]) - 127)
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mm_mxfp4_weight(dtype):
    g = _gen(4)
    m, n, k = 4, 6, 64
    a = torch.randn(m, k, generator=g).to(dtype)
    blocks = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(120, 131, (n, k // 32), generator=g, dtype=torch.uint8)
    bias = torch.randn(n, generator=g, dtype=torch.float32)
    exact = a.double() @ _mxfp4_dequant_f64(blocks, scales).T + bias.double()
    got = tk.mm(a, blocks, bias, b_scale=scales, out_dtype=torch.float32, override=REF)
    torch.testing.assert_close(got.double(), exact, rtol=1e-5, atol=1e-4)


def test_mm_validation_names_the_argument():
    a = torch.randn(2, 64, dtype=torch.bfloat16)
    b = torch.randn(3, 64, dtype=torch.bfloat16)
    a8, b8 = a.to(FP8), b.to(FP8)
    one = torch.ones(1)
    with pytest.raises(ValueError, match="^b: expected shape"):
        tk.mm(a, b[:, :32])
    with pytest.raises(TypeError, match="^b: expected dtype"):
        tk.mm(a, b.float())
    with pytest.raises(ValueError, match="^bias: expected shape"):
        tk.mm(a, b, torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="^a_scale:"):
        tk.mm(a8, b8, b_scale=one)
    with pytest.raises(ValueError, match="^a_scale:"):
        tk.mm(a, b, a_scale=one)
    with pytest.raises(ValueError, match="^b_scale: scale of shape"):
        tk.mm(a8, b8, a_scale=one, b_scale=torch.ones(2, 2))
    with pytest.raises(TypeError, match="^a: an fp8 b needs an fp8 a"):
        tk.mm(a, b8, b_scale=one)
    with pytest.raises(TypeError, match="^a: an MXFP4 b"):
        tk.mm(a.float(), torch.zeros(3, 32, dtype=torch.uint8), b_scale=torch.zeros(3, 2, dtype=torch.uint8))
    with pytest.raises(TypeError, match="^out: expected dtype"):
        tk.mm(a, b, out=torch.empty(2, 3))
    with pytest.raises(TypeError, match="^out_dtype:"):
        tk.mm(a, b, out_dtype=torch.int32)


# ---------------------------------------------------------------------------
# swiglu / silu_and_mul


def _sigmoid_f64(z: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-z))


def _swiglu_f64(x: torch.Tensor, alpha: float, limit: float | None, up_offset: float, interleaved: bool):
    x = x.double()
    i = x.shape[-1] // 2
    if interleaved:
        pairs = x.reshape(*x.shape[:-1], i, 2)
        gate, up = pairs[..., 0], pairs[..., 1]
    else:
        gate, up = x[..., :i], x[..., i:]
    if limit is not None:
        gate = torch.minimum(gate, torch.tensor(limit, dtype=torch.float64))
        up = torch.maximum(torch.minimum(up, torch.tensor(limit, dtype=torch.float64)), torch.tensor(-limit))
    return (up + up_offset) * gate * _sigmoid_f64(alpha * gate)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("limit", [7.0, None])
def test_swiglu_matches_float64(dtype, interleaved, limit):
    # Spread wide enough that the clamp at 7 bites on a good share of the inputs.
    x = (torch.randn(3, 5, 32, generator=_gen(6)) * 6).to(dtype)
    got = tk.swiglu(x, limit=limit, interleaved=interleaved, override=REF)
    assert got.dtype == dtype and got.shape == (3, 5, 16)
    _assert_rounded_close(got, _swiglu_f64(x, 1.702, limit, 1.0, interleaved))


def test_swiglu_custom_constants_and_out():
    x = torch.randn(4, 24, generator=_gen(7)) * 3
    out = torch.empty(4, 12)
    got = tk.swiglu(x, alpha=0.5, limit=2.5, up_offset=-0.25, interleaved=False, out=out, override=REF)
    assert got is out
    _assert_rounded_close(out, _swiglu_f64(x, 0.5, 2.5, -0.25, False))


def test_swiglu_gpt_oss_hand_value():
    # gate=10 -> 7, up=-10 -> -7: (-7 + 1) * 7 * sigmoid(1.702 * 7)
    x = torch.tensor([[10.0, -10.0]])
    expected = -6.0 * 7.0 / (1.0 + math.exp(-1.702 * 7.0))
    assert tk.swiglu(x, override=REF).item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_silu_and_mul_matches_float64(dtype):
    x = (torch.randn(7, 40, generator=_gen(8)) * 4).to(dtype)
    xd = x.double()
    gate, up = xd[:, :20], xd[:, 20:]
    got = tk.silu_and_mul(x, override=REF)
    assert got.dtype == dtype
    _assert_rounded_close(got, gate * _sigmoid_f64(gate) * up)


def test_activation_validation_names_the_argument():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="^x: expected an even last dim"):
        tk.swiglu(torch.randn(2, 7))
    with pytest.raises(TypeError, match="^x: expected dtype"):
        tk.silu_and_mul(x.double())
    with pytest.raises(ValueError, match="^limit:"):
        tk.swiglu(x, limit=-1.0)
    with pytest.raises(ValueError, match="^out: expected shape"):
        tk.silu_and_mul(x, out=torch.empty(2, 8))
    with pytest.raises(ValueError, match="^x: expected the last dim to be contiguous"):
        tk.swiglu(torch.randn(8, 2).T)


# ---------------------------------------------------------------------------
# apply_rotary


def _cos_sin_cache(max_pos: int, rot: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    angles = torch.arange(max_pos, dtype=torch.float64).unsqueeze(1) * inv_freq
    return torch.cat((angles.cos(), angles.sin()), dim=1).float()


def _neox_complex_f64(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Neox pairs (x[i], x[i + R/2]) as the complex number x[i] + i*x[i+R/2], times e^{i*theta}."""
    half = cache.shape[1] // 2
    rot = 2 * half
    xd = x.double()
    c = cache.double()[positions.long()]
    z = torch.complex(xd[..., :half], xd[..., half:rot])
    w = torch.complex(c[:, :half], c[:, half:]).unsqueeze(1)
    zr = z * w
    return torch.cat((zr.real, zr.imag, xd[..., rot:]), dim=-1)


def _gptj_loops_f64(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Gpt-j pairs (x[2i], x[2i+1]) rotated one pair at a time."""
    half = cache.shape[1] // 2
    out = x.double().clone()
    for t in range(x.shape[0]):
        row = cache[int(positions[t])].double()
        for h in range(x.shape[1]):
            for i in range(half):
                x1, x2 = float(x[t, h, 2 * i]), float(x[t, h, 2 * i + 1])
                cos, sin = float(row[i]), float(row[half + i])
                out[t, h, 2 * i] = x1 * cos - x2 * sin
                out[t, h, 2 * i + 1] = x2 * cos + x1 * sin
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("style", ["neox", "gptj"])
@pytest.mark.parametrize("rot", [16, 8])
def test_apply_rotary_matches_independent_formulation(dtype, style, rot):
    g = _gen(9)
    t, hq, hk, d = 5, 3, 2, 16
    q = torch.randn(t, hq, d, generator=g).to(dtype)
    k = torch.randn(t, hk, d, generator=g).to(dtype)
    cache = _cos_sin_cache(64, rot)
    positions = torch.tensor([7, 0, 63, 7, 30], dtype=torch.int32)
    q_before, k_before = q.clone(), k.clone()
    q_out, k_out = tk.apply_rotary(q, k, cache, positions, style=style, override=REF)
    assert torch.equal(q, q_before) and torch.equal(k, k_before), "inputs must not be modified"
    assert q_out.dtype == dtype and k_out.shape == k.shape
    expect = _neox_complex_f64 if style == "neox" else _gptj_loops_f64
    _assert_rounded_close(q_out, expect(q, cache, positions))
    _assert_rounded_close(k_out, expect(k, cache, positions))
    # Dims past the rotary dim pass through bit for bit.
    assert torch.equal(q_out[..., rot:], q[..., rot:]) and torch.equal(k_out[..., rot:], k[..., rot:])


def test_apply_rotary_styles_differ_and_positions_int64():
    g = _gen(10)
    q = torch.randn(4, 2, 8, generator=g)
    k = torch.randn(4, 1, 8, generator=g)
    cache = _cos_sin_cache(16, 8)
    pos = torch.tensor([1, 2, 3, 15])
    neox = tk.apply_rotary(q, k, cache, pos, override=REF)
    gptj = tk.apply_rotary(q, k, cache, pos.int(), style="gptj", override=REF)
    assert not torch.allclose(neox[0], gptj[0], atol=1e-3)
    _assert_rounded_close(neox[0], _neox_complex_f64(q, cache, pos))
    # Rotation keeps each pair's norm.
    pairs = gptj[1].reshape(4, 1, 4, 2).norm(dim=-1)
    torch.testing.assert_close(pairs, k.reshape(4, 1, 4, 2).norm(dim=-1), rtol=1e-5, atol=1e-6)


def test_apply_rotary_validation_names_the_argument():
    q = torch.randn(3, 2, 8)
    k = torch.randn(3, 1, 8)
    cache = _cos_sin_cache(8, 8)
    pos = torch.zeros(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="^cos_sin_cache: rotary dim 7"):
        tk.apply_rotary(q, k, torch.zeros(8, 7), pos)
    with pytest.raises(ValueError, match="^cos_sin_cache: rotary dim 10"):
        tk.apply_rotary(q, k, torch.zeros(8, 10), pos)
    with pytest.raises(TypeError, match="^k: expected dtype"):
        tk.apply_rotary(q, k.to(torch.bfloat16), cache, pos)
    with pytest.raises(ValueError, match="^k: expected shape"):
        tk.apply_rotary(q, torch.randn(3, 1, 4), cache, pos)
    with pytest.raises(TypeError, match="^positions: expected dtype"):
        tk.apply_rotary(q, k, cache, pos.float())
    with pytest.raises(ValueError, match="^style:"):
        tk.apply_rotary(q, k, cache, pos, style="llama")
    with pytest.raises(TypeError, match="^cos_sin_cache: expected dtype"):
        tk.apply_rotary(q, k, cache.double(), pos)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("style", ["neox", "gptj"])
def test_apply_rotary_and_store_matches_independent_formulation(dtype, style):
    """q rotated (float64 formulas above, rounded once); the cache rows of the slots hold the rotated k, rounded to
    k's dtype, and v; a negative slot and every other row are left as they were."""
    g = _gen(11)
    t, hq, hk, d, ps, pages = 5, 3, 2, 16, 4, 3
    q = torch.randn(t, hq, d, generator=g).to(dtype)
    k = torch.randn(t, hk, d, generator=g).to(dtype)
    v = torch.randn(t, hk, d, generator=g).to(dtype)
    cache = _cos_sin_cache(64, 16)
    positions = torch.tensor([7, 0, 63, 7, 30])
    slots = torch.tensor([5, -1, 11, 0, 6])
    k_cache, v_cache = torch.randn(pages, ps, hk, d, generator=g).to(dtype), torch.zeros(pages, ps, hk, d, dtype=dtype)
    k_before, v_before = k_cache.clone(), v_cache.clone()
    q_out = tk.apply_rotary_and_store(q, k, v, cache, positions, k_cache, v_cache, slots, style=style, override=REF)
    expect = _neox_complex_f64 if style == "neox" else _gptj_loops_f64
    _assert_rounded_close(q_out, expect(q, cache, positions))
    k_rot = expect(k, cache, positions)
    written = set()
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            written.add(s)
            _assert_rounded_close(k_cache[s // ps, s % ps], k_rot[i])
            assert torch.equal(v_cache[s // ps, s % ps], v[i])
    for s in set(range(pages * ps)) - written:
        assert torch.equal(k_cache[s // ps, s % ps], k_before[s // ps, s % ps])
        assert torch.equal(v_cache[s // ps, s % ps], v_before[s // ps, s % ps])


def test_apply_rotary_and_store_validation_names_the_argument():
    q, k, v = torch.randn(3, 2, 8), torch.randn(3, 1, 8), torch.randn(3, 1, 8)
    cache = _cos_sin_cache(8, 8)
    pos, slots = torch.zeros(3, dtype=torch.int64), torch.tensor([0, 1, 2])
    kc, vc = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    with pytest.raises(ValueError, match="^cos_sin_cache: rotary dim 7"):
        tk.apply_rotary_and_store(q, k, v, torch.zeros(8, 7), pos, kc, vc, slots)
    with pytest.raises(ValueError, match="^v: expected shape"):
        tk.apply_rotary_and_store(q, k, torch.randn(3, 2, 8), cache, pos, kc, vc, slots)
    with pytest.raises(ValueError, match="^k: expected shape"):
        tk.apply_rotary_and_store(q, k, v, cache, pos, torch.zeros(2, 4, 2, 8), torch.zeros(2, 4, 2, 8), slots)
    with pytest.raises(ValueError, match="^slot_mapping: slot 8 is past"):
        tk.apply_rotary_and_store(q, k, v, cache, pos, kc, vc, torch.tensor([0, 8, 1]))
    with pytest.raises(TypeError, match="^v_cache: expected dtype"):
        tk.apply_rotary_and_store(q, k, v, cache, pos, kc, vc.double(), slots)


def test_fp8_granularity_of_one_row_scales():
    from tokenspeed_kernel.core.formats import fp8_granularity

    one = torch.ones(1, 1)
    assert fp8_granularity(one, 1, 256, weight=False, name="a_scale") == "per_token"
    assert fp8_granularity(torch.ones(1), 1, 256, weight=False, name="a_scale") == "per_tensor"
    assert fp8_granularity(one, 4, 256, weight=False, name="a_scale") == "per_tensor"
    assert fp8_granularity(torch.ones(1, 1), 1, 256, weight=True, name="b_scale") == "per_channel"


def test_scalar_and_index_arguments_must_be_finite_and_in_range():
    x = torch.randn(3, 8)
    with pytest.raises(ValueError, match="^eps: expected a finite float >= 0, got nan"):
        tk.rmsnorm(x, torch.ones(8), float("nan"))
    with pytest.raises(TypeError, match=r"^eps: expected a finite float >= 0, got '1e-5' \(str\)"):
        tk.rmsnorm(x, torch.ones(8), "1e-5")
    with pytest.raises(ValueError, match="^alpha: expected a finite float, got inf"):
        tk.swiglu(x, alpha=float("inf"))
    with pytest.raises(TypeError, match=r"^up_offset: expected a finite float, got None \(NoneType\)"):
        tk.swiglu(x, up_offset=None)
    with pytest.raises(ValueError, match="^limit: expected None or a finite float > 0, got nan"):
        tk.swiglu(x, limit=float("nan"))
    q, k = torch.randn(3, 2, 8), torch.randn(3, 1, 8)
    with pytest.raises(ValueError, match=r"^positions: expected rows of cos_sin_cache in \[0, 8\), got \[0, 8\]"):
        tk.apply_rotary(q, k, _cos_sin_cache(8, 8), torch.tensor([0, 3, 8]))
    with pytest.raises(ValueError, match=r"^positions: expected rows of cos_sin_cache in \[0, 8\), got \[-1, 3\]"):
        tk.apply_rotary(q, k, _cos_sin_cache(8, 8), torch.tensor([0, 3, -1]))

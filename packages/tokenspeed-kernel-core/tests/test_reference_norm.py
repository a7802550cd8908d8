"""Reference rmsnorm against the float64 formula, the fused residual, and GPT-OSS's weight-in-fp32 rule."""

from __future__ import annotations

import pytest
import torch

import tokenspeed_kernel as tk

REF = "reference"


def _rmsnorm_f64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xd = x.double()
    return xd / torch.sqrt((xd * xd).mean(dim=-1, keepdim=True) + eps) * weight.double()


def _assert_rounded_close(actual: torch.Tensor, exact: torch.Tensor) -> None:
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual.double(), exact, rtol=1e-5, atol=1e-6)
        return
    ulp = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}[actual.dtype]
    torch.testing.assert_close(actual.double(), exact.to(actual.dtype).double(), rtol=ulp, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(7, 64), (2, 3, 48)])
def test_rmsnorm_matches_float64(dtype, shape):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 3 + 0.5).to(dtype)
    weight = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype)
    got = tk.rmsnorm(x, weight, 1e-5, override=REF)
    assert got.dtype == dtype and got.shape == x.shape
    _assert_rounded_close(got, _rmsnorm_f64(x, weight, 1e-5))


def test_eps_is_inside_the_square_root():
    # mean(x^2) = 1e-6, comparable to eps: y = x / sqrt(1e-6 + eps).
    x = torch.full((1, 16), 1e-3)
    weight = torch.ones(16)
    got = tk.rmsnorm(x, weight, 1e-6, override=REF)
    torch.testing.assert_close(got, torch.full((1, 16), 1e-3 / (2e-6) ** 0.5), rtol=1e-6, atol=0)
    assert tk.rmsnorm(x, weight, 0.0, override=REF)[0, 0].item() == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_residual_returns_rounded_sum_and_its_norm(dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 32, generator=g).to(dtype)
    residual = (torch.randn(5, 32, generator=g) * 4).to(dtype)
    weight = torch.rand(32, generator=g).to(dtype) + 0.5
    out = torch.empty_like(x)
    y, s = tk.rmsnorm(x, weight, 1e-5, residual=residual, out=out, override=REF)
    assert y is out
    # The sum is rounded once to x's dtype, and that rounded sum is what gets normalised.
    expected_sum = (x.double() + residual.double()).to(dtype)
    assert s.dtype == dtype and torch.equal(s, expected_sum)
    _assert_rounded_close(y, _rmsnorm_f64(expected_sum, weight, 1e-5))
    assert not torch.equal(residual, s), "the residual input must not be overwritten"


def test_gpt_oss_weight_multiplied_in_fp32_before_the_cast():
    # bf16 activations with an fp32 weight whose values bf16 cannot hold. GPT-OSS:
    # cast(norm(x) * w) in fp32; the Llama order, cast(norm(x)) * w, rounds twice.
    g = torch.Generator().manual_seed(2)
    h = 256
    x = torch.randn(16, h, generator=g).to(torch.bfloat16)
    weight = torch.rand(h, generator=g) * 2 + 0.3
    got = tk.rmsnorm(x, weight, 1e-5, override=REF)
    gpt_oss = _rmsnorm_f64(x, weight, 1e-5).to(torch.bfloat16)
    xd = x.double()
    llama = (xd / torch.sqrt((xd * xd).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16) * weight.to(torch.bfloat16)
    # fp32 vs fp64 intermediate rounding may flip a rare element by one ulp.
    assert (got != gpt_oss).float().mean().item() < 0.01
    assert (got != llama).float().mean().item() > 0.1


def test_rmsnorm_validation_names_the_argument():
    x = torch.randn(4, 8)
    w = torch.ones(8)
    with pytest.raises(ValueError, match="^weight: expected shape"):
        tk.rmsnorm(x, torch.ones(7))
    with pytest.raises(TypeError, match="^weight: expected dtype"):
        tk.rmsnorm(x, w.double())
    with pytest.raises(TypeError, match="^residual: expected dtype"):
        tk.rmsnorm(x, w, residual=x.to(torch.bfloat16))
    with pytest.raises(ValueError, match="^residual: expected shape"):
        tk.rmsnorm(x, w, residual=torch.randn(4, 4))
    with pytest.raises(ValueError, match="^eps:"):
        tk.rmsnorm(x, w, -1.0)
    with pytest.raises(ValueError, match="^x: expected the last dim to be contiguous"):
        tk.rmsnorm(torch.randn(8, 4).T, w)
    with pytest.raises(ValueError, match="^out: expected shape"):
        tk.rmsnorm(x, w, out=torch.empty(4, 9))

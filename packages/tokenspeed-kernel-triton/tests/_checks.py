"""Checks shared by this folder's numerics tests (conftest puts the folder on ``sys.path``)."""

from __future__ import annotations

import torch

from tokenspeed_kernel.core.platform import platform_for_device
from tokenspeed_kernel.core.selection import select_spec

#: Output rounding of one element: bf16 keeps 8 significant bits, fp16 11. The
#: interpreter truncates fp32 -> bf16 instead of rounding, hence a full ulp for bf16.
ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-20}

#: E2M1 magnitudes of codes 0..7 (8..15 are their negatives).
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def assert_triton(op: str, signature: tuple[str, ...], traits: dict, device: torch.device) -> None:
    """Selection picks ``triton.<op>`` for this call key on ``device``'s platform."""
    spec = select_spec(op, signature, traits, platform=platform_for_device(device)).spec
    assert spec.name == f"triton.{op}", f"selection picked {spec.name} for {op}"


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, scale: float | None = None) -> None:
    """|actual - expected| <= a few output ulps of the largest |expected| (or ``scale``)."""
    expected = expected.to(torch.float64)
    bound = (scale if scale is not None else expected.abs().max().item()) * 2 * ULP[dtype] + 1e-30
    err = (actual.to(torch.float64) - expected).abs().max().item()
    assert err <= bound, f"max error {err:.3g} > {bound:.3g}"

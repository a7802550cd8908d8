"""Reference dense matmul: dequantise both operands to fp32, one fp32 matmul, one cast."""

from __future__ import annotations

import torch

from ..core.formats import fp8_granularity
from .quantization import mxfp4_to_float

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _expand_scale(scale: torch.Tensor, rows: int, cols: int, *, weight: bool, name: str) -> torch.Tensor:
    """The scale of every element of a ``[rows, cols]`` FP8 operand, ``float32 [rows, cols]`` (or broadcastable)."""
    granularity = fp8_granularity(scale, rows, cols, weight=weight, name=name)
    s = scale.to(torch.float32)
    if granularity == "per_tensor":
        return s.reshape(1, 1)
    if granularity in ("per_token", "per_channel"):
        return s.reshape(rows, 1)
    # block128: one scale per 1x128 (activation) or 128x128 (weight) block; the
    # last block along each dim may be partial, hence the crop.
    s = s.repeat_interleave(128, dim=1)[:, :cols]
    if weight:
        s = s.repeat_interleave(128, dim=0)[:rows]
    return s


def mm(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    a_scale: torch.Tensor | None,
    b_scale: torch.Tensor | None,
    out_dtype: torch.dtype,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """``out [M, N] = (a * a_scale) @ (b * b_scale).T + bias``, accumulated in fp32.

    Args:
        a: ``[M, K]`` bf16/fp16/fp32, or fp8 with ``a_scale float32`` of shape
            ``[1]``, ``[M, 1]`` or ``[M, ceil(K/128)]``.
        b: ``[N, K]`` like ``a``; fp8 with ``b_scale float32`` of shape ``[1]``,
            ``[N, 1]`` or ``[ceil(N/128), ceil(K/128)]``; or MXFP4 ``uint8 [N, K/2]``
            with E8M0 ``b_scale uint8 [N, K/32]``.
        bias: optional ``[N]``, added in fp32.
        out_dtype: the result's dtype.
        out: optional ``[M, N]`` of ``out_dtype``, written and returned.
    """
    m, k = a.shape
    n = b.shape[0]
    af = a.to(torch.float32)
    if a.dtype in _FP8:
        af = af * _expand_scale(a_scale, m, k, weight=False, name="a_scale")
    if b.dtype == torch.uint8:
        bf = mxfp4_to_float(b, b_scale)
    else:
        bf = b.to(torch.float32)
        if b.dtype in _FP8:
            bf = bf * _expand_scale(b_scale, n, k, weight=True, name="b_scale")
    y = af @ bf.T
    if bias is not None:
        y = y + bias.to(torch.float32)
    y = y.to(out_dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y

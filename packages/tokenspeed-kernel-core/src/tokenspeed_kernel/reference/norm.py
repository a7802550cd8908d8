"""Reference RMSNorm (GPT-OSS numerics: weight multiplied in fp32, one final cast)."""

from __future__ import annotations

import torch


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if residual is not None:
        x = x + residual
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    y = y.to(x.dtype)
    if out is not None:
        out.copy_(y)
        y = out
    return (y, x) if residual is not None else y

"""AITER RMSNorm behind ``tokenspeed_kernel.rmsnorm``'s arguments."""

from __future__ import annotations

import torch

__all__ = ["rmsnorm"]


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.shape[-1]).contiguous()


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-5,
    *,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm (+ residual) through ``aiter.rmsnorm2d_fwd`` / ``aiter.rmsnorm2d_fwd_with_add``.

    Args:
        x: ``[..., H]`` bf16/fp16.
        weight: ``[H]``. AITER takes it in ``x``'s dtype; a weight of another dtype is
            not rounded (that would change the numerics): the call then runs the
            package's Gluon kernel instead.
        eps: added to the mean square.
        residual: optional, like ``x``; then returns ``(y, x + residual)``.
        out: optional output like ``x``.
    """
    if weight.dtype != x.dtype:
        from ..cdna import norm as gluon_norm
        from ..cdna.arch import GFX950

        # The Gluon RMSNorm compiles to the same code on gfx942 and gfx950.
        return gluon_norm.rmsnorm(GFX950, x, weight, eps, residual=residual, out=out)
    import aiter

    n = x.shape[-1]
    x2 = _rows(x)
    w = weight.contiguous()
    if residual is None:
        y2 = aiter.rmsnorm2d_fwd(x2, w, float(eps))
        s = None
    else:
        y2 = torch.empty_like(x2)
        s = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        aiter.rmsnorm2d_fwd_with_add(y2, x2, _rows(residual), s.view(-1, n), w, float(eps))
    y = y2.view(x.shape)
    if out is not None:
        out.copy_(y)
        y = out
    return (y, s) if residual is not None else y

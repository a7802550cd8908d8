"""Reference gated activations, computed in fp32 with one final cast."""

from __future__ import annotations

import torch


def _finish(y: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
    y = y.to(dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y


def swiglu(
    x: torch.Tensor,
    *,
    alpha: float,
    limit: float | None,
    up_offset: float,
    interleaved: bool,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """GPT-OSS SwiGLU: ``x [..., 2I]`` -> ``[..., I]`` of ``x``'s dtype.

    Args:
        x: ``[..., 2I]`` bf16/fp16/fp32; gate/up are the even/odd elements if
            ``interleaved``, else the first/second halves.
        alpha: sigmoid slope.
        limit: ``None`` or the clamp: ``gate <= limit``, ``-limit <= up <= limit``.
        up_offset: added to ``up`` before the product.
        out: optional ``[..., I]`` like ``x``, written and returned.
    """
    xf = x.to(torch.float32)
    if interleaved:
        gate, up = xf[..., 0::2], xf[..., 1::2]
    else:
        gate, up = xf.chunk(2, dim=-1)
    if limit is not None:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    y = (up + up_offset) * gate * torch.sigmoid(alpha * gate)
    return _finish(y, x.dtype, out)


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None) -> torch.Tensor:
    """``silu(x[..., :I]) * x[..., I:]`` -> ``[..., I]`` of ``x``'s dtype (fp32 math).

    Args:
        x: ``[..., 2I]`` bf16/fp16/fp32.
        out: optional ``[..., I]`` like ``x``, written and returned.
    """
    gate, up = x.to(torch.float32).chunk(2, dim=-1)
    return _finish(torch.nn.functional.silu(gate) * up, x.dtype, out)

"""Portable Triton gated activations: GPT-OSS SwiGLU and SiLU-and-mul (fp32 math, one cast).

``silu(g) * u`` is SwiGLU with ``alpha = 1``, no clamp, ``up_offset = 0`` and
gate/up in halves, so both ops run the same kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2

from ._host import RowConfig, RowsOut, as_rows, row_config

__all__ = ["SWIGLU_CONFIGS", "swiglu", "silu_and_mul", "TRITON_KERNELS"]

#: Per family: ``block`` is the widest chunk of a row's I outputs one program holds.
#: Not measured on hardware (1024 lanes of 4 warps: 8 values a thread); the interpreter's
#: 16 makes test rows span several programs with a tail.
SWIGLU_CONFIGS: dict[str, RowConfig] = {
    "nvidia": RowConfig(block=1024, num_warps=4),
    "amd": RowConfig(block=1024, num_warps=4),
    "interpret": RowConfig(block=16),
}


@triton.jit
def _swiglu_kernel(
    x_ptr,
    y_ptr,
    I,
    stride_x,
    stride_y,
    alpha,
    limit,
    up_offset,
    INTERLEAVED: tl.constexpr,
    CLAMP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = j < I
    x_row = x_ptr + row * stride_x
    if INTERLEAVED:
        # (gate, up) pairs are adjacent: one [BLOCK, 2] load reads them as contiguous
        # pairs (vectorised), then split separates the two columns in registers.
        pair = (2 * j)[:, None] + tl.arange(0, 2)[None, :]
        gate, up = tl.split(tl.load(x_row + pair, mask=mask[:, None], other=0.0).to(tl.float32))
    else:
        gate = tl.load(x_row + j, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_row + I + j, mask=mask, other=0.0).to(tl.float32)
    if CLAMP:
        gate = tl.minimum(gate, limit)
        up = tl.clamp(up, -limit, limit)
    y = (up + up_offset) * gate * tl.sigmoid(alpha * gate)
    tl.store(y_ptr + row * stride_y + j, y.to(y_ptr.dtype.element_ty), mask=mask)


TRITON_KERNELS = {"swiglu": _swiglu_kernel}


def _launch(
    x: torch.Tensor, out: torch.Tensor | None, alpha: float, limit: float | None, up_offset: float, interleaved: bool
) -> torch.Tensor:
    inter = x.shape[-1] // 2
    x2 = as_rows(x)
    y = RowsOut(out, (*x.shape[:-1], inter), x.dtype, x.device)
    if x2.shape[0] and inter:
        cfg = row_config(SWIGLU_CONFIGS, x.device)
        block = min(cfg.block, next_power_of_2(inter))
        cached(_swiglu_kernel)[(x2.shape[0], cdiv(inter, block))](
            x2, y.rows, inter, x2.stride(0), y.rows.stride(0),
            alpha, limit if limit is not None else 0.0, up_offset,
            INTERLEAVED=interleaved,
            CLAMP=limit is not None,
            BLOCK=block,
            num_warps=cfg.num_warps,
            **cfg.launch,
        )  # fmt: skip
    return y.finish()


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
        x: ``[..., 2I]`` bf16/fp16/fp32, last dim contiguous; gate/up are the
            even/odd elements if ``interleaved``, else the two halves.
        alpha: sigmoid slope.
        limit: None, or the clamp ``gate <= limit``, ``-limit <= up <= limit``.
        up_offset: added to ``up``: ``y = (up + up_offset) * gate * sigmoid(alpha * gate)``.
        out: optional ``[..., I]`` like ``x``.
    """
    return _launch(x, out, alpha, limit, up_offset, interleaved)


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None) -> torch.Tensor:
    """``silu(x[..., :I]) * x[..., I:]`` on ``x [..., 2I]`` -> ``[..., I]`` (fp32 math).

    Args:
        x: ``[..., 2I]`` bf16/fp16/fp32, last dim contiguous.
        out: optional ``[..., I]`` like ``x``.
    """
    return _launch(x, out, 1.0, None, 0.0, False)

"""Gluon RMSNorm (+ fused residual add) for CDNA3 / CDNA4.

One program per row. Rows up to ``_SINGLE_PASS_MAX`` elements stay in registers
(one HBM read of ``x``, one write of ``y``); longer rows take two passes, the second
re-reading the row (or the residual sum it wrote) from L2. Every global access is
a 16-byte buffer load/store from a per-row 64-bit scalar base.

GPT-OSS numerics (as the reference): ``s = x + residual`` rounded to ``x``'s dtype,
``y = (s_fp32 * rsqrt(mean(s_fp32^2) + eps)) * weight_fp32`` cast once.
"""

from __future__ import annotations

from typing import Any

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .._launch import KernelLaunch, next_pow2
from .arch import CdnaArch

__all__ = ["rmsnorm", "rmsnorm_launch"]

#: Longest row normalised from registers (fp32 values per lane: this / 512 at 8 warps).
_SINGLE_PASS_MAX = 16384
#: Chunk of the two-pass path.
_CHUNK = 8192


@gluon.jit
def _rmsnorm_kernel(
    x_ptr, w_ptr, r_ptr, y_ptr, s_ptr, n_cols, stride_x, stride_w, stride_r, stride_y, stride_s, eps,
    BLOCK: gl.constexpr, NUM_CHUNKS: gl.constexpr, VEC: gl.constexpr, HAS_RESIDUAL: gl.constexpr,
    NUM_WARPS: gl.constexpr,
):  # fmt: skip
    # VEC elements = 16 bytes per lane per access; lanes then warps along the row.
    LAYOUT: gl.constexpr = gl.BlockedLayout([VEC], [64], [NUM_WARPS], [0])
    dtype: gl.constexpr = x_ptr.dtype.element_ty
    row = gl.program_id(0).to(gl.int64)
    x_row = x_ptr + row * stride_x
    y_row = y_ptr + row * stride_y
    cols = gl.arange(0, BLOCK, layout=LAYOUT)
    if NUM_CHUNKS == 1:
        ok = cols < n_cols
        x = gl.amd.cdna3.buffer_load(x_row, cols, mask=ok, other=0.0)
        if HAS_RESIDUAL:
            r = gl.amd.cdna3.buffer_load(r_ptr + row * stride_r, cols, mask=ok, other=0.0)
            x = (x.to(gl.float32) + r.to(gl.float32)).to(dtype)
            gl.amd.cdna3.buffer_store(x, s_ptr + row * stride_s, cols, mask=ok)
        xf = x.to(gl.float32)
        rstd = gl.rsqrt(gl.sum(xf * xf, axis=0) / n_cols + eps)
        w = gl.amd.cdna3.buffer_load(w_ptr, cols * stride_w, mask=ok, other=0.0).to(gl.float32)
        gl.amd.cdna3.buffer_store((xf * rstd * w).to(dtype), y_row, cols, mask=ok)
    else:
        # Pass 1: sum of squares (and the residual sum, written once).
        sq = gl.zeros([BLOCK], gl.float32, LAYOUT)
        for c in range(NUM_CHUNKS):
            cc = c * BLOCK + cols
            ok = cc < n_cols
            x = gl.amd.cdna3.buffer_load(x_row, cc, mask=ok, other=0.0)
            if HAS_RESIDUAL:
                r = gl.amd.cdna3.buffer_load(r_ptr + row * stride_r, cc, mask=ok, other=0.0)
                x = (x.to(gl.float32) + r.to(gl.float32)).to(dtype)
                gl.amd.cdna3.buffer_store(x, s_ptr + row * stride_s, cc, mask=ok)
            xf = x.to(gl.float32)
            sq += xf * xf
        rstd = gl.rsqrt(gl.sum(sq, axis=0) / n_cols + eps)
        # Pass 2: each lane re-reads exactly the elements it wrote in pass 1, so the
        # residual sum needs no barrier before it is read back.
        src_row = x_row
        if HAS_RESIDUAL:
            src_row = s_ptr + row * stride_s
        for c in range(NUM_CHUNKS):
            cc = c * BLOCK + cols
            ok = cc < n_cols
            xf = gl.amd.cdna3.buffer_load(src_row, cc, mask=ok, other=0.0).to(gl.float32)
            w = gl.amd.cdna3.buffer_load(w_ptr, cc * stride_w, mask=ok, other=0.0).to(gl.float32)
            gl.amd.cdna3.buffer_store((xf * rstd * w).to(dtype), y_row, cc, mask=ok)


def _rows(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` as a [rows, H] view with unit column stride, or None when no such view exists."""
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return None


def rmsnorm_launch(
    x2: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    y2: torch.Tensor,
    residual2: torch.Tensor | None,
    sum2: torch.Tensor | None,
) -> KernelLaunch:
    """The launch :func:`rmsnorm` makes for [rows, H] views (no allocation)."""
    rows, n = x2.shape
    vec = 16 // x2.element_size()
    if n <= _SINGLE_PASS_MAX:
        block, chunks = max(64, next_pow2(n)), 1
    else:
        block, chunks = _CHUNK, -(-n // _CHUNK)
    vec = min(vec, block // 64)
    warps = max(1, min(8, block // (vec * 64)))
    res_stride = residual2.stride(0) if residual2 is not None else 0
    sum_stride = sum2.stride(0) if sum2 is not None else 0
    args = (
        x2, weight, residual2, y2, sum2, n, x2.stride(0), weight.stride(0), res_stride, y2.stride(0), sum_stride,
        float(eps),
    )  # fmt: skip
    kwargs: dict[str, Any] = dict(
        BLOCK=block, NUM_CHUNKS=chunks, VEC=vec, HAS_RESIDUAL=residual2 is not None, NUM_WARPS=warps, num_warps=warps
    )
    return KernelLaunch(_rmsnorm_kernel, (rows,), args, kwargs)


def rmsnorm(
    arch: CdnaArch,
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-5,
    *,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim; arguments as ``tokenspeed_kernel.rmsnorm``.

    Args:
        arch: the CDNA target (the kernel is the same on gfx942 and gfx950; the
            argument keeps the per-arch entry points uniform).
        x: ``[..., H]`` bf16/fp16/fp32, last dim contiguous.
        weight: ``[H]`` any float dtype, used in fp32.
        eps: added to the mean square.
        residual: optional, like ``x``: ``s = x + residual`` is normalised and returned.
        out: optional output like ``x``.

    Returns:
        ``y``, or ``(y, s)`` with a residual.
    """
    del arch
    n = x.shape[-1]
    x2 = _rows(x)
    if x2 is None:
        x2 = x.reshape(-1, n).contiguous()
    r2 = None
    s = s2 = None
    if residual is not None:
        r2 = _rows(residual)
        if r2 is None:
            r2 = residual.reshape(-1, n).contiguous()
        s = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        s2 = s.view(-1, n)
    y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y2 = _rows(y)
    staged = y2 is None
    if staged:
        y2 = torch.empty((x2.shape[0], n), dtype=x.dtype, device=x.device)
    if x2.shape[0] and n:
        rmsnorm_launch(x2, weight, eps, y2, r2, s2)()
    if staged:
        y.copy_(y2.view(y.shape))
    return (y, s) if residual is not None else y

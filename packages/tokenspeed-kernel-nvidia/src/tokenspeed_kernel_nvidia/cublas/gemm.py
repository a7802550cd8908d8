"""``mm`` through cuBLAS / cuBLASLt as PyTorch ships it (``torch.addmm``, ``torch._scaled_mm``).

bf16/fp16: ``out = bias + a @ b.T`` in one cuBLAS call (fp32 accumulation).
FP8 e4m3: ``torch._scaled_mm`` with per-tensor scales, or row-wise scales
(``a_scale [M, 1]`` per token with ``b_scale [N, 1]`` per channel), which
cuBLASLt applies in its epilogue. ``b`` is ``[N, K]`` row-major, so ``b.T`` is the
column-major operand cuBLASLt wants, without a copy.
"""

from __future__ import annotations

import torch


def mm_dense(a, b, bias, *, a_scale, b_scale, out_dtype, out):
    if out is None and (bias is None or bias.dtype == a.dtype):
        # One C++ call (ATen's linear is this addmm / mm for 2-D a): no Python-side transpose or cast.
        return _linear(a, b, bias)
    if bias is None:
        return torch.mm(a, b.t(), out=out)
    return torch.addmm(bias.to(a.dtype), a, b.t(), out=out)


_linear = torch.nn.functional.linear


def mm_fp8(a, b, bias, *, a_scale, b_scale, out_dtype, out):
    if a_scale.dim() == 2:
        # Row-wise (per token x per channel; also for M = 1): cuBLASLt wants [M, 1] and [1, N].
        scale_a, scale_b = a_scale.contiguous(), b_scale.reshape(1, -1)
    else:
        scale_a, scale_b = a_scale.reshape(()), b_scale.reshape(())
    y = torch._scaled_mm(
        a,
        b.t(),
        scale_a=scale_a,
        scale_b=scale_b,
        bias=None if bias is None else bias.to(out_dtype),
        out_dtype=out_dtype,
    )
    if out is not None:
        out.copy_(y)
        return out
    return y

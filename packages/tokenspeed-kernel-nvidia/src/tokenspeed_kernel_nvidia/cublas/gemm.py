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
    if bias is None:
        return torch.mm(a, b.t(), out=out)
    return torch.addmm(bias.to(a.dtype), a, b.t(), out=out)


def mm_fp8(a, b, bias, *, a_scale, b_scale, out_dtype, out):
    scale_b = b_scale if b_scale.numel() == 1 else b_scale.reshape(1, -1)
    scale_a = a_scale if a_scale.numel() == 1 else a_scale.reshape(-1, 1)
    y = torch._scaled_mm(
        a, b.t(), scale_a=scale_a.reshape(()) if scale_a.numel() == 1 else scale_a,
        scale_b=scale_b.reshape(()) if scale_b.numel() == 1 else scale_b,
        bias=None if bias is None else bias.to(out_dtype), out_dtype=out_dtype,
    )  # fmt: skip
    if out is not None:
        out.copy_(y)
        return out
    return y

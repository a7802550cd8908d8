"""FlashInfer RMSNorm wrapper (``flashinfer.norm.rmsnorm``).

Numerics (FlashInfer 0.7.4, both its CuTe-DSL kernel and its CUDA fallback):
``x`` is read in fp32, ``rsqrt(mean(x^2) + eps)`` (hardware approximate rsqrt)
multiplies it, then the weight, read as fp32, multiplies that product, and the
result is cast once to ``x``'s dtype: GPT-OSS's order (weight multiplied before
the one cast). The kernel reads the weight in ``x``'s dtype, so a weight of
another dtype is cast to ``x``'s dtype first; GPT-OSS weights are bf16 like its
activations (exact), but an fp32 weight with bf16 ``x`` is rounded to bf16 here,
unlike the op contract's fp32 weight.

Only the plain variant is registered. FlashInfer's ``fused_add_rmsnorm`` writes
the sum into ``residual`` and the output into ``x`` (our op must not modify its
inputs: honouring that costs two extra copies, more traffic than an unfused add)
and normalises the unrounded fp32 sum, while our contract normalises the sum
rounded to ``x``'s dtype.
"""

from __future__ import annotations

import torch

from ._jit import first_use, import_flashinfer

_fi = import_flashinfer()


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y = x / sqrt(mean(x^2) + eps) * weight`` over the last dim (no residual; see the module doc)."""
    if residual is not None:
        raise ValueError("residual: the FlashInfer RMSNorm kernel is registered for fused_residual=False only")
    h = x.shape[-1]
    rows = x.numel() // h if h else 0
    result = out if out is not None else torch.empty_like(x, memory_format=torch.contiguous_format)
    if rows == 0:
        return result
    x2 = x.reshape(rows, h)  # a view unless x's rows are not evenly strided
    w = weight if weight.dtype == x.dtype else weight.to(x.dtype)
    try:
        y2, copy_back = result.view(rows, h), False
    except RuntimeError:  # an out= whose rows cannot be flattened: write a temporary, then copy
        y2, copy_back = torch.empty(rows, h, dtype=x.dtype, device=x.device), True
    with first_use(f"rmsnorm {str(x.dtype).removeprefix('torch.')}"):
        _fi.rmsnorm(x2, w, eps, out=y2)
    if copy_back:
        result.copy_(y2.view(result.shape))
    return result

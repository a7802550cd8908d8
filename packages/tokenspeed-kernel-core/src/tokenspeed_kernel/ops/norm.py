"""RMSNorm with an optional fused residual add."""

from __future__ import annotations

import torch

from ..core.contracts import ANY, Size, TraitSpec
from ..core.formats import DTYPE_NAMES
from ..core.op import KernelCall, Op, Reference, kernel_call
from ..core.validation import check_float, check_same_device, check_tensor

__all__ = ["rmsnorm"]

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_FLOAT = ("fp32", "bf16", "fp16")


def _bind_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-5,
    *,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> KernelCall:
    """``y = (x / sqrt(mean(x^2) + eps)) * weight`` over the last dim.

    GPT-OSS numerics: ``x`` is upcast to fp32, normalised, multiplied by
    ``weight`` in fp32, and cast once to ``x``'s dtype.

    Args:
        x: ``[..., H]`` bf16/fp16/fp32, last dim contiguous.
        weight: ``[H]`` (any float dtype; used in fp32).
        eps: added to the mean square.
        residual: optional, same shape and dtype as ``x``: then ``s = x +
            residual`` (rounded to ``x``'s dtype) is normalised and the call
            returns ``(y, s)``.
        out: optional output like ``x``.
    """
    check_tensor("x", x, dtypes=_DTYPES, last_dim_contiguous=True)
    if x.dim() < 1:
        raise ValueError("x: expected at least 1 dim")
    check_tensor("weight", weight, dtypes=_DTYPES, shape=(x.shape[-1],))
    if residual is not None:
        check_tensor("residual", residual, dtypes=(x.dtype,), shape=tuple(x.shape), last_dim_contiguous=True)
    if out is not None:
        check_tensor("out", out, dtypes=(x.dtype,), shape=tuple(x.shape), last_dim_contiguous=True)
    eps = check_float("eps", eps, minimum=0.0, expected="a finite float >= 0")
    device = x.device
    if weight.device != device or (residual is not None or out is not None):
        check_same_device("x", x, weight=weight, residual=residual, out=out)
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return kernel_call(
        device, (DTYPE_NAMES[x.dtype],), (("fused_residual", residual is not None),), (rows,),
        x, weight, eps, residual=residual, out=out,
    )  # fmt: skip


def _fake_rmsnorm(x, weight, eps=1e-5, *, residual=None, out=None):
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    return (y, torch.empty_like(y)) if residual is not None else y


rmsnorm = Op(
    name="rmsnorm",
    family="norm",
    roles=("x",),
    traits={"fused_residual": TraitSpec(bool, default=False, doc="add a residual first and return the sum")},
    sizes=(Size("rows", "rows of x (every dim but the last)"),),
    doc="RMSNorm (+ residual).",
    bind=_bind_rmsnorm,
    fake=_fake_rmsnorm,
    reference=Reference(
        "tokenspeed_kernel.reference.norm:rmsnorm", formats=[{"x": _FLOAT}], traits={"fused_residual": ANY}
    ),
    workload="tokenspeed_kernel.numerics.cases.norm:RMSNORM",
)

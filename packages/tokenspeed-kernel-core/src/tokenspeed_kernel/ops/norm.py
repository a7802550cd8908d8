"""RMSNorm with an optional fused residual add."""

from __future__ import annotations

import torch

from ..core import dispatch
from ..core.contracts import TraitSpec, define_op
from ..core.formats import DTYPE_NAMES
from ..core.selection import Target
from ..core.validation import check_same_device, check_tensor

__all__ = ["rmsnorm"]

RMSNORM = define_op(
    "rmsnorm",
    family="norm",
    roles=("x",),
    traits={"fused_residual": TraitSpec(bool, default=False, doc="add a residual first and return the sum")},
    doc="RMSNorm (+ residual).",
)
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-5,
    *,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    solution: Target | None = None,
    override: Target | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
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
    if not isinstance(eps, (int, float)) or eps < 0:
        raise ValueError(f"eps: expected a float >= 0, got {eps!r}")
    device = x.device
    if weight.device != device or (residual is not None or out is not None):
        check_same_device("x", x, weight=weight, residual=residual, out=out)
    return dispatch.run(
        "rmsnorm", device, (DTYPE_NAMES[x.dtype],), (("fused_residual", residual is not None),), solution, override,
        x, weight, float(eps), residual=residual, out=out,
    )  # fmt: skip

"""Gated activations: GPT-OSS SwiGLU and SiLU-and-mul."""

from __future__ import annotations

import torch

from ..core.contracts import ANY, Size, TraitSpec
from ..core.formats import DTYPE_NAMES
from ..core.op import KernelCall, Op, Reference, kernel_call
from ..core.validation import check_float, check_same_device, check_tensor

__all__ = ["swiglu", "silu_and_mul"]

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_FLOAT = ("fp32", "bf16", "fp16")
_ROWS = (Size("rows", "rows of x (every dim but the last)"),)


def _check(x: torch.Tensor, out: torch.Tensor | None) -> int:
    """Checks shared by the gated activations; returns the row count."""
    check_tensor("x", x, dtypes=_DTYPES, last_dim_contiguous=True)
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"x: expected an even last dim (gate + up), got shape {list(x.shape)}")
    if out is not None:
        check_tensor("out", out, dtypes=(x.dtype,), shape=(*x.shape[:-1], x.shape[-1] // 2), last_dim_contiguous=True)
        check_same_device("x", x, out=out)
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def _fake_gated(x, *, out=None, **_):
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _bind_swiglu(
    x: torch.Tensor,
    *,
    alpha: float = 1.702,
    limit: float | None = 7.0,
    up_offset: float = 1.0,
    interleaved: bool = True,
    out: torch.Tensor | None = None,
) -> KernelCall:
    """GPT-OSS SwiGLU on ``x [..., 2I]`` -> ``[..., I]``, computed in fp32.

    ``gate, up = x[..., 0::2], x[..., 1::2]`` if ``interleaved`` else the two
    halves; with ``limit``: ``gate = min(gate, limit)``, ``up = clamp(up, -limit,
    limit)``; ``out = (up + up_offset) * gate * sigmoid(alpha * gate)``.
    """
    rows = _check(x, out)
    if limit is not None:
        limit = check_float("limit", limit, minimum=0.0, strict=True, expected="None or a finite float > 0")
    alpha = check_float("alpha", alpha, expected="a finite float")
    up_offset = check_float("up_offset", up_offset, expected="a finite float")
    traits = {"interleaved": bool(interleaved), "clamp": limit is not None}
    return kernel_call(
        x.device, (DTYPE_NAMES[x.dtype],), traits, (rows,),
        x, alpha=alpha, limit=limit, up_offset=up_offset,
        interleaved=bool(interleaved), out=out,
    )  # fmt: skip


swiglu = Op(
    name="swiglu",
    family="activation",
    roles=("x",),
    traits={
        "interleaved": TraitSpec(bool, default=False, doc="gate/up alternate along the last dim"),
        "clamp": TraitSpec(bool, default=False, doc="limit set"),
    },
    sizes=_ROWS,
    doc="GPT-OSS SwiGLU.",
    bind=_bind_swiglu,
    fake=_fake_gated,
    reference=Reference(
        "tokenspeed_kernel.reference.activation:swiglu",
        formats=[{"x": _FLOAT}],
        traits={"interleaved": ANY, "clamp": ANY},
    ),
    workload="tokenspeed_kernel.numerics.cases.activation:SWIGLU",
)


def _bind_silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> KernelCall:
    """``silu(x[..., :I]) * x[..., I:]`` on ``x [..., 2I]``, computed in fp32."""
    rows = _check(x, out)
    return kernel_call(x.device, (DTYPE_NAMES[x.dtype],), (), (rows,), x, out=out)


silu_and_mul = Op(
    name="silu_and_mul",
    family="activation",
    roles=("x",),
    traits={},
    sizes=_ROWS,
    doc="silu(gate) * up.",
    bind=_bind_silu_and_mul,
    fake=_fake_gated,
    reference=Reference("tokenspeed_kernel.reference.activation:silu_and_mul", formats=[{"x": _FLOAT}]),
    workload="tokenspeed_kernel.numerics.cases.activation:SILU_AND_MUL",
)

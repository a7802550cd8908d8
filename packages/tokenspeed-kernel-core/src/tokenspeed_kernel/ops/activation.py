"""Gated activations: GPT-OSS SwiGLU and SiLU-and-mul."""

from __future__ import annotations

import torch

from ..core import dispatch
from ..core.contracts import TraitSpec, define_op
from ..core.formats import DTYPE_NAMES
from ..core.selection import Target
from ..core.validation import check_same_device, check_tensor

__all__ = ["swiglu", "silu_and_mul"]

SWIGLU = define_op(
    "swiglu",
    family="activation",
    roles=("x",),
    traits={
        "interleaved": TraitSpec(bool, default=False, doc="gate/up alternate along the last dim"),
        "clamp": TraitSpec(bool, default=False, doc="limit set"),
    },
    doc="GPT-OSS SwiGLU.",
)
SILU_AND_MUL = define_op("silu_and_mul", family="activation", roles=("x",), doc="silu(gate) * up.")
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(x: torch.Tensor, out: torch.Tensor | None) -> tuple[int, ...]:
    check_tensor("x", x, dtypes=_DTYPES, last_dim_contiguous=True)
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(f"x: expected an even last dim (gate + up), got shape {list(x.shape)}")
    out_shape = (*x.shape[:-1], x.shape[-1] // 2)
    if out is not None:
        check_tensor("out", out, dtypes=(x.dtype,), shape=out_shape, last_dim_contiguous=True)
        check_same_device("x", x, out=out)
    return out_shape


def swiglu(
    x: torch.Tensor,
    *,
    alpha: float = 1.702,
    limit: float | None = 7.0,
    up_offset: float = 1.0,
    interleaved: bool = True,
    out: torch.Tensor | None = None,
    solution: Target | None = None,
    override: Target | None = None,
) -> torch.Tensor:
    """GPT-OSS SwiGLU on ``x [..., 2I]`` -> ``[..., I]``, computed in fp32.

    ``gate, up = x[..., 0::2], x[..., 1::2]`` if ``interleaved`` else the two
    halves; with ``limit``: ``gate = min(gate, limit)``, ``up = clamp(up, -limit,
    limit)``; ``out = (up + up_offset) * gate * sigmoid(alpha * gate)``.
    """
    _check(x, out)
    if limit is not None and (not isinstance(limit, (int, float)) or limit <= 0):
        raise ValueError(f"limit: expected None or a float > 0, got {limit!r}")
    traits = {"interleaved": bool(interleaved), "clamp": limit is not None}
    return dispatch.run(
        "swiglu", x.device, (DTYPE_NAMES[x.dtype],), traits, solution, override,
        x, alpha=float(alpha), limit=None if limit is None else float(limit), up_offset=float(up_offset),
        interleaved=bool(interleaved), out=out,
    )  # fmt: skip


def silu_and_mul(
    x: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    solution: Target | None = None,
    override: Target | None = None,
) -> torch.Tensor:
    """``silu(x[..., :I]) * x[..., I:]`` on ``x [..., 2I]``, computed in fp32."""
    _check(x, out)
    return dispatch.run("silu_and_mul", x.device, (DTYPE_NAMES[x.dtype],), {}, solution, override, x, out=out)

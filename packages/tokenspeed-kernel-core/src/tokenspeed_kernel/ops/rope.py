"""Rotary position embedding with a caller-supplied cos/sin cache (e.g. YaRN)."""

from __future__ import annotations

import torch

from ..core.contracts import ANY, Size, TraitSpec
from ..core.formats import DTYPE_NAMES
from ..core.op import KernelCall, Op, Reference, kernel_call
from ..core.validation import check_same_device, check_tensor, readable_values

__all__ = ["apply_rotary"]

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _bind_apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    style: str = "neox",
) -> KernelCall:
    """Rotate the first ``R`` dims of each head of ``q`` and ``k``; returns new tensors.

    Args:
        q: ``[T, Hq, D]``; k: ``[T, Hk, D]``, same dtype.
        cos_sin_cache: ``float32 [max_position, R]``: ``[:, :R/2]`` is cos,
            ``[:, R/2:]`` is sin (any scaling, e.g. YaRN's, already applied).
        positions: ``int32/int64 [T]`` rows of the cache.
        style: ``"neox"``: pairs ``(x[i], x[i + R/2])`` (GPT-OSS); ``"gptj"``:
            pairs ``(x[2i], x[2i+1])``. Each pair becomes ``(x1*cos - x2*sin,
            x2*cos + x1*sin)``, computed in fp32; dims past ``R`` pass through.

    Returns:
        ``(q_rotated, k_rotated)``.
    """
    check_tensor("q", q, dtypes=_DTYPES, dim=3, last_dim_contiguous=True)
    check_tensor("k", k, dtypes=(q.dtype,), shape=(q.shape[0], None, q.shape[2]), last_dim_contiguous=True)
    check_tensor("cos_sin_cache", cos_sin_cache, dtypes=(torch.float32,), dim=2, contiguous=True)
    rot = cos_sin_cache.shape[1]
    if rot % 2 or rot > q.shape[-1] or rot == 0:
        raise ValueError(f"cos_sin_cache: rotary dim {rot} must be even, > 0 and <= head_dim {q.shape[-1]}")
    check_tensor("positions", positions, dtypes=(torch.int32, torch.int64), shape=(q.shape[0],))
    if style not in ("neox", "gptj"):
        raise ValueError(f"style: expected 'neox' or 'gptj', got {style!r}")
    check_same_device("q", q, k=k, cos_sin_cache=cos_sin_cache, positions=positions)
    pos = readable_values(positions)
    if pos is not None and pos.numel():
        lo, hi = (int(v) for v in torch.aminmax(pos))
        if lo < 0 or hi >= cos_sin_cache.shape[0]:
            raise ValueError(
                f"positions: expected rows of cos_sin_cache in [0, {cos_sin_cache.shape[0]}), got [{lo}, {hi}]"
            )
    traits = {"style": style, "partial": rot < q.shape[-1]}
    return kernel_call(
        q.device, (DTYPE_NAMES[q.dtype],), traits, (q.shape[0],), q, k, cos_sin_cache, positions, style=style
    )


def _fake_apply_rotary(q, k, cos_sin_cache, positions, *, style="neox"):
    return q.new_empty(q.shape), k.new_empty(k.shape)


apply_rotary = Op(
    name="apply_rotary",
    memo_bind=True,
    family="rope",
    roles=("x",),
    traits={
        "style": TraitSpec(str, default="neox", allowed=("neox", "gptj"), doc="half-split or adjacent pairs"),
        "partial": TraitSpec(bool, default=False, doc="rotary dim < head dim"),
    },
    sizes=(Size("tokens", "T, rows of q and k"),),
    doc="Rotary embedding of q and k.",
    bind=_bind_apply_rotary,
    fake=_fake_apply_rotary,
    reference=Reference(
        "tokenspeed_kernel.reference.rope:apply_rotary",
        formats=[{"x": ("fp32", "bf16", "fp16")}],
        traits={"style": ANY, "partial": ANY},
    ),
    workload="tokenspeed_kernel.numerics.cases.rope:APPLY_ROTARY",
)

"""Rotary position embedding with a caller-supplied cos/sin cache (e.g. YaRN)."""

from __future__ import annotations

import torch

from ..core import dispatch
from ..core.contracts import TraitSpec, define_op
from ..core.formats import DTYPE_NAMES
from ..core.selection import Target
from ..core.validation import check_same_device, check_tensor

__all__ = ["apply_rotary"]

ROTARY = define_op(
    "apply_rotary",
    family="rope",
    roles=("x",),
    traits={
        "style": TraitSpec(str, default="neox", allowed=("neox", "gptj"), doc="half-split or adjacent pairs"),
        "partial": TraitSpec(bool, default=False, doc="rotary dim < head dim"),
    },
    doc="Rotary embedding of q and k.",
)
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    style: str = "neox",
    solution: Target | None = None,
    override: Target | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first ``R`` dims of each head of ``q`` and ``k``; returns new tensors.

    Args:
        q: ``[T, Hq, D]``; k: ``[T, Hk, D]``, same dtype.
        cos_sin_cache: ``float32 [max_position, R]``: ``[:, :R/2]`` is cos,
            ``[:, R/2:]`` is sin (any scaling, e.g. YaRN's, already applied).
        positions: ``int32/int64 [T]`` rows of the cache.
        style: ``"neox"``: pairs ``(x[i], x[i + R/2])`` (GPT-OSS); ``"gptj"``:
            pairs ``(x[2i], x[2i+1])``. Each pair becomes ``(x1*cos - x2*sin,
            x2*cos + x1*sin)``, computed in fp32; dims past ``R`` pass through.
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
    traits = {"style": style, "partial": rot < q.shape[-1]}
    return dispatch.run(
        "apply_rotary", q.device, (DTYPE_NAMES[q.dtype],), traits, solution, override,
        q, k, cos_sin_cache, positions, style=style,
    )  # fmt: skip

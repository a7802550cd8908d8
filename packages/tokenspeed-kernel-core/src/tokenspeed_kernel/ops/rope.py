"""Rotary position embedding with a caller-supplied cos/sin cache (e.g. YaRN)."""

from __future__ import annotations

import torch

from ..core.contracts import ANY, Size, TraitSpec
from ..core.formats import DTYPE_NAMES
from ..core.op import KernelCall, Op, Reference, kernel_call
from ..core.validation import check_same_device, check_tensor, readable_values
from .attention import check_kv_store, check_rotary_table

__all__ = ["apply_rotary", "apply_rotary_and_store"]

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
    traits = _check_rotary(q, k, cos_sin_cache, positions, style)
    return kernel_call(
        q.device, (DTYPE_NAMES[q.dtype],), traits, (q.shape[0],), q, k, cos_sin_cache, positions, style=style
    )


def _check_rotary(
    q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor, style: str
) -> dict[str, object]:
    """The checks of a rotation of ``q`` and ``k``; returns the call's traits."""
    check_tensor("q", q, dtypes=_DTYPES, dim=3, last_dim_contiguous=True)
    check_tensor("k", k, dtypes=(q.dtype,), shape=(q.shape[0], None, q.shape[2]), last_dim_contiguous=True)
    check_rotary_table(cos_sin_cache, q.shape[-1], style)
    rot = cos_sin_cache.shape[1]
    check_tensor("positions", positions, dtypes=(torch.int32, torch.int64), shape=(q.shape[0],))
    check_same_device("q", q, k=k, cos_sin_cache=cos_sin_cache, positions=positions)
    pos = readable_values(positions)
    if pos is not None and pos.numel():
        lo, hi = (int(v) for v in torch.aminmax(pos))
        if lo < 0 or hi >= cos_sin_cache.shape[0]:
            raise ValueError(
                f"positions: expected rows of cos_sin_cache in [0, {cos_sin_cache.shape[0]}), got [{lo}, {hi}]"
            )
    return {"style": style, "partial": rot < q.shape[-1]}


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


def _bind_apply_rotary_and_store(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    style: str = "neox",
) -> KernelCall:
    """Rotate ``q`` and ``k`` as :func:`apply_rotary` does and write the rotated ``k`` and ``v`` into the paged
    caches as :func:`kvcache_store` does, in one call; returns the rotated ``q`` (a new tensor).

    The same results as ``q, k = apply_rotary(q, k, ...)`` then ``kvcache_store(k, v, k_cache, v_cache,
    slot_mapping)``, without the rotated ``k`` as a tensor of its own: a decode step's attention reads it from the
    cache (one call and one launch fewer a layer, and no ``k`` output).

    Args:
        q: ``[T, Hq, D]``; k, v: ``[T, Hkv, D]``, the same float dtype, last dim contiguous.
        cos_sin_cache, positions, style: as :func:`apply_rotary`.
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]`` (bf16/fp16/fp32/fp8 e4m3), written in place: the
            rotated ``k`` (rounded to ``k``'s dtype, then cast to the cache's) and ``v``.
        slot_mapping: ``int32/int64 [T]``, as :func:`kvcache_store` (a negative slot writes nothing; ``q`` of
            that token is still rotated).

    Returns:
        ``q_rotated [T, Hq, D]`` in ``q``'s dtype.
    """
    traits = _check_rotary(q, k, cos_sin_cache, positions, style)
    check_kv_store(k, v, k_cache, v_cache, slot_mapping)  # (k is in both checks' device sets: one device)
    sig = (DTYPE_NAMES[q.dtype], DTYPE_NAMES[k_cache.dtype])
    return kernel_call(
        q.device, sig, traits, (q.shape[0],),
        q, k, v, cos_sin_cache, positions, k_cache, v_cache, slot_mapping, style=style,
    )  # fmt: skip


def _fake_apply_rotary_and_store(q, k, v, cos_sin_cache, positions, k_cache, v_cache, slot_mapping, *, style="neox"):
    return q.new_empty(q.shape)


apply_rotary_and_store = Op(
    name="apply_rotary_and_store",
    memo_bind=True,
    family="rope",
    roles=("x", "kv"),
    traits=apply_rotary.traits,
    sizes=(Size("tokens", "T, rows of q, k and v"),),
    doc="Rotary embedding of q and k, the rotated k and v written into the paged KV cache.",
    bind=_bind_apply_rotary_and_store,
    fake=_fake_apply_rotary_and_store,
    reference=Reference(
        "tokenspeed_kernel.reference.rope:apply_rotary_and_store",
        formats=[{"x": ("fp32", "bf16", "fp16"), "kv": ("fp32", "bf16", "fp16", "fp8_e4m3")}],
        traits={"style": ANY, "partial": ANY},
    ),
    workload="tokenspeed_kernel.numerics.cases.rope:APPLY_ROTARY_AND_STORE",
    mutates=("k_cache", "v_cache"),
    mutating_result=True,
)

"""Reference rotary position embedding (neox and gpt-j pairings, partial rotary)."""

from __future__ import annotations

import torch

from .attention import kvcache_store, mha_decode_with_kvcache


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    rot = 2 * cos.shape[-1]
    xf = x[..., :rot].to(torch.float32)
    if style == "neox":
        x1, x2 = xf.chunk(2, dim=-1)
    else:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
    r1 = x1 * cos - x2 * sin
    r2 = x2 * cos + x1 * sin
    if style == "neox":
        rotated = torch.cat((r1, r2), dim=-1)
    else:
        rotated = torch.stack((r1, r2), dim=-1).flatten(-2)
    return torch.cat((rotated.to(x.dtype), x[..., rot:]), dim=-1)


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    style: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first ``R`` dims of every head; returns new ``(q, k)``.

    Args:
        q: ``[T, Hq, D]``; k: ``[T, Hk, D]``, same float dtype.
        cos_sin_cache: ``float32 [max_position, R]``, cos in ``[:, :R/2]``, sin in ``[:, R/2:]``.
        positions: ``int32/int64 [T]``, the cache row of each token.
        style: ``"neox"`` pairs ``(x[i], x[i + R/2])``; ``"gptj"`` pairs ``(x[2i], x[2i+1])``.
    """
    half = cos_sin_cache.shape[1] // 2
    rows = cos_sin_cache[positions.long()]
    # [T, 1, R/2]: one angle per token, shared by every head.
    cos = rows[:, None, :half]
    sin = rows[:, None, half:]
    return _rotate(q, cos, sin, style), _rotate(k, cos, sin, style)


def apply_rotary_and_store(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    style: str,
) -> torch.Tensor:
    """Reference of :func:`tokenspeed_kernel.apply_rotary_and_store`: the references of ``apply_rotary`` and
    ``kvcache_store`` one after the other; returns the rotated ``q``."""
    q_out, k_out = apply_rotary(q, k, cos_sin_cache, positions, style=style)
    kvcache_store(k_out, v, k_cache, v_cache, slot_mapping)
    return q_out


def mha_decode_append_kvcache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    cos_sin_cache: torch.Tensor | None,
    style: str,
    window_left: int,
    sinks: torch.Tensor | None,
    softmax_scale: float,
    logit_cap: float,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """Reference of :func:`tokenspeed_kernel.mha_decode_append_kvcache`: the references of ``apply_rotary`` (at
    position ``cache_seqlens - 1``), ``kvcache_store`` (that position's slot from the page table) and
    :func:`mha_decode_with_kvcache`; writes the caches in place, returns ``out``."""
    pos = cache_seqlens.long() - 1
    if cos_sin_cache is not None:
        q, k = apply_rotary(q, k, cos_sin_cache, pos, style=style)
    page_size = k_cache.shape[1]
    slots = page_table.long().gather(1, (pos // page_size)[:, None])[:, 0] * page_size + pos % page_size
    kvcache_store(k, v, k_cache, v_cache, slots)
    return mha_decode_with_kvcache(
        q, k_cache, v_cache, page_table, cache_seqlens, window_left=window_left, sinks=sinks,
        softmax_scale=softmax_scale, logit_cap=logit_cap, return_lse=False, out=out,
    )  # fmt: skip

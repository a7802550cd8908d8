"""Portable Triton rotary embedding (neox / gpt-j pairing, partial rotary), q and k in one launch.

Each element ``i < R`` of a head becomes ``x[i] * cos[f(i)] + sign(i) * x[p(i)] * sin[f(i)]``
with its pair partner ``p(i)`` and angle index ``f(i)``; elements past ``R`` pass
through. Math in fp32, one cast; the results are new tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2

from ._host import RowConfig, row_config

__all__ = ["ROTARY_CONFIGS", "apply_rotary", "apply_rotary_and_store", "TRITON_KERNELS"]

#: Per family: ``rows`` heads per program (``block`` is unused: head_dim, rounded up to
#: a power of two, is set per call). Not measured on hardware; the interpreter's 2 heads
#: make test tokens span several programs.
ROTARY_CONFIGS: dict[str, RowConfig] = {
    "nvidia": RowConfig(block=0, rows=16, num_warps=4),
    "amd": RowConfig(block=0, rows=16, num_warps=4),
    "interpret": RowConfig(block=0, rows=2),
}


@triton.jit
def rotated_rows(src, h, h_ok, stride_src_h, d, partner, D, rotated, cos, sin, sign):
    """Rows ``h`` (where ``h_ok``) of the heads at ``src`` rotated (fp32 math), rounded to the source's dtype."""
    mask = h_ok[:, None] & (d < D)[None, :]
    row_src = src + h[:, None] * stride_src_h
    x = tl.load(row_src + d[None, :], mask=mask, other=0.0).to(tl.float32)
    # The partner element is a gather within the same head row, already in L1.
    xp = tl.load(row_src + partner[None, :], mask=mask & rotated[None, :], other=0.0).to(tl.float32)
    y = tl.where(rotated[None, :], x * cos[None, :] + sign[None, :] * xp * sin[None, :], x)
    return y.to(src.dtype.element_ty)


@triton.jit
def _rotate_heads(src, dst, h, H, stride_src_h, stride_dst_h, d, partner, D, rotated, cos, sin, sign):
    # Rounded to the source's dtype, then cast to the destination's (the same dtype, or a KV cache's).
    y = rotated_rows(src, h, h < H, stride_src_h, d, partner, D, rotated, cos, sin, sign).to(dst.dtype.element_ty)
    tl.store(dst + h[:, None] * stride_dst_h + d[None, :], y, mask=(h < H)[:, None] & (d < D)[None, :])


@triton.jit
def _angles(cache_ptr, pos_ptr, t, R, stride_cache, GPTJ: tl.constexpr, BLOCK_D: tl.constexpr):
    """Token ``t``'s rotation (its position read at ``pos_ptr + t``): :func:`angles_at`."""
    return angles_at(cache_ptr, tl.load(pos_ptr + t), R, stride_cache, GPTJ, BLOCK_D)


@triton.jit
def angles_at(cache_ptr, position, R, stride_cache, GPTJ: tl.constexpr, BLOCK_D: tl.constexpr):
    """The rotation at ``position``: per lane of a head its partner lane, sign, cos and sin, and whether it
    rotates."""
    d = tl.arange(0, BLOCK_D)
    half = R // 2
    if GPTJ:
        # pairs (2j, 2j+1) share angle j
        freq = d // 2
        partner = d ^ 1
        sign = tl.where(d % 2 == 0, -1.0, 1.0)
    else:
        # pairs (j, j + R/2) share angle j
        first = d < half
        freq = tl.where(first, d, d - half)
        partner = tl.where(first, d + half, d - half)
        sign = tl.where(first, -1.0, 1.0)
    rotated = d < R
    # One cos/sin row per token, shared by every head of q and k.
    cache_row = cache_ptr + position.to(tl.int64) * stride_cache
    cos = tl.load(cache_row + freq, mask=rotated, other=1.0)
    sin = tl.load(cache_row + half + freq, mask=rotated, other=0.0)
    return d, partner, sign, rotated, cos, sin


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    q_out_ptr,
    k_out_ptr,
    cache_ptr,
    pos_ptr,
    Hq,
    Hk,
    D,
    R,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_qot,
    stride_qoh,
    stride_kot,
    stride_koh,
    stride_cache,
    GPTJ: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d, partner, sign, rotated, cos, sin = _angles(cache_ptr, pos_ptr, t, R, stride_cache, GPTJ, BLOCK_D)
    _rotate_heads(
        q_ptr + t * stride_qt, q_out_ptr + t * stride_qot, h, Hq, stride_qh, stride_qoh,
        d, partner, D, rotated, cos, sin, sign,
    )  # fmt: skip
    _rotate_heads(
        k_ptr + t * stride_kt, k_out_ptr + t * stride_kot, h, Hk, stride_kh, stride_koh,
        d, partner, D, rotated, cos, sin, sign,
    )  # fmt: skip


@triton.jit
def _rotary_store_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    q_out_ptr,
    k_cache_ptr,
    v_cache_ptr,
    cache_ptr,
    pos_ptr,
    slot_ptr,
    Hq,
    Hk,
    D,
    R,
    page_size,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_qot,
    stride_qoh,
    stride_kc_page,
    stride_kc_tok,
    stride_kc_head,
    stride_vc_page,
    stride_vc_tok,
    stride_vc_head,
    stride_cache,
    GPTJ: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """``_rotary_kernel`` whose rotated k, and v, go to the paged caches at token ``t``'s slot (``kvcache_store``:
    a negative slot writes nothing); the rotated k is rounded to k's dtype before the cache's."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d, partner, sign, rotated, cos, sin = _angles(cache_ptr, pos_ptr, t, R, stride_cache, GPTJ, BLOCK_D)
    _rotate_heads(
        q_ptr + t * stride_qt, q_out_ptr + t * stride_qot, h, Hq, stride_qh, stride_qoh,
        d, partner, D, rotated, cos, sin, sign,
    )  # fmt: skip
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        page = slot // page_size
        row = slot - page * page_size
        _rotate_heads(
            k_ptr + t * stride_kt, k_cache_ptr + page * stride_kc_page + row * stride_kc_tok, h, Hk, stride_kh,
            stride_kc_head, d, partner, D, rotated, cos, sin, sign,
        )  # fmt: skip
        mask = (h < Hk)[:, None] & (d < D)[None, :]
        v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
        dst = v_cache_ptr + page * stride_vc_page + row * stride_vc_tok + h[:, None] * stride_vc_head + d[None, :]
        tl.store(dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


TRITON_KERNELS = {"apply_rotary": _rotary_kernel, "apply_rotary_and_store": _rotary_store_kernel}


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    style: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate the first ``R`` dims of every head of ``q`` and ``k``; returns new ``(q, k)``.

    Args:
        q: ``[T, Hq, D]`` bf16/fp16/fp32, last dim contiguous.
        k: ``[T, Hk, D]`` like ``q``.
        cos_sin_cache: ``float32 [max_position, R]``, contiguous: cos in
            ``[:, :R/2]``, sin in ``[:, R/2:]``.
        positions: ``int32/int64 [T]``, each token's cache row.
        style: ``"neox"`` pairs ``(x[i], x[i + R/2])``; ``"gptj"`` pairs ``(x[2i], x[2i+1])``.
    """
    t, hq, d = q.shape
    hk = k.shape[1]
    q_out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((t, hk, d), dtype=k.dtype, device=k.device)
    if t == 0 or d == 0 or max(hq, hk) == 0:
        return q_out, k_out
    cfg = row_config(ROTARY_CONFIGS, q.device)
    block_h = min(cfg.rows, next_power_of_2(max(hq, hk)))
    cached(_rotary_kernel)[(t, cdiv(max(hq, hk), block_h))](
        q, k, q_out, k_out, cos_sin_cache, positions,
        hq, hk, d, cos_sin_cache.shape[1],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        q_out.stride(0), q_out.stride(1), k_out.stride(0), k_out.stride(1),
        cos_sin_cache.stride(0),
        GPTJ=style == "gptj",
        BLOCK_H=block_h,
        BLOCK_D=next_power_of_2(d),
        num_warps=cfg.num_warps,
        **cfg.launch,
    )  # fmt: skip
    return q_out, k_out


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
    """:func:`apply_rotary` of ``q`` and ``k`` whose rotated ``k``, and ``v``, are written into the paged caches at
    ``slot_mapping`` (semantics: ``tokenspeed_kernel.apply_rotary_and_store``), in one launch; returns the rotated
    ``q``.

    Args:
        q: ``[T, Hq, D]``; k, v: ``[T, Hk, D]`` like ``q``, last dim contiguous.
        cos_sin_cache, positions, style: as :func:`apply_rotary`.
        k_cache, v_cache: ``[num_pages, page_size, Hk, D]``, last dim contiguous (values cast to their dtype).
        slot_mapping: ``int32/int64 [T]``; a negative slot writes nothing.
    """
    t, hq, d = q.shape
    hk = k.shape[1]
    q_out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    if t == 0 or d == 0 or max(hq, hk) == 0:
        return q_out
    cfg = row_config(ROTARY_CONFIGS, q.device)
    block_h = min(cfg.rows, next_power_of_2(max(hq, hk)))
    _ROTARY_STORE[(t, cdiv(max(hq, hk), block_h))](
        q, k, v, q_out, k_cache, v_cache, cos_sin_cache, positions, slot_mapping,
        hq, hk, d, cos_sin_cache.shape[1], k_cache.shape[1],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        cos_sin_cache.stride(0),
        GPTJ=style == "gptj",
        BLOCK_H=block_h,
        BLOCK_D=next_power_of_2(d),
        num_warps=cfg.num_warps,
        **cfg.launch,
    )  # fmt: skip
    return q_out


_ROTARY_STORE = cached(_rotary_store_kernel)

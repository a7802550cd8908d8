"""Portable Triton quantization: FP8 e4m3 (per tensor / token / 1x128 block, static) and MXFP4.

Bit-exact with ``tokenspeed_kernel.reference.quantization`` by construction:

- FP8: ``q = clamp(x / scale, -448, 448)`` with an IEEE division (``div_rn``),
  rounded to the e4m3 grid by an explicit round-to-nearest-even (so the final
  conversion is exact on every backend, the interpreter's included);
  ``scale = amax / 448``, 1 for an all-zero group. Per tensor takes two passes
  (partial maxima, then quantize) and never synchronises with the host.
- MXFP4: scale byte ``clamp(floor(log2(amax)) - 2 + 127, 0, 254)`` read from the
  exponent bits of ``amax`` (exact, no ``log2``), 127 for an all-zero group;
  ``x * 2**(127 - s)`` (a power of two, exact) rounded to the nearest E2M1 value,
  ties to the even code, saturating at 6; the sign bit is ``x``'s (``-0`` is code 8).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2

from ._host import RowConfig, as_rows, row_config
from ._mxfp4 import unpack_mxfp4

__all__ = [
    "DEQUANTIZE_MXFP4_CONFIGS",
    "QUANTIZE_FP8_BLOCK128_CONFIGS",
    "QUANTIZE_FP8_CONFIGS",
    "QUANTIZE_MXFP4_CONFIGS",
    "quantize_fp8",
    "quantize_mxfp4",
    "dequantize_mxfp4",
    "TRITON_KERNELS",
]

# Per-family configs. None is measured on hardware; the interpreter's small blocks make
# test rows span several programs with tails.
#: quantize_fp8 per token / per tensor / static: ``block`` is the K chunk, ``rows`` rows per program.
QUANTIZE_FP8_CONFIGS: dict[str, RowConfig] = {
    "nvidia": RowConfig(block=4096, num_warps=8),
    "amd": RowConfig(block=4096, num_warps=8),
    "interpret": RowConfig(block=32, rows=2),
}
#: quantize_fp8 block128: ``rows`` 128-blocks (of one row) per program.
QUANTIZE_FP8_BLOCK128_CONFIGS: dict[str, RowConfig] = {
    "nvidia": RowConfig(block=128, rows=8, num_warps=4),
    "amd": RowConfig(block=128, rows=8, num_warps=4),
    "interpret": RowConfig(block=128, rows=2),
}
#: quantize_mxfp4: ``rows`` 32-value groups (of one row) per program.
QUANTIZE_MXFP4_CONFIGS: dict[str, RowConfig] = {
    "nvidia": RowConfig(block=32, rows=64, num_warps=4),
    "amd": RowConfig(block=32, rows=64, num_warps=4),
    "interpret": RowConfig(block=32, rows=2),
}
#: dequantize_mxfp4: ``block`` values of ``rows`` rows per program.
DEQUANTIZE_MXFP4_CONFIGS: dict[str, RowConfig] = {
    "nvidia": RowConfig(block=1024, rows=4, num_warps=4),
    "amd": RowConfig(block=1024, rows=4, num_warps=4),
    "interpret": RowConfig(block=64, rows=2),
}

#: Largest finite float8_e4m3fn magnitude.
_E4M3_MAX = tl.constexpr(448.0)
#: How _fp8_rows_kernel gets its scales (the MODE constexpr).
_MODE_PER_ROW = tl.constexpr(0)  # dynamic, one per row, written to scale[m]
_MODE_STATIC = tl.constexpr(1)  # the given scale[0]
_MODE_PER_TENSOR = tl.constexpr(2)  # dynamic, from the partial maxima of _amax_partial_kernel
#: Upper bound on the partial maxima of the per-tensor first pass (each quantize
#: program of the second pass reduces all of them).
_MAX_PARTIALS = 512


@triton.jit
def _round_to_e4m3(y):
    """Round fp32 ``y`` (already within +-448) to the nearest e4m3 value, ties to even."""
    a = tl.abs(y)
    # Biased fp32 exponent, floored at e4m3's smallest normal binade (2^-6, 127 - 6),
    # below which e4m3's spacing stays 2^-9.
    e = tl.maximum(a.to(tl.int32, bitcast=True) >> 23, 121)
    # Adding 2^(E+20) puts the sum in a binade whose fp32 ulp is 2^(E-3), e4m3's
    # spacing in binade E: the add rounds to nearest even there, the subtract is exact.
    big = ((e + 20) << 23).to(tl.float32, bitcast=True)
    r = (a + big) - big
    # Copy the sign bit (negation would be 0 - r, losing -0): -0.0 and negatives that
    # round to zero stay -0 (0x80), as a direct conversion gives.
    sign = (y.to(tl.int32, bitcast=True) >> 31) << 31
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _quantize_tile(x, s):
    """fp32 tile ``x`` divided by ``s`` (broadcastable), clamped, rounded to e4m3 values (fp32)."""
    return _round_to_e4m3(tl.clamp(tl.div_rn(x, s), -_E4M3_MAX, _E4M3_MAX))


@triton.jit
def _amax_to_scale(amax):
    return tl.where(amax > 0, tl.div_rn(amax, _E4M3_MAX), 1.0)


@triton.jit
def _amax_partial_kernel(
    x_ptr, partial_ptr, M, K, stride_xm, rows_per_program, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr
):
    """Per-tensor pass one: program p writes the |x| maximum of its rows to ``partial[p]``."""
    pid = tl.program_id(0)
    row0 = pid * rows_per_program
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for m0 in range(row0, row0 + rows_per_program, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = (rows < M) & (rows < row0 + rows_per_program)
        base = x_ptr + rows.to(tl.int64)[:, None] * stride_xm
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(base + cols[None, :], mask=row_ok[:, None] & (cols < K)[None, :], other=0.0)
            acc = tl.maximum(acc, tl.abs(x.to(tl.float32)))
    tl.store(partial_ptr + pid, tl.max(tl.max(acc, axis=1), axis=0))


@triton.jit
def _fp8_rows_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    partial_ptr,
    n_partials,
    M,
    K,
    stride_xm,
    stride_qm,
    MODE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    """Quantize ``BLOCK_M`` rows with the scales MODE names; per tensor, the scale comes from
    ``n_partials`` partial maxima (each program derives it, program 0 writes ``scale[0]``)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    rows = rows.to(tl.int64)
    x_base = x_ptr + rows[:, None] * stride_xm
    if MODE == _MODE_PER_ROW:
        # Rows are re-read by the second loop; for K <= BLOCK_K it is one tile anyway.
        acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            x = tl.load(x_base + cols[None, :], mask=row_ok[:, None] & (cols < K)[None, :], other=0.0)
            acc = tl.maximum(acc, tl.abs(x.to(tl.float32)))
        s = _amax_to_scale(tl.max(acc, axis=1))
        tl.store(scale_ptr + rows, s, mask=row_ok)
        s = s[:, None]
    elif MODE == _MODE_STATIC:
        s = tl.load(scale_ptr)
    else:  # _MODE_PER_TENSOR
        p = tl.arange(0, BLOCK_P)
        s = _amax_to_scale(tl.max(tl.load(partial_ptr + p, mask=p < n_partials, other=0.0), axis=0))
        if tl.program_id(0) == 0:
            tl.store(scale_ptr, s)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        mask = row_ok[:, None] & (cols < K)[None, :]
        x = tl.load(x_base + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        q = _quantize_tile(x, s)
        tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _fp8_block128_kernel(x_ptr, q_ptr, scale_ptr, K, n_blocks, stride_xm, stride_qm, stride_sm, BLOCKS: tl.constexpr):
    """One row, ``BLOCKS`` 1x128 groups: a [BLOCKS, 128] tile, one scale per tile row."""
    row = tl.program_id(0).to(tl.int64)
    kb = tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)
    cols = kb[:, None] * 128 + tl.arange(0, 128)[None, :]
    mask = (kb < n_blocks)[:, None] & (cols < K)
    x = tl.load(x_ptr + row * stride_xm + cols, mask=mask, other=0.0).to(tl.float32)
    s = _amax_to_scale(tl.max(tl.abs(x), axis=1))
    tl.store(scale_ptr + row * stride_sm + kb, s, mask=kb < n_blocks)
    q = _quantize_tile(x, s[:, None])
    tl.store(q_ptr + row * stride_qm + cols, q.to(q_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mxfp4_quantize_kernel(
    x_ptr, blocks_ptr, scales_ptr, n_groups, stride_xm, stride_bm, stride_sm, GROUPS: tl.constexpr
):
    """One row, ``GROUPS`` groups of 32 values: a [GROUPS, 32] tile, one E8M0 byte per tile row."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    g_ok = g < n_groups
    x = tl.load(x_ptr + row * stride_xm + g[:, None] * 32 + tl.arange(0, 32)[None, :], mask=g_ok[:, None], other=0.0)
    x = x.to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    # floor(log2(amax)) is amax's unbiased exponent; every subnormal amax clamps to 0 anyway.
    s = tl.minimum(tl.maximum((amax.to(tl.int32, bitcast=True) >> 23) - 2, 0), 254)
    s = tl.where(amax == 0, 127, s)
    # 2^(127 - s) built from its exponent bits (s <= 252 here, so it is a normal float).
    inv_scale = ((254 - s) << 23).to(tl.float32, bitcast=True)
    a = tl.abs(x * inv_scale[:, None])
    # One comparison per boundary between adjacent magnitudes; at a midpoint ties go
    # to the even code: ">" above an even code, ">=" above an odd one.
    mag = (
        (a > 0.25).to(tl.int32)
        + (a >= 0.75).to(tl.int32)
        + (a > 1.25).to(tl.int32)
        + (a >= 1.75).to(tl.int32)
        + (a > 2.5).to(tl.int32)
        + (a >= 3.5).to(tl.int32)
        + (a > 5.0).to(tl.int32)
    )
    code = mag | tl.where(x.to(tl.int32, bitcast=True) < 0, 8, 0)
    # Pair neighbours along K: the even element goes to the low nibble.
    lo, hi = tl.split(tl.reshape(code, (GROUPS, 16, 2)))
    packed = (lo | (hi << 4)).to(tl.uint8)
    tl.store(blocks_ptr + row * stride_bm + g[:, None] * 16 + tl.arange(0, 16)[None, :], packed, mask=g_ok[:, None])
    tl.store(scales_ptr + row * stride_sm + g, s.to(tl.uint8), mask=g_ok)


@triton.jit
def _mxfp4_dequantize_kernel(
    blocks_ptr,
    scales_ptr,
    out_ptr,
    n_rows,
    K,
    stride_bm,
    stride_sm,
    stride_om,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = (rows < n_rows)[:, None]
    rows = rows.to(tl.int64)
    k0 = tl.program_id(1) * BLOCK_K
    kp = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    ks = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    # K is a multiple of 32, so these masks cut whole bytes and whole groups.
    packed = tl.load(
        blocks_ptr + rows[:, None] * stride_bm + kp[None, :], mask=row_ok & (kp < K // 2)[None, :], other=0
    )
    scale_exp = tl.load(
        scales_ptr + rows[:, None] * stride_sm + ks[None, :], mask=row_ok & (ks < K // 32)[None, :], other=0
    )
    vals = unpack_mxfp4(packed, scale_exp, BLOCK_R, BLOCK_K)
    cols = k0 + tl.arange(0, BLOCK_K)
    mask = row_ok & (cols < K)[None, :]
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], vals.to(out_ptr.dtype.element_ty), mask=mask)


TRITON_KERNELS = {
    "amax_partial": _amax_partial_kernel,
    "fp8_rows": _fp8_rows_kernel,
    "fp8_block128": _fp8_block128_kernel,
    "mxfp4_quantize": _mxfp4_quantize_kernel,
    "mxfp4_dequantize": _mxfp4_dequantize_kernel,
}


def quantize_fp8(x: torch.Tensor, *, granularity: str, scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [M, K]`` to ``float8_e4m3fn`` with ``float32`` scales.

    Args:
        x: ``[M, K]`` bf16/fp16/fp32, last dim contiguous.
        granularity: ``"per_tensor"`` (scale ``[1]``), ``"per_token"`` (``[M, 1]``) or
            ``"block128"`` (``[M, ceil(K/128)]``, the last block partial).
        scale: static ``float32 [1]`` (``per_tensor`` only), used as given and returned;
            None for dynamic ``amax / 448`` scales (1 for an all-zero group).

    Returns:
        ``(x_fp8 float8_e4m3fn [M, K], scale float32)``.
    """
    m, k = x.shape
    q = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    dev = x.device
    if granularity == "block128":
        nb = cdiv(k, 128)
        scales = torch.empty((m, nb), dtype=torch.float32, device=dev)
        if m and nb:
            cfg = row_config(QUANTIZE_FP8_BLOCK128_CONFIGS, dev)
            blocks = min(cfg.rows, next_power_of_2(nb))
            cached(_fp8_block128_kernel)[(m, cdiv(nb, blocks))](
                x, q, scales, k, nb, x.stride(0), q.stride(0), scales.stride(0),
                BLOCKS=blocks, num_warps=cfg.num_warps, **cfg.launch,
            )  # fmt: skip
        return q, scales
    cfg = row_config(QUANTIZE_FP8_CONFIGS, dev)
    block_k = max(16, min(cfg.block, next_power_of_2(max(k, 1))))
    block_m = cfg.rows
    grid = (cdiv(m, block_m),)
    common = dict(BLOCK_M=block_m, BLOCK_K=block_k, num_warps=cfg.num_warps, **cfg.launch)
    if scale is not None:
        if m and k:
            cached(_fp8_rows_kernel)[grid](
                x, q, scale, None, 0, m, k, x.stride(0), q.stride(0), MODE=_MODE_STATIC, BLOCK_P=1, **common
            )
        return q, scale
    if granularity == "per_token":
        scales = torch.empty((m, 1), dtype=torch.float32, device=dev)
        if m and not k:
            scales.fill_(1.0)
        elif m:
            cached(_fp8_rows_kernel)[grid](
                x, q, scales, None, 0, m, k, x.stride(0), q.stride(0), MODE=_MODE_PER_ROW, BLOCK_P=1, **common
            )
        return q, scales
    # per tensor: partial maxima, then quantize with the scale each program derives from them
    scales = torch.empty((1,), dtype=torch.float32, device=dev)
    if not (m and k):
        scales.fill_(1.0)
        return q, scales
    n_partials = min(cdiv(m, block_m), _MAX_PARTIALS)
    rows_per_program = cdiv(cdiv(m, block_m), n_partials) * block_m
    n_partials = cdiv(m, rows_per_program)
    partials = torch.empty((n_partials,), dtype=torch.float32, device=dev)
    cached(_amax_partial_kernel)[(n_partials,)](
        x, partials, m, k, x.stride(0), rows_per_program,
        BLOCK_M=block_m, BLOCK_K=block_k, num_warps=cfg.num_warps, **cfg.launch,
    )  # fmt: skip
    cached(_fp8_rows_kernel)[grid](
        x, q, scales, partials, n_partials, m, k, x.stride(0), q.stride(0),
        MODE=_MODE_PER_TENSOR, BLOCK_P=next_power_of_2(n_partials), **common,
    )  # fmt: skip
    return q, scales


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., K]`` (K divisible by 32) to MXFP4 (rounding in the module doc).

    Args:
        x: ``[..., K]`` bf16/fp16/fp32, last dim contiguous.

    Returns:
        ``(blocks uint8 [..., K/2], scales uint8 [..., K/32])``, contiguous.
    """
    k = x.shape[-1]
    lead = tuple(x.shape[:-1])
    blocks = torch.empty((*lead, k // 2), dtype=torch.uint8, device=x.device)
    scales = torch.empty((*lead, k // 32), dtype=torch.uint8, device=x.device)
    x2 = as_rows(x)
    n_groups = k // 32
    if x2.shape[0] and n_groups:
        cfg = row_config(QUANTIZE_MXFP4_CONFIGS, x.device)
        groups = min(cfg.rows, next_power_of_2(n_groups))
        b2, s2 = blocks.view(-1, k // 2), scales.view(-1, n_groups)
        cached(_mxfp4_quantize_kernel)[(x2.shape[0], cdiv(n_groups, groups))](
            x2, b2, s2, n_groups, x2.stride(0), b2.stride(0), s2.stride(0),
            GROUPS=groups, num_warps=cfg.num_warps, **cfg.launch,
        )  # fmt: skip
    return blocks, scales


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, *, dtype: torch.dtype) -> torch.Tensor:
    """``blocks uint8 [..., K/2]`` + E8M0 ``scales uint8 [..., K/32]`` -> ``dtype [..., K]`` (exact in fp32).

    Args:
        blocks: ``uint8 [..., K/2]``, two E2M1 codes a byte, low nibble = even element.
        scales: ``uint8 [..., K/32]``, value ``2**(s - 127)`` per 32 values.
        dtype: bf16/fp16/fp32 output dtype.
    """
    k = blocks.shape[-1] * 2
    out = torch.empty((*blocks.shape[:-1], k), dtype=dtype, device=blocks.device)
    b2, s2 = as_rows(blocks), as_rows(scales)
    n_rows = b2.shape[0]
    if n_rows and k:
        cfg = row_config(DEQUANTIZE_MXFP4_CONFIGS, blocks.device)
        block_k = max(32, min(cfg.block, next_power_of_2(k)))
        o2 = out.view(-1, k)
        cached(_mxfp4_dequantize_kernel)[(cdiv(n_rows, cfg.rows), cdiv(k, block_k))](
            b2, s2, o2, n_rows, k, b2.stride(0), s2.stride(0), o2.stride(0),
            BLOCK_R=cfg.rows, BLOCK_K=block_k, num_warps=cfg.num_warps, **cfg.launch,
        )  # fmt: skip
    return out

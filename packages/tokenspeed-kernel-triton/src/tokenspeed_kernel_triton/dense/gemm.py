"""Portable Triton GEMM: ``out = (a * a_scale) @ (b * b_scale).T + bias``, fp32 accumulate.

One kernel serves every operand format; constexpr scale modes pick the path:

- bf16/fp16/fp32 ``a`` and ``b`` (no scales);
- FP8 e4m3 with a per-tensor or per-row scale on each side (applied once, in the
  epilogue) or 1x128 / 128x128 block scales (applied to each BLOCK_K partial
  product, so BLOCK_K divides 128);
- MXFP4 ``b`` (``uint8 [N, K/2]`` + E8M0 ``uint8 [N, K/32]``), decoded in registers
  right after the load with :func:`tokenspeed_kernel_triton._mxfp4.unpack_mxfp4`
  and cast to ``a``'s dtype for the MMA: the weight is never written out wider.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._mxfp4 import unpack_mxfp4
from ._configs import MMConfig, mm_config

__all__ = [
    "mm",
    "mm_with_config",
    "operand_kind",
    "TRITON_KERNELS",
    "SCALE_NONE",
    "SCALE_TENSOR",
    "SCALE_ROW",
    "SCALE_BLOCK128",
    "SCALE_MXFP4",
]

# Scale modes (constexpr). SCALE_ROW is per token for a and per channel for b.
SCALE_NONE, SCALE_TENSOR, SCALE_ROW, SCALE_BLOCK128, SCALE_MXFP4 = 0, 1, 2, 3, 4

_FP8 = (torch.float8_e4m3fn,)


@triton.jit
def _mm_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    a_scale_ptr,
    b_scale_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    stride_asm,
    stride_ask,
    stride_bsn,
    stride_bsk,
    A_SCALE: tl.constexpr,
    B_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    IMPRECISE_ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # Grouped order: GROUP_M row tiles walk the same column tiles together, so a B
    # tile fetched by one program is still in L2 for the next ones.
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows/columns past M/N wrap around: every load stays in bounds without an M/N
    # mask (the loop body stays mask-free when EVEN_K); the store masks them out.
    am = (rm % M).to(tl.int64)
    bn = (rn % N).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)

    a_ptrs = a_ptr + am[:, None] * stride_am + rk[None, :] * stride_ak
    if B_SCALE == 4:
        # MXFP4: BLOCK_K values are BLOCK_K // 2 bytes and BLOCK_K // 32 scales of each row.
        rkp = tl.arange(0, BLOCK_K // 2)
        rks = tl.arange(0, BLOCK_K // 32)
        b_ptrs = b_ptr + bn[:, None] * stride_bn + rkp[None, :] * stride_bk
        bs_ptrs = b_scale_ptr + bn[:, None] * stride_bsn + rks[None, :] * stride_bsk
    else:
        # b is [N, K] with K contiguous: read it as the [BLOCK_K, BLOCK_N] K-major
        # operand the MMA wants (no transpose in registers).
        b_ptrs = b_ptr + rk[:, None] * stride_bk + bn[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
        else:
            a = tl.load(a_ptrs, mask=(k0 + rk)[None, :] < K, other=0.0)
        if B_SCALE == 4:
            if EVEN_K:
                packed = tl.load(b_ptrs)
                scale_exp = tl.load(bs_ptrs)
            else:
                # K is a multiple of 32: a tail step masks whole bytes and whole groups.
                packed = tl.load(b_ptrs, mask=(k0 // 2 + rkp)[None, :] < K // 2, other=0)
                scale_exp = tl.load(bs_ptrs, mask=(k0 // 32 + rks)[None, :] < K // 32, other=0)
            w = unpack_mxfp4(packed, scale_exp, BLOCK_N, BLOCK_K)
            # E2M1 x 2^e is exact in bf16 (and in fp16 within its exponent range).
            b = tl.trans(w.to(a.dtype))
        elif EVEN_K:
            b = tl.load(b_ptrs)
        else:
            b = tl.load(b_ptrs, mask=(k0 + rk)[:, None] < K, other=0.0)
        if DOT_IN_FP32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if A_SCALE == 3 or B_SCALE == 3:
            # Block scales change every 128 along K: scale each BLOCK_K partial
            # product (BLOCK_K divides 128, so one step sits in one scale block).
            part = tl.dot(a, b, input_precision=INPUT_PRECISION)
            ks = k0 // 128
            if A_SCALE == 3:
                part = part * tl.load(a_scale_ptr + am * stride_asm + ks * stride_ask)[:, None]
            if B_SCALE == 3:
                part = part * tl.load(b_scale_ptr + (bn // 128) * stride_bsn + ks * stride_bsk)[None, :]
            acc += part
        else:
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION, max_num_imprecise_acc=IMPRECISE_ACC)
        a_ptrs += BLOCK_K * stride_ak
        if B_SCALE == 4:
            b_ptrs += (BLOCK_K // 2) * stride_bk
            bs_ptrs += (BLOCK_K // 32) * stride_bsk
        else:
            b_ptrs += BLOCK_K * stride_bk

    # Per-tensor and per-row scales are constant along K: one multiply at the end.
    if A_SCALE == 1:
        acc = acc * tl.load(a_scale_ptr)
    elif A_SCALE == 2:
        acc = acc * tl.load(a_scale_ptr + am * stride_asm)[:, None]
    if B_SCALE == 1:
        acc = acc * tl.load(b_scale_ptr)
    elif B_SCALE == 2:
        acc = acc * tl.load(b_scale_ptr + bn * stride_bsn)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + bn).to(tl.float32)[None, :]

    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :] * stride_cn
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


#: Every Triton kernel of this module (the cross-compile test covers each).
TRITON_KERNELS = {"mm": _mm_kernel}


def _scale_mode(scale: torch.Tensor | None, rows: int) -> int:
    if scale is None:
        return SCALE_NONE
    if scale.numel() == 1:
        return SCALE_TENSOR
    if scale.dim() == 2 and scale.shape[0] == rows and scale.shape[1] == 1:
        return SCALE_ROW
    return SCALE_BLOCK128


def _scale_strides(scale: torch.Tensor | None, mode: int) -> tuple[int, int]:
    if mode in (SCALE_ROW, SCALE_BLOCK128, SCALE_MXFP4):
        return scale.stride(0), scale.stride(1)
    return 0, 0


def mm(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    a_scale: torch.Tensor | None,
    b_scale: torch.Tensor | None,
    out_dtype: torch.dtype,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """``out [M, N] = (a * a_scale) @ (b * b_scale).T + bias``, accumulated in fp32.

    Args:
        a: ``[M, K]`` bf16/fp16/fp32, or fp8 e4m3 with ``a_scale``.
        b: ``[N, K]`` of ``a``'s dtype; fp8 e4m3 with ``b_scale``; or MXFP4
            ``uint8 [N, K/2]`` (low nibble = even element) with a bf16/fp16 ``a``.
        bias: optional ``[N]`` (any float dtype; added in fp32).
        a_scale: fp8 ``a`` only: ``float32 [1]``, ``[M, 1]`` or ``[M, ceil(K/128)]``.
        b_scale: fp8 ``b``: ``float32 [1]``, ``[N, 1]`` or ``[ceil(N/128), ceil(K/128)]``;
            MXFP4 ``b``: E8M0 ``uint8 [N, K/32]``.
        out_dtype: bf16/fp16/fp32 result dtype.
        out: optional ``[M, N]`` of ``out_dtype`` (any strides), written and returned.

    Returns:
        ``out_dtype [M, N]``.
    """
    return mm_with_config(a, b, bias, a_scale=a_scale, b_scale=b_scale, out_dtype=out_dtype, out=out, config=None)


def operand_kind(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor | None, b_scale: torch.Tensor | None) -> str:
    """The config-table kind of a call: "16bit", "fp32", "fp8", "fp8_block128" or "mxfp4"."""
    if b.dtype == torch.uint8:
        return "mxfp4"
    if a.dtype in _FP8:
        m, n = a.shape[0], b.shape[0]
        modes = (_scale_mode(a_scale, m), _scale_mode(b_scale, n))
        return "fp8_block128" if SCALE_BLOCK128 in modes else "fp8"
    return "fp32" if a.dtype == torch.float32 else "16bit"


def mm_with_config(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    a_scale: torch.Tensor | None,
    b_scale: torch.Tensor | None,
    out_dtype: torch.dtype,
    out: torch.Tensor | None,
    config: MMConfig | None,
) -> torch.Tensor:
    """:func:`mm` with an explicit tile (None = the table's); benchmarks and tuning sweeps use it."""
    m, k = a.shape
    n = b.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    kind = operand_kind(a, b, a_scale, b_scale)
    a_mode = _scale_mode(a_scale, m)
    b_mode = SCALE_MXFP4 if kind == "mxfp4" else _scale_mode(b_scale, n)
    cfg = config if config is not None else mm_config(kind, m, a.device)
    if kind == "fp8_block128" and 128 % cfg.block_k:
        raise AssertionError(f"mm config: fp8 block128 needs BLOCK_K dividing 128, got {cfg.block_k}")
    asm, ask = _scale_strides(a_scale, a_mode)
    bsm, bsk = _scale_strides(b_scale, b_mode)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    _mm_kernel[grid](
        a, b, out, bias, a_scale, b_scale,
        m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
        asm, ask, bsm, bsk,
        A_SCALE=a_mode,
        B_SCALE=b_mode,
        HAS_BIAS=bias is not None,
        EVEN_K=k % cfg.block_k == 0,
        DOT_IN_FP32=cfg.dot_in_fp32,
        INPUT_PRECISION="ieee" if a.dtype == torch.float32 else None,
        IMPRECISE_ACC=cfg.fp8_imprecise_acc if kind == "fp8" else None,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **cfg.launch,
    )  # fmt: skip
    return out

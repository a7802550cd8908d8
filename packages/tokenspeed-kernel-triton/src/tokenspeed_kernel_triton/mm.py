"""Portable Triton GEMM: ``out = (a * a_scale) @ (b * b_scale).T + bias``, fp32 accumulate.

One tile kernel serves every operand format; constexpr scale modes pick the path:

- bf16/fp16/fp32 ``a`` and ``b`` (no scales);
- FP8 e4m3 with a per-tensor or per-row scale on each side (applied once, in the
  epilogue) or 1x128 / 128x128 block scales (applied to each BLOCK_K partial
  product, so BLOCK_K divides 128);
- MXFP4 ``b`` (``uint8 [N, K/2]`` + E8M0 ``uint8 [N, K/32]``), decoded in registers
  right after the load (:mod:`tokenspeed_kernel_triton._mxfp4`) and cast to ``a``'s
  dtype for the MMA: the weight is never written out wider. Codes are read as int32
  words (eight a word) when the weight's rows are 4-byte aligned, else byte by byte.

Small M is weight-streaming bound, so three more pieces serve decode:

- split-K (``MMConfig.split_k``): the K range is cut into slices, each program writes
  an fp32 partial tile to a workspace, and a second kernel adds the slices in a fixed
  order (plus bias, cast, ``out``'s strides): more programs in flight, and the result
  is the same on every run (no atomics);
- an MXFP4 GEMV (``MMConfig.gemv``) for a handful of rows: no MMA, every decoded
  weight is used by CUDA-core FMAs straight from the code planes, and the E8M0 scale
  is applied once per 32-value group after the FMAs;
- a dense GEMV (``MMConfig.gemv`` on bf16/fp16/fp32 weights with unit stride along K):
  one launch, each program streams a few weight rows over all of K with vector loads
  (the next tile in flight while one is multiplied), no split and no workspace.

FP8 accuracy note: Hopper's fp8 ``wgmma`` keeps its accumulator with fewer bits
than fp32 (about 14, as DeepSeek-V3 reports); the kernel promotes into the fp32
accumulator every 128 K (``fp8_imprecise_acc`` / one block-scale step), so the
error of a result is a few 1e-5 of ``sum_k |a_k b_k|``, not of ``|result|``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.core.formats import fp8_granularity
from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2

from ._host import arch_family
from ._mxfp4 import E2M1_REBIAS, e2m1_word_planes, e8m0_to_float, unpack_mxfp4, unpack_mxfp4_words

__all__ = [
    "MMConfig",
    "MM_CONFIGS",
    "mm_config",
    "mm",
    "mm_with_config",
    "operand_kind",
    "split_k_plan",
    "TRITON_KERNELS",
    "SCALE_NONE",
    "SCALE_TENSOR",
    "SCALE_ROW",
    "SCALE_BLOCK128",
    "SCALE_MXFP4",
    "SCALE_MXFP4_WORDS",
]

# Scale modes of each operand (the A_SCALE / B_SCALE constexprs).
SCALE_NONE = tl.constexpr(0)
SCALE_TENSOR = tl.constexpr(1)
SCALE_ROW = tl.constexpr(2)  # per token for a, per channel for b
SCALE_BLOCK128 = tl.constexpr(3)  # 1x128 blocks for a, 128x128 for b
SCALE_MXFP4 = tl.constexpr(4)  # b only: E8M0 per 32 values, codes read byte by byte
SCALE_MXFP4_WORDS = tl.constexpr(5)  # b only: the same, codes read as int32 words (8 a word)

_FP8 = (torch.float8_e4m3fn,)


@dataclass(frozen=True)
class MMConfig:
    """One GEMM tile: ``BLOCK_M x BLOCK_N`` outputs per program, ``BLOCK_K`` per step.

    ``group_m``: programs are walked in column groups of this many row tiles so
    that neighbouring programs share B tiles in L2. ``dot_in_fp32``: upcast both
    operands to fp32 before ``tl.dot`` (the interpreter multiplies bf16 storage as
    raw integers, so its config needs this; GPUs never do). ``fp8_imprecise_acc``:
    how many K elements Hopper's fp8 wgmma may sum in its reduced-precision
    accumulator before promoting to fp32 (None = Triton's default, i.e. never).
    ``split_k``: at most this many K slices (fp32 partials, then an ordered reduction);
    ``split_target``: use only as many slices as it takes for the output tiles times the
    slices to reach this many programs (0 = always ``split_k``). ``gemv``: the MMA-free GEMV
    kernel for a handful of rows (``block_m`` = rows per program): MXFP4 weights (split-K
    applies), or bf16/fp16/fp32 ``b`` with unit stride along K (one launch, no split).
    ``launch``: extra backend launch options (e.g. AMD ``waves_per_eu``).
    """

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    dot_in_fp32: bool = False
    fp8_imprecise_acc: int | None = None
    split_k: int = 1
    split_target: int = 0
    gemv: bool = False
    launch: Mapping[str, Any] = field(default_factory=dict)


# mm: per family, per operand kind, (largest M, config) rows tried in order; the
# last row has M = None (any). Kinds: "16bit" (bf16/fp16), "fp32", "fp8"
# (per-tensor/row scales), "fp8_block128" (BLOCK_K must divide 128), "mxfp4"
# (BLOCK_K a multiple of 32).
#
# Small M is weight-streaming bound and short of programs: GPT-OSS's QKV projection
# (N = 5120) is 320 tiles of 16, its O projection (N = 2880) 180, on 132 SMs, each tile
# walking all of K. Split-K (split_k / split_target, ~4 programs per SM) multiplies the
# programs in flight; MXFP4 decode also spends ALU time per weight value, which split-K
# spreads over more SMs. ``gemv=True`` rows (a few rows: MXFP4, and bf16/fp16 on NVIDIA) take the MMA-free GEMVs.
#
# NVIDIA (H200), measured 2026-11-30 with do_bench (--quick bench): bf16 mm 0.53-0.75x
# cuBLAS, fp8 0.39-0.59x; at M <= 16, split-K (bf16/fp8) and the GEMV + split-K (MXFP4)
# measured 2-4x slower than the plain tiles, so those rows are plain again. do_bench
# times a Python call: the split paths' extra launch and allocation add CPU time that
# can exceed the L2-flush memset do_bench queues first, so part of that gap may be host
# overhead a CUDA-graph decode step does not pay; the bench's "graph us" column and
# --sweep (graph-timed, split-K and GEMV configs included) tell. Reasoned, not measured:
# prefill bf16 128x256x64 with 4 stages (4 x 48 KB of smem, under the 227 KB; wgmma
# m64n256 per warpgroup, 8 warps); fp8 128x256x128 with 4 stages (4 x 48 KB).
_NV_FP8_ACC = 128
_SPLIT_TARGET = 4 * 132  # programs: about four per H200 SM
MM_CONFIGS: dict[str, dict[str, tuple[tuple[int | None, MMConfig], ...]]] = {
    "nvidia": {
        "16bit": (
            # M <= 2: the dense GEMV, one launch (tools/gemv_sweep.py on an H100, 2026-12-06, device time, cold L2,
            # against cuBLAS: M=1 qkv 1.22x, o 0.88x, router 0.85x, unembedding 0.97x; M=2 qkv 1.21x, o 0.86x).
            (2, MMConfig(2, 4, 512, num_warps=4, num_stages=1, gemv=True)),
            # M <= 16 bf16/fp16: no split-K. Measured on the H200 (2026-11-30, --quick): qkv M=1
            # 30.8 us without split-K, 115.3 us with split_k=4.
            (16, MMConfig(16, 16, 256, num_warps=4, num_stages=4)),
            (64, MMConfig(64, 64, 64, num_warps=4, num_stages=4)),
            (256, MMConfig(128, 128, 64, num_warps=8, num_stages=3)),
            (None, MMConfig(128, 256, 64, num_warps=8, num_stages=4)),
        ),
        "fp32": ((None, MMConfig(64, 64, 32, num_warps=4, num_stages=3)),),
        "fp8": (
            # fp8 M <= 16: no split-K (H200: o M=1 28.6 us without, 105 us with split_k=4).
            (16, MMConfig(16, 16, 256, num_warps=4, num_stages=4, fp8_imprecise_acc=_NV_FP8_ACC)),
            (64, MMConfig(64, 64, 128, num_warps=4, num_stages=4, fp8_imprecise_acc=_NV_FP8_ACC)),
            (None, MMConfig(128, 256, 128, num_warps=8, num_stages=4, fp8_imprecise_acc=_NV_FP8_ACC)),
        ),
        "fp8_block128": (
            # no split-K at M <= 16, as the measured bf16/fp8 rows (not measured here)
            (16, MMConfig(16, 32, 128, num_warps=4, num_stages=4)),
            (64, MMConfig(64, 64, 128, num_warps=4, num_stages=4)),
            # 128x128: the per-step partial product doubles the accumulator registers
            (None, MMConfig(128, 128, 128, num_warps=8, num_stages=3)),
        ),
        "mxfp4": (
            # MXFP4 M <= 16: the call-2 tile (H200: qkv M=1 46.5 us; the GEMV + split_k=8 row
            # measured 92.1 us). M <= 64 keeps split_k=4 (qkv M=64 63.7 -> 40.1 us).
            (16, MMConfig(16, 32, 256, num_warps=4, num_stages=4)),
            (64, MMConfig(64, 64, 128, num_warps=4, num_stages=4, split_k=4, split_target=_SPLIT_TARGET)),
            (None, MMConfig(128, 128, 128, num_warps=8, num_stages=3)),
        ),
    },
    # Sized so that neither gfx942 nor gfx950 spills VGPRs (checked by the cross-compile
    # test); 256-wide tiles spilled 100+ VGPRs on both. gfx942 has no OCP fp8 MFMA, so
    # its fp8 tiles also pay for the conversion to fp16 in registers. Not measured on
    # hardware; split-K on the decode rows as on NVIDIA (MI300X/MI355X: 304/256 CUs).
    "amd": {
        "16bit": (
            (16, MMConfig(16, 64, 128, num_warps=4, num_stages=2, split_k=4, split_target=4 * 304)),
            (64, MMConfig(64, 64, 64, num_warps=4, num_stages=2)),
            (None, MMConfig(128, 128, 64, num_warps=8, num_stages=2)),
        ),
        "fp32": ((None, MMConfig(64, 64, 32, num_warps=4, num_stages=2)),),
        "fp8": (
            (16, MMConfig(16, 64, 64, num_warps=4, num_stages=2, split_k=4, split_target=4 * 304)),
            (64, MMConfig(64, 64, 64, num_warps=4, num_stages=2)),
            (None, MMConfig(128, 64, 64, num_warps=4, num_stages=2)),
        ),
        "fp8_block128": (
            (16, MMConfig(16, 64, 64, num_warps=4, num_stages=2, split_k=4, split_target=4 * 304)),
            (None, MMConfig(64, 64, 64, num_warps=4, num_stages=2)),
        ),
        "mxfp4": (
            (4, MMConfig(4, 64, 256, num_warps=4, num_stages=1, gemv=True, split_k=8, split_target=4 * 304)),
            (16, MMConfig(16, 64, 128, num_warps=4, num_stages=2, split_k=8, split_target=4 * 304)),
            (64, MMConfig(64, 64, 64, num_warps=4, num_stages=2, split_k=4, split_target=4 * 304)),
            (None, MMConfig(128, 128, 64, num_warps=8, num_stages=2)),
        ),
    },
    # Small tiles so the tests exercise several programs, K tails, wrap-around rows,
    # split-K (two slices at M <= 2) and the MXFP4 GEMV.
    "interpret": {
        "16bit": (
            (2, MMConfig(16, 16, 32, group_m=2, dot_in_fp32=True, split_k=2)),
            (None, MMConfig(16, 16, 32, group_m=2, dot_in_fp32=True)),
        ),
        "fp32": ((None, MMConfig(16, 16, 32, group_m=2, dot_in_fp32=True)),),
        "fp8": ((None, MMConfig(16, 16, 32, group_m=2, dot_in_fp32=True)),),
        "fp8_block128": ((None, MMConfig(16, 16, 32, group_m=2, dot_in_fp32=True)),),
        "mxfp4": (
            (2, MMConfig(2, 16, 64, gemv=True, split_k=2)),
            (None, MMConfig(16, 16, 64, group_m=2, dot_in_fp32=True)),
        ),
    },
}


def mm_config(kind: str, m: int, device: torch.device, *, gemv: bool = True) -> MMConfig:
    """The GEMM tile for operand ``kind`` at ``m`` rows on ``device``'s family
    (``gemv=False``: skip GEMV rows, for MXFP4 codes the GEMV cannot read)."""
    for max_m, cfg in MM_CONFIGS[arch_family(device)][kind]:
        if (max_m is None or m <= max_m) and (gemv or not cfg.gemv):
            return cfg
    raise AssertionError(f"mm config table for {kind!r} has no catch-all row")


@triton.jit
def _store_tile(
    acc,
    c_ptr,
    bias_ptr,
    rm,
    rn,
    bias_cols,
    pid_k,
    M,
    N,
    stride_cm,
    stride_cn,
    SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Write the fp32 tile ``acc`` of rows ``rm`` and columns ``rn`` (``bias_cols``: the
    columns wrapped into N, safe to load). With SPLIT, as this K slice's partial in the
    workspace ``[splits, M, N]``: bias and the cast happen once, in _split_k_reduce_kernel."""
    mask = (rm < M)[:, None] & (rn < N)[None, :]
    if SPLIT:
        ws = c_ptr + pid_k.to(tl.int64) * M * N + rm.to(tl.int64)[:, None] * N + rn[None, :]
        tl.store(ws, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + bias_cols).to(tl.float32)[None, :]
        c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


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
    k_per_split,
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    stride_a_scale_m,
    stride_a_scale_k,
    stride_b_scale_n,
    stride_b_scale_k,
    A_SCALE: tl.constexpr,
    B_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    SPLIT: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    IMPRECISE_ACC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    B_MXFP4: tl.constexpr = B_SCALE == SCALE_MXFP4 or B_SCALE == SCALE_MXFP4_WORDS
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
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
    offs_k = tl.arange(0, BLOCK_K)
    # This program's K slice (all of K without split-K); k_per_split is a multiple of BLOCK_K.
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)

    a_ptrs = a_ptr + am[:, None] * stride_am + (k_lo + offs_k)[None, :] * stride_ak
    if B_SCALE == SCALE_MXFP4:
        # MXFP4 bytes: BLOCK_K values are BLOCK_K // 2 bytes and BLOCK_K // 32 scales of each row.
        offs_byte = tl.arange(0, BLOCK_K // 2)
        b_ptrs = b_ptr + bn[:, None] * stride_bn + (k_lo // 2 + offs_byte)[None, :] * stride_bk
    elif B_SCALE == SCALE_MXFP4_WORDS:
        # MXFP4 words: BLOCK_K values are BLOCK_K // 8 int32 words (16-byte vector loads).
        offs_word = tl.arange(0, BLOCK_K // 8)
        # A row is K / 8 words, a multiple of 4 (K % 32 == 0): rows start 16-byte aligned.
        b_rows = tl.multiple_of(bn * stride_bn, 4)
        b_ptrs = b_ptr + b_rows[:, None] + (k_lo // 8 + offs_word)[None, :] * stride_bk
    else:
        # b is [N, K] with K contiguous: read it as the [BLOCK_K, BLOCK_N] K-major
        # operand the MMA wants (no transpose in registers).
        b_ptrs = b_ptr + (k_lo + offs_k)[:, None] * stride_bk + bn[None, :] * stride_bn
    if B_MXFP4:
        offs_group = tl.arange(0, BLOCK_K // 32)
        b_scale_ptrs = (
            b_scale_ptr + bn[:, None] * stride_b_scale_n + (k_lo // 32 + offs_group)[None, :] * stride_b_scale_k
        )

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
        else:
            a = tl.load(a_ptrs, mask=(k0 + offs_k)[None, :] < K, other=0.0)
        if B_MXFP4:
            # K is a multiple of 32: a tail step masks whole bytes, words and groups.
            if EVEN_K:
                packed = tl.load(b_ptrs)
                scale_exp = tl.load(b_scale_ptrs)
            else:
                scale_exp = tl.load(b_scale_ptrs, mask=(k0 // 32 + offs_group)[None, :] < K // 32, other=0)
                if B_SCALE == SCALE_MXFP4:
                    packed = tl.load(b_ptrs, mask=(k0 // 2 + offs_byte)[None, :] < K // 2, other=0)
                else:
                    packed = tl.load(b_ptrs, mask=(k0 // 8 + offs_word)[None, :] < K // 8, other=0)
            if B_SCALE == SCALE_MXFP4:
                w = unpack_mxfp4(packed, scale_exp, BLOCK_N, BLOCK_K)
            else:
                w = unpack_mxfp4_words(packed, scale_exp, BLOCK_N, BLOCK_K)
            # E2M1 x 2^e is exact in bf16 (and in fp16 within its exponent range).
            b = tl.trans(w.to(a.dtype))
        elif EVEN_K:
            b = tl.load(b_ptrs)
        else:
            b = tl.load(b_ptrs, mask=(k0 + offs_k)[:, None] < K, other=0.0)
        if DOT_IN_FP32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if A_SCALE == SCALE_BLOCK128 or B_SCALE == SCALE_BLOCK128:
            # Block scales change every 128 along K: scale each BLOCK_K partial
            # product (BLOCK_K divides 128 and k0 is a multiple of BLOCK_K, so one step
            # sits in one scale block). Each partial starts from zero, so fp8 wgmma's
            # reduced-precision accumulation never spans more than BLOCK_K.
            part = tl.dot(a, b, input_precision=INPUT_PRECISION)
            ks = k0 // 128
            if A_SCALE == SCALE_BLOCK128:
                part = part * tl.load(a_scale_ptr + am * stride_a_scale_m + ks * stride_a_scale_k)[:, None]
            if B_SCALE == SCALE_BLOCK128:
                # one scale per column: a BLOCK_N wider than 128 spans several weight blocks
                part = part * tl.load(b_scale_ptr + (bn // 128) * stride_b_scale_n + ks * stride_b_scale_k)[None, :]
            acc += part
        else:
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION, max_num_imprecise_acc=IMPRECISE_ACC)
        a_ptrs += BLOCK_K * stride_ak
        if B_SCALE == SCALE_MXFP4:
            b_ptrs += (BLOCK_K // 2) * stride_bk
        elif B_SCALE == SCALE_MXFP4_WORDS:
            b_ptrs += (BLOCK_K // 8) * stride_bk
        else:
            b_ptrs += BLOCK_K * stride_bk
        if B_MXFP4:
            b_scale_ptrs += (BLOCK_K // 32) * stride_b_scale_k

    # Per-tensor and per-row scales are constant along K: one multiply at the end.
    if A_SCALE == SCALE_TENSOR:
        acc = acc * tl.load(a_scale_ptr)
    elif A_SCALE == SCALE_ROW:
        acc = acc * tl.load(a_scale_ptr + am * stride_a_scale_m)[:, None]
    if B_SCALE == SCALE_TENSOR:
        acc = acc * tl.load(b_scale_ptr)
    elif B_SCALE == SCALE_ROW:
        acc = acc * tl.load(b_scale_ptr + bn * stride_b_scale_n)[None, :]
    _store_tile(acc, c_ptr, bias_ptr, rm, rn, bn, pid_k, M, N, stride_cm, stride_cn, SPLIT, HAS_BIAS)


@triton.jit
def _mxfp4_gemv_kernel(
    a_ptr,
    w_ptr,
    scale_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    k_per_split,
    stride_am,
    stride_ak,
    stride_wn,
    stride_scale_n,
    stride_scale_k,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``c[m, n] = sum_k a[m, k] w[n, k]`` for MXFP4 ``w`` read as int32 code words
    (``[N, K/8]``, unit stride along K) and a handful of rows ``m``: no MMA.

    A program owns BLOCK_N weight rows and one K slice. Words are loaded as
    ``[BLOCK_N, G, 4]`` (G 32-value groups of four words: one 16-byte vector per
    group and row); code j of word (g, w) multiplies ``a[m, k0 + 32 g + 8 w + j]``.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    G: tl.constexpr = BLOCK_K // 32
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    wn = (rn % N).to(tl.int64)  # wrap-around rows keep loads in bounds (masked at the store)
    rg = tl.arange(0, G)
    rw = tl.arange(0, 4)
    kw = rg[:, None] * 4 + rw[None, :]  # word offset of (group, word) within a step
    # A row is K / 8 words, a multiple of 4 (K % 32 == 0): rows start 16-byte aligned,
    # so each (row, group) is one 16-byte vector load.
    w_rows = tl.multiple_of(wn * stride_wn, 4)
    w_ptrs = w_ptr + w_rows[:, None, None] + kw[None, :, :]
    scale_ptrs = scale_ptr + wn[:, None] * stride_scale_n + rg[None, :] * stride_scale_k
    a_off = (rg[:, None] * 32 + rw[None, :] * 8) * stride_ak  # a column of code 0 of each word
    rm_local = tl.arange(0, BLOCK_M)
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)

    # Manual double buffering: the next step's words and scales are in flight while
    # this step decodes (one program's step is only BLOCK_N * BLOCK_K / 2 bytes).
    # Every step starts at a multiple of BLOCK_K (k_per_split is one): tell the compiler,
    # so the word loads stay 16-byte vectors.
    if EVEN_K:
        next_words = tl.load(w_ptrs + tl.multiple_of(k_lo // 8, BLOCK_K // 8), mask=k_lo < k_hi, other=0)
        next_scales = tl.load(scale_ptrs + (k_lo // 32) * stride_scale_k, mask=k_lo < k_hi, other=0)
    else:
        g_ok = (k_lo // 32 + rg) < K // 32
        next_words = tl.load(w_ptrs + tl.multiple_of(k_lo // 8, BLOCK_K // 8), mask=g_ok[None, :, None], other=0)
        next_scales = tl.load(scale_ptrs + (k_lo // 32) * stride_scale_k, mask=g_ok[None, :], other=0)
    # Per (row, weight row, group) partial sums: the reduction over groups (across
    # threads) happens once, after the K loop.
    acc = tl.zeros((BLOCK_M, BLOCK_N, G), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        words = next_words
        scale = e8m0_to_float(next_scales)
        k1 = k0 + BLOCK_K
        g1_ok = ((k1 // 32 + rg) < K // 32) & (k1 < k_hi)
        next_words = tl.load(w_ptrs + tl.multiple_of(k1 // 8, BLOCK_K // 8), mask=g1_ok[None, :, None], other=0)
        next_scales = tl.load(scale_ptrs + (k1 // 32) * stride_scale_k, mask=g1_ok[None, :], other=0)
        c0, c1, c2, c3, c4, c5, c6, c7 = e2m1_word_planes(words)
        g_ok = (k0 // 32 + rg) < K // 32
        for i in tl.static_range(BLOCK_M):
            row = pid_m * BLOCK_M + i
            a_row = a_ptr + row.to(tl.int64) * stride_am + k0 * stride_ak + a_off
            a_ok = g_ok[:, None] & (row < M)
            # Eight FMAs per word, one per code plane; a is tiny and cached.
            part = c0 * tl.load(a_row, mask=a_ok, other=0.0).to(tl.float32)[None, :, :]
            part += c1 * tl.load(a_row + stride_ak, mask=a_ok, other=0.0).to(tl.float32)[None, :, :]
            part += c2 * tl.load(a_row + 2 * stride_ak, mask=a_ok, other=0.0).to(tl.float32)[None, :, :]
            part += c3 * tl.load(a_row + 3 * stride_ak, mask=a_ok, other=0.0).to(tl.float32)[None, :, :]
            part += c4 * tl.load(a_row + 4 * stride_ak, mask=a_ok, other=0.0).to(tl.float32)[None, :, :]
            part += c5 * tl.load(a_row + 5 * stride_ak, mask=a_ok, other=0.0).to(tl.float32)[None, :, :]
            part += c6 * tl.load(a_row + 6 * stride_ak, mask=a_ok, other=0.0).to(tl.float32)[None, :, :]
            part += c7 * tl.load(a_row + 7 * stride_ak, mask=a_ok, other=0.0).to(tl.float32)[None, :, :]
            # Per group: undo the decoder's 2**-14 (exact), then the E8M0 scale.
            group = (tl.sum(part, axis=2) * E2M1_REBIAS) * scale
            acc += tl.where(rm_local[:, None, None] == i, group[None, :, :], 0.0)

    acc = tl.sum(acc, axis=2)
    rm = pid_m * BLOCK_M + rm_local
    _store_tile(acc, c_ptr, bias_ptr, rm, rn, wn, pid_k, M, N, stride_cm, stride_cn, SPLIT, HAS_BIAS)


@triton.jit
def _dense_gemv_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bn,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``c[m, n] = sum_k a[m, k] b[n, k] (+ bias[n])`` for bf16/fp16/fp32 ``b`` (unit stride along K) and a
    handful of rows ``m``: no MMA, and no split (one launch; every program walks all of K).

    A program owns BLOCK_N rows of ``b`` and BLOCK_M rows of ``a``. Each step loads a ``[BLOCK_N, BLOCK_K]``
    tile of ``b`` as vectors while the previous one is multiplied (register double buffering); the products
    are summed per K position and reduced across K once, after the loop.
    """
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    bn = (rn % N).to(tl.int64)  # wrap-around rows keep loads in bounds (masked at the store)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    am = tl.minimum(rm, M - 1).to(tl.int64)
    rk = tl.arange(0, BLOCK_K)
    b_ptrs = b_ptr + bn[:, None] * stride_bn + rk[None, :]
    a_ptrs = a_ptr + am[:, None] * stride_am + rk[None, :] * stride_ak
    next_b = tl.load(b_ptrs, mask=rk[None, :] < K, other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = next_b
        k1 = k0 + BLOCK_K
        next_b = tl.load(b_ptrs + k1, mask=(k1 + rk)[None, :] < K, other=0.0)
        x = tl.load(a_ptrs + k0 * stride_ak, mask=(k0 + rk)[None, :] < K, other=0.0)
        acc += x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
    c = tl.sum(acc, axis=2)
    if HAS_BIAS:
        c += tl.load(bias_ptr + bn).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, c.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _split_k_reduce_kernel(
    ws_ptr, bias_ptr, c_ptr, MN, N, splits, stride_cm, stride_cn, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr
):
    """``c[m, :] = sum_s ws[s, m, :] (+ bias)`` (``MN = M * N``, one slice's size), the
    slices added in order (deterministic)."""
    m = tl.program_id(0).to(tl.int64)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = rn < N
    ptrs = ws_ptr + m * N + rn
    acc = tl.load(ptrs, mask=mask, other=0.0)
    for _ in range(1, splits):
        ptrs += MN
        acc += tl.load(ptrs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=mask, other=0.0).to(tl.float32)
    tl.store(c_ptr + m * stride_cm + rn * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)


#: Every Triton kernel of this module (the cross-compile test covers each).
TRITON_KERNELS = {
    "mm": _mm_kernel,
    "mxfp4_gemv": _mxfp4_gemv_kernel,
    "dense_gemv": _dense_gemv_kernel,
    "split_k_reduce": _split_k_reduce_kernel,
}

#: Columns per program of the split-K reduction.
_REDUCE_BLOCK_N = 1024


#: The core's FP8 scale granularities (the op's format) -> the kernel's scale mode.
_SCALE_MODES = {
    "per_tensor": SCALE_TENSOR,
    "per_token": SCALE_ROW,
    "per_channel": SCALE_ROW,
    "block128": SCALE_BLOCK128,
}


def _scale_mode(scale: torch.Tensor | None, rows: int, cols: int, *, weight: bool) -> int:
    """The kernel's scale mode of an FP8 operand ``[rows, cols]`` (one copy of the granularity rules: the core's)."""
    if scale is None:
        return SCALE_NONE
    return _SCALE_MODES[fp8_granularity(scale, rows, cols, weight=weight, name="b_scale" if weight else "a_scale")]


def _scale_strides(scale: torch.Tensor | None, mode: int) -> tuple[int, int]:
    if mode in (SCALE_ROW, SCALE_BLOCK128, SCALE_MXFP4, SCALE_MXFP4_WORDS):
        return scale.stride(0), scale.stride(1)
    return 0, 0


def _as_words(blocks: torch.Tensor) -> torch.Tensor | None:
    """MXFP4 codes ``uint8 [N, K/2]`` viewed as ``int32 [N, K/8]`` (no copy), or None when
    the rows are not 4-byte aligned with unit stride along K."""
    if blocks.stride(1) != 1 or blocks.stride(0) % 4 or blocks.data_ptr() % 4 or blocks.shape[1] % 4:
        return None
    try:
        return blocks.view(torch.int32)
    except RuntimeError:
        return None


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
        (m, k), n = a.shape, b.shape[0]
        modes = (_scale_mode(a_scale, m, k, weight=False), _scale_mode(b_scale, n, k, weight=True))
        return "fp8_block128" if SCALE_BLOCK128 in modes else "fp8"
    return "fp32" if a.dtype == torch.float32 else "16bit"


def split_k_plan(cfg: MMConfig, tiles: int, k: int) -> tuple[int, int]:
    """``(splits, k_per_split)`` for ``tiles`` output tiles over ``k``: at most ``cfg.split_k``
    slices, fewer when ``tiles`` alone reach ``cfg.split_target`` programs; every slice
    gets at least one BLOCK_K step and ``k_per_split`` is a multiple of BLOCK_K."""
    steps = max(1, cdiv(k, cfg.block_k))
    splits = cfg.split_k
    if cfg.split_target:
        splits = min(splits, max(1, cdiv(cfg.split_target, tiles)))
    splits = max(1, min(splits, steps))
    per = cdiv(steps, splits)
    return cdiv(steps, per), per * cfg.block_k


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
    if k == 0:
        return out.copy_(bias.expand(m, n) if bias is not None else torch.zeros((), device=a.device))
    kind = operand_kind(a, b, a_scale, b_scale)
    cfg = config if config is not None else mm_config(kind, m, a.device)
    if kind == "fp8_block128" and 128 % cfg.block_k:
        raise AssertionError(f"mm config: fp8 block128 needs BLOCK_K dividing 128, got {cfg.block_k}")
    if kind == "mxfp4" and cfg.block_k % 32:
        raise AssertionError(f"mm config: MXFP4 needs BLOCK_K a multiple of 32, got {cfg.block_k}")
    words = _as_words(b) if kind == "mxfp4" else None
    if cfg.gemv and kind in ("16bit", "fp32") and b.stride(1) == 1:
        return _dense_gemv(a, b, bias, out, cfg)
    if cfg.gemv:
        if words is not None:
            return _gemv(a, words, bias, b_scale, out, cfg)
        # unaligned codes or a strided dense b: the table's MMA tile (of an explicit config, the same width)
        cfg = mm_config(kind, m, a.device, gemv=False) if config is None else replace(cfg, block_m=16, gemv=False)
    a_mode = _scale_mode(a_scale, m, k, weight=False)
    if kind == "mxfp4":
        b_mode = SCALE_MXFP4_WORDS if words is not None else SCALE_MXFP4
        b = words if words is not None else b
    else:
        b_mode = _scale_mode(b_scale, n, k, weight=True)
    a_scale_strides = _scale_strides(a_scale, a_mode)
    b_scale_strides = _scale_strides(b_scale, b_mode)
    tiles = cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n)
    splits, k_per_split = split_k_plan(cfg, tiles, k)
    target = out if splits == 1 else torch.empty((splits, m, n), dtype=torch.float32, device=a.device)
    cached(_mm_kernel)[(tiles, splits)](
        a, b, target, bias, a_scale, b_scale,
        m, n, k, k_per_split,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
        *a_scale_strides, *b_scale_strides,
        A_SCALE=a_mode,
        B_SCALE=b_mode,
        HAS_BIAS=bias is not None,
        EVEN_K=k % cfg.block_k == 0,
        SPLIT=splits > 1,
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
    if splits > 1:
        _reduce(target, bias, out, splits)
    return out


def _reduce(ws: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, splits: int) -> None:
    m, n = out.shape
    cached(_split_k_reduce_kernel)[(m, cdiv(n, _REDUCE_BLOCK_N))](
        ws, bias, out, m * n, n, splits, out.stride(0), out.stride(1),
        HAS_BIAS=bias is not None, BLOCK_N=_REDUCE_BLOCK_N, num_warps=4,
    )  # fmt: skip


def _gemv(
    a: torch.Tensor,
    words: torch.Tensor,
    bias: torch.Tensor | None,
    scales: torch.Tensor,
    out: torch.Tensor,
    cfg: MMConfig,
) -> torch.Tensor:
    m, k = a.shape
    n = words.shape[0]
    # Rows per program: M itself rounded up (at most the config's), so M = 1 does no
    # wasted FMAs; more rows than that take more programs along grid axis 2.
    block_m = min(cfg.block_m, next_power_of_2(m))
    tiles = cdiv(n, cfg.block_n) * cdiv(m, block_m)
    splits, k_per_split = split_k_plan(cfg, tiles, k)
    target = out if splits == 1 else torch.empty((splits, m, n), dtype=torch.float32, device=a.device)
    cached(_mxfp4_gemv_kernel)[(cdiv(n, cfg.block_n), splits, cdiv(m, block_m))](
        a, words, scales, target, bias,
        m, n, k, k_per_split,
        a.stride(0), a.stride(1), words.stride(0), scales.stride(0), scales.stride(1), out.stride(0), out.stride(1),
        HAS_BIAS=bias is not None,
        EVEN_K=k % cfg.block_k == 0,
        SPLIT=splits > 1,
        BLOCK_M=block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        **cfg.launch,
    )  # fmt: skip
    if splits > 1:
        _reduce(target, bias, out, splits)
    return out


def _dense_gemv(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, cfg: MMConfig
) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[0]
    block_m = min(cfg.block_m, next_power_of_2(m))  # (as _gemv: M = 1 multiplies one row)
    cached(_dense_gemv_kernel)[(cdiv(n, cfg.block_n), cdiv(m, block_m))](
        a, b, out, bias, m, n, k, a.stride(0), a.stride(1), b.stride(0), out.stride(0), out.stride(1),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **cfg.launch,
    )  # fmt: skip
    return out

"""mm's Triton kernels (GEMM, MXFP4 and dense GEMVs, split-K reduction) compile for sm90, gfx942 and gfx950 at GPT-OSS shapes.

The GEMM must land on the matrix units (``mma``/``wgmma`` in the PTX, ``v_mfma`` in the
AMDGCN; fp32 with IEEE precision is FMA work on NVIDIA) and spill nothing (see
``_compile_cases``). Each case uses the tile the config table gives its arch family:
by default the decode (first row) and prefill (last row) tiles GPT-OSS runs; the slow
test compiles every row of every table. ``python test_cross_compile_mm.py sm90 [--slow]``
prints one target's raw results.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from _compile_cases import HIDDEN, QKV_N, Case, child_main, cross_compile_tests, ints, run_children

from tokenspeed_kernel_triton import mm
from tokenspeed_kernel_triton.mm import MM_CONFIGS, MMConfig

_MM_OPERANDS = {  # kind -> (a type, b type, A_SCALE, B_SCALE)
    "16bit": ("*bf16", "*bf16", mm.SCALE_NONE, mm.SCALE_NONE),
    "fp32": ("*fp32", "*fp32", mm.SCALE_NONE, mm.SCALE_NONE),
    "fp8": ("*fp8e4nv", "*fp8e4nv", mm.SCALE_ROW, mm.SCALE_ROW),
    "fp8_block128": ("*fp8e4nv", "*fp8e4nv", mm.SCALE_BLOCK128, mm.SCALE_BLOCK128),
    # aligned checkpoints' codes are read as int32 words; "mxfp4_bytes" is the unaligned path
    "mxfp4": ("*bf16", "*i32", mm.SCALE_NONE, mm.SCALE_MXFP4_WORDS),
    "mxfp4_bytes": ("*bf16", "*u8", mm.SCALE_NONE, mm.SCALE_MXFP4),
}


def _gemv_case(cfg: Any) -> Case:
    types = {
        "a_ptr": "*bf16",
        "w_ptr": "*i32",
        "scale_ptr": "*u8",
        "c_ptr": "*fp32",  # split-K partials
        "bias_ptr": "*bf16",
        **ints("M", "N", "K", "k_per_split", "stride_am", "stride_ak", "stride_wn", "stride_scale_n", "stride_scale_k"),
        **ints("stride_cm", "stride_cn"),
    }
    constexprs = {
        "HAS_BIAS": False,
        "EVEN_K": HIDDEN % cfg.block_k == 0,
        "SPLIT": cfg.split_k > 1,
        "BLOCK_M": 1,  # decode: one token
        "BLOCK_N": cfg.block_n,
        "BLOCK_K": cfg.block_k,
    }
    splits, k_per_split = mm.split_k_plan(cfg, -(-QKV_N // cfg.block_n), HIDDEN)
    values = {
        "M": 1, "N": QKV_N, "K": HIDDEN, "k_per_split": k_per_split, "stride_am": HIDDEN, "stride_ak": 1,
        "stride_wn": HIDDEN // 8, "stride_scale_n": HIDDEN // 32, "stride_scale_k": 1, "stride_cm": QKV_N, "stride_cn": 1,
    }  # fmt: skip
    constexprs["SPLIT"] = splits > 1
    return Case(mm._mxfp4_gemv_kernel, types, constexprs, cfg.num_warps, cfg.num_stages, values=values)


def _dense_gemv_case(cfg: Any) -> Case:
    """The bf16 GEMV at GPT-OSS's QKV projection, one token, with its bias."""
    types = {
        "a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "bias_ptr": "*bf16",
        **ints("M", "N", "K", "stride_am", "stride_ak", "stride_bn", "stride_cm", "stride_cn"),
    }  # fmt: skip
    constexprs = {"HAS_BIAS": True, "BLOCK_M": 1, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k}
    values = {"M": 1, "N": QKV_N, "K": HIDDEN, "stride_am": HIDDEN, "stride_ak": 1, "stride_bn": HIDDEN,
              "stride_cm": QKV_N, "stride_cn": 1}  # fmt: skip
    return Case(mm._dense_gemv_kernel, types, constexprs, cfg.num_warps, cfg.num_stages, values=values)


def _mm_case(kind: str, family: str, row: int) -> Case:
    a_type, b_type, a_mode, b_mode = _MM_OPERANDS[kind]
    cfg = MM_CONFIGS[family][kind.removesuffix("_bytes")][row][1]
    if cfg.gemv and kind in ("16bit", "fp32"):
        return _dense_gemv_case(cfg)
    if cfg.gemv:
        if kind == "mxfp4_bytes":  # unaligned codes run the MMA tile of the same width
            cfg = replace(cfg, block_m=16, gemv=False)
        else:
            return _gemv_case(cfg)
    max_m = MM_CONFIGS[family][kind.removesuffix("_bytes")][row][0]
    m = 1 if row == 0 else (max_m or 4096)  # decode: one token; else the row's largest M
    tiles = -(-m // cfg.block_m) * -(-QKV_N // cfg.block_n)
    splits, k_per_split = mm.split_k_plan(cfg, tiles, HIDDEN)
    split = splits > 1
    # operand strides of contiguous GPT-OSS QKV operands (M x 2880 @ 5120 x 2880)
    b_row = {mm.SCALE_MXFP4: HIDDEN // 2, mm.SCALE_MXFP4_WORDS: HIDDEN // 8}.get(b_mode, HIDDEN)
    a_scale_rows = -(-HIDDEN // 128) if a_mode == mm.SCALE_BLOCK128 else 1
    b_scale_rows = {mm.SCALE_BLOCK128: -(-HIDDEN // 128), mm.SCALE_MXFP4: HIDDEN // 32}.get(b_mode, 1)
    b_scale_rows = HIDDEN // 32 if b_mode == mm.SCALE_MXFP4_WORDS else b_scale_rows
    values = {
        "M": m, "N": QKV_N, "K": HIDDEN, "k_per_split": k_per_split, "stride_am": HIDDEN, "stride_ak": 1,
        "stride_bn": b_row, "stride_bk": 1, "stride_cm": QKV_N, "stride_cn": 1,
        "stride_a_scale_m": a_scale_rows, "stride_a_scale_k": 1, "stride_b_scale_n": b_scale_rows, "stride_b_scale_k": 1,
    }  # fmt: skip
    types = {
        "a_ptr": a_type,
        "b_ptr": b_type,
        "c_ptr": "*fp32" if split else "*bf16",
        "bias_ptr": "*bf16",
        "a_scale_ptr": "*fp32",
        "b_scale_ptr": "*u8" if b_mode >= mm.SCALE_MXFP4 else "*fp32",
        **ints("M", "N", "K", "k_per_split", "stride_am", "stride_ak", "stride_bn", "stride_bk"),
        **ints(
            "stride_cm", "stride_cn", "stride_a_scale_m", "stride_a_scale_k", "stride_b_scale_n", "stride_b_scale_k"
        ),
    }
    constexprs: dict[str, Any] = {
        "A_SCALE": a_mode,
        "B_SCALE": b_mode,
        "HAS_BIAS": not split,  # GPT-OSS's attention projections have biases (split-K: in the reduction)
        "EVEN_K": HIDDEN % cfg.block_k == 0,
        "SPLIT": split,
        "DOT_IN_FP32": cfg.dot_in_fp32,
        "INPUT_PRECISION": "ieee" if kind == "fp32" else None,
        "IMPRECISE_ACC": cfg.fp8_imprecise_acc if kind == "fp8" else None,
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "BLOCK_K": cfg.block_k,
        "GROUP_M": cfg.group_m,
    }
    if a_mode == mm.SCALE_NONE:
        constexprs["a_scale_ptr"] = None
    if b_mode == mm.SCALE_NONE:
        constexprs["b_scale_ptr"] = None
    # fp32 with IEEE precision is FMA work on NVIDIA (no fp32 tensor-core path); every
    # other kind must use the MMA units.
    checks = {"gfx": r"v_mfma_"}
    if kind != "fp32":
        checks["sm"] = r"\b(wgmma\.mma_async|mma\.sync)\b"
    return Case(mm._mm_kernel, types, constexprs, cfg.num_warps, cfg.num_stages, checks, values)


# By default the decode (first row) and prefill (last row) tiles GPT-OSS runs: bf16
# and MXFP4 weights for both (MXFP4 also its M <= 16 MMA row, and the byte path), FP8
# for decode and prefill. The slow sweep compiles every row of every table.
_MM_DEFAULT = {
    "16bit": ("decode", "prefill"),
    "fp8": ("decode", "prefill"),
    "fp8_block128": ("decode", "prefill"),
    "mxfp4": ("decode", "row1", "prefill"),
    "mxfp4_bytes": ("row1",),
}


def _mm_cases(family: str, every_row: bool) -> dict[str, Case]:
    cases = {}
    for kind in _MM_OPERANDS:
        rows = len(MM_CONFIGS[family][kind.removesuffix("_bytes")])
        if every_row:
            cases.update({f"mm-{kind}-row{row}": _mm_case(kind, family, row) for row in range(rows)})
        for phase in _MM_DEFAULT.get(kind, ()) if not every_row else ():
            row = {"decode": 0, "row1": 1, "prefill": rows - 1}[phase]
            cases[f"mm-{kind}-{phase}"] = _mm_case(kind, family, row)
    # The GEMV, from the family's GEMV row if its table has one, else a default tile.
    gemv_rows = [cfg for _, cfg in MM_CONFIGS[family]["mxfp4"] if cfg.gemv]
    gemv_cfg = gemv_rows[0] if gemv_rows else MMConfig(1, 32, 256, num_warps=4, num_stages=1, gemv=True, split_k=4)
    cases["mm-mxfp4-gemv"] = _gemv_case(gemv_cfg)
    dense_rows = [cfg for _, cfg in MM_CONFIGS[family]["16bit"] if cfg.gemv]
    dense_cfg = dense_rows[0] if dense_rows else MMConfig(1, 8, 512, num_warps=4, num_stages=1, gemv=True)
    cases["mm-dense-gemv"] = _dense_gemv_case(dense_cfg)
    cases["mm-split_k_reduce"] = Case(
        mm._split_k_reduce_kernel,
        {
            "ws_ptr": "*fp32",
            "bias_ptr": "*bf16",
            "c_ptr": "*bf16",
            **ints("MN", "N", "splits", "stride_cm", "stride_cn"),
        },
        {"HAS_BIAS": True, "BLOCK_N": 1024},
        values={"MN": QKV_N, "N": QKV_N, "splits": 4, "stride_cm": QKV_N, "stride_cn": 1},
    )
    return cases


def cases(family: str) -> dict[str, Case]:
    return _mm_cases(family, every_row=False)


def every_row_cases(family: str) -> dict[str, Case]:
    return _mm_cases(family, every_row=True)


compiled, test_every_kernel_has_a_cross_compile_case, test_kernel_compiles = cross_compile_tests(
    mm.TRITON_KERNELS, cases, __file__
)


@pytest.mark.slow
def test_every_mm_config_row_compiles() -> None:
    for target, results in run_children(__file__, "--slow").items():
        bad = {name: problems for name, problems in results.items() if problems}
        assert not bad, f"{target}: {bad}"


if __name__ == "__main__":
    child_main(cases, every_row_cases)

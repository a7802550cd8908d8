"""Every dense Triton kernel compiles for sm90, gfx942 and gfx950 with no GPU, at GPT-OSS shapes.

The GEMM must land on the matrix units (``mma``/``wgmma`` in the PTX, ``v_mfma`` in
the AMDGCN); no kernel may spill: no local memory in the PTX, no VGPR spilled to
scratch on AMD (SGPR spills go to VGPR lanes, not memory, and are tolerated). Each
case uses the tile its config table gives for that arch family, so what compiles
here is what runs there.

Compilation runs in child processes, one per target, started once for the file:
under ``TRITON_INTERPRET=1`` (set by conftest for the numerics tests) ``@triton.jit``
yields interpreter objects that cannot be compiled. ``python
test_cross_compile_dense.py sm90 [--slow]`` prints one target's raw results.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

pytest.importorskip("triton")

from tokenspeed_kernel_triton import activation, quantization, rope, sampling
from tokenspeed_kernel_triton import mm as gemm
from tokenspeed_kernel_triton import rmsnorm as norm
from tokenspeed_kernel_triton._common import CROSS_COMPILE_TARGETS
from tokenspeed_kernel_triton.mm import MM_CONFIGS, MMConfig
from tokenspeed_kernel_triton.rmsnorm import RMSNORM_CONFIGS
from tokenspeed_kernel_triton.sampling import SAMPLE_CONFIGS

ROW_CONFIGS = {
    "swiglu": activation.SWIGLU_CONFIGS,
    "apply_rotary": rope.ROTARY_CONFIGS,
    "quantize_fp8": quantization.QUANTIZE_FP8_CONFIGS,
    "quantize_fp8_block128": quantization.QUANTIZE_FP8_BLOCK128_CONFIGS,
    "quantize_mxfp4": quantization.QUANTIZE_MXFP4_CONFIGS,
    "dequantize_mxfp4": quantization.DEQUANTIZE_MXFP4_CONFIGS,
    "argmax": sampling.ARGMAX_CONFIGS,
}

TARGETS = {"sm90": "nvidia", "gfx942": "amd", "gfx950": "amd"}
HIDDEN = 2880  # GPT-OSS hidden size (and MoE intermediate size)
QKV_N = 64 * 64 + 2 * 8 * 64  # GPT-OSS QKV projection width
VOCAB = 201088
MODULES = (gemm, norm, activation, rope, quantization, sampling)


@dataclass
class Case:
    kernel: Any
    types: dict[str, str]  # runtime argument -> Triton type
    constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 2
    checks: dict[str, str] = field(default_factory=dict)  # target prefix -> regex the asm must contain
    values: dict[str, int] = field(default_factory=dict)  # integer arguments' values at GPT-OSS shapes


def _specialize(case: Case) -> tuple[dict[str, str], dict[str, Any], dict[tuple[int, ...], list]]:
    """(signature, constexprs, attrs) as Triton's launcher would specialize the call: an
    integer equal to 1 becomes a constexpr, pointers (torch allocations are 16-byte aligned)
    and integers divisible by 16 carry ``tt.divisibility = 16``. Without this, unit strides
    and alignment are unknown, loads stay scalar, and the sm90 pipeliner (which needs
    vector copies) never runs: the compiled code would not be the code that runs."""
    params = list(inspect.signature(case.kernel.fn).parameters)
    missing = set(params) - set(case.types) - set(case.constexprs)
    assert not missing, f"{case.kernel.fn.__name__}: no type for {sorted(missing)}"
    constexprs = dict(case.constexprs)
    constexprs.update({p: 1 for p, v in case.values.items() if v == 1 and p not in constexprs})
    signature = {p: "constexpr" if p in constexprs else case.types[p] for p in params}
    attrs = {}
    for i, p in enumerate(params):
        aligned = signature[p].startswith("*") or (p in case.values and case.values[p] % 16 == 0)
        if signature[p] != "constexpr" and aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


#: Shared memory (LDS) a workgroup may use: H200 227 KB opt-in; MI300X 64 KB; MI355X 160 KB.
SHARED_LIMIT = {"sm90": 232448, "gfx942": 65536, "gfx950": 163840}


def _compile(case: Case, target: str) -> tuple[str, int]:
    import triton
    from triton.backends.compiler import GPUTarget

    # cross_compile (tokenspeed_kernel_triton._common) with the launcher's specialization
    backend, arch, warp = CROSS_COMPILE_TARGETS[target]
    signature, constexprs, attrs = _specialize(case)
    src = triton.compiler.ASTSource(fn=case.kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    opts = {"num_warps": case.num_warps, "num_stages": case.num_stages}
    kernel = triton.compile(src, target=GPUTarget(backend, arch, warp), options=opts)
    asm = kernel.asm["ptx"] if target.startswith("sm") else kernel.asm["amdgcn"]
    return asm, int(kernel.metadata.shared)


def _ints(*names: str) -> dict[str, str]:
    return dict.fromkeys(names, "i32")


# -- GEMM ------------------------------------------------------------------------

_MM_OPERANDS = {  # kind -> (a type, b type, A_SCALE, B_SCALE)
    "16bit": ("*bf16", "*bf16", gemm.SCALE_NONE, gemm.SCALE_NONE),
    "fp32": ("*fp32", "*fp32", gemm.SCALE_NONE, gemm.SCALE_NONE),
    "fp8": ("*fp8e4nv", "*fp8e4nv", gemm.SCALE_ROW, gemm.SCALE_ROW),
    "fp8_block128": ("*fp8e4nv", "*fp8e4nv", gemm.SCALE_BLOCK128, gemm.SCALE_BLOCK128),
    # aligned checkpoints' codes are read as int32 words; "mxfp4_bytes" is the unaligned path
    "mxfp4": ("*bf16", "*i32", gemm.SCALE_NONE, gemm.SCALE_MXFP4_WORDS),
    "mxfp4_bytes": ("*bf16", "*u8", gemm.SCALE_NONE, gemm.SCALE_MXFP4),
}


def _gemv_case(cfg: Any) -> Case:
    types = {
        "a_ptr": "*bf16",
        "w_ptr": "*i32",
        "s_ptr": "*u8",
        "c_ptr": "*fp32",  # split-K partials
        "bias_ptr": "*bf16",
        **_ints("M", "N", "K", "k_per_split", "stride_am", "stride_ak", "stride_wn", "stride_sn", "stride_sk"),
        **_ints("stride_cm", "stride_cn"),
    }
    constexprs = {
        "HAS_BIAS": False,
        "EVEN_K": HIDDEN % cfg.block_k == 0,
        "SPLIT": cfg.split_k > 1,
        "BLOCK_M": 1,  # decode: one token
        "BLOCK_N": cfg.block_n,
        "BLOCK_K": cfg.block_k,
    }
    splits, k_per_split = gemm.split_k_plan(cfg, -(-QKV_N // cfg.block_n), HIDDEN)
    values = {
        "M": 1, "N": QKV_N, "K": HIDDEN, "k_per_split": k_per_split, "stride_am": HIDDEN, "stride_ak": 1,
        "stride_wn": HIDDEN // 8, "stride_sn": HIDDEN // 32, "stride_sk": 1, "stride_cm": QKV_N, "stride_cn": 1,
    }  # fmt: skip
    constexprs["SPLIT"] = splits > 1
    return Case(gemm._mxfp4_gemv_kernel, types, constexprs, cfg.num_warps, cfg.num_stages, values=values)


def _mm_case(kind: str, family: str, row: int) -> Case:
    a_type, b_type, a_mode, b_mode = _MM_OPERANDS[kind]
    cfg = MM_CONFIGS[family][kind.removesuffix("_bytes")][row][1]
    if cfg.gemv:
        if kind == "mxfp4_bytes":  # unaligned codes run the MMA tile of the same width
            cfg = dataclasses.replace(cfg, block_m=16, gemv=False)
        else:
            return _gemv_case(cfg)
    max_m = MM_CONFIGS[family][kind.removesuffix("_bytes")][row][0]
    m = 1 if row == 0 else (max_m or 4096)  # decode: one token; else the row's largest M
    tiles = -(-m // cfg.block_m) * -(-QKV_N // cfg.block_n)
    splits, k_per_split = gemm.split_k_plan(cfg, tiles, HIDDEN)
    split = splits > 1
    # operand strides of contiguous GPT-OSS QKV operands (M x 2880 @ 5120 x 2880)
    b_row = {gemm.SCALE_MXFP4: HIDDEN // 2, gemm.SCALE_MXFP4_WORDS: HIDDEN // 8}.get(b_mode, HIDDEN)
    a_scale_rows = -(-HIDDEN // 128) if a_mode == gemm.SCALE_BLOCK128 else 1
    b_scale_rows = {gemm.SCALE_BLOCK128: -(-HIDDEN // 128), gemm.SCALE_MXFP4: HIDDEN // 32}.get(b_mode, 1)
    b_scale_rows = HIDDEN // 32 if b_mode == gemm.SCALE_MXFP4_WORDS else b_scale_rows
    values = {
        "M": m, "N": QKV_N, "K": HIDDEN, "k_per_split": k_per_split, "stride_am": HIDDEN, "stride_ak": 1,
        "stride_bn": b_row, "stride_bk": 1, "stride_cm": QKV_N, "stride_cn": 1,
        "stride_asm": a_scale_rows, "stride_ask": 1, "stride_bsn": b_scale_rows, "stride_bsk": 1,
    }  # fmt: skip
    types = {
        "a_ptr": a_type,
        "b_ptr": b_type,
        "c_ptr": "*fp32" if split else "*bf16",
        "bias_ptr": "*bf16",
        "a_scale_ptr": "*fp32",
        "b_scale_ptr": "*u8" if b_mode >= gemm.SCALE_MXFP4 else "*fp32",
        **_ints("M", "N", "K", "k_per_split", "stride_am", "stride_ak", "stride_bn", "stride_bk"),
        **_ints("stride_cm", "stride_cn", "stride_asm", "stride_ask", "stride_bsn", "stride_bsk"),
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
    if a_mode == gemm.SCALE_NONE:
        constexprs["a_scale_ptr"] = None
    if b_mode == gemm.SCALE_NONE:
        constexprs["b_scale_ptr"] = None
    # fp32 with IEEE precision is FMA work on NVIDIA (no fp32 tensor-core path); every
    # other kind must use the MMA units.
    checks = {"gfx": r"v_mfma_"}
    if kind != "fp32":
        checks["sm"] = r"\b(wgmma\.mma_async|mma\.sync)\b"
    return Case(gemm._mm_kernel, types, constexprs, cfg.num_warps, cfg.num_stages, checks, values)


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
    cases["mm-split_k_reduce"] = Case(
        gemm._split_k_reduce_kernel,
        {
            "ws_ptr": "*fp32",
            "bias_ptr": "*bf16",
            "c_ptr": "*bf16",
            **_ints("MN", "N", "splits", "stride_cm", "stride_cn"),
        },
        {"HAS_BIAS": True, "BLOCK_N": 1024},
        values={"MN": QKV_N, "N": QKV_N, "splits": 4, "stride_cm": QKV_N, "stride_cn": 1},
    )
    return cases


# -- Row-wise kernels at GPT-OSS shapes ---------------------------------------------


# Integer arguments of the row-wise kernels at GPT-OSS shapes (4096 tokens, hidden 2880,
# 64 q / 8 kv heads of 64 inside one packed QKV row, vocabulary 201088).
_ROW_VALUES: dict[str, dict[str, int]] = {
    "rmsnorm-residual": {"n_rows": 4096, "H": HIDDEN, "stride_x": HIDDEN, "stride_r": HIDDEN, "stride_y": HIDDEN,
                         "stride_s": HIDDEN},
    "rmsnorm-one-tile": {"n_rows": 16384, "H": HIDDEN, "stride_x": HIDDEN, "stride_r": HIDDEN, "stride_y": HIDDEN,
                         "stride_s": HIDDEN},
    "rmsnorm-two-pass": {"n_rows": 4096, "H": HIDDEN, "stride_x": HIDDEN, "stride_r": HIDDEN, "stride_y": HIDDEN,
                         "stride_s": HIDDEN},
    "swiglu-interleaved-clamp": {"I": HIDDEN, "stride_x": 2 * HIDDEN, "stride_y": HIDDEN},
    "swiglu-halves": {"I": HIDDEN, "stride_x": 2 * HIDDEN, "stride_y": HIDDEN},
    "apply_rotary-neox": {"Hq": 64, "Hk": 8, "D": 64, "R": 64, "stride_qt": QKV_N, "stride_qh": 64,
                          "stride_kt": QKV_N, "stride_kh": 64, "stride_qot": 4096, "stride_qoh": 64, "stride_kot": 512,
                          "stride_koh": 64, "stride_cache": 64},
    "quantize_fp8-amax_partial": {"M": 4096, "K": HIDDEN, "stride_xm": HIDDEN, "rows_per_program": 8},
    **{f"quantize_fp8-{mode}": {"n_partials": 512, "M": 4096, "K": HIDDEN, "stride_xm": HIDDEN, "stride_qm": HIDDEN}
       for mode in ("per_token", "static", "per_tensor")},
    "quantize_fp8-block128": {"K": HIDDEN, "n_blocks": 23, "stride_xm": HIDDEN, "stride_qm": HIDDEN, "stride_sm": 23},
    "quantize_mxfp4": {"n_groups": HIDDEN // 32, "stride_xm": HIDDEN, "stride_bm": HIDDEN // 2,
                       "stride_sm": HIDDEN // 32},
    "dequantize_mxfp4": {"n_rows": 5760, "K": HIDDEN, "stride_bm": HIDDEN // 2, "stride_sm": HIDDEN // 32,
                         "stride_om": HIDDEN},
    "argmax-chunk": {"V": VOCAB, "stride_x": VOCAB, "n_chunks": 50},
    "argmax-reduce": {"n_chunks": 50},
}  # fmt: skip


def rmsnorm_config_rows(family: str, n_rows: int) -> Any:
    return next(cfg for max_rows, cfg in RMSNORM_CONFIGS[family] if max_rows is None or n_rows <= max_rows)


def _sample_cases(smp: Any) -> dict[str, Case]:
    """The sampler's kernels for bf16 logits (2 key levels) at a GPT-OSS vocabulary row."""
    block, steps, levels = smp.block, smp.steps, 2
    logits = {"logits_ptr": "*bf16"}
    rows = dict.fromkeys(("top_k_ptr",), "*i32") | dict.fromkeys(
        ("top_p_ptr", "temperature_ptr", "uniform_ptr"), "*fp32"
    )
    scratch = {"si_ptr": "*i32", "sf_ptr": "*fp64", "cand_i_ptr": "*i32", "cand_e_ptr": "*fp32", "pmax_ptr": "*fp32"}
    types = logits | rows | scratch | {"out_ptr": "*i64"} | _ints("V", "stride_row", "n_chunks")
    pass_cx = {"LEVELS": levels, "BLOCK": block, "STEPS": steps}
    cases = {
        f"sample-topk-level{level}": Case(sampling._topk_pass_kernel, types, {"LEVEL": level, **pass_cx}, smp.num_warps)
        for level in range(levels)
    }
    n_chunks = -(-VOCAB // (block * steps))
    cases["sample-candidates"] = Case(
        sampling._candidates_kernel,
        types,
        {"CAP": smp.cap, "BLOCK_C": 1 << (n_chunks - 1).bit_length(), **pass_cx},
        smp.num_warps,
    )
    for p in (1, 3):  # histogram pass, compaction pass
        cases[f"sample-topp-pass{p}"] = Case(
            sampling._topp_pass_kernel, types, {"PASS": p, "CAP": smp.cap, **pass_cx}, smp.num_warps
        )
    cases["sample-topp-threshold"] = Case(
        sampling._topp_threshold_kernel,
        types,
        {"LEVELS": levels, "CAP": smp.cap, "BLOCK": block, "PROBES": smp.probes},
        smp.num_warps,
    )
    cases["sample-final-mass"] = Case(sampling._final_mass_kernel, types, pass_cx, smp.num_warps)
    cases["sample-final-pick"] = Case(sampling._final_pick_kernel, types, pass_cx, smp.num_warps)
    for case in cases.values():
        case.values = {"V": VOCAB, "stride_row": VOCAB, "n_chunks": n_chunks}
    return cases


def _row_cases(family: str) -> dict[str, Case]:
    rms = rmsnorm_config_rows(family, 4096)
    rms_big = rmsnorm_config_rows(family, 16384)
    act = ROW_CONFIGS["swiglu"][family]
    rot = ROW_CONFIGS["apply_rotary"][family]
    q8 = ROW_CONFIGS["quantize_fp8"][family]
    q8b = ROW_CONFIGS["quantize_fp8_block128"][family]
    mxq = ROW_CONFIGS["quantize_mxfp4"][family]
    mxd = ROW_CONFIGS["dequantize_mxfp4"][family]
    am = ROW_CONFIGS["argmax"][family]
    smp = SAMPLE_CONFIGS[family]
    rms_types = {
        **dict.fromkeys(("x_ptr", "res_ptr", "w_ptr", "y_ptr", "s_ptr"), "*bf16"),
        **_ints("n_rows", "H", "stride_x", "stride_r", "stride_y", "stride_s"),
        "eps": "fp32",
    }
    fp8_rows_types = {
        "x_ptr": "*bf16",
        "q_ptr": "*fp8e4nv",
        "scale_ptr": "*fp32",
        "partial_ptr": "*fp32",
        **_ints("n_partials", "M", "K", "stride_xm", "stride_qm"),
    }
    fp8_rows = {"BLOCK_M": q8.rows, "BLOCK_K": min(q8.block, 4096), "BLOCK_P": 512}
    cases = {
        "rmsnorm-residual": Case(
            norm._rmsnorm_kernel,
            rms_types,
            # 2880 = a 2048 tile + a 1024 tail tile (832 used)
            {"HAS_RESIDUAL": True, "ONE_PASS": True, "BLOCK": 2048, "BLOCK_TAIL": 1024, "ROWS": rms.rows},
            rms.num_warps,
        ),
        "rmsnorm-one-tile": Case(
            norm._rmsnorm_kernel,
            rms_types,
            {"HAS_RESIDUAL": False, "ONE_PASS": True, "BLOCK": 4096, "BLOCK_TAIL": 0, "ROWS": rms_big.rows},
            rms_big.num_warps,
        ),
        "rmsnorm-two-pass": Case(
            norm._rmsnorm_kernel,
            rms_types,
            {"HAS_RESIDUAL": False, "ONE_PASS": False, "BLOCK": 1024, "BLOCK_TAIL": 0, "ROWS": rms.rows},
            rms.num_warps,
        ),
        "swiglu-interleaved-clamp": Case(
            activation._swiglu_kernel,
            {
                "x_ptr": "*bf16",
                "y_ptr": "*bf16",
                **_ints("I", "stride_x", "stride_y"),
                **dict.fromkeys(("alpha", "limit", "up_offset"), "fp32"),
            },
            {"INTERLEAVED": True, "CLAMP": True, "BLOCK": act.block},
            act.num_warps,
        ),
        "swiglu-halves": Case(
            activation._swiglu_kernel,
            {
                "x_ptr": "*bf16",
                "y_ptr": "*bf16",
                **_ints("I", "stride_x", "stride_y"),
                **dict.fromkeys(("alpha", "limit", "up_offset"), "fp32"),
            },
            {"INTERLEAVED": False, "CLAMP": False, "BLOCK": act.block},
            act.num_warps,
        ),
        "apply_rotary-neox": Case(
            rope._rotary_kernel,
            {
                **dict.fromkeys(("q_ptr", "k_ptr", "q_out_ptr", "k_out_ptr"), "*bf16"),
                "cache_ptr": "*fp32",
                "pos_ptr": "*i64",
                **_ints("Hq", "Hk", "D", "R", "stride_qt", "stride_qh", "stride_kt", "stride_kh"),
                **_ints("stride_qot", "stride_qoh", "stride_kot", "stride_koh", "stride_cache"),
            },
            {"GPTJ": False, "BLOCK_H": rot.rows, "BLOCK_D": 64},  # GPT-OSS: 64 q heads, head_dim 64
            rot.num_warps,
        ),
        "quantize_fp8-amax_partial": Case(
            quantization._amax_partial_kernel,
            {"x_ptr": "*bf16", "partial_ptr": "*fp32", **_ints("M", "K", "stride_xm", "rows_per_program")},
            {"BLOCK_M": q8.rows, "BLOCK_K": 4096},
            q8.num_warps,
        ),
        "quantize_fp8-per_token": Case(quantization._fp8_rows_kernel, fp8_rows_types, {"MODE": 0, **fp8_rows}),
        "quantize_fp8-static": Case(quantization._fp8_rows_kernel, fp8_rows_types, {"MODE": 1, **fp8_rows}),
        "quantize_fp8-per_tensor": Case(quantization._fp8_rows_kernel, fp8_rows_types, {"MODE": 2, **fp8_rows}),
        "quantize_fp8-block128": Case(
            quantization._fp8_block128_kernel,
            {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "scale_ptr": "*fp32"}
            | _ints("K", "n_blocks", "stride_xm", "stride_qm", "stride_sm"),
            {"BLOCKS": q8b.rows},
            q8b.num_warps,
        ),
        "quantize_mxfp4": Case(
            quantization._mxfp4_quantize_kernel,
            {"x_ptr": "*bf16", "blocks_ptr": "*u8", "scales_ptr": "*u8"}
            | _ints("n_groups", "stride_xm", "stride_bm", "stride_sm"),
            {"GROUPS": mxq.rows},
            mxq.num_warps,
        ),
        "dequantize_mxfp4": Case(
            quantization._mxfp4_dequantize_kernel,
            {"blocks_ptr": "*u8", "scales_ptr": "*u8", "out_ptr": "*bf16"}
            | _ints("n_rows", "K", "stride_bm", "stride_sm", "stride_om"),
            {"BLOCK_R": mxd.rows, "BLOCK_K": mxd.block},
            mxd.num_warps,
        ),
        "argmax-chunk": Case(
            sampling._argmax_chunk_kernel,
            {"x_ptr": "*bf16", "val_ptr": "*fp32", "idx_ptr": "*i32", **_ints("V", "stride_x", "n_chunks")},
            {"BLOCK": am.block, "STEPS": am.rows},
            am.num_warps,
        ),
        "argmax-reduce": Case(
            sampling._argmax_reduce_kernel,
            {"val_ptr": "*fp32", "idx_ptr": "*i32", "out_ptr": "*i64", "n_chunks": "i32"},
            # the number of chunks of one GPT-OSS vocabulary row, rounded up to a power of two
            {"BLOCK_C": 1 << (-(-VOCAB // (am.block * am.rows)) - 1).bit_length()},
        ),
        **_sample_cases(smp),
    }
    for name, values in _ROW_VALUES.items():
        if name in cases:
            cases[name].values = values
    return cases


def _cases(family: str, every_row: bool = False) -> dict[str, Case]:
    return {**_mm_cases(family, every_row), **_row_cases(family)}


def _asm_problems(case: Case, target: str, asm: str, shared: int) -> list[str]:
    problems = []
    if shared > SHARED_LIMIT[target]:
        problems.append(f"{shared} bytes of shared memory (limit {SHARED_LIMIT[target]})")
    for prefix, pattern in case.checks.items():
        if target.startswith(prefix) and not re.search(pattern, asm):
            problems.append(f"expected /{pattern}/ in the assembly")
    if target.startswith("gfx"):
        spills = re.search(r"\.vgpr_spill_count:\s*(\d+)", asm)
        if spills is None:
            problems.append("no .vgpr_spill_count in the AMDGCN metadata")
        elif int(spills.group(1)):
            problems.append(f"{spills.group(1)} VGPRs spilled")
    elif ".local" in asm:
        problems.append("local-memory spills in the PTX")
    return problems


def compile_all(target: str, every_row: bool) -> dict[str, list[str]]:
    """Child-process entry: compile every case for ``target``; name -> problems (empty = fine)."""
    results = {}
    for name, case in _cases(TARGETS[target], every_row).items():
        try:
            results[name] = _asm_problems(case, target, *_compile(case, target))
        except Exception as exc:  # reported per case by the parent
            results[name] = [f"compile failed: {type(exc).__name__}: {str(exc)[:2000]}"]
    return results


def _run_children(every_row: bool) -> dict[str, dict[str, list[str]]]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = ["--slow"] if every_row else []
    children = {
        t: subprocess.Popen(
            [sys.executable, __file__, t, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for t in TARGETS
    }
    results = {}
    for target, child in children.items():
        out, err = child.communicate(timeout=900)
        assert child.returncode == 0, f"{target} compile child failed:\n{err[-4000:]}"
        results[target] = json.loads(out.strip().splitlines()[-1])
    return results


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict[str, list[str]]]:
    return _run_children(every_row=False)


def test_every_dense_kernel_has_a_cross_compile_case() -> None:
    declared = {k for module in MODULES for k in module.TRITON_KERNELS.values()}
    covered = {case.kernel for case in _cases("nvidia").values()}
    assert set(_cases("nvidia")) == set(_cases("amd"))
    assert declared == covered, f"kernels without a cross-compile case: {declared - covered}"


_NAMES = list(_cases("nvidia"))


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("name", _NAMES)
def test_kernel_compiles(compiled: dict, target: str, name: str) -> None:
    assert compiled[target][name] == [], f"{name} on {target}: {compiled[target][name]}"


@pytest.mark.slow
def test_every_mm_config_row_compiles() -> None:
    for target, results in _run_children(every_row=True).items():
        bad = {name: problems for name, problems in results.items() if problems}
        assert not bad, f"{target}: {bad}"


if __name__ == "__main__":
    print(json.dumps(compile_all(sys.argv[1], every_row="--slow" in sys.argv[2:])))

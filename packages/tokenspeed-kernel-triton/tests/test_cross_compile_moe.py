"""Every Triton MoE kernel compiles for sm90, gfx942 and gfx950 (no GPU needed).

GPT-OSS constexprs: E=128 experts (E_PAD 128), top-4, H = I = 2880 (runtime sizes:
the tiles come from the NVIDIA / AMD tables in ``moe.configs``), MXFP4 weights with
biases, interleaved gate/up and the clamped SwiGLU. The GEMM kernels must lower
``tl.dot`` to tensor-core / matrix-core instructions: wgmma or mma.sync in the PTX,
v_mfma in the AMDGCN; AMD builds must not spill VGPRs.

Compilation runs in a child process: under ``TRITON_INTERPRET=1`` (set by conftest
for the numerics tests) ``@triton.jit`` yields interpreter objects that cannot be
compiled. Run this file as a script (``--slow`` adds the FP8 / bf16 / dot_scaled
variants) to see the raw results.
"""

from __future__ import annotations

import json
import sys

import pytest
from _compile_cases import compile_summary, script_result, signature_by_name, start_script

TARGETS = ("sm90", "gfx942", "gfx950")
_E_PAD, _TOPK, _K = 128, 4, 2880

_INT32_POINTERS = {
    "map_ptr", "perm_ptr", "ids_ptr", "offsets_ptr", "counts_ptr", "base_ptr", "inv_ptr", "row_of_ptr", "counter_ptr",
}  # fmt: skip
_FP32_POINTERS = {"topk_w_ptr", "part_ptr"}
_FLOAT_ARGS = {"alpha", "limit", "up_offset", "eps"}


def _gemm_variant(kernel: str, gemm: str, path: str, weight: str, size: int, **overrides: object) -> tuple:
    """(module, kernel, constexpr builder) for one GEMM variant: the table's config for ``size`` on the
    target's family, with ``overrides``."""

    def build(family: str) -> tuple[dict, dict]:
        import dataclasses

        from tokenspeed_kernel_triton.moe import configs
        from tokenspeed_kernel_triton.moe import gemm as g

        kind = "mxfp4" if weight == "mxfp4" else "dense"
        cfg = configs.gemm_config(family, path, kind, gemm, size)
        cfg = dataclasses.replace(cfg, **overrides)
        w_kind = {"mxfp4": g.W_MXFP4, "fp8": g.W_FP8, "bf16": g.W_DENSE}[weight]
        constexprs = {
            "ROWS": g.ROWS_TINY if path == "tiny" else g.ROWS_GATHER,
            "W_KIND": w_kind,
            "SCALE": g.SCALE_PER_CHANNEL if weight == "fp8" else g.SCALE_NONE,
            "HAS_BIAS": True,
            "DECODE": cfg.decode,
            "SWAP_AB": cfg.swap_ab,
            "MMA_FP32": False,
            "EVEN_K": _K % cfg.block_k == 0,
            "USE_DOT": cfg.use_dot,
            "STAGES": cfg.num_stages,
            "BLOCK_M": (16 if cfg.use_dot else 1) if path == "tiny" else cfg.block_m,
            "BLOCK_N": cfg.block_n,
            "BLOCK_K": cfg.block_k,
            "GROUP_M": cfg.group_m,
            "E_PAD": _E_PAD,
            "PAIRS_PAD": 4 if path == "tiny" else 1,
        }
        if gemm == "gate_up":
            constexprs.update(TOPK=_TOPK, INTERLEAVED=True, HAS_LIMIT=True)
        else:
            constexprs.update(ROUTE_WEIGHT=True)
        pointers = {
            "w_ptr": {"mxfp4": "*u8", "fp8": "*fp8e4nv", "bf16": "*bf16"}[weight],
            "scale_ptr": {"mxfp4": "*u8", "fp8": "*fp32", "bf16": "*bf16"}[weight],
        }
        return constexprs, {"options": {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}, "pointers": pointers}

    return ("gemm", kernel, build)


def _fixed(module: str, kernel: str, constexprs: dict, pointers: dict | None = None, num_warps: int = 4) -> tuple:
    def build(family: str) -> tuple[dict, dict]:
        options = {"num_warps": num_warps, "num_stages": 1}
        return dict(constexprs), {"options": options, "pointers": dict(pointers or {})}

    return (module, kernel, build)


#: moe_gate's constexprs at GPT-OSS-20B's router (32 experts, top-4, a bias).
_GATE = {
    "HAS_BIAS": True, "TOPK": 4, "RENORMALIZE": True, "DOT_FP32": False, "E_PAD": 32, "TOPK_PAD": 4,
    "HAS_NORM": False, "HAS_RESIDUAL": False, "NORM_BLOCK": 16, "E_BLOCK": 0,
}  # fmt: skip
#: with the post-attention norm of the stream x + residual first (GPT-OSS's decode and prefill layers).
_NORM = {"HAS_NORM": True, "HAS_RESIDUAL": True}

#: name -> (module, kernel, build(family) -> (constexprs, extras)). A variant whose USE_DOT constexpr is
#: set must lower tl.dot to matrix instructions (the GEMV, USE_DOT=False, runs on the vector units by
#: design; the NVIDIA tiny-path table picks it, measured on the H200). GPT-OSS decode
#: (1 token, tiny path) and prefill (16384 tokens x top-4, grouped path's largest tiles).
KERNELS: dict[str, tuple] = {
    "route": _fixed(
        "route",
        "_route_kernel",
        {"TOPK": 4, "RENORMALIZE": True, "BLOCK_T": 16, "E_PAD": 128, "TOPK_PAD": 4},
        {"w_ptr": "*fp32"},
    ),
    # moe_gate at GPT-OSS-20B's router (32 experts): one decode token on the CUDA cores, 16-token tiles by tl.dot.
    "gate_decode": _fixed(
        "route", "_gate_kernel", {**_GATE, "DOT": False, "BLOCK_T": 1, "BLOCK_K": 256}, {"w_ptr": "*fp32"}, num_warps=8
    ),
    "gate_dot": _fixed(
        "route", "_gate_kernel", {**_GATE, "DOT": True, "BLOCK_T": 16, "BLOCK_K": 64}, {"w_ptr": "*fp32"}, num_warps=8
    ),
    # The decode tiles of the tables: four experts a program (8 programs at 32 experts), the last to arrive routes.
    "gate_decode_split": _fixed(
        "route",
        "_gate_kernel",
        {**_GATE, "DOT": False, "BLOCK_T": 1, "BLOCK_K": 1024, "E_BLOCK": 4},
        {"w_ptr": "*fp32"},
        num_warps=8,
    ),
    "gate_decode_split_norm": _fixed(
        "route",
        "_gate_kernel",
        {**_GATE, **_NORM, "DOT": False, "BLOCK_T": 1, "BLOCK_K": 1024, "NORM_BLOCK": 4096, "E_BLOCK": 4},
        {"w_ptr": "*fp32"},
        num_warps=8,
    ),
    # NVIDIA's rows up to 8 tokens: a program a token, a 2048 K step.
    "gate_decode_split_k2048_norm": _fixed(
        "route",
        "_gate_kernel",
        {**_GATE, **_NORM, "DOT": False, "BLOCK_T": 1, "BLOCK_K": 2048, "NORM_BLOCK": 4096, "E_BLOCK": 4},
        {"w_ptr": "*fp32"},
        num_warps=8,
    ),
    "gate_decode2_split_norm": _fixed(
        "route",
        "_gate_kernel",
        {**_GATE, **_NORM, "DOT": False, "BLOCK_T": 2, "BLOCK_K": 512, "NORM_BLOCK": 4096, "E_BLOCK": 4},
        {"w_ptr": "*fp32"},
        num_warps=8,
    ),
    "gate_decode_norm": _fixed(
        "route",
        "_gate_kernel",
        {**_GATE, **_NORM, "DOT": False, "BLOCK_T": 1, "BLOCK_K": 256, "NORM_BLOCK": 4096},
        {"w_ptr": "*fp32"},
        num_warps=8,
    ),
    "gate_decode2_norm": _fixed(  # 2-15 tokens: two rows of 4096 in the first pass's tile
        "route",
        "_gate_kernel",
        {**_GATE, **_NORM, "DOT": False, "BLOCK_T": 2, "BLOCK_K": 128, "NORM_BLOCK": 4096},
        {"w_ptr": "*fp32"},
        num_warps=8,
    ),
    "gate_dot_norm": _fixed(
        "route",
        "_gate_kernel",
        {**_GATE, **_NORM, "DOT": True, "BLOCK_T": 16, "BLOCK_K": 64, "NORM_BLOCK": 64},
        {"w_ptr": "*fp32"},
        num_warps=8,
    ),
    "sort_single": _fixed("dispatch", "_sort_single_kernel", {"BLOCK": 128, "E_PAD": 128}),
    "sort_count": _fixed("dispatch", "_count_kernel", {"BLOCK": 128, "E_PAD": 128}),
    "sort_scan": _fixed("dispatch", "_scan_kernel", {"CHUNK": 32, "E_PAD": 128}),
    "sort_place": _fixed("dispatch", "_place_kernel", {"BLOCK": 128, "E_PAD": 128}),
    "gather_rows": _fixed("dispatch", "_gather_rows_kernel", {"TOPK": 4, "BLOCK_R": 16, "BLOCK_H": 512}),
    "invert": _fixed("combine", "_invert_kernel", {"BLOCK": 1024}),
    "combine": _fixed(
        "combine", "_combine_kernel", {"TOPK": 4, "GATHER": True, "WEIGHTED": True, "BLOCK_H": 1024}, {"w_ptr": "*fp32"}
    ),
    "gate_up_mxfp4_tiny": _gemm_variant("moe_gate_up_kernel", "gate_up", "tiny", "mxfp4", 1),
    "gate_up_mxfp4_grouped": _gemm_variant("moe_gate_up_kernel", "gate_up", "grouped", "mxfp4", 65536),
    "down_mxfp4_tiny": _gemm_variant("moe_down_kernel", "down", "tiny", "mxfp4", 1),
    "down_mxfp4_grouped": _gemm_variant("moe_down_kernel", "down", "grouped", "mxfp4", 65536),
}
#: Further variants, compiled only with --slow (pytest -m slow).
SLOW_KERNELS: dict[str, tuple] = {
    "gate_up_mxfp4_grouped_small": _gemm_variant("moe_gate_up_kernel", "gate_up", "grouped", "mxfp4", 256),
    "gate_up_mxfp4_tiny_dot_scaled": _gemm_variant(
        "moe_gate_up_kernel", "gate_up", "tiny", "mxfp4", 1, decode="dot_scaled", swap_ab=True
    ),
    "down_mxfp4_grouped_dot_scaled": _gemm_variant(
        "moe_down_kernel", "down", "grouped", "mxfp4", 65536, decode="dot_scaled"
    ),
    "gate_up_mxfp4_tiny_swapped": _gemm_variant("moe_gate_up_kernel", "gate_up", "tiny", "mxfp4", 1, swap_ab=True),
    "down_mxfp4_tiny_gemv": _gemm_variant("moe_down_kernel", "down", "tiny", "mxfp4", 1, use_dot=False),
    "gate_up_mxfp4_tiny_gemv": _gemm_variant("moe_gate_up_kernel", "gate_up", "tiny", "mxfp4", 1, use_dot=False),
    "gate_up_fp8_grouped": _gemm_variant("moe_gate_up_kernel", "gate_up", "grouped", "fp8", 65536),
    "down_fp8_tiny": _gemm_variant("moe_down_kernel", "down", "tiny", "fp8", 1),
    "gate_up_bf16_tiny": _gemm_variant("moe_gate_up_kernel", "gate_up", "tiny", "bf16", 1),
    "down_bf16_grouped": _gemm_variant("moe_down_kernel", "down", "grouped", "bf16", 65536),
}


#: Variants Triton 3.6 cannot build for a target (the table never picks them there).
UNSUPPORTED: dict[tuple[str, str], str] = {
    ("gate_up_mxfp4_tiny_dot_scaled", "gfx942"): (
        "tl.dot_scaled emulation on CDNA3 (no scaled MFMA) fails LLVM translation for swapped 16-row tiles"
    ),
}


def _signature(fn, constexprs: dict, pointers: dict) -> dict[str, str]:
    """Triton types: bf16 activations, the variant's weight/scale types, int32/fp32 metadata."""
    types = dict.fromkeys(_INT32_POINTERS, "*i32") | dict.fromkeys(_FP32_POINTERS, "*fp32") | pointers
    return signature_by_name(fn, constexprs, types, lambda name: name.endswith("_ptr"), _FLOAT_ARGS)


def _compile_all(kernels: dict[str, tuple]) -> dict[str, dict[str, dict]]:
    """name -> target -> {"mma": bool, "vgpr_spills": int, "error": str | None, "dot": uses tl.dot}."""
    import importlib

    results: dict[str, dict[str, dict]] = {}
    for name, (module, attr, build) in kernels.items():
        fn = getattr(importlib.import_module(f"tokenspeed_kernel_triton.moe.{module}"), attr)
        results[name] = {}
        for target in TARGETS:
            constexprs, extras = build("nvidia" if target.startswith("sm") else "amd")
            sig = _signature(fn, constexprs, extras["pointers"])
            results[name][target] = compile_summary(fn, sig, constexprs, target, **extras["options"])
            results[name][target]["dot"] = bool(constexprs.get("USE_DOT", constexprs.get("DOT", False)))
    return results


def _run_child(*flags: str) -> dict[str, dict[str, dict]]:
    pytest.importorskip("triton")
    return script_result(start_script(__file__, *flags))


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict[str, dict]]:
    return _run_child()


@pytest.fixture(scope="module")
def compiled_slow() -> dict[str, dict[str, dict]]:
    return _run_child("--slow", "--only-slow")


def _check(table: dict, results: dict, name: str, target: str) -> None:
    result = results[name][target]
    assert result["error"] is None, f"{name} on {target}: {result['error']}"
    if result["dot"]:
        assert result["mma"], f"{name} on {target}: tl.dot did not lower to matrix instructions"
    assert result["vgpr_spills"] == 0, f"{name} on {target}: {result['vgpr_spills']} VGPRs spilled"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_moe_kernel_cross_compiles(compiled: dict, name: str, target: str) -> None:
    _check(KERNELS, compiled, name, target)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(SLOW_KERNELS))
def test_moe_kernel_variant_cross_compiles(compiled_slow: dict, name: str, target: str) -> None:
    if (name, target) in UNSUPPORTED:
        assert compiled_slow[name][target]["error"] is not None, f"{name} now builds on {target}: drop the exclusion"
        pytest.skip(UNSUPPORTED[name, target])
    _check(SLOW_KERNELS, compiled_slow, name, target)


if __name__ == "__main__":
    chosen = {} if "--only-slow" in sys.argv else dict(KERNELS)
    if "--slow" in sys.argv:
        chosen.update(SLOW_KERNELS)
    print(json.dumps(_compile_all(chosen)))

"""Every Triton attention kernel compiles for sm90, gfx942 and gfx950 (no GPU needed).

GPT-OSS constexprs (head_dim 64, 8 query heads per KV head, window + sinks, page 16),
tile sizes and launch options from ``attention.configs`` for the target's family. The
MMA kernels must lower ``tl.dot`` to tensor-core / matrix-core instructions (wgmma or
mma.sync in the PTX, v_mfma in the AMDGCN), and the AMD builds must not spill VGPRs
(SGPR spills into VGPR lanes are cheap and allowed).

A second pass compiles the MMA kernels for sm90 the way a GPT-OSS launch specialises
them (pointers and strides divisible by 16, passed to ``cross_compile`` as ``attrs``):
the K/V loop must then be software-pipelined (cp.async) and prefill must use wgmma.

The compilation runs in one child process: under ``TRITON_INTERPRET=1`` (set by
conftest for the numerics tests) ``@triton.jit`` yields interpreter objects that
cannot be compiled, and the choice is made when the kernel modules are imported.
Run this file as a script to see the raw results.
"""

from __future__ import annotations

import json

import pytest
from _compile_cases import compile_summary, script_result, signature_by_name, start_script

from tokenspeed_kernel.testing import cross_compile

_FLOAT_ARGS = {"qk_scale", "cap_scale", "cap_log2"}
_FP32_POINTERS = {"Lse", "Sinks", "Partials", "CosSin"}
_INT32_POINTERS = {"CuSeqlensQ", "CuSeqlensK", "CacheSeqlens", "PageTable", "SlotMapping", "Counters"}
TARGETS = ("sm90", "gfx942", "gfx950")

_ATTENTION = {
    "HEAD_DIM": 64, "GROUP": 8, "HEADS_PER_TILE": 8, "CAUSAL": True,
    "HAS_WINDOW": True, "HAS_SINKS": True, "HAS_CAP": False, "RETURN_LSE": True, "DOT_FP32": False,
    "DOT_PRECISION": None,
}  # fmt: skip
_DECODE = {
    "HEAD_DIM": 64, "GROUP": 8, "HEADS_PER_TILE": 8, "BLOCK_H": 16, "PAGE_SIZE": 16,
    "HAS_WINDOW": True, "HAS_SINKS": True, "HAS_CAP": False, "RETURN_LSE": True, "DOT_FP32": False,
    "DOT_PRECISION": None,
}  # fmt: skip

#: name -> (module, kernel, constexprs, config table in attention.configs or None, uses tl.dot)
KERNELS: dict[str, tuple[str, str, dict, str | None, bool]] = {
    "prefill": ("prefill", "attention_kernel", {**_ATTENTION, "PAGED": False, "PAGE_SIZE": 1}, "prefill", True),
    "extend": ("prefill", "attention_kernel", {**_ATTENTION, "PAGED": True, "PAGE_SIZE": 16}, "extend", True),
    # (split: the partials, and the merge by the last split of each head program, counted with atomics)
    "decode_split": ("decode", "decode_split_kernel", {**_DECODE, "DIRECT": False, "BLOCK_S": 16}, "decode", True),
    "decode_direct": ("decode", "decode_split_kernel", {**_DECODE, "DIRECT": True, "BLOCK_S": 1}, "decode", True),
    # mha_decode_append_kvcache: the new token's K/V (rotated, GPT-OSS's neox) from registers, stored by one program.
    "decode_append_rotary": (
        "decode",
        "decode_append_kernel",
        {**_DECODE, "DIRECT": False, "BLOCK_S": 16, "RETURN_LSE": False, "ROTARY": True, "GPTJ": False},
        "decode",
        True,
    ),
    "decode_append_direct": (
        "decode",
        "decode_append_kernel",
        {**_DECODE, "DIRECT": True, "BLOCK_S": 1, "RETURN_LSE": False, "ROTARY": False, "GPTJ": False},
        "decode",
        True,
    ),
    "kvcache_store": ("store", "kvcache_store_kernel", {"HEAD_DIM": 64, "BLOCK_H": 8, "BLOCK_D": 64}, None, False),
}


def _tile_config(table: str | None, target: str) -> tuple[dict, dict]:
    """(constexprs, launch options) of the config the kernel would run with on ``target``."""
    if table is None:
        return {}, {"num_warps": 4, "num_stages": 2}
    from tokenspeed_kernel_triton.attention import configs

    tables = {"prefill": configs.PREFILL_CONFIGS, "extend": configs.EXTEND_CONFIGS, "decode": configs.DECODE_CONFIGS}
    family = "nvidia" if target.startswith("sm") else "amd"
    cfg = configs._by_head_dim(tables[table][family], 64)
    tiles = {k: cfg[k] for k in ("BLOCK_M", "BLOCK_N") if k in cfg}
    return tiles, {"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}


def _signature(fn, constexprs: dict) -> dict[str, str]:
    """Triton types for every argument: bf16 tensors (capitalised names), fp32/int32 metadata, i32 scalars."""
    types = dict.fromkeys(_FP32_POINTERS, "*fp32") | dict.fromkeys(_INT32_POINTERS, "*i32")
    return signature_by_name(fn, constexprs, types, lambda name: name[0].isupper(), _FLOAT_ARGS)


def _compile_all() -> dict[str, dict[str, dict]]:
    """name -> target -> {"mma": bool, "vgpr_spills": int, "error": str | None}."""
    import importlib

    results: dict[str, dict[str, dict]] = {}
    for name, (module, attr, base, table, _) in KERNELS.items():
        fn = getattr(importlib.import_module(f"tokenspeed_kernel_triton.attention.{module}"), attr)
        results[name] = {}
        for target in TARGETS:
            tiles, options = _tile_config(table, target)
            constexprs = {**base, **tiles}
            results[name][target] = compile_summary(fn, _signature(fn, constexprs), constexprs, target, **options)
    return results


def _compile_as_launched() -> dict[str, dict]:
    """sm90 builds with the launch-time specialisation: name -> {"cp_async": bool, "wgmma": bool}."""
    import importlib

    results = {}
    for name in ("prefill", "extend", "decode_split", "decode_append_rotary"):
        module, attr, base, table, _ = KERNELS[name]
        fn = getattr(importlib.import_module(f"tokenspeed_kernel_triton.attention.{module}"), attr)
        tiles, options = _tile_config(table, "sm90")
        constexprs = {**base, **tiles}
        signature = _signature(fn, constexprs)
        # What Triton's launcher records for 16-byte aligned tensors and strides that are
        # multiples of 16 (all of GPT-OSS's, except the page table's row stride).
        aligned = {
            (i,): [["tt.divisibility", 16]]
            for i, arg in enumerate(fn.arg_names)
            if signature[arg].startswith("*") or (arg.startswith("stride") and arg != "stride_pt_seq")
        }
        ptx = cross_compile(fn, signature, constexprs, "sm90", attrs=aligned, **options).asm["ptx"]
        results[name] = {"cp_async": "cp.async" in ptx, "wgmma": "wgmma.mma_async" in ptx}
    return results


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict[str, dict]]:
    pytest.importorskip("triton")
    return script_result(start_script(__file__), timeout=900)


@pytest.mark.parametrize("name", ["prefill", "extend", "decode_split", "decode_append_rotary"])
def test_attention_kernel_pipelined_as_launched_on_sm90(compiled: dict, name: str) -> None:
    result = compiled["as_launched"][name]
    assert result["cp_async"], f"{name}: K/V loads are not software-pipelined (no cp.async)"
    if not name.startswith("decode"):  # decode's 16-row tiles use mma.sync by design
        assert result["wgmma"], f"{name}: no wgmma on sm90"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_attention_kernel_cross_compiles(compiled: dict, name: str, target: str) -> None:
    result = compiled[name][target]
    assert result["error"] is None, f"{name} on {target}: {result['error']}"
    if KERNELS[name][4]:
        assert result["mma"], f"{name} on {target}: tl.dot did not lower to matrix instructions"
    assert result["vgpr_spills"] == 0, f"{name} on {target}: {result['vgpr_spills']} VGPRs spilled"


if __name__ == "__main__":
    print(json.dumps({**_compile_all(), "as_launched": _compile_as_launched()}))

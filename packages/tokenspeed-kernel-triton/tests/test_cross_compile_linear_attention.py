"""The gated-delta-rule kernels compile for sm90, gfx942 and gfx950 at Qwen3-Next shapes, spilling nothing.

Qwen3-Next's linear-attention layers: 16 q/k heads, 32 value heads, K = V = 128, q/k
L2-normalised, bf16 activations (fp32 ``g``, bf16 ``beta``), 16384 packed tokens in 4 (or
8) sequences. Tiles and launch options come from ``GDN_PREFILL_CONFIGS`` /
``GDN_DECODE_CONFIGS`` for the target's family; the state kernel is compiled for both rows
of its table (one sequence: BV = 32; eight: BV = 64).

Spill bound: zero for bf16 / fp16 inputs (what models run), and at most
:data:`FP32_SPILL_BYTES` bytes of spill stores per thread on sm90 for fp32 inputs, whose
products run as IEEE fp32 FMAs (no tensor cores; 13.6 KB in the state kernel and 44 KB in
the output kernel measured with Triton 3.6: the fp32 path is for accuracy, not speed). On top of ``_compile_cases.case_problems`` (shared memory within the
target's, no ``.local`` in the PTX, no VGPR spilled to scratch on AMD), the sm90 PTX is
assembled with Triton's ptxas (``-v``), which must report 0 bytes of spill stores and
loads: register allocation happens in ptxas, so spills do not show in the PTX. The chunk
kernels must run their products on the tensor cores (``mma.sync`` / ``wgmma`` in the PTX).
``python test_cross_compile_linear_attention.py sm90`` prints one target's raw results.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

import pytest
from _compile_cases import TARGETS, Case, case_problems, run_children, specialize

from tokenspeed_kernel.testing import cross_compile
from tokenspeed_kernel_triton import linear_attention as la

_T, _H, _HV, _K, _V = 16384, 16, 32, 128, 128
_MMA = {"sm": r"mma\.sync|wgmma"}
#: The sm90 spill-store bound of the fp32 (IEEE) variants, per thread (see the module docstring).
FP32_SPILL_BYTES = 65536

_STRIDES = {
    "stride_qt": _H * _K, "stride_qh": _K, "stride_kt": _H * _K, "stride_kh": _K,
    "stride_vt": _HV * _V, "stride_vh": _V, "stride_gt": _HV, "stride_gh": 1, "stride_bt": _HV, "stride_bh": 1,
    "stride_ot": _HV * _V, "stride_oh": _V,
}  # fmt: skip
_DECODE_STRIDES = {
    "stride_qb": _H * _K, "stride_qh": _K, "stride_kb": _H * _K, "stride_kh": _K, "stride_vb": _HV * _V,
    "stride_vh": _V, "stride_gb": _HV, "stride_gh": 1, "stride_bb": _HV, "stride_bh": 1, "stride_ob": _HV * _V,
    "stride_oh": _V,
}  # fmt: skip
_FP32 = ("g_ptr", "gcum_ptr", "init_ptr", "final_ptr", "state_ptr")
_INT32 = ("cu_ptr", "cf_ptr", "idx_ptr")


def _types(kernel, act: str = "*bf16") -> dict[str, str]:
    types = {}
    for name in kernel.arg_names:
        if name.endswith("_ptr"):
            types[name] = "*fp32" if name in _FP32 else "*i32" if name in _INT32 else act
        else:
            types[name] = "fp32" if name == "scale" else "i32"
    return types


def _case(kernel, tile: la.GdnTile, constexprs: dict, batch: int, checks=None, decode: bool = False,
          act: str = "*bf16") -> Case:  # fmt: skip
    values = {"T": _T, "B": batch, "HV": _HV, "group": _HV // _H, "search_steps": (batch - 1).bit_length()}
    values.update(_DECODE_STRIDES if decode else _STRIDES)
    values = {n: x for n, x in values.items() if n in kernel.arg_names}
    return Case(kernel, _types(kernel, act), constexprs, tile.num_warps, tile.num_stages, checks or {}, values)


def _row(table, n: int):
    return next(cfg for limit, cfg in table if limit is None or n <= limit)


def cases(family: str) -> dict[str, Case]:
    common = {"K": _K, "V": _V, "L2NORM": True, "DOT_FP32": 0, "CHUNK": la.CHUNK}
    fp32_mode = la.DOT_MODES["ieee"]
    one = _row(la.GDN_PREFILL_CONFIGS[family], 1 * _HV)
    many = _row(la.GDN_PREFILL_CONFIGS[family], 8 * _HV)
    decode = _row(la.GDN_DECODE_CONFIGS[family], 64)
    state = {**common, "VARLEN": True, "HAS_INIT": True, "STORE_FINAL": True}
    return {
        "gdn-wy": _case(
            la._gdn_wy_kernel, one.wy,
            {**common, "BK": one.wy.block, "BV": one.wy.block, "VARLEN": True, "SUB": 16}, 4, _MMA,
        ),
        "gdn-state-bv32": _case(la._gdn_state_kernel, one.state, {**state, "BV": one.state.block}, 1, _MMA),
        "gdn-state-bv64": _case(la._gdn_state_kernel, many.state, {**state, "BV": many.state.block}, 8, _MMA),
        "gdn-output": _case(la._gdn_output_kernel, one.out, {**common, "BV": one.out.block, "VARLEN": True}, 4, _MMA),
        # fp32 inputs (la.dot_mode): IEEE fp32 products.
        "gdn-wy-fp32": _case(
            la._gdn_wy_kernel, one.wy,
            {**common, "DOT_FP32": fp32_mode, "BK": one.wy.block, "BV": one.wy.block, "VARLEN": True, "SUB": 16}, 4,
            act="*fp32",
        ),
        "gdn-state-fp32": _case(la._gdn_state_kernel, one.state, {**state, "DOT_FP32": fp32_mode, "BV": one.state.block}, 1,
                                act="*fp32"),
        "gdn-output-fp32": _case(la._gdn_output_kernel, one.out,
                                 {**common, "DOT_FP32": fp32_mode, "BV": one.out.block, "VARLEN": True}, 4, act="*fp32"),
        "gdn-decode": _case(
            la._gdn_decode_kernel, decode,
            {"K": _K, "V": _V, "BV": decode.block, "HAS_INDICES": True, "L2NORM": True}, 64, decode=True,
        ),
    }  # fmt: skip


def _ptxas_problems(case: Case, max_spill: int = 0) -> tuple[list[str], str]:
    """Assemble the sm90 PTX with ``ptxas -v``: (problems, its register / spill line)."""
    from triton.backends.nvidia.compiler import get_ptxas

    signature, constexprs, attrs = specialize(case)
    kernel = cross_compile(
        case.kernel, signature, constexprs, "sm90", num_warps=case.num_warps, num_stages=case.num_stages, attrs=attrs
    )
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(kernel.asm["ptx"])
        run = subprocess.run(
            [get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", src, "-o", os.path.join(tmp, "kernel.o")],
            capture_output=True,
            text=True,
        )
    if run.returncode:
        return [f"ptxas failed: {run.stderr[-2000:]}"], ""
    info = " ".join(
        line.split(":", 1)[-1].strip() for line in run.stderr.splitlines() if "spill" in line or "registers" in line
    )
    stores = [int(n) for n in re.findall(r"(\d+) bytes spill stores", info)]
    if not stores:
        return [f"no spill report in ptxas -v: {run.stderr[-500:]}"], info
    return ([f"ptxas spills: {info}"] if max(stores) > max_spill else []), info


def _child() -> None:
    target = sys.argv[1]
    results = {}
    for name, case in cases(TARGETS[target]).items():
        try:
            problems = case_problems(case, target)
            if target.startswith("sm"):
                problems += _ptxas_problems(case, FP32_SPILL_BYTES if name.endswith("-fp32") else 0)[0]
        except Exception as exc:  # reported per case by the parent
            problems = [f"compile failed: {type(exc).__name__}: {str(exc)[:2000]}"]
        results[name] = problems
    print(json.dumps(results))


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict[str, list[str]]]:
    return run_children(__file__)


def test_every_kernel_has_a_cross_compile_case() -> None:
    assert set(cases("nvidia")) == set(cases("amd"))
    assert set(la.TRITON_KERNELS.values()) == {case.kernel for case in cases("nvidia").values()}


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("name", list(cases("nvidia")))
def test_kernel_compiles(compiled: dict, target: str, name: str) -> None:
    assert compiled[target][name] == [], f"{name} on {target}: {compiled[target][name]}"


if __name__ == "__main__":
    _child()

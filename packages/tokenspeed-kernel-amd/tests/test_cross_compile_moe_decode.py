"""The Gluon MXFP4 MoE decode kernels (``cdna.moe_decode``) compile for gfx950 and gfx942, no GPU.

Each case builds the two decode launches exactly as the host does
(:func:`tokenspeed_kernel_amd.moe.fused.moe_launches` with ``T <= 8`` tokens, CPU
tensors, the target's kernel set) and compiles them for ``hip:<arch>``. The AMDGCN must
then have:

- no MFMA (the decode kernels are matrix-vector products: FMAs and cross-lane sums);
- buffer loads (the weights stream through 16-byte ``buffer_load_dwordx4``);
- no register spills: the bound is 0 VGPR and 0 SGPR spills, what every case measures
  today with Triton 3.6 (a regression is a real performance bug);
- LDS within the arch's budget.

Each arch compiles in its own subprocess (both at once): in Triton 3.6 a cold compile of an
fp32 -> float8e4nv conversion for gfx942 after one for gfx950 in the same process emits
gfx950-only instructions and fails to assemble (the other order works).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

#: Register spill bounds stated by this package (see the module docstring).
MAX_VGPR_SPILLS = 0
MAX_SGPR_SPILLS = 0

ARCH_NAMES = ("gfx950", "gfx942")

#: (label, experts, top_k, x dtype, biases, interleaved, FP8 activations, route in the kernel, tokens)
CASES = [
    *[
        (f"gpt_oss_120b_{act}_{how}", 128, 4, "bf16", True, True, fp8, route, n)
        for act, fp8 in (("fp8", True), ("bf16", False))
        for how, route, n in (("route", True, 1), ("topk", False, 8))
    ],
    ("fp16_no_bias_not_interleaved", 128, 4, "fp16", False, False, False, True, 3),
    ("gpt_oss_20b_fp8_route", 32, 4, "bf16", True, True, True, True, 2),
]
HIDDEN = INTER = 2880


@functools.cache
def _weights(experts: int, bias: bool, interleaved: bool):
    import torch

    from tokenspeed_kernel_amd.moe.weights import MxfpMoeWeights, prepare_weights

    g = torch.Generator().manual_seed(0)
    h, i = HIDDEN, INTER
    w13 = torch.randint(0, 256, (experts, 2 * i, h // 2), dtype=torch.uint8, generator=g)
    s13 = torch.randint(118, 130, (experts, 2 * i, h // 32), dtype=torch.uint8, generator=g)
    w2 = torch.randint(0, 256, (experts, h, i // 2), dtype=torch.uint8, generator=g)
    s2 = torch.randint(118, 130, (experts, h, i // 32), dtype=torch.uint8, generator=g)
    if interleaved:
        b13, b2 = (torch.randn(experts, 2 * i), torch.randn(experts, h)) if bias else (None, None)
        return prepare_weights(w13, s13, w2, s2, b13, b2)
    assert not bias
    # Gate rows first, up rows after them: the kernels' non-interleaved row sets.
    return MxfpMoeWeights(w13, s13, w2, s2, interleaved=False)


def _compile_case(arch: str, case: tuple) -> list[dict]:
    """Build the case's launches as the host does, compile them for ``arch``; one record per launch."""
    import torch

    from tokenspeed_kernel.testing import amdgcn_stats, compile_launch
    from tokenspeed_kernel_amd.moe import fused

    _, experts, k, dtype, bias, interleaved, fp8, route, tokens = case
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    weights = _weights(experts, bias, interleaved)
    torch.manual_seed(0)
    x = torch.randn(tokens, HIDDEN, dtype=dt)
    logits = torch.randn(tokens, experts, dtype=dt)
    topk = None
    if not route:
        wts, ids = fused.route(logits, k)
        topk = (wts.contiguous(), ids.contiguous())
    acts = (torch.tensor([0.05]), torch.tensor([0.02])) if fp8 else None
    out = torch.empty(tokens, HIDDEN, dtype=dt)
    tiles = fused.choose_tiles(tokens, experts, k)
    launches, _ = fused.moe_launches(
        x, weights, top_k=k, router_logits=logits if route else None, topk=topk, act_scales=acts,
        swiglu=(1.702, 7.0, 1.0), out=out, kernels=fused.kernel_set(arch), tiles=tiles,
    )  # fmt: skip
    records = []
    for launch in launches:
        kernel = compile_launch(launch.fn, launch.args, launch.kwargs, arch)
        stats = amdgcn_stats(kernel.asm["amdgcn"])
        records.append(
            dict(
                name=launch.fn.__name__, module=launch.fn.fn.__module__, grid=launch.grid, path=tiles.path,
                kwargs={key: v for key, v in launch.kwargs.items() if isinstance(v, (bool, int, str))},
                mfma=sorted(stats.mfma), buffer_loads=stats.buffer_loads, vgpr_spills=stats.vgpr_spills,
                sgpr_spills=stats.sgpr_spills, vgprs=stats.vgprs, occupancy=stats.occupancy,
                lds=kernel.metadata.shared,
            )
        )  # fmt: skip
    return records


def _compile_all(arch: str) -> dict[str, object]:
    """Every case's records for ``arch`` (or the error, as a string), by label."""
    results: dict[str, object] = {}
    for case in CASES:
        try:
            results[case[0]] = _compile_case(arch, case)
        except Exception as exc:  # reported by the case's test
            results[case[0]] = f"{type(exc).__name__}: {exc}"[-4000:]
    return results


_WORKER = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("moe_decode_compile_worker", sys.argv[1])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
print("RESULT " + json.dumps(mod._compile_all(sys.argv[2])))
"""


@pytest.fixture(scope="module")
def compiled():
    """``{arch: {label: records or error}}``, each arch compiled in its own process (see the
    module docstring), both at once."""
    procs = {
        arch: subprocess.Popen([sys.executable, "-c", _WORKER, __file__, arch], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        for arch in ARCH_NAMES
    }  # fmt: skip
    results = {}
    for arch, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, f"{arch} compile worker failed:\n{stderr[-4000:]}"
        results[arch] = json.loads(lines[-1][len("RESULT ") :])
    return results


@pytest.mark.parametrize("arch", ARCH_NAMES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_decode_kernels_compile(compiled, arch, case):
    from tokenspeed_kernel_amd.cdna.arch import ARCHS

    _, _, k, _, bias, interleaved, fp8, route, tokens = case
    records = compiled[arch][case[0]]
    assert isinstance(records, list), records
    assert [r["name"] for r in records] == ["decode_gate_up", "decode_down"]
    assert {r["module"] for r in records} == {"tokenspeed_kernel_amd.cdna.moe_decode"}
    assert {r["path"] for r in records} == {"decode"}
    gate_up, down = records
    assert tuple(gate_up["grid"]) == (tokens * k, -(-INTER // gate_up["kwargs"]["BLOCK_N"]))
    assert tuple(down["grid"]) == (tokens, -(-HIDDEN // down["kwargs"]["BLOCK_N"]))
    assert gate_up["kwargs"]["ROUTE"] is route and gate_up["kwargs"]["ACT_FP8"] is fp8
    assert gate_up["kwargs"]["INTERLEAVED"] is interleaved and gate_up["kwargs"]["HAS_BIAS"] is bias
    assert gate_up["kwargs"]["SCALED_MFMA"] is (arch == "gfx950")
    for r in records:
        assert not r["mfma"], r
        assert r["buffer_loads"] > 0, r
        assert r["vgpr_spills"] <= MAX_VGPR_SPILLS, r
        assert r["sgpr_spills"] <= MAX_SGPR_SPILLS, r
        assert r["lds"] <= ARCHS[arch].lds_bytes, r

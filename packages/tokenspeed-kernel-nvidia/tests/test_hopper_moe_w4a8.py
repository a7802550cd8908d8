"""The W4A8 prefill path of ``hopper.moe_apply`` (``fp8=True``): e4m3 activations, fp8 wgmma.

On a CPU: the decode's PTX (run through a small emulator of the PTX instructions it uses, against
torch's own E4M3 rounding of the exact weights), its table constants, the K permutation, the
activation quantization under the Triton interpreter, the intermediate's scale, and the GEMMs
cross-compiled for sm_90 as the host launches them (fp8 ``QGMMA`` with the A operand in registers,
no spills, no write to an in-flight MMA's registers). On a GPU: the layer against the float32
W4A8 reference (``tokenspeed_kernel.reference.moe.moe_apply_w4a8``), determinism, graph replay.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

import tokenspeed_kernel as tk

sys.path.insert(0, os.path.dirname(__file__))
from test_hopper_moe import GPT_OSS, gpu_inputs
from test_hopper_moe_prefill import _prefill_launches, assert_no_spills_or_hazards, check_on_gpu, compiled_gemms

# -- a PTX emulator for the decode's instructions --------------------------------------------

M32 = 0xFFFFFFFF


def _prmt(a: int, b: int, c: int) -> int:
    """``prmt.b32`` (default mode): byte n of the result is byte ``c[4n:4n+3] & 7`` of ``{b, a}``,
    replaced by its bit 7 replicated when ``c``'s bit ``4n + 3`` is set."""
    src = (b << 32) | a
    out = 0
    for n in range(4):
        sel = (c >> (4 * n)) & 0xF
        byte = (src >> (8 * (sel & 7))) & 0xFF
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        out |= byte << (8 * n)
    return out


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        idx = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        out |= ((lut >> idx) & 1) << bit
    return out


def run_ptx(asm: str, args: list[int]) -> list[int]:
    """Run the straight-line ``.b32`` PTX of ``asm`` (and/shr/shl/prmt/lop3, ``$i`` operands)."""
    regs = {f"${i}": v for i, v in enumerate(args)}

    def val(tok: str) -> int:
        tok = tok.strip()
        return int(tok, 0) & M32 if tok[0].isdigit() else regs[tok]

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        dst, *src = [t.strip() for t in rest.split(",")]
        v = [val(t) for t in src]
        if op == "and.b32":
            regs[dst] = v[0] & v[1]
        elif op == "shr.u32":
            regs[dst] = v[0] >> v[1]
        elif op == "shl.b32":
            regs[dst] = (v[0] << v[1]) & M32
        elif op == "prmt.b32":
            regs[dst] = _prmt(v[0], v[1], v[2])
        elif op == "lop3.b32":
            regs[dst] = _lop3(v[0], v[1], v[2], v[3])
        else:
            raise AssertionError(f"the emulator does not know {op!r}")
    return [regs[f"${i}"] for i in range(len(args)) if f"${i}" in regs]


def test_the_emulator_follows_the_ptx_definitions():
    assert _prmt(0x33221100, 0x77665544, 0x7654) == 0x77665544  # plain byte picks
    assert _prmt(0x00007F80, 0, 0x8989) == 0xFF00FF00  # sign mode: byte 1 (0x7F) -> 0, byte 0 (0x80) -> 0xFF
    assert _lop3(0xF0, 0xCC, 0xAA, 0xF8) == 0xF8  # a | (b & c) on the canonical inputs


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _table(d: int) -> tuple[int, int]:
    from tokenspeed_kernel_nvidia.hopper.moe import prefill

    if d < prefill.E4M3_MIN_D.value:
        return 0, 0
    return tuple((prefill.E4M3_TABLE.value[i] + d * prefill.E4M3_STEP.value[i]) & M32 for i in range(2))


def test_the_table_holds_the_e4m3_bits_of_each_magnitude_times_2_to_the_d():
    from tokenspeed_kernel_nvidia.hopper.moe import prefill

    lo = prefill.E4M3_MIN_D.value
    for d in range(lo, 7):
        l0, l1 = _table(d)
        got = [((l1 if c >= 4 else l0) >> (8 * (c % 4))) & 0xFF for c in range(8)]
        want = torch.tensor([m * 2.0**d for m in E2M1]).to(torch.float8_e4m3fn).view(torch.uint8).tolist()
        assert got == want, d
    # One step below, 0.5 * 2**d is an E4M3 subnormal, which the exponent-field step cannot make.
    half = torch.tensor([0.5 * 2.0 ** (lo - 1)]).to(torch.float8_e4m3fn).view(torch.uint8).item()
    assert half >> 3 == 0


def test_the_decode_ptx_gives_e4m3_of_the_exact_weights():
    """Every code in every position of a word, with scales from the row's largest down past the
    flush bound: bytes equal to torch's E4M3 of ``E2M1 * 2**(s - rmax + 6)`` (zero below the bound)."""
    from tokenspeed_kernel_nvidia.hopper.moe import prefill

    asm = prefill.E4M3_WORDS_ASM.value
    g = torch.Generator().manual_seed(0)
    words = [sum(((j + c) % 16) << (4 * j) for j in range(8)) for c in range(16)]
    words += torch.randint(0, 2**32, (200,), generator=g, dtype=torch.int64).tolist()
    for d in (6, 3, 0, -3, prefill.E4M3_MIN_D.value, prefill.E4M3_MIN_D.value - 1, -20):
        l0, l1 = _table(d)
        for w in words:
            lo, hi = run_ptx(asm, [0, 0, w, l0, l1])[:2]
            got = [((hi if j >= 4 else lo) >> (8 * (j % 4))) & 0xFF for j in range(8)]
            codes = [(w >> (4 * j)) & 0xF for j in range(8)]
            exact = [(-1.0 if c & 8 else 1.0) * E2M1[c & 7] * 2.0**d for c in codes]
            want = torch.tensor(exact) if d >= prefill.E4M3_MIN_D.value else torch.zeros(8)
            got_v = torch.tensor(got, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
            assert torch.equal(got_v, want.to(torch.float8_e4m3fn).float()), (hex(w), d, got, exact)
            # the sign survives (a -0 only where the value is zero)
            assert all((b >> 7) == (c >> 3) for b, c in zip(got, codes) if b & 0x7F), (hex(w), d)


def _canonical_of_mma8(kk: int) -> int:
    """The documented placement, enumerated: lane q's register j = 2 w + h holds canonical
    ``16 q + 4 j + i`` in byte i, at fp8 MMA K ``16 j + 4 q + i``."""
    for q in range(4):
        for j in range(4):
            for i in range(4):
                if 16 * j + 4 * q + i == kk % 64:
                    return kk - kk % 64 + 16 * q + 4 * j + i
    raise AssertionError(kk)


def test_kperm8_places_each_value_where_the_decode_puts_its_weight():
    from tokenspeed_kernel_nvidia.hopper.moe.prefill import kperm8

    cols = range(2880)
    assert sorted(kperm8(c) for c in cols) == list(cols)
    assert all(kperm8(kperm8(c)) == c for c in cols)
    assert all(_canonical_of_mma8(kperm8(c)) == c for c in cols)


def test_the_intermediate_scale_keeps_the_clamped_swiglu_within_e4m3():
    from tokenspeed_kernel.ops.moe import w4a8_inter_scale

    assert w4a8_inter_scale(GPT_OSS) == 8.0  # |out| <= 7 * (7 + 1) = 56; 56 * 8 = 448
    act = tk.MoEActivation(alpha=1.702, limit=10.0, up_offset=1.0)
    q = w4a8_inter_scale(act)
    gate = torch.linspace(-200, 10, 100001, dtype=torch.float64)
    glu = gate * torch.sigmoid(act.alpha * gate)
    assert q * glu.abs().max().item() * (10.0 + 1.0) <= 448.0 and q * 2 * 10 * 11 > 448.0
    with pytest.raises(ValueError, match="limit"):
        w4a8_inter_scale(tk.MoEActivation.silu())


_GATHER8 = r"""
import json, torch
from tokenspeed_kernel_nvidia.hopper.moe.prefill import gather_rows_fp8, kperm8
from tokenspeed_kernel.reference.moe import quantize_rows_e4m3
g = torch.Generator().manual_seed(0)
t, k, h = 5, 4, 192
# E4M3 values times 2**r with each row's largest 448 * 2**r: the scaled values are exact E4M3 (the
# interpreter's float -> e4m3 rounding loses the carry into the exponent; the GPU tests round).
codes = torch.randint(0, 256, (t, h), generator=g, dtype=torch.uint8)
codes[(codes & 0x7F) == 0x7F] = 0  # no NaN
v = codes.view(torch.float8_e4m3fn).float()
v[:, 7] = 448.0
x = (v * torch.tensor([2.0**r for r in (-9, -3, 0, 2, 6)])[:, None]).to(torch.bfloat16)
order = torch.randperm(t * k, generator=g).to(torch.int32)
xs = torch.empty(t * k, h, dtype=torch.float8_e4m3fn)
xscale = torch.empty(t * k)
gather_rows_fp8[(t * k,)](x, x.stride(0), order, xs, xscale, h, TOP_K=k, BLOCK=256)
perm = torch.tensor([kperm8(c) for c in range(h)])
got = xs[:, perm].float() * xscale[:, None]
want = quantize_rows_e4m3(x[order.long() // k])
print(json.dumps({"equal": bool(torch.equal(got, want)),
                  "scale": bool(torch.allclose(xscale, x[order.long() // k].float().abs().amax(1) / 448))}))
"""


def test_gather_rows_fp8_matches_the_reference_quantization_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _GATHER8], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"equal": True, "scale": True}


def test_fp8_takes_the_w4a8_launches_from_its_token_count(monkeypatch):
    from tokenspeed_kernel_nvidia.hopper.moe import decode, layer, prefill

    # The sort is one launch up to SORT_MAX_PAIRS pairs, two above.
    def sort(tokens):
        if 4 * tokens <= prefill.SORT_MAX_PAIRS:
            return [prefill.sort_pairs]
        return [prefill.block_histograms, prefill.scatter_sorted]

    calls, _ = _prefill_launches(monkeypatch, layer.FP8_MIN_TOKENS - 1, e=8, h=128, i=128, fp8=True)
    head = [*sort(layer.FP8_MIN_TOKENS - 1), prefill.gather_rows]
    assert [c[0] for c in calls][: len(head)] == head  # bf16 below the bound
    assert not any(c[3].get("FP8") for c in calls)
    calls, ids = _prefill_launches(monkeypatch, layer.FP8_MIN_TOKENS, e=8, h=128, i=128, fp8=True)
    s = len(sort(layer.FP8_MIN_TOKENS))
    assert [c[0] for c in calls] == [*sort(layer.FP8_MIN_TOKENS), prefill.gather_rows_fp8, prefill.moe_prefill_gemm,
                                     prefill.moe_prefill_gemm, decode.combine_slots]  # fmt: skip
    assert all(c[3]["FP8"] for c in calls[s + 1 : s + 3])
    gu, down = calls[s + 1][2], calls[s + 2][2]
    assert gu[0].base.dtype == down[0].base.dtype == torch.float8_e4m3fn  # both B operands e4m3
    assert gu[-2].dtype == torch.float32 and gu[-2].numel() == ids.numel()  # a scale per pair
    assert gu[-1] == 8.0 and down[-1] == 1.0 / 8.0  # inter's scale, and its inverse
    with pytest.raises(ValueError, match="limit"):
        layer.moe_apply(torch.zeros(4, 128, dtype=torch.bfloat16), torch.ones(4, 1), torch.zeros(4, 1, dtype=torch.int32),
                        None, tk.MoEActivation.silu(), fp8=True)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "tile",
    [
        (128, 128, 8, 2),
        (128, 128, 8, 4, 2),
        (64, 64, 4, 2, 2),
        (64, 16, 4, 4, 4),
        (64, 64, 4, 2, 2, 2),
        (128, 64, 4, 2, 2),
    ],
)
def test_w4a8_gemms_cross_compile_for_sm90(monkeypatch, tile):
    from tokenspeed_kernel_nvidia.hopper.moe import prefill

    pt = prefill.PrefillTile(*tile)
    for _kwargs, _ck, ptx, sass in compiled_gemms(monkeypatch, 4096, (pt, pt), fp8=True):
        assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3", ptx)
        assert re.search(r"QGMMA\.64x\d+x32\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc", sass)  # A from registers
        assert "prmt.b32" in ptx
        assert_no_spills_or_hazards(sass)


# -- on the H200 ----------------------------------------------------------------------------

GPU_CASES = [
    ("120b_T2048", 128, 2048, {}, "random", None),
    ("20b_T1500", 32, 1500, {}, "random", None),
    ("120b_T1024_one_hot_expert", 128, 1024, {}, "hot", None),
    ("T300_ragged_empty_experts_tile_16", 128, 300, {}, "random", (64, 16, 4, 4, 4)),
    ("no_bias_not_interleaved_T1024", 128, 1024, {"bias": False, "interleaved": False}, "random", None),
    ("unroll_2_bt128_T3000", 128, 3000, {}, "random", (128, 128, 8, 4, 2)),
    ("chunks_2_T2048", 128, 2048, {}, "random", (64, 64, 4, 2, 2, 2)),
    ("rows_32_a_warp_T2048", 128, 2048, {}, "random", (128, 64, 4, 2, 2)),
]


def _w4a8_reference(x, topk_w, topk_ids, w):
    from tokenspeed_kernel.reference.moe import moe_apply_w4a8

    return moe_apply_w4a8(x.float(), topk_w, topk_ids, w, GPT_OSS)  # upcasts the bf16 biases itself


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("label,e,tokens,wkw,routing,tile", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_w4a8_matches_the_w4a8_reference_and_replays_in_a_graph(label, e, tokens, wkw, routing, tile):
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    tk.load_plugins()
    tiles = None if tile is None else (layer.PrefillTile(*tile), layer.PrefillTile(*tile))
    w, x, topk_w, topk_ids, _ = gpu_inputs(e, tokens, wkw, routing)

    def run(out=None):
        return layer.moe_apply(x, topk_w, topk_ids, w, GPT_OSS, out=out, tiles=tiles, fp8=True)

    check_on_gpu(run, _w4a8_reference(x, topk_w, topk_ids, w))

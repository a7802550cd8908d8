"""The prefill path of ``hopper.moe_apply`` (:mod:`tokenspeed_kernel_nvidia.hopper.moe.prefill`).

On a CPU: the K permutation, the sort by expert and the row gather under the Triton interpreter, the host's choice of
path and tiles, and the Gluon GEMMs cross-compiled for sm_90 exactly as the host launches them
(CPU tensors stand in for device tensors). The SASS must show the warpgroup MMA (``HGMMA``) fed
by the TMA ring, the decode's ``mul.rn.bf16x2`` in the K loop, no register spills, and no
instruction writing an in-flight MMA's register operand before the wait that retires it (the
hazard a first version had: NaNs on the H200). On a GPU: numerics against the fp32 reference,
determinism and graph replay.
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
from test_hopper_moe import GPT_OSS, LAYOUTS, _Recorder, _reference, _weights, gpu_inputs, in_layout

NAME = "hopper.moe_apply"


def _canonical_of_mma(kk: int) -> int:
    """The decode's documented placement, enumerated: lane q's word w holds canonical
    ``16 q + 8 w + j``; code j = p + 4 i (plane p = p0 + 2 p1, half i) lands at MMA K
    ``16 (2 w + p1) + 8 p0 + 2 q + i``."""
    for q in range(4):
        for w in range(2):
            for p0 in range(2):
                for p1 in range(2):
                    for i in range(2):
                        if 16 * (2 * w + p1) + 8 * p0 + 2 * q + i == kk % 64:
                            return kk - kk % 64 + 16 * q + 8 * w + p0 + 2 * p1 + 4 * i
    raise AssertionError(kk)


def test_kperm_places_each_value_where_the_decode_puts_its_weight():
    from tokenspeed_kernel_nvidia.hopper.moe.prefill import kperm, kperm_inverse

    cols = range(2880)
    assert sorted(kperm(c) for c in cols) == list(cols)  # a permutation within each 64-value step
    assert all(kperm(c) // 64 == c // 64 for c in cols)
    assert all(kperm_inverse(kperm(c)) == c for c in cols)
    assert all(_canonical_of_mma(kperm(c)) == c for c in cols)


_GATHER = r"""
import json, torch
from tokenspeed_kernel_nvidia.hopper.moe.prefill import gather_rows, kperm
g = torch.Generator().manual_seed(0)
t, k, h = 5, 3, 192
x = torch.randn(t, h, generator=g).to(torch.bfloat16)
order = torch.randperm(t * k, generator=g).to(torch.int32)
xs = torch.empty(t * k, h, dtype=torch.bfloat16)
gather_rows[(t * k, 2)](x, x.stride(0), order, xs, h, TOP_K=k, BLOCK=128)
want = torch.empty_like(xs)
want[:, torch.tensor([kperm(c) for c in range(h)])] = x[order.long() // k]
print(json.dumps({"equal": bool(torch.equal(xs, want))}))
"""


def test_gather_rows_matches_torch_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _GATHER], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"equal": True}


_SORT = r"""
import json, torch
from tokenspeed_kernel_nvidia.hopper.moe import prefill
g = torch.Generator().manual_seed(0)
cases = []
bound = prefill.SORT_MAX_PAIRS
for experts, pairs, kind in [(128, 1200, "random"), (128, 5, "random"), (32, 1, "random"), (20, 300, "random"),
                             (128, 64, "one hot expert"), (8, bound, "random"), (8, 333, "last expert empty"),
                             # several blocks of the two-launch sort, the last one partial
                             (128, bound + 1, "random"), (128, 3 * prefill.SORT_BLOCK, "one hot expert"),
                             (20, 4100, "last expert empty")]:
    hi = experts - 1 if kind == "last expert empty" else experts
    ids = torch.randint(0, hi, (pairs,), generator=g).to(torch.int32)
    if kind == "one hot expert":
        ids[:] = 77
    # The reference: torch's stable sort, and each expert's first row by counting.
    want_order = torch.sort(ids.long(), stable=True)[1]
    counts = torch.bincount(ids.long(), minlength=experts)
    want_off = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(counts, 0)])
    for limit in (1 << 30, 0):  # one launch, then the two-launch sort
        prefill.SORT_MAX_PAIRS = limit
        order, off = prefill.sort_by_expert(ids, experts)
        cases.append(order.dtype == off.dtype == torch.int32 and torch.equal(order.long(), want_order)
                     and torch.equal(off.long(), want_off))
    prefill.SORT_MAX_PAIRS = bound
print(json.dumps({"equal": cases}))
"""


def test_sort_by_expert_is_torchs_stable_sort_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _SORT], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"equal": [True] * 20}


@pytest.mark.slow
@pytest.mark.parametrize("pairs", [20, 1024, 1025, 2048, 65536])
def test_the_sort_kernels_cross_compile_for_sm90_without_spills(monkeypatch, pairs):
    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel.testing import sass as sm90_sass
    from tokenspeed_kernel_nvidia.hopper.moe import prefill

    calls = []
    monkeypatch.setattr(prefill, "cached", lambda fn: _Recorder(fn, calls))
    prefill.sort_by_expert(torch.zeros(pairs, dtype=torch.int32), 128)
    if pairs <= prefill.SORT_MAX_PAIRS:
        ((fn, grid, _args, kwargs),) = calls
        assert fn is prefill.sort_pairs and grid == (1,) and kwargs["BLOCK"] >= pairs
    else:
        blocks = -(-pairs // prefill.SORT_BLOCK)
        assert [(c[0], c[1]) for c in calls] == [
            (prefill.block_histograms, (blocks,)),
            (prefill.scatter_sorted, (blocks,)),
        ]
        assert calls[1][3]["NB_P2"] >= blocks
    for fn, _grid, args, kwargs in calls:
        sass = sm90_sass(compile_launch(fn, args, dict(kwargs), "sm90").asm["cubin"])
        assert not re.findall(r"\b(STL|LDL)(\.[A-Z0-9]+)*\b", sass), "register spills"


def test_prefill_tile_rejects_shapes_the_kernel_cannot_lay_out():
    from tokenspeed_kernel_nvidia.hopper.moe.prefill import PrefillTile

    assert tuple(PrefillTile(128, 64, 8)) == (128, 64, 8, 4, 1, 1)
    assert tuple(PrefillTile(128, 64, 4)) == (128, 64, 4, 4, 1, 1)  # 32 rows a warp
    for args, word in [((128, 64, 2), "warps"), ((64, 64, 8), "block_m"), ((96, 64, 4), "block_m"), ((128, 48, 8), "block_t"),
                       ((128, 64, 8, 1), "stages"), ((128, 64, 8, 4, 3), "unroll"),
                       ((64, 16, 4, 2, 4), "stages"), ((64, 32, 4, 2, 2, 3), "chunks")]:  # fmt: skip
        with pytest.raises(ValueError, match=word):
            PrefillTile(*args)


def _prefill_launches(monkeypatch, tokens, tiles=None, e=128, h=2880, i=2880, fp8=False, **wkw):
    from tokenspeed_kernel_nvidia.hopper.moe import layer, prefill

    calls = []
    monkeypatch.setattr(prefill, "cached", lambda fn: _Recorder(fn, calls))
    monkeypatch.setattr(layer, "cached", lambda fn: _Recorder(fn, calls))
    w = _weights(e, h, i, codes=False, **wkw)  # the launches are recorded, not run
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, h, generator=g).to(torch.bfloat16)
    tw, ids = tk.moe_route(torch.randn(tokens, e, generator=g), 4, solution="reference")
    layer.moe_apply(x, tw, ids, w, GPT_OSS, tiles=tiles, graphs=False, fp8=fp8)
    return calls, ids


def test_the_path_follows_the_token_count_and_the_tiles(monkeypatch):
    from tokenspeed_kernel_nvidia.hopper.moe import decode, layer, prefill

    calls, _ = _prefill_launches(monkeypatch, layer.PREFILL_MIN_TOKENS - 1, e=8, h=128, i=128)
    assert prefill.moe_prefill_gemm not in [c[0] for c in calls]
    assert [c[0] for c in calls].count(decode.moe_decode_gemm) == 2
    calls, ids = _prefill_launches(monkeypatch, layer.PREFILL_MIN_TOKENS, e=8, h=128, i=128)
    assert [c[0] for c in calls] == [prefill.sort_pairs, prefill.gather_rows, prefill.moe_prefill_gemm,
                                     prefill.moe_prefill_gemm, decode.combine_slots], [c[0] for c in calls]  # fmt: skip
    gu, down = calls[2], calls[3]
    assert gu[3]["GATE_UP"] and not down[3]["GATE_UP"]
    # The table's tiles for 256 tokens; N tiles first, then the ragged M bound (every expert adds at
    # most one partial tile).
    want = layer._prefill_tiles(layer.PREFILL_MIN_TOKENS * 4, 8)
    assert (gu[3]["BLOCK_M"], gu[3]["BLOCK_T"], gu[3]["STAGES"]) == tuple(want[0][i] for i in (0, 1, 3))
    pairs = ids.numel()
    assert gu[1] == (128 // (want[0][0] // 2), -(-pairs // (want[0][1] * want[0][5])) + 8)
    assert down[1] == (-(-128 // want[1][0]), -(-pairs // (want[1][1] * want[1][5])) + 8)
    # Two PrefillTile force the prefill path at any size; mixed tiles are refused naming the argument.
    tile = prefill.PrefillTile(64, 16, 4, 2)
    calls, _ = _prefill_launches(monkeypatch, 3, tiles=(tile, tile), e=8, h=128, i=128)
    assert [c[0] for c in calls].count(prefill.moe_prefill_gemm) == 2
    with pytest.raises(TypeError, match="tiles"):
        _prefill_launches(monkeypatch, 3, tiles=(tile, layer.DecodeTile(64, 8, 4)), e=8, h=128, i=128)


def test_the_prefill_tiles_follow_the_load_of_an_expert_and_two_chunks_reach_the_launch(monkeypatch):
    from tokenspeed_kernel_nvidia.hopper.moe import layer, prefill

    # GPT-OSS-20B (32 experts) at 2048 tokens loads an expert as the 120B layer (128) at 8192 does.
    assert layer._prefill_tiles(2048 * 4, 32) == layer._prefill_tiles(8192 * 4, 128)
    assert layer._prefill_tiles(2048 * 4, 32) != layer._prefill_tiles(2048 * 4, 128)
    assert layer._fp8_tiles(1024 * 4, 32) == layer._fp8_tiles(4096 * 4, 128) != layer._fp8_tiles(1024 * 4, 128)
    # A two-chunk program covers 2 * BLOCK_T sorted pairs: the ragged M bound counts those.
    tile = prefill.PrefillTile(64, 16, 4, 2, 1, 2)
    calls, ids = _prefill_launches(monkeypatch, 40, tiles=(tile, tile), e=8, h=128, i=128)
    gemms = [c for c in calls if c[0] is prefill.moe_prefill_gemm]
    assert len(gemms) == 2
    for _fn, grid, _args, kwargs in gemms:
        assert kwargs["CHUNKS"] == 2 and kwargs["BLOCK_T"] == 16
        assert grid[1] == -(-ids.numel() // 32) + 8


def _group_regs(line: str) -> set[int]:
    """The A-operand registers of an ``HGMMA ... R<acc>, R<a>, gdesc...`` (4 for bf16 k16)."""
    m = re.search(r"HGMMA\.\S+\s+R\d+,\s+R(\d+),", line)
    return set(range(int(m.group(1)), int(m.group(1)) + 4)) if m else set()


def _dest_regs(line: str) -> set[int]:
    m = re.match(r"\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s+R(\d+)\b", line)
    if not m or m.group(1).startswith(("HGMMA", "ST", "RED", "ATOM", "BAR", "BRA", "ISETP", "FSETP")):
        return set()
    width = 4 if ".128" in m.group(1) else 2 if (".64" in m.group(1) or ".WIDE" in m.group(1)) else 1
    return set(range(int(m.group(2)), int(m.group(2)) + width))


def wgmma_register_hazards(sass: str) -> list[str]:
    """Instructions that write a register an in-flight ``HGMMA`` reads as its A operand, in program
    order, each loop body walked twice (a write at the top of the next iteration counts).
    ``WARPGROUP.DEPBAR.LE gsb0, N`` retires all but the last N groups."""
    lines = [ln.split("\t", 1)[-1] for ln in sass.splitlines()]
    labels = {m.group(1): n for n, ln in enumerate(lines) if (m := re.match(r"\s*\.?(L\w+):", ln))}
    order = []
    for n, ln in enumerate(lines):
        order.append(n)
        m = re.search(r"\bBRA\s+`?\(?\.?(L\w+)", ln)
        if m and m.group(1) in labels and labels[m.group(1)] < n:
            order.extend(range(labels[m.group(1)], n + 1))  # the loop once more
    groups: list[set[int]] = []
    current: set[int] = set()
    bad = []
    for n in order:
        ln = lines[n]
        if "HGMMA" in ln:
            current |= _group_regs(ln)
            if "gsb0" in ln:
                groups.append(current)
                current = set()
            continue
        if m := re.search(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*0x([0-9a-f]+)", ln):
            keep = int(m.group(1), 16)
            groups = groups[len(groups) - keep :] if keep else []
            continue
        live = set().union(*groups, current) if (groups or current) else set()
        if live & _dest_regs(ln):
            bad.append(ln.strip())
    return bad


def test_the_hazard_check_sees_a_write_to_an_in_flight_operand():
    sass = "\n".join([
        "HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR4], R24, gsb0;",
        "LOP3.LUT R90, R1, R2, RZ, 0xc0, !PT;",  # writes R90 while the group reads R88..R91
        "WARPGROUP.DEPBAR.LE gsb0, 0x0;",
        "LOP3.LUT R91, R1, R2, RZ, 0xc0, !PT;",  # after the wait: fine
    ])  # fmt: skip
    assert wgmma_register_hazards(sass) == ["LOP3.LUT R90, R1, R2, RZ, 0xc0, !PT;"]


CROSS = [
    ("table_T512", 512, None, {}),
    ("table_T4096", 4096, None, {}),
    ("no_bias_not_interleaved_T300", 300, None, {"bias": False, "interleaved": False}),
    ("scales_above_128_T300", 300, None, {"scale_hi": 140}),
    ("four_warps_T300", 300, (64, 64, 4, 3), {}),
    ("two_stages_T300", 300, (128, 128, 8, 2), {}),
    ("unroll_2_T300", 300, (128, 32, 8, 4, 2), {}),
    ("unroll_2_bt128_T300", 300, (128, 128, 8, 4, 2), {}),
    ("unroll_2_even_steps_T300", 300, (64, 16, 4, 2, 2), {"h": 1024, "i": 1024}),
    ("unroll_4_T300", 300, (64, 16, 4, 4, 4), {}),  # 45 steps: one left after the rounds
    ("unroll_4_three_left_T300", 300, (64, 32, 4, 8, 4), {"h": 448, "i": 448}),
    ("chunks_2_unroll_2_T1024", 1024, (64, 32, 4, 2, 2, 2), {}),
    ("chunks_2_unroll_4_T512", 512, (64, 16, 4, 4, 4, 2), {}),
    ("chunks_2_unroll_1_bt64_T300", 300, (64, 64, 4, 3, 1, 2), {}),
    # 32 weight rows a warp (two wgmma M blocks on each activation tile).
    ("rows_32_a_warp_unroll_2_T1024", 1024, (128, 64, 4, 2, 2), {}),
    ("rows_32_a_warp_chunks_2_T2048", 2048, (128, 32, 4, 2, 2, 2), {}),
]


def compiled_gemms(monkeypatch, tokens, tiles, **kw):
    """The two prefill GEMMs of a ``tokens`` call, cross-compiled for sm_90 as the host launches them:
    ``(launch kwargs, compiled kernel, ptx, sass)`` each."""
    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel.testing import sass as sm90_sass
    from tokenspeed_kernel_nvidia.hopper.moe import prefill

    calls, _ = _prefill_launches(monkeypatch, tokens, tiles=tiles, **kw)
    gemms = [c for c in calls if c[0] is prefill.moe_prefill_gemm]
    assert len(gemms) == 2
    out = []
    for fn, _grid, args, kwargs in gemms:
        ck = compile_launch(fn, args, dict(kwargs), "sm90")
        out.append((kwargs, ck, ck.asm["ptx"], sm90_sass(ck.asm["cubin"])))
    return out


def assert_no_spills_or_hazards(sass: str) -> None:
    assert not re.findall(r"\b(STL|LDL)(\.[A-Z0-9]+)*\b", sass), "register spills"
    assert wgmma_register_hazards(sass) == []


@pytest.mark.slow
@pytest.mark.parametrize("label,tokens,tile,wkw", CROSS, ids=[c[0] for c in CROSS])
def test_prefill_gemms_cross_compile_for_sm90_with_wgmma_and_no_hazards(monkeypatch, label, tokens, tile, wkw):
    from tokenspeed_kernel_nvidia.hopper.moe import prefill

    tiles = None if tile is None else (prefill.PrefillTile(*tile), prefill.PrefillTile(*tile))
    for kwargs, ck, ptx, sass in compiled_gemms(monkeypatch, tokens, tiles, **wkw):
        bt, stages = kwargs["BLOCK_T"], kwargs["STAGES"]
        chunks = kwargs.get("CHUNKS", 1)
        ring = stages * bt * chunks * 64 * 2
        # The down epilogue converts the fp32 accumulator's layout through shared memory (after the
        # ring is dead with one chunk; next to it with two, as ptxas places it).
        scratch = 0 if kwargs["GATE_UP"] else kwargs["BLOCK_M"] * bt * 4
        bound = max(ring, scratch) if chunks == 1 else ring + scratch
        assert ring <= ck.metadata.shared <= bound + 1024, (ck.metadata.shared, ring, scratch)
        assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{bt}k16\.f32\.bf16\.bf16", ptx)
        assert "cp.async.bulk.tensor.2d" in ptx  # the activations by TMA
        assert "mul.rn.bf16x2" in ptx  # the E8M0 scale on decoded pairs
        assert "HGMMA.64x" in sass
        assert_no_spills_or_hazards(sass)


# -- on the H200 ----------------------------------------------------------------------------

GPU_CASES = [
    ("120b_T600", 128, 600, {}, "random", None),
    ("120b_T3000", 128, 3000, {}, "random", None),
    ("120b_T4096_table_two_steps_two_stages", 128, 4096, {}, "random", None),
    ("20b_T700", 32, 700, {}, "random", None),
    ("120b_T300_one_hot_expert", 128, 300, {}, "hot", None),
    ("no_bias_not_interleaved_T300", 128, 300, {"bias": False, "interleaved": False}, "random", None),
    ("scales_above_128_T300", 128, 300, {"scale_hi": 140}, "random", None),
    ("prefill_tiles_T5_empty_experts", 128, 5, {}, "random", (128, 16, 8, 4)),
    ("four_warps_T400", 128, 400, {}, "random", (64, 64, 4, 3)),
    ("two_stages_T600", 128, 600, {}, "random", (128, 128, 8, 2)),
    # Two K steps a round: 45 steps (a tail step) at 2880, 16 (none) at 1024.
    ("unroll_2_T600", 128, 600, {}, "random", (128, 32, 8, 4, 2)),
    ("unroll_2_bt128_T3000", 128, 3000, {}, "random", (128, 128, 8, 4, 2)),
    ("unroll_2_h1024_T500", 32, 500, {"hidden": 1024}, "random", (128, 16, 8, 2, 2)),
    ("unroll_4_T600", 128, 600, {}, "random", (64, 16, 4, 4, 4)),
    ("unroll_4_h448_T300", 32, 300, {"hidden": 448}, "random", (64, 32, 4, 8, 4)),
    # Two chunks a program: experts with one chunk (the one-chunk loop), two, and more (several programs).
    ("chunks_2_unroll_2_T1024", 128, 1024, {}, "random", (64, 32, 4, 2, 2, 2)),
    ("chunks_2_unroll_4_one_hot_expert_T300", 128, 300, {}, "hot", (64, 16, 4, 4, 4, 2)),
    ("chunks_2_unroll_1_20b_T500", 32, 500, {"bias": False, "interleaved": False}, "random", (64, 64, 4, 3, 1, 2)),
    ("chunks_2_bt64_8_warps_T4096", 128, 4096, {}, "random", (128, 64, 8, 2, 2, 2)),
    # 32 weight rows a warp: two wgmma M blocks per warpgroup on each activation tile.
    ("rows_32_a_warp_T1024", 128, 1024, {}, "random", (128, 64, 4, 2, 2)),
    ("rows_32_a_warp_unroll_4_one_hot_expert_T300", 128, 300, {}, "hot", (128, 16, 4, 4, 4)),
    ("rows_32_a_warp_chunks_2_20b_T2048", 32, 2048, {}, "random", (128, 32, 4, 2, 2, 2)),
    (
        "rows_32_a_warp_8_warps_no_bias_T600",
        128,
        600,
        {"bias": False, "interleaved": False},
        "random",
        (256, 64, 8, 2, 2),
    ),
    ("rows_32_a_warp_unroll_1_h448_T300", 32, 300, {"hidden": 448}, "random", (128, 32, 4, 3, 1)),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("label,e,tokens,wkw,routing,tile", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_prefill_matches_the_reference_and_replays_in_a_graph(label, e, tokens, wkw, routing, tile, layout):
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    tk.load_plugins()
    tiles = None if tile is None else (layer.PrefillTile(*tile), layer.PrefillTile(*tile))
    canonical, x, topk_w, topk_ids, _ = gpu_inputs(e, tokens, wkw, routing)
    w, name = in_layout(canonical, layout)

    def run(out=None):
        if tiles is None:
            return tk.moe_apply(x, topk_w, topk_ids, w, GPT_OSS, out=out, override=name)
        return layer.moe_apply(x, topk_w, topk_ids, w, GPT_OSS, out=out, tiles=tiles)

    check_on_gpu(run, _reference(x, topk_w, topk_ids, canonical, GPT_OSS))


def check_on_gpu(run, ref, bound=1e-2):
    """``run(out=None)`` within ``bound`` (relative Frobenius) of ``ref``, bit-identical on a second
    call (deterministic: no atomics) and under a CUDA-graph replay into ``out``."""
    got = run()
    err = ((got.float() - ref).norm() / ref.norm()).item()
    assert err < bound, err
    assert torch.equal(run(), got)
    graph = torch.cuda.CUDAGraph()
    out = torch.empty_like(got)
    with torch.cuda.graph(graph):
        run(out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, got)

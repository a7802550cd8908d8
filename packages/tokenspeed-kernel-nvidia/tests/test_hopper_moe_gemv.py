"""The CUDA-core path of ``hopper.moe_apply`` (``hopper/moe/gemv.py``, :class:`GemvTile`): its tiles' argument
checks, its arithmetic under Triton's interpreter against an independent float64 emulation, and its kernels
cross-compiled for sm_90 (the bf16x2 scale multiply, one FFMA a value, no spills). Its GPU numerics and graph
replay are in ``test_hopper_moe.py``'s GPU tests (``layout="gemv"`` cases)."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import replace

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.reference.moe import dequantize_expert_weights

sys.path.insert(0, os.path.dirname(__file__))
from test_hopper_moe import GPT_OSS, _weights

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def test_gemv_tile_arguments_raise_naming_the_field():
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile

    assert GemvTile(16, 8) == (16, 8, 4)
    for kwargs, name in (({"rows": 12, "blocks": 8}, "rows"), ({"rows": 16, "blocks": 0}, "blocks"),
                         ({"rows": 16, "blocks": 8, "warps": 3}, "warps"), ({"rows": 1, "blocks": 8}, "rows"),
                         ({"rows": 16, "blocks": 8, "warps": 32}, "warps"), ({"rows": 16.0, "blocks": 8}, "rows")):  # fmt: skip
        with pytest.raises(ValueError, match=f"^{name}: "):
            GemvTile(**kwargs)
    from tokenspeed_kernel_nvidia.hopper.moe import layer
    from tokenspeed_kernel_nvidia.hopper.moe.layer import DecodeTile

    w = _weights(2, 64, 64)
    x = torch.zeros(1, 64, dtype=torch.bfloat16)
    mixed = (GemvTile(16, 8), DecodeTile(32, 8, 1))
    ids = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(TypeError, match="^tiles: .*GemvTile"):
        layer.moe_apply(x, torch.ones(1, 2), ids, w, GPT_OSS, tiles=mixed)
    # Experts 34 bytes apart (rows of 32 bytes, contiguous within an expert): not whole 32-bit words.
    odd = replace(w, w13=torch.zeros(2, 128 * 32 + 2, dtype=torch.uint8)[:, : 128 * 32].view(2, 128, 32))
    with pytest.raises(ValueError, match="^w13: .*multiples of 4"):
        layer.moe_apply(x, torch.ones(1, 2), ids, odd, GPT_OSS, tiles=(GemvTile(16, 2), GemvTile(8, 2)))


def _bf16_trunc(v: torch.Tensor) -> torch.Tensor:
    """float64 -> float32 -> bf16 by truncation (Triton's interpreter converts to bf16 so), as float64."""
    return (v.float().view(torch.int32) & -65536).view(torch.float32).double()


def _emulate(x, tw, ids, w, act):
    """The path's arithmetic in float64 from the dequantized weights (:func:`dequantize_expert_weights`, the
    reference's decode), ``inter`` rounded to bf16 as the kernels store it (by truncation, as the interpreter does)."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e = int(ids[t, s])
            w13, w2 = dequantize_expert_weights(w, e)
            g = x[t].double() @ w13.double().T
            if w.w13_bias is not None:
                g += w.w13_bias[e].double()
            gate, up = (g[0::2], g[1::2]) if w.gate_up_interleaved else (g[: w.intermediate], g[w.intermediate :])
            gate, up = gate.clamp(max=act.limit), up.clamp(-act.limit, act.limit)
            h = _bf16_trunc((up + act.up_offset) * gate * torch.sigmoid(act.alpha * gate))
            y = h @ w2.double().T
            if w.w2_bias is not None:
                y += w.w2_bias[e].double()
            out[t] += float(tw[t, s]) * y
    return out


# fmt: off
CASES = [  # experts, hidden, intermediate, tokens, slots, weights' keywords, (gate/up tile, down tile)
    ("T1_k4", 4, 128, 64, 1, 4, {}, ((8, 2, 4), (4, 2, 4))),
    ("T2_k3_not_interleaved_no_bias", 6, 192, 128, 2, 3, {"interleaved": False, "bias": False},
     ((16, 4, 4), (2, 1, 2))),
    ("T1_k4_scales_above_128", 4, 128, 64, 1, 4, {"scale_hi": 140}, ((8, 2, 4), (4, 2, 4))),
    ("T3_k4_packed", 8, 128, 192, 3, 4, {"packed": True}, ((4, 2, 1), (8, 4, 4))),
    ("T2_k2_packed_scales_above_128", 4, 192, 64, 2, 2, {"packed": True, "scale_hi": 140}, ((8, 8, 4), (4, 2, 4))),
]
# fmt: on


@pytest.mark.skipif(not INTERPRET, reason="runs the kernels under Triton's interpreter (TRITON_INTERPRET=1)")
@pytest.mark.parametrize("label,e,h,i,t,k,wkw,tiles", CASES, ids=[c[0] for c in CASES])
def test_interpreted_path_equals_the_float64_emulation(label, e, h, i, t, k, wkw, tiles):
    from tokenspeed_kernel_nvidia.hopper.moe import layer
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile

    w = _weights(e, h, i, **wkw)
    # The packed layout holds the same values: the emulation reads the canonical weights of the same seed.
    canonical = _weights(e, h, i, **{**wkw, "packed": False}) if wkw.get("packed") else w
    g = torch.Generator().manual_seed(t * 10 + k)
    x = torch.randn(t, h, generator=g).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    tw = torch.rand(t, k, generator=g)
    got = layer.moe_apply(x, tw, ids, w, GPT_OSS, tiles=tuple(GemvTile(*v) for v in tiles), graphs=False)
    want = _emulate(x, tw, ids, canonical, GPT_OSS)
    # Each output within one bf16 step of the emulation (the output's own rounding); every other step is exact.
    ulp = torch.exp2(torch.floor(torch.log2(want.abs().clamp(min=2.0**-100))) - 7)
    assert ((got.double() - want).abs() <= ulp).all(), ((got.double() - want).abs() / ulp).max()


def test_sass_loop_counts_takes_the_innermost_loop_holding_the_opcode():
    from tokenspeed_kernel.testing import sass_loop_counts

    ins = "--:-:-:-:1\t{}"
    sass = "\n".join([
        ins.format("S2R R0, SR_TID.X;"),
        "LBB0:",
        ins.format("IMAD R1, R0, R0, RZ;"),
        "LBB1:",
        ins.format("FFMA R2, R1, R1, R2;"),
        ins.format("@P0 FFMA R3, R1, R2, R3;"),
        ins.format("@P1 BRA LBB1;"),
        ins.format("FADD R4, R2, R3;"),
        ins.format("@P2 BRA LBB0;"),
        ins.format("EXIT;"),
    ])  # fmt: skip
    c = sass_loop_counts(sass, "FFMA")
    assert c == {"before": 2, "loop": 3, "after": 3, "mix": {"FFMA": 2, "BRA": 1}}
    assert sass_loop_counts(sass, "IMAD")["loop"] == 6  # the outer loop: the inner one has no IMAD
    with pytest.raises(ValueError, match="HMMA"):
        sass_loop_counts(sass, "HMMA")


@pytest.mark.slow
@pytest.mark.parametrize("packed", [False, True], ids=["canonical", "packed"])
@pytest.mark.parametrize("two_step", [False, True], ids=["one_step", "two_step"])
def test_kernels_cross_compile_for_sm90_with_bf16x2_scales_and_one_ffma_a_value(monkeypatch, packed, two_step):
    pytest.importorskip("triton")
    from triton.tools.disasm import get_sass

    from tokenspeed_kernel.testing import compile_launch, sass_loop_counts
    from tokenspeed_kernel_nvidia.hopper.moe import gemv, layer
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile

    calls = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append((grid, a, kw))

    monkeypatch.setattr(layer, "moe_gemv", Recorder())
    monkeypatch.setattr(layer.triton.knobs.runtime, "interpret", False)
    w = _weights(32, 2880, 2880, packed=packed, scale_hi=140 if two_step else 128)
    x = torch.randn(1, 2880).to(torch.bfloat16)
    tw, ids = tk.moe_route(torch.randn(1, 32), 4, solution="reference")
    tiles = (GemvTile(16, 8, 4), GemvTile(8, 8, 4))
    layer.moe_apply(x, tw, ids, w, GPT_OSS, tiles=tiles, graphs=False)
    assert [kw["GATE_UP"] for _, _, kw in calls] == [True, False]
    assert all(kw["ASM"] and kw["TWO_STEP"] == two_step and kw["PACKED"] == packed for _, _, kw in calls)
    for (_, args, kwargs), tile in zip(calls, tiles):
        ck = compile_launch(gemv.moe_gemv, args, dict(kwargs), "sm90")
        assert "mul.rn.bf16x2" in ck.asm["ptx"]
        sass = get_sass(ck.asm["cubin"])
        assert not re.search(r"\b(STL|LDL)\b", sass), "register spills"
        mix = sass_loop_counts(sass, "FFMA")["mix"]
        slots = kwargs["SLOTS"]
        values_per_thread = slots * tile[0] * tile[1] * 32 // (32 * tile[2])
        assert mix["FFMA"] == values_per_thread, (mix["FFMA"], values_per_thread)
        # The scale multiply: one bf16x2 multiply a value pair (two with TWO_STEP); ptxas may emit it as HFMA2.
        hmul = mix.get("HMUL2", 0) + mix.get("HFMA2", 0)
        assert hmul >= values_per_thread // 2 * (2 if two_step else 1), hmul


# fmt: off
GPU_CASES = [  # label, experts, tokens, weights' keywords, routing, layout, (gate/up tile, down tile)
    ("20b_T1", 32, 1, {}, "random", "canonical", ((16, 16, 4), (8, 8, 4))),
    ("20b_T2_packed", 32, 2, {}, "random", "packed", ((16, 16, 4), (8, 8, 4))),
    ("120b_T1_packed", 128, 1, {}, "random", "packed", ((32, 8, 4), (4, 16, 4))),
    ("20b_T4_one_hot_expert", 32, 4, {}, "hot", "canonical", ((16, 8, 4), (8, 8, 4))),
    ("20b_T3_no_bias_not_interleaved", 32, 3, {"bias": False, "interleaved": False}, "random", "canonical",
     ((32, 16, 8), (8, 16, 8))),
    ("20b_T2_scales_above_128", 32, 2, {"scale_hi": 140}, "random", "packed", ((16, 16, 4), (4, 16, 4))),
]
# fmt: on


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("label,e,tokens,wkw,routing,layout,tiles", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_path_matches_the_reference_and_replays_in_a_graph(label, e, tokens, wkw, routing, layout, tiles):
    from test_hopper_moe import _reference, assert_replays_in_a_graph, gpu_inputs, in_layout

    from tokenspeed_kernel_nvidia.hopper.moe import layer
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile

    tk.load_plugins()
    tiles = tuple(GemvTile(*v) for v in tiles)
    canonical, x, topk_w, topk_ids, _ = gpu_inputs(e, tokens, dict(wkw), routing)
    w, _ = in_layout(canonical, layout)

    def run(out=None):
        return layer.moe_apply(x, topk_w, topk_ids, w, GPT_OSS, out=out, tiles=tiles)

    got = run()
    ref = _reference(x, topk_w, topk_ids, canonical, GPT_OSS)
    err = ((got.float() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err  # bf16 activations and intermediate, as the MMA path
    mma = layer.moe_apply(x, topk_w, topk_ids, w, GPT_OSS, graphs=False)
    assert ((got.float() - mma.float()).norm() / ref.norm()).item() < 1e-2
    assert torch.equal(run(), got)  # deterministic
    assert_replays_in_a_graph(run, got)


@pytest.mark.skipif(not INTERPRET, reason="runs the kernels under Triton's interpreter (TRITON_INTERPRET=1)")
def test_interpreted_path_reads_activations_at_any_offset():
    """The kernels read x as int32 words: a row that starts mid-word (an odd element offset) is copied first."""
    from tokenspeed_kernel_nvidia.hopper.moe import layer
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile

    w = _weights(4, 64, 64)
    g = torch.Generator().manual_seed(5)
    big = torch.randn(2, 65, generator=g).to(torch.bfloat16)
    x = big[:, 1:]  # storage offset 1, row stride 65
    ids = torch.tensor([[0, 2], [3, 1]], dtype=torch.int32)
    tw = torch.rand(2, 2, generator=g)
    tiles = (GemvTile(4, 2), GemvTile(2, 2))
    got = layer.moe_apply(x, tw, ids, w, GPT_OSS, tiles=tiles, graphs=False)
    assert torch.equal(got, layer.moe_apply(x.contiguous(), tw, ids, w, GPT_OSS, tiles=tiles, graphs=False))

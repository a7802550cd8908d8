"""The grouped MoE GEMMs (``cdna.moe_grouped``) compile for gfx950 and gfx942, with no GPU.

Each case plans the grouped path exactly as the host does (``fused.moe_launches`` on
CPU tensors of GPT-OSS shapes: E = 128, k = 4, H = I = 2880, with ``T`` chosen so that
every tile of ``GROUPED_TILES`` is picked) and compiles both launches for the arch,
with the argument specialisation a GPU launch would get. The AMDGCN must contain:

- exactly the intended MFMA: on gfx950 with FP8 activations the scaled
  ``v_mfma_scale_f32_16x16x128_f8f6f4`` (``32x32x64`` for ``BLOCK_K = 64``) fed with
  the packed E2M1 weights; otherwise (gfx942, or 16-bit activations) the 16-bit MFMA
  of the arch on weights decoded in registers (16x16 below ``BLOCK_M = 64``, 32x32
  from there);
- buffer loads, and on gfx950 direct-to-LDS buffer loads of the weight tiles
  (gfx942 has none: it prefetches into registers);
- no register spills: the bound is 0 VGPR and 0 SGPR spills, what every case measures
  today with Triton 3.6;
- LDS within the arch's budget.

Compiles take about a second each on a CPU.
"""

from __future__ import annotations

import pytest
import torch

from tokenspeed_kernel.testing import amdgcn_stats, compile_launch
from tokenspeed_kernel_amd.cdna.arch import ARCHS
from tokenspeed_kernel_amd.moe import fused
from tokenspeed_kernel_amd.moe.schedule import GROUPED_TILES
from tokenspeed_kernel_amd.moe.weights import MxfpMoeWeights, prepare_weights

#: Register spill bounds of the grouped MoE kernels (see the module docstring).
MAX_VGPR_SPILLS = 0
MAX_SGPR_SPILLS = 0

E, TOP_K, HIDDEN, INTER = 128, 4, 2880, 2880
#: Token counts picking each grouped tile (mean rows per expert T * k / E: 2, 32, 64, 128).
TOKENS_BY_BLOCK_M = {16: 64, 32: 1024, 64: 2048, 128: 4096}

#: 16-bit MFMA per (arch, dtype, tile M/N).
MFMA_16BIT = {
    ("gfx950", torch.bfloat16, 16): "v_mfma_f32_16x16x32_bf16",
    ("gfx950", torch.bfloat16, 32): "v_mfma_f32_32x32x16_bf16",
    ("gfx950", torch.float16, 16): "v_mfma_f32_16x16x32_f16",
    ("gfx950", torch.float16, 32): "v_mfma_f32_32x32x16_f16",
    ("gfx942", torch.bfloat16, 16): "v_mfma_f32_16x16x16_bf16",
    ("gfx942", torch.bfloat16, 32): "v_mfma_f32_32x32x8_bf16",
    ("gfx942", torch.float16, 16): "v_mfma_f32_16x16x16_f16",
    ("gfx942", torch.float16, 32): "v_mfma_f32_32x32x8_f16",
}
#: Scaled MFMA (gfx950, FP8 activations) per BLOCK_K.
MFMA_SCALED = {128: "v_mfma_scale_f32_16x16x128_f8f6f4", 64: "v_mfma_scale_f32_32x32x64_f8f6f4"}


def _expected_mfma(arch, fp8, dtype, tiles):
    if arch == "gfx950" and fp8:
        return MFMA_SCALED[tiles.block_k]
    # FP8 activations on gfx942 run the bf16 MFMA on their exact bf16 values.
    return MFMA_16BIT[arch, torch.bfloat16 if fp8 else dtype, 32 if tiles.block_m >= 64 else 16]


@pytest.fixture(scope="module")
def raw_weights():
    """GPT-OSS-shaped MXFP4 experts (uint8 codes and E8M0 scales) and biases, once per module."""
    g = torch.Generator().manual_seed(0)
    w13 = torch.randint(0, 256, (E, 2 * INTER, HIDDEN // 2), dtype=torch.uint8, generator=g)
    s13 = torch.randint(118, 131, (E, 2 * INTER, HIDDEN // 32), dtype=torch.uint8, generator=g)
    w2 = torch.randint(0, 256, (E, HIDDEN, INTER // 2), dtype=torch.uint8, generator=g)
    s2 = torch.randint(118, 131, (E, HIDDEN, INTER // 32), dtype=torch.uint8, generator=g)
    return w13, s13, w2, s2, torch.randn(E, 2 * INTER, generator=g), torch.randn(E, HIDDEN, generator=g)


def _compile_grouped(arch, weights, tokens, *, fp8, dtype=torch.bfloat16):
    """Plan the grouped path as the host does and compile its two launches:
    ``(tiles, launches, [(AmdgcnStats, LDS bytes)])``."""
    torch.manual_seed(0)
    x = torch.randn(tokens, HIDDEN, dtype=dtype)
    logits = torch.randn(tokens, E)
    out = torch.empty_like(x)
    act_scales = (torch.tensor([0.05]), torch.tensor([0.02])) if fp8 else None
    tiles = fused.choose_tiles(tokens, E, TOP_K, decode=False)
    launches, _ = fused.moe_launches(
        x, weights, top_k=TOP_K, router_logits=logits, topk=None, act_scales=act_scales,
        swiglu=(1.702, 7.0, 1.0), out=out, kernels=fused.kernel_set(arch), tiles=tiles,
    )  # fmt: skip
    assert [launch.fn.__name__ for launch in launches] == ["grouped_gate_up", "grouped_down"]
    compiled = []
    for launch in launches:
        kernel = compile_launch(launch.fn, launch.args, launch.kwargs, arch)
        compiled.append((amdgcn_stats(kernel.asm["amdgcn"]), kernel.metadata.shared))
    return tiles, launches, compiled


def _check(arch, fp8, dtype, tiles, compiled):
    expected = _expected_mfma(arch, fp8, dtype, tiles)
    for stats, lds in compiled:
        assert stats.vgpr_spills <= MAX_VGPR_SPILLS, stats
        assert stats.sgpr_spills <= MAX_SGPR_SPILLS, stats
        assert lds <= ARCHS[arch].lds_bytes, (lds, stats)
        assert stats.mfma == {expected}, stats.mfma
        assert stats.buffer_loads > 0, stats
        if arch == "gfx950":
            assert stats.lds_buffer_loads > 0, f"gfx950 weight tiles must be copied straight into LDS: {stats}"
        else:
            assert stats.lds_buffer_loads == stats.lds_global_loads == 0, stats


TILE_IDS = [f"bm{t.block_m}_bk{t.block_k}_w{t.num_warps}" for _, t in GROUPED_TILES]


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
@pytest.mark.parametrize("fp8", [True, False], ids=["w4a8", "w4a16"])
@pytest.mark.parametrize("block_m", [t.block_m for _, t in GROUPED_TILES], ids=TILE_IDS)
def test_grouped_compiles(raw_weights, arch, fp8, block_m):
    weights = prepare_weights(*raw_weights)
    tiles, launches, compiled = _compile_grouped(arch, weights, TOKENS_BY_BLOCK_M[block_m], fp8=fp8)
    assert tiles.block_m == block_m
    gate_up, down = launches
    assert gate_up.kwargs["INTERLEAVED"] is True and gate_up.kwargs["HAS_BIAS"] is True
    assert gate_up.kwargs["ACT_FP8"] is fp8 and down.kwargs["ACT_FP8"] is fp8
    assert gate_up.kwargs["SCALED_MFMA"] is (arch == "gfx950")
    _check(arch, fp8, torch.bfloat16, tiles, compiled)


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
def test_grouped_fp16_without_bias_compiles(raw_weights, arch):
    w13, s13, w2, s2, _, _ = raw_weights
    tiles, launches, compiled = _compile_grouped(arch, prepare_weights(w13, s13, w2, s2), 1024, fp8=False,
                                                 dtype=torch.float16)  # fmt: skip
    assert all(launch.kwargs["HAS_BIAS"] is False for launch in launches)
    _check(arch, False, torch.float16, tiles, compiled)


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
@pytest.mark.parametrize("fp8", [True, False], ids=["w4a8", "w4a16"])
def test_grouped_gate_then_up_rows_compile(raw_weights, arch, fp8):
    """Gate rows ``0 .. I-1`` then up rows (``interleaved=False``, as the checkpoint)."""
    w13, s13, w2, s2, b13, b2 = raw_weights
    weights = MxfpMoeWeights(w13, s13, w2, s2, b13, b2, interleaved=False)
    tiles, launches, compiled = _compile_grouped(arch, weights, 2048, fp8=fp8)
    assert launches[0].kwargs["INTERLEAVED"] is False
    _check(arch, fp8, torch.bfloat16, tiles, compiled)


@pytest.mark.parametrize(
    "tokens,names", [(1, ["decode_gate_up", "decode_down"]), (64, ["grouped_gate_up", "grouped_down"])]
)
def test_vllm_call_on_gfx950_compiles(raw_weights, recorded_launches, tokens, names):
    """vLLM's calling sequence on a (faked) gfx950, up to the launch: the preprocessing on a
    layer with vLLM's attributes, ``gluon_mxfp_fused_moe`` without a target (the device's
    arch), and the recorded launches compiled: W4A8 on the scaled MFMA."""
    import tokenspeed_kernel as tk
    from tokenspeed_kernel_amd.ops.gfx950.moe.mxfp4.fused import gluon_mxfp_fused_moe
    from tokenspeed_kernel_amd.ops.gfx950.moe.mxfp4.weight_preprocess import preprocess_gluon_mxfp4_gfx950_moe_weights

    w13, s13, w2, s2, b13, b2 = raw_weights
    layer = torch.nn.Module()
    for name, t in (("w13_weight", w13), ("w2_weight", w2), ("w13_weight_scale", s13), ("w2_weight_scale", s2),
                    ("w13_weight_bias", b13), ("w2_weight_bias", b2), ("w13_input_scale", torch.full((E,), 0.01)),
                    ("w2_input_scale", torch.full((E,), 0.1))):  # fmt: skip
        setattr(layer, name, torch.nn.Parameter(t, requires_grad=False))
    preprocess_gluon_mxfp4_gfx950_moe_weights({}, layer, preshuffle=True)
    x = torch.randn(tokens, HIDDEN, dtype=torch.bfloat16)
    with tk.fake_platform("gfx950"):
        gluon_mxfp_fused_moe(
            x, torch.randn(tokens, E), layer.w13_weight_triton_tensor, layer.w2_weight_triton_tensor,
            w13_mx_scale=layer.w13_precision_config.b_mx_scale, w2_mx_scale=layer.w2_precision_config.b_mx_scale,
            w13_act_scale=layer.w13_act_scale, w2_act_scale=layer.w2_act_scale, top_k=4,
            w13_bias=layer.w13_weight_bias, w2_bias=layer.w2_weight_bias, out_dtype=torch.bfloat16,
            enable_warp_decode=True, swiglu_alpha=1.702, swiglu_limit=7.0, swiglu_beta=1.0,
        )  # fmt: skip
    assert [launch.fn.__name__ for launch in recorded_launches] == names
    for launch in recorded_launches:
        assert launch.kwargs["ACT_FP8"] is True and launch.kwargs["SCALED_MFMA"] is True
        stats = amdgcn_stats(compile_launch(launch.fn, launch.args, launch.kwargs, "gfx950").asm["amdgcn"])
        assert stats.buffer_loads > 0 and stats.vgpr_spills == stats.sgpr_spills == 0
        if names[0].startswith("grouped"):
            assert stats.mfma == {MFMA_SCALED[launch.kwargs["BLOCK_K"]]}, stats.mfma
        else:
            assert not stats.mfma

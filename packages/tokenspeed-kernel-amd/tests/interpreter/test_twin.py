"""The CDNA MoE's algorithm, run: its portable Triton twin under the interpreter against
an independent PyTorch reference (``tests/_moe_ref.py``), through the same host plan
the Gluon kernels use (``moe.fused``), and vLLM's calling sequence on the twin.

Tolerance: 1e-2 of the largest output (bf16 output rounding, fp32 summation order; in
W4A8 an intermediate value near an E4M3 rounding boundary can land one step away). A
wrong expert, weight, scale or slot gives errors of the order of the output itself.
"""

from __future__ import annotations

import pytest
import torch
from _moe_ref import moe_reference, random_experts

from tokenspeed_kernel_amd.moe import fused, schedule
from tokenspeed_kernel_amd.moe.weights import prepare_weights

E, H, I = 8, 96, 64  # K tails: H and I are not multiples of BLOCK_K (128 / 64)


def _close(out, ref, rel):
    err = (out.float() - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err <= rel * scale, f"max error {err:.4g} vs max |ref| {scale:.4g} (bound {rel * scale:.4g})"


def _scales():
    return torch.tensor([0.02]), torch.tensor([0.03])


@pytest.mark.parametrize("tokens,decode", [(1, True), (5, True), (5, False), (40, False), (200, False)])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-act", "w4a8"])
def test_routed_layer(tokens, decode, fp8):
    torch.manual_seed(tokens)
    raw = random_experts(E, H, I, seed=tokens)
    w = prepare_weights(*raw)
    x = torch.randn(tokens, H, dtype=torch.bfloat16)
    logits = torch.randn(tokens, E)
    a1, a2 = _scales() if fp8 else (None, None)
    out = fused.fused_moe(x, w, top_k=2, router_logits=logits, w13_act_scale=a1, w2_act_scale=a2, decode=decode,
                          target="portable")  # fmt: skip
    tiles = fused.choose_tiles(tokens, E, 2, decode=decode)
    assert tiles.path == ("decode" if decode else "grouped")
    _close(out, moe_reference(x, raw, top_k=2, router_logits=logits, a1=a1, a2=a2), 1e-2)


@pytest.mark.parametrize("tokens", [3, 64])
def test_given_routing_ragged_and_empty_experts(tokens):
    """moe_apply's form: the caller's routing, most experts empty, one hot expert."""
    raw = random_experts(E, H, I, seed=1)
    w = prepare_weights(*raw)
    x = torch.randn(tokens, H, dtype=torch.float16)
    ids = torch.zeros(tokens, 3, dtype=torch.int32)
    ids[:, 1] = 5
    ids[::3, 2] = 7
    ids[1::3, 2] = 2
    ids[2::3, 2] = 6
    wts = torch.softmax(torch.randn(tokens, 3), dim=-1)
    out = fused.fused_moe(x, w, top_k=3, topk_weights=wts, topk_ids=ids, target="portable")
    assert out.dtype == torch.float16
    _close(out, moe_reference(x, raw, top_k=3, topk=(wts, ids)), 1e-2)


def test_concatenated_gate_up_no_bias_no_clamp():
    raw = random_experts(E, H, I, bias=False, seed=2)
    w13, s13, w2, s2, _, _ = raw
    # The same experts with gate rows first: prepare_weights interleaves them back.
    cat13 = torch.cat((w13[:, 0::2], w13[:, 1::2]), dim=1)
    cats13 = torch.cat((s13[:, 0::2], s13[:, 1::2]), dim=1)
    w = prepare_weights(cat13, cats13, w2, s2, interleaved=False)
    assert torch.equal(w.w13, w13) and torch.equal(w.w13_scale, s13)
    x = torch.randn(20, H, dtype=torch.bfloat16)
    logits = torch.randn(20, E)
    out = fused.fused_moe(x, w, top_k=2, router_logits=logits, swiglu_limit=None, swiglu_alpha=1.0, swiglu_beta=0.0,
                          target="portable")  # fmt: skip
    ref = moe_reference(x, (cat13, cats13, w2, s2, None, None), top_k=2, router_logits=logits, limit=None, alpha=1.0,
                        beta=0.0, interleaved=False)  # fmt: skip
    _close(out, ref, 1e-2)


def test_decode_writes_the_routing():
    """The decode kernel routes in its prologue; its ids / weights equal the reference routing."""
    raw = random_experts(E, H, I, seed=3)
    w = prepare_weights(*raw)
    x = torch.randn(4, H, dtype=torch.bfloat16)
    logits = torch.randn(4, E)
    logits[0, 3] = logits[0, 6] = 9.0  # a tie: the lower expert first
    out = torch.empty(4, H, dtype=torch.bfloat16)
    launches, finish = fused.moe_launches(
        x, w, top_k=2, router_logits=logits, topk=None, act_scales=None, swiglu=(1.702, 7.0, 1.0), out=out,
        kernels=fused.kernel_set("portable"), tiles=schedule.DECODE_TILES,
    )  # fmt: skip
    for launch in launches:
        launch()
    finish()
    ids, wts = launches[0].args[7], launches[0].args[8]
    ref_w, ref_ids = schedule.route(logits, 2)
    assert ids[0].tolist() == [3, 6]
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(wts, ref_w)


def test_vllm_calling_sequence():
    """vLLM's TokenSpeedMxfp4Experts: a layer with the attributes vLLM loads, the
    preprocessing, then gluon_mxfp_fused_moe with what it reads back (run on the twin)."""
    from tokenspeed_kernel_amd.ops.moe.fused_mxfp_gfx950 import gluon_mxfp_fused_moe
    from tokenspeed_kernel_amd.ops.moe.mxfp4_gfx950_preprocess import preprocess_gluon_mxfp4_gfx950_moe_weights

    w13, s13, w2, s2, _, _ = random_experts(4, 64, 64, bias=False, seed=4)
    layer = torch.nn.Module()
    for name, t in (("w13_weight", w13), ("w2_weight", w2), ("w13_weight_scale", s13), ("w2_weight_scale", s2)):
        setattr(layer, name, torch.nn.Parameter(t.clone(), requires_grad=False))
    layer.w13_input_scale = torch.nn.Parameter(torch.tensor([0.01, 0.02, 0.015, 0.01]), requires_grad=False)
    layer.w2_input_scale = torch.nn.Parameter(torch.full((4,), 0.03), requires_grad=False)
    preprocess_gluon_mxfp4_gfx950_moe_weights({}, layer, preshuffle=True)
    assert not hasattr(layer, "w13_weight") and not hasattr(layer, "w2_weight")
    assert torch.equal(layer.w13_weight_triton_tensor, w13) and torch.equal(layer.w2_weight_triton_tensor, w2)
    assert torch.equal(layer.w13_precision_config.b_mx_scale, s13)
    assert layer.w13_weight_bias.dtype == torch.float32 and not layer.w13_weight_bias.any()
    assert layer.w13_act_scale.tolist() == [pytest.approx(0.02)] and layer.w2_act_scale.tolist() == [
        pytest.approx(0.03)
    ]
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(4, 64, dtype=dtype) / 10
        logits = torch.randn(4, 4)
        out = gluon_mxfp_fused_moe(
            x, logits, layer.w13_weight_triton_tensor, layer.w2_weight_triton_tensor,
            w13_mx_scale=layer.w13_precision_config.b_mx_scale, w2_mx_scale=layer.w2_precision_config.b_mx_scale,
            w13_act_scale=layer.w13_act_scale, w2_act_scale=layer.w2_act_scale, top_k=2,
            w13_bias=layer.w13_weight_bias, w2_bias=layer.w2_weight_bias, out_dtype=x.dtype,
            enable_warp_decode=True, swiglu_alpha=1.702, swiglu_limit=7.0, swiglu_beta=1.0, target="portable",
        )  # fmt: skip
        assert out.dtype == dtype and out.shape == x.shape
        ref = moe_reference(x, (w13, s13, w2, s2, None, None), top_k=2, router_logits=logits,
                            a1=layer.w13_act_scale, a2=layer.w2_act_scale)  # fmt: skip
        # vLLM's own test bound (rtol = atol = 0.1) and ours.
        torch.testing.assert_close(out.float(), ref, rtol=0.1, atol=0.1)
        _close(out, ref, 1e-2)

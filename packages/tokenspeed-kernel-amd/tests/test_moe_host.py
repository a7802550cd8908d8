"""The CDNA MoE's host side on CPU: block schedule, tiles, argument checks, target
resolution, registration and selection (no kernel runs here; the twin runs under
``tests/interpreter``, the Gluon kernels compile in ``test_cross_compile_moe_*``)."""

from __future__ import annotations

import pytest
import torch
from _moe_ref import random_experts

import tokenspeed_kernel as tk
from tokenspeed_kernel.core.registry import registry
from tokenspeed_kernel.ops.moe import MoEActivation, MoEWeights
from tokenspeed_kernel.reference.moe import moe_route
from tokenspeed_kernel_amd.moe import fused, schedule
from tokenspeed_kernel_amd.moe.weights import prepare_weights


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("block_m", [16, 128])
def test_schedule_covers_every_row_once(seed, block_m):
    g = torch.Generator().manual_seed(seed)
    e, k = 16, 4
    tokens = int(torch.randint(1, 300, (1,), generator=g))
    # Skewed routing: a few hot experts, several empty ones.
    ids = torch.randint(0, 5, (tokens, k), generator=g, dtype=torch.int32) * 3
    s = schedule.build_schedule(ids, e, block_m)
    flat = ids.reshape(-1)
    assert torch.equal(flat[s.sorted_rows.long()], torch.sort(flat, stable=True).values)
    counts = torch.bincount(flat.long(), minlength=e)
    assert s.expert_offsets.tolist() == [0, *torch.cumsum(counts, 0).tolist()]
    assert len(s.tile_expert) == schedule.max_tiles(tokens * k, e, block_m)
    covered = torch.zeros(tokens * k, dtype=torch.int64)
    seen_invalid = False
    for ex, start in zip(s.tile_expert.tolist(), s.tile_start.tolist(), strict=True):
        if ex < 0:
            seen_invalid = True
            continue
        assert not seen_invalid, "valid tiles come first"
        lo, hi = s.expert_offsets[ex].item(), s.expert_offsets[ex + 1].item()
        assert lo <= start < hi and (start - lo) % block_m == 0
        covered[start : min(start + block_m, hi)] += 1
    assert torch.all(covered == 1)
    # Empty experts get no tile; the count is exactly the sum of ceil(rows / block_m).
    assert int((s.tile_expert >= 0).sum()) == int(((counts + block_m - 1) // block_m).sum())


def test_tiles_follow_token_count():
    assert schedule.choose_tiles(1, 128, 4) is schedule.DECODE_TILES
    assert schedule.choose_tiles(8, 128, 4).path == "decode"
    assert schedule.choose_tiles(8, 128, 4, decode=False).path == "grouped"
    picked = [schedule.choose_tiles(t, 128, 4).block_m for t in (9, 512, 1024, 2048, 16384)]
    assert picked == sorted(picked) and picked[0] == 16 and picked[-1] == 128


def _weights(**kw):
    return prepare_weights(*random_experts(8, 64, 64, **kw))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(top_k=0), "top_k"),
        (dict(top_k=9), "top_k"),
        (dict(w13_act_scale=torch.tensor([0.1])), "give both"),
        (dict(w13_act_scale=torch.tensor([0.1, 0.2]), w2_act_scale=torch.tensor([0.1])), "w13_act_scale"),
        (dict(out_dtype=torch.float32), "out_dtype"),
        (dict(topk_ids=torch.zeros(3, 2, dtype=torch.int32)), "not both"),
        (dict(target="gfx90a"), "target"),
    ],
)
def test_argument_errors_name_the_argument(kwargs, match):
    w = _weights()
    base = dict(top_k=2, router_logits=torch.randn(3, 8), target="portable")
    base.update(kwargs)
    with pytest.raises((TypeError, ValueError), match=match):
        fused.fused_moe(torch.randn(3, 64, dtype=torch.bfloat16), w, **base)


def test_weight_shape_errors():
    w13, s13, w2, s2, b13, b2 = random_experts(4, 64, 64)
    with pytest.raises(ValueError, match="w13_scale"):
        prepare_weights(w13, s13[:, :, :1], w2, s2)
    with pytest.raises(ValueError, match="w2_bias"):
        prepare_weights(w13, s13, w2, s2, b13, b2[:, :8])
    with pytest.raises(ValueError, match="multiples of 32"):
        prepare_weights(w13[:, :, :8], s13, w2, s2)


def test_target_needs_a_cdna_device():
    w = _weights()
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="target='portable'"):
        fused.fused_moe(x, w, top_k=2, router_logits=torch.randn(2, 8))
    with tk.fake_platform("gfx950"):
        assert fused.resolve_target(x.device, None) == "gfx950"
    with tk.fake_platform("gfx942"):
        assert fused.resolve_target(x.device, None) == "gfx942"


def test_vllm_preprocess_errors():
    from tokenspeed_kernel_amd.ops.moe.mxfp4_gfx950_preprocess import preprocess_gluon_mxfp4_gfx950_moe_weights

    w13, s13, w2, s2, _, _ = random_experts(4, 64, 64, bias=False)

    def layer(**skip):
        m = torch.nn.Module()
        for name, t in (("w13_weight", w13), ("w2_weight", w2), ("w13_weight_scale", s13), ("w2_weight_scale", s2),
                        ("w13_input_scale", torch.ones(4)), ("w2_input_scale", torch.ones(4))):  # fmt: skip
            if name not in skip:
                setattr(m, name, torch.nn.Parameter(t.clone(), requires_grad=False))
        return m

    with pytest.raises(ValueError, match="w2_input_scale"):
        preprocess_gluon_mxfp4_gfx950_moe_weights({}, layer(w2_input_scale=1))
    with pytest.raises(ValueError, match="preshuffle"):
        preprocess_gluon_mxfp4_gfx950_moe_weights({}, layer(), preshuffle=False)
    with pytest.raises(ValueError, match="internal_activation_dtype"):
        preprocess_gluon_mxfp4_gfx950_moe_weights({"internal_activation_dtype": "bf16"}, layer())
    with pytest.warns(UserWarning, match="not used"):
        preprocess_gluon_mxfp4_gfx950_moe_weights({"something": 1}, layer())
    m = layer()
    m.w13_input_layout = "concatenated"
    preprocess_gluon_mxfp4_gfx950_moe_weights({}, m)
    i = w13.shape[1] // 2
    assert torch.equal(m.w13_weight_triton_tensor[:, 0::2], w13[:, :i])  # gate rows first -> interleaved


def _canonical(bias=True):
    w13, s13, w2, s2, b13, b2 = random_experts(8, 64, 64, bias=bias)
    return MoEWeights(w13=w13, w2=w2, format="mxfp4", w13_scale=s13, w2_scale=s2, w13_bias=b13, w2_bias=b2)


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
def test_moe_apply_selects_the_cdna_kernel(arch, recorded_launches):
    """Our own selection on a (faked) AMD GPU: plan, weight conversion, and the call's launches."""
    w = _canonical()
    act = MoEActivation()
    tw, ids = moe_route(torch.randn(40, 8), 2, renormalize=True)
    with tk.fake_platform(arch):
        plan = tk.moe_plan(w, act)
        assert plan.kernel == f"amd.{arch}.moe_apply" and plan.layout == "amd.cdna.mxfp4"
        pw = tk.moe_process_weights(plan, w)
        x = torch.randn(40, 64, dtype=torch.bfloat16)
        tk.moe_apply(x, tw, ids, pw, act, plan=plan)
    names = [launch.fn.__name__ for launch in recorded_launches]
    assert names == ["grouped_gate_up", "grouped_down"]
    assert recorded_launches[0].kwargs["SCALED_MFMA"] is (arch == "gfx950")
    assert recorded_launches[0].kwargs["ACT_FP8"] is False  # moe_apply: activations in x's dtype


def test_registrations_say_not_run_on_hardware():
    assert tk.plugin_reports()["amd"].status == "loaded"
    specs = [s for s in registry.for_op("moe_apply") if s.name.startswith("amd.")]
    assert {s.name for s in specs} == {"amd.gfx950.moe_apply", "amd.gfx942.moe_apply"}
    assert all(s.hardware_validated is False for s in specs)

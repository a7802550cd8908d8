"""OpenAI triton_kernels MoE: registration and weight layout on a CPU; numerics at GPT-OSS shapes on a GPU."""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
import torch

import tokenspeed_kernel as tk

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton_kernels") is None, reason="tokenspeed-triton-kernels is not installed"
)
NAME = "triton_kernels.moe_apply"
GPT_OSS = tk.MoEActivation()  # swiglu, alpha 1.702, limit 7, up + 1
SM90 = tk.make_platform("sm90", device_name="NVIDIA H200")


def _weights(e: int, h: int, i: int, *, interleaved: bool = True, device="cpu", seed: int = 0) -> tk.MoEWeights:
    g = torch.Generator(device="cpu").manual_seed(seed)
    w13 = torch.randn(e, 2 * i, h, generator=g) * 3 / h**0.5
    w2 = torch.randn(e, h, i, generator=g) / i**0.5
    q13, s13 = tk.quantize_mxfp4(w13, solution="reference")
    q2, s2 = tk.quantize_mxfp4(w2, solution="reference")
    return tk.MoEWeights(
        w13=q13.to(device), w2=q2.to(device), format="mxfp4", w13_scale=s13.to(device), w2_scale=s2.to(device),
        w13_bias=(0.1 * torch.randn(e, 2 * i, generator=g)).to(torch.bfloat16).to(device),
        w2_bias=(0.1 * torch.randn(e, h, generator=g)).to(torch.bfloat16).to(device),
        gate_up_interleaved=interleaved,
    )  # fmt: skip


def _candidates(traits: dict, platform=SM90, sig=("bf16", "mxfp4")) -> dict:
    return {c.name: c for c in tk.explain_selection("moe_apply", sig, traits, platform=platform)}


def test_registered_as_the_peer_for_gpt_oss_mxfp4_on_hopper_only():
    tk.load_plugins()
    spec = tk.registry.get(NAME)
    assert spec is not None and spec.peer and spec.band == "PERFORMANT" and spec.source == "nvidia"
    assert spec.weight_layout == NAME and spec.weight_preprocessor is not None
    gpt_oss = {"activation": "swiglu", "clamp": True, "bias": True, "gate_up_interleaved": True, "layout": NAME}
    assert _candidates(gpt_oss)[NAME].eligible
    assert (
        _candidates({**gpt_oss, "layout": "canonical"})[NAME].reason == f"trait layout='canonical' (supports {NAME!r})"
    )
    assert "activation='silu'" in _candidates({**gpt_oss, "activation": "silu", "clamp": False})[NAME].reason
    # Its fused SwiGLU computes up + 1: another offset goes to a kernel that takes it.
    assert _candidates({**gpt_oss, "up_offset": 0.5})[NAME].reason == "trait up_offset=0.5 (supports 1.0)"
    assert "formats x=fp16" in _candidates(gpt_oss, sig=("fp16", "mxfp4"))[NAME].reason
    sm100 = tk.make_platform("sm100")
    assert _candidates(gpt_oss, platform=sm100)[NAME].reason == "needs arch <= sm90, platform is sm100"


def _unswizzle(data: torch.Tensor, layout, shape: list[int], fp4: bool) -> torch.Tensor:
    from tokenspeed_kernel_nvidia.triton_kernels.moe import _tk

    t = _tk.tensor.Tensor(_tk.tensor.Storage(data, layout), dtype=_tk.tensor.FP4 if fp4 else _tk.tensor.UINT8,
                          shape=shape)  # fmt: skip
    return _tk.tensor.convert_layout(t, _tk.tensor_details.layout.StridedLayout(-2)).storage.data


def test_preprocess_converts_to_the_hopper_layouts_losslessly_and_interleaves_gate_up():
    from tokenspeed_kernel_nvidia.triton_kernels import moe

    e, h, i = 3, 64, 96
    w = _weights(e, h, i)
    p = moe.preprocess_weights(w)
    assert p.extra == (e, h, i) and p.gate_up_interleaved and p.w13_bias.dtype == torch.float32
    assert p.num_experts == e
    # Back from the library's Hopper layouts to the canonical codes and scales: every byte kept.
    back13 = _unswizzle(p.w13, moe._value_layout(), [e, h, 2 * i], fp4=True)
    back2 = _unswizzle(p.w2, moe._value_layout(), [e, i, h], fp4=True)
    assert torch.equal(back13, w.w13.transpose(-2, -1)) and torch.equal(back2, w.w2.transpose(-2, -1))
    s13 = _unswizzle(p.w13_scale, moe._scale_layout(), [e, h // 32, 2 * i], fp4=False)
    assert torch.equal(s13, w.w13_scale.transpose(-2, -1))
    assert torch.equal(p.w13_bias, w.w13_bias.float()) and torch.equal(p.w2_bias, w.w2_bias.float())
    # [gate; up] halves become the interleaved pairs the fused SwiGLU reads.
    halves = replace(
        w,
        w13=torch.cat((w.w13[:, 0::2], w.w13[:, 1::2]), 1),
        w13_scale=torch.cat((w.w13_scale[:, 0::2], w.w13_scale[:, 1::2]), 1),
        w13_bias=torch.cat((w.w13_bias[:, 0::2], w.w13_bias[:, 1::2]), 1),
        gate_up_interleaved=False,
    )
    q = moe.preprocess_weights(halves)
    assert torch.equal(q.w13, p.w13) and torch.equal(q.w13_scale, p.w13_scale) and torch.equal(q.w13_bias, p.w13_bias)
    with pytest.raises(ValueError, match="takes mxfp4 weights"):
        moe.preprocess_weights(replace(w, format="bf16"))


def test_moe_plan_on_hopper_picks_its_layout_when_forced_and_process_weights_converts():
    tk.load_plugins()
    w = _weights(2, 64, 64)
    with tk.fake_platform(SM90):
        plan = tk.moe_plan(w, GPT_OSS, dtype=torch.bfloat16, device="cpu", override=NAME)
    assert plan.kernel == NAME and plan.layout == NAME
    p = tk.moe_process_weights(plan, w)
    assert p.layout == NAME and p.extra == (2, 64, 64)


# -- on the H200 --------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("tokens", [1, 7, 64, 333])
def test_gpu_matches_the_reference_at_gpt_oss_20b_shapes(tokens):
    tk.load_plugins()
    e, h, i, k = 32, 2880, 2880, 4
    w = _weights(e, h, i, device="cuda", seed=tokens)
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, h, device="cuda", generator=g).to(torch.bfloat16)
    topk_w, topk_ids = tk.moe_route(torch.randn(tokens, e, device="cuda", generator=g), k, solution="reference")
    plan = tk.moe_plan(w, GPT_OSS, dtype=torch.bfloat16, override=NAME)
    packed = tk.moe_process_weights(plan, w)
    got = tk.moe_apply(x, topk_w, topk_ids, packed, GPT_OSS, plan=plan, override=NAME)
    ref = tk.moe_apply(x.float(), topk_w, topk_ids, replace(w, w13_bias=w.w13_bias.float(), w2_bias=w.w2_bias.float()),
                       GPT_OSS, solution="reference")  # fmt: skip
    err = ((got.float() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err  # bf16 activations through two GEMMs: ~3e-3 expected
    # Graph-capturable: the same result replayed.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = tk.moe_apply(x, topk_w, topk_ids, packed, GPT_OSS, plan=plan, override=NAME)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, got)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_eager_calls_replay_a_graph_equal_to_the_direct_path():
    """Eager calls of <= GRAPH_MAX_TOKENS tokens replay a captured graph: bit-identical to running the
    library directly. Per token count: the first call runs directly, the second (other tensors) captures the
    copying graph, the third replays it on new inputs; the third's tensors again (their addresses recurring)
    capture the graph that reads them in place, which then replays new values written at those addresses."""
    from tokenspeed_kernel_nvidia.triton_kernels import moe as tkm

    tk.load_plugins()
    e, h, i, k = 32, 2880, 2880, 4
    w = _weights(e, h, i, device="cuda", seed=5)
    plan = tk.moe_plan(w, GPT_OSS, dtype=torch.bfloat16, override=NAME)
    packed = tk.moe_process_weights(plan, w)
    before = tkm._GRAPHS.captures
    held = []  # every call's tensors stay alive: no address recurs by reuse
    for tokens in (1, 4, 64):
        for seed in (0, 1, 2, 3):
            g = torch.Generator(device="cuda").manual_seed(seed * 100 + tokens)
            if seed < 3:
                x = torch.randn(tokens, h, device="cuda", generator=g).to(torch.bfloat16)
                topk_w, topk_ids = tk.moe_route(torch.randn(tokens, e, device="cuda", generator=g), k)
                held.append((x, topk_w, topk_ids))
            else:  # seed 2's tensors again, then new values in them
                x, topk_w, topk_ids = held[-1]
            for _ in range(2 if seed == 3 else 1):
                got = tk.moe_apply(x, topk_w, topk_ids, packed, GPT_OSS, plan=plan, override=NAME)
                direct = tkm._apply(x, topk_w, topk_ids, packed, GPT_OSS)
                torch.cuda.synchronize()
                assert torch.equal(got, direct), (tokens, seed)
                x.copy_(torch.randn(tokens, h, device="cuda", generator=g).to(torch.bfloat16))
    assert tkm._GRAPHS.captures == before + 6  # per token count: one copying graph, one in place

"""The MoE's portable Triton twin compiled and run on a GPU (any Triton GPU: the H200
runs it) at GPT-OSS-20B shapes, against the independent reference in ``_moe_ref``;
CUDA-graph capture of vLLM's call (no host sync on either path)."""

from __future__ import annotations

import pytest
import torch
from _moe_ref import moe_reference, random_experts

from tokenspeed_kernel_amd.moe import fused
from tokenspeed_kernel_amd.moe.weights import prepare_weights

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]
E, K, H, I = 32, 4, 2880, 2880


@pytest.fixture(scope="module")
def experts():
    raw = random_experts(E, H, I, device="cuda", seed=5)
    return raw, prepare_weights(*raw)


def _rel(out, ref):
    return float((out.float() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("tokens,decode", [(1, True), (7, True), (7, False), (300, False)])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16-act", "w4a8"])
def test_twin_on_gpu(experts, tokens, decode, fp8):
    raw, w = experts
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, H, device="cuda", generator=g).to(torch.bfloat16)
    logits = torch.randn(tokens, E, device="cuda", generator=g)
    a1, a2 = (torch.tensor([6 / 448], device="cuda"), torch.tensor([56 / 448], device="cuda")) if fp8 else (None, None)
    out = fused.fused_moe(x, w, top_k=K, router_logits=logits, w13_act_scale=a1, w2_act_scale=a2, decode=decode,
                          target="portable")  # fmt: skip
    ref = moe_reference(x, raw, top_k=K, router_logits=logits, a1=a1, a2=a2)
    assert _rel(out, ref) < 1e-2


@pytest.mark.parametrize("tokens", [4, 200])
def test_graph_capture(experts, tokens):
    _, w = experts
    x = torch.randn(tokens, H, device="cuda").to(torch.bfloat16)
    logits = torch.randn(tokens, E, device="cuda")
    a = torch.tensor([6 / 448], device="cuda")

    def call():
        return fused.fused_moe(x, w, top_k=K, router_logits=logits, w13_act_scale=a, w2_act_scale=a,
                               target="portable")  # fmt: skip

    eager = call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, eager, rtol=0, atol=0)

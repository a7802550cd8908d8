"""FlashInfer wrappers against the PyTorch reference at GPT-OSS shapes (H200).

Skipped without CUDA or without ``flashinfer``. The first call of each FlashInfer
module JIT-compiles it (about a minute for an attention module; the SM90 fused-MoE
module takes more than nine minutes, hence ``slow`` on the MoE tests): set
``TOKENSPEED_FLASHINFER_CACHE`` to a persistent directory to keep the builds.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.core.registry import registry
from tokenspeed_kernel.ops.moe import MoEActivation, MoEWeights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="flashinfer-python absent"),
]
HQ, HKV, D = 64, 8, 64
HIDDEN, INTER, EXPERTS, TOP_K = 2880, 2880, 32, 4


@pytest.fixture(scope="module", autouse=True)
def _registered():
    # Until the nvidia plugin's register() calls ours, register here.
    if registry.get("flashinfer.mha_prefill") is None:
        from tokenspeed_kernel_nvidia.flashinfer._register import register

        tk.plugin_reports()
        register()


def _close(got, want, what, atol=2e-2):
    err = (got.float() - want.float()).abs().max().item()
    assert err < atol, f"{what}: max abs error {err}"


def _cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def _packed(lens, h):
    return torch.randn(sum(lens), h, D, device="cuda", dtype=torch.bfloat16)


def _sinks(on):
    return torch.randn(HQ, device="cuda", dtype=torch.float32) if on else None


@pytest.mark.parametrize("sinks", [True, False])
@pytest.mark.parametrize("window_left", [-1, 127])
@pytest.mark.parametrize("lens", [[1024], [300, 1, 777, 129]])
def test_prefill_matches_reference(lens, window_left, sinks):
    torch.manual_seed(0)
    q, k, v = _packed(lens, HQ), _packed(lens, HKV), _packed(lens, HKV)
    args = (q, k, v, _cu(lens), _cu(lens), max(lens), max(lens))
    kw = dict(window_left=window_left, sinks=_sinks(sinks), return_lse=True)
    out, lse = tk.mha_prefill(*args, **kw, solution="flashinfer")
    want, want_lse = tk.mha_prefill(*args, **kw, solution="reference")
    _close(out, want, "out")
    _close(lse, want_lse, "lse")


def test_prefill_non_causal_kv_longer_than_q_and_soft_cap():
    torch.manual_seed(1)
    qlens, klens = [17, 200], [300, 333]
    q, k, v = _packed(qlens, HQ), _packed(klens, HKV), _packed(klens, HKV)
    args = (q, k, v, _cu(qlens), _cu(klens), max(qlens), max(klens))
    sinks = _sinks(True)
    for kw in (
        dict(causal=False, window_left=63),
        dict(causal=False, window_left=63, sinks=sinks),
        dict(causal=True, logit_cap=30.0),
        dict(causal=True, sinks=sinks),
    ):
        got = tk.mha_prefill(*args, **kw, return_lse=True, solution="flashinfer")
        want = tk.mha_prefill(*args, **kw, return_lse=True, solution="reference")
        _close(got[0], want[0], f"out {kw}")
        _close(got[1], want[1], f"lse {kw}")


def _paged_cache(lens, page_size, extra_pages=3):
    pages_per = [-(-n // page_size) for n in lens]
    total = sum(pages_per) + extra_pages
    perm = torch.randperm(total, device="cuda")
    k_cache = torch.randn(total, page_size, HKV, D, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    table = torch.zeros(len(lens), max(pages_per) + 2, dtype=torch.int32, device="cuda")
    at = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = perm[at : at + n].int()
        at += n
    return k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32, device="cuda")


@pytest.mark.parametrize("sinks", [True, False])
@pytest.mark.parametrize("window_left", [-1, 127])
@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_decode_matches_reference(page_size, window_left, sinks):
    torch.manual_seed(2)
    k_cache, v_cache, table, seqlens = _paged_cache([1, 200, 1000, 4097], page_size)
    q = torch.randn(4, HQ, D, device="cuda", dtype=torch.bfloat16)
    kw = dict(window_left=window_left, sinks=_sinks(sinks), return_lse=True)
    out, lse = tk.mha_decode_with_kvcache(q, k_cache, v_cache, table, seqlens, **kw, solution="flashinfer")
    want, want_lse = tk.mha_decode_with_kvcache(q, k_cache, v_cache, table, seqlens, **kw, solution="reference")
    _close(out, want, "out")
    _close(lse, want_lse, "lse")


def test_decode_plan_reuse_sees_a_new_page_table_and_new_lengths():
    torch.manual_seed(3)
    k_cache, v_cache, table, seqlens = _paged_cache([33, 500, 64], 16)
    q = torch.randn(3, HQ, D, device="cuda", dtype=torch.bfloat16)
    kw = dict(window_left=127, sinks=_sinks(True))
    call = lambda kc, vc, t, s, sol: tk.mha_decode_with_kvcache(q, kc, vc, t, s, **kw, solution=sol)
    first = call(k_cache, v_cache, table, seqlens, "flashinfer")
    _close(first, call(k_cache, v_cache, table, seqlens, "reference"), "first plan")
    # Same lengths (the plan is reused) but every page moved: the gathered page ids must follow.
    perm = torch.randperm(k_cache.shape[0], device="cuda")
    k2, v2 = torch.empty_like(k_cache), torch.empty_like(v_cache)
    k2[perm], v2[perm] = k_cache, v_cache
    moved = perm[table.long()].int()
    assert not torch.equal(moved, table)
    again = call(k2, v2, moved, seqlens, "flashinfer")
    _close(again, first, "reused plan, moved pages")
    # New lengths: a new plan.
    longer = seqlens + 1
    _close(call(k2, v2, moved, longer, "flashinfer"), call(k2, v2, moved, longer, "reference"), "new lengths")


@pytest.mark.parametrize("sinks", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_extend_matches_reference(causal, sinks):
    torch.manual_seed(4)
    lens, qlens = [100, 700, 33], [5, 300, 33]
    k_cache, v_cache, table, seqlens = _paged_cache(lens, 16)
    q = _packed(qlens, HQ)
    args = (q, k_cache, v_cache, table, seqlens, _cu(qlens), max(qlens))
    kw = dict(causal=causal, window_left=127, sinks=_sinks(sinks), return_lse=True)
    out = torch.empty_like(q)
    got, got_lse = tk.mha_extend_with_kvcache(*args, **kw, out=out, solution="flashinfer")
    assert got.data_ptr() == out.data_ptr()
    want, want_lse = tk.mha_extend_with_kvcache(*args, **kw, solution="reference")
    _close(got, want, "out")
    _close(got_lse, want_lse, "lse")


def _within_one_ulp(got, want, what):
    # fp32 math and one cast in both: at most one rounding step apart (approximate rsqrt).
    diff = (got.float() - want.float()).abs()
    ulp = torch.finfo(want.dtype).eps * want.float().abs().clamp(min=torch.finfo(want.dtype).tiny)
    bad = (diff > ulp).sum().item()
    assert bad == 0, f"{what}: {bad} elements more than one ulp apart (max diff {diff.max().item()})"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(37, HIDDEN), (2, 5, HIDDEN), (1, 64)])
def test_rmsnorm_matches_reference(shape, dtype):
    torch.manual_seed(5)
    x = torch.randn(*shape, device="cuda", dtype=dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], device="cuda")).to(dtype)
    out = torch.empty_like(x)
    got = tk.rmsnorm(x, w, 1e-5, out=out, solution="flashinfer")
    assert got.data_ptr() == out.data_ptr()
    _within_one_ulp(got, tk.rmsnorm(x, w, 1e-5, solution="reference"), "rmsnorm")


def test_rmsnorm_fp32_weight_is_rounded_to_x_dtype_as_documented():
    torch.manual_seed(6)
    x = torch.randn(8, HIDDEN, device="cuda", dtype=torch.bfloat16)
    w = 1 + 0.1 * torch.randn(HIDDEN, device="cuda")
    got = tk.rmsnorm(x, w, 1e-5, solution="flashinfer")
    _within_one_ulp(got, tk.rmsnorm(x, w.bfloat16(), 1e-5, solution="reference"), "rmsnorm")


def _moe_weights(e, h, i, *, bias, interleaved):
    g = torch.Generator(device="cuda").manual_seed(7)
    w13, s13 = tk.quantize_mxfp4(torch.randn(e, 2 * i, h, device="cuda", generator=g).bfloat16() * 0.05)
    w2, s2 = tk.quantize_mxfp4(torch.randn(e, h, i, device="cuda", generator=g).bfloat16() * 0.05)
    b = lambda *s: (torch.randn(*s, device="cuda", generator=g) * 0.1).bfloat16() if bias else None
    return MoEWeights(
        w13=w13, w2=w2, format="mxfp4", w13_scale=s13, w2_scale=s2, w13_bias=b(e, 2 * i), w2_bias=b(e, h),
        gate_up_interleaved=interleaved,
    )  # fmt: skip


def _check_moe(w: MoEWeights, act: MoEActivation, tokens: int, top_k: int):
    torch.manual_seed(8)
    x = torch.randn(tokens, w.hidden, device="cuda", dtype=torch.bfloat16)
    topk_w, topk_ids = tk.moe_route(torch.randn(tokens, w.num_experts, device="cuda"), top_k)
    plan = tk.moe_plan(w, act, dtype=torch.bfloat16, device="cuda", solution="flashinfer")
    assert plan.kernel == "flashinfer.moe_apply"
    processed = tk.moe_process_weights(plan, w)
    got = tk.moe_apply(x, topk_w, topk_ids, processed, act, plan=plan)
    want = tk.moe_apply(x, topk_w, topk_ids, w, act, solution="reference").float()
    rel = ((got.float() - want).norm() / want.norm()).item()
    assert rel < 1e-2, f"relative error {rel}"
    _close(got, want, "moe", atol=0.05 * want.abs().max().item())


@pytest.mark.slow
@pytest.mark.parametrize("tokens", [1, 37, 512])
def test_moe_gpt_oss_matches_reference(tokens):
    # GPT-OSS-20B experts: hidden and intermediate 2880 (padded to 3072 inside), biases, interleaved gate/up.
    w = _moe_weights(EXPERTS, HIDDEN, INTER, bias=True, interleaved=True)
    _check_moe(w, MoEActivation(), tokens, TOP_K)


@pytest.mark.slow
def test_moe_silu_aligned_no_bias_matches_reference():
    w = _moe_weights(8, 256, 384, bias=False, interleaved=False)
    _check_moe(w, MoEActivation.silu(), 64, 2)

"""The measured H200 and H100 tables this package ships and registers from its plugin (CPU: no GPU needed)."""

from __future__ import annotations

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.core import measured, selection
from tokenspeed_kernel.core.registry import registry

GPT_OSS = {"head_dim": 64, "gqa_group": 8, "sinks": True}
SIG = ("bf16", "bf16")
_KERNELS = ("triton.mha_decode_with_kvcache", "fa3.mha_decode_with_kvcache", "triton.mha_prefill", "fa3.mha_prefill")
_MM = ("cublas.mm_bf16", "triton.mm")
_MOE = (
    "hopper.moe_apply",
    "hopper.moe_apply_packed",
    "hopper.moe_apply_w4a8",
    "triton.moe_apply",
    "triton_kernels.moe_apply",
)
_GDN = ("triton.gdn_chunk_prefill", "fla.gdn_chunk_prefill")


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv("TOKENSPEED_KERNEL_ORACLE", raising=False)
    selection.reload_settings()
    yield monkeypatch
    monkeypatch.undo()
    selection.reload_settings()


def _ranked(op, traits, platform, **sizes) -> list[str]:
    sig = ("bf16",) * len(tk.get_contract(op).roles)
    cands = tk.explain_selection(op, sig, traits, sizes=sizes or None, platform=platform)
    return [c.name for c in cands if c.eligible]


def test_the_plugin_registers_its_h200_table_and_it_loads():
    tk.load_plugins()
    assert any(d == "H200" and w.endswith("h200.json") for d, w in measured.registered_tables())
    assert tk.plugin_reports()["nvidia"].tables
    [table] = measured.tables_for_device("NVIDIA H200")
    [h100] = measured.tables_for_device("NVIDIA H100 80GB HBM3")
    assert h100 is not table and {e.op for e in h100.entries} == {"mm"} and not h100.notes
    assert all(s["device"] == "NVIDIA H100 80GB HBM3" for s in h100.sources)
    assert len(table) >= 3 and not table.notes
    assert all(s["device"] == "NVIDIA H200" and s["date"].startswith("2026-") for s in table.sources)
    assert {e.op for e in table.entries} == {
        "mm",
        "mha_prefill",
        "mha_decode_with_kvcache",
        "moe_apply",
        "gdn_chunk_prefill",
    }
    assert all(min(e.scores.values()) == pytest.approx(1.0) for e in table.entries)
    assert all(e.buckets for e in table.entries)  # every group is per size bucket
    # The table names kernels of other packages (it compares them); core names none.
    assert {k for e in table.entries for k in e.scores} == {*_KERNELS, *_MM, *_MOE, *_GDN}


@pytest.fixture
def measured_kernels(env):
    """The kernels the table measured; stand-ins (same names and bands) for those not installed here
    (this package's tests run without the Triton package; FA3 may be absent)."""
    tk.load_plugins()
    added = []
    for name in (*_KERNELS, *_MM, *_MOE, *_GDN):
        env.delitem(selection._broken, name, raising=False)  # a CPU selection elsewhere may have failed to load FA3
        if registry.get(name) is None:
            op = name.split(".", 1)[1].removesuffix("_bf16")
            contract = tk.get_contract(op)
            traits = {t: tk.ANY for t in contract.traits}
            band = tk.Priority.PORTABLE if name.startswith("triton.") else tk.Priority.PERFORMANT + 10
            formats = [{role: ("bf16", "mxfp4") for role in contract.roles}]
            tk.register_kernel(op, name=name, solution=name.split(".")[0], formats=formats, traits=traits,
                               priority=band, impl=lambda *a, **k: None)  # fmt: skip
            added.append(name)
    yield
    for name in added:
        tk.unregister_kernel(name)


def test_it_ranks_triton_for_decode_and_windowed_prefill_and_fa3_for_full_causal_prefill(env, measured_kernels):
    h200 = tk.make_platform("sm90", device_name="NVIDIA H200")
    for window in (False, True):
        decode = _ranked("mha_decode_with_kvcache", {**GPT_OSS, "window": window, "page_size": 16}, h200,
                         batch=64, context=8192)  # fmt: skip
        assert decode[:2] == ["triton.mha_decode_with_kvcache", "fa3.mha_decode_with_kvcache"]
    assert _ranked("mha_prefill", {**GPT_OSS, "window": False}, h200, tokens=8192)[:2] == [
        "fa3.mha_prefill",
        "triton.mha_prefill",
    ]
    assert _ranked("mha_prefill", {**GPT_OSS, "window": True}, h200, tokens=8192)[:2] == [
        "triton.mha_prefill",
        "fa3.mha_prefill",
    ]
    # Other sm90 devices, and TOKENSPEED_KERNEL_ORACLE=none, keep the priority order.
    h100 = tk.make_platform("sm90", device_name="NVIDIA H100")
    assert _ranked("mha_prefill", {**GPT_OSS, "window": True}, h100, tokens=8192)[0] == "fa3.mha_prefill"
    env.setenv("TOKENSPEED_KERNEL_ORACLE", "none")
    selection.reload_settings()
    assert _ranked("mha_prefill", {**GPT_OSS, "window": True}, h200, tokens=8192)[0] == "fa3.mha_prefill"


def test_moe_plan_by_token_count_and_mm_follow_the_table(env, measured_kernels):
    """Measured 2026-12-03 (docs/benchmarks/h200-2026-12-01/hopper-moe/session13/call3/r/sel, sets A and F,
    the prefill path with two-chunk tiles from 1536 tokens): the Hopper MoE on the packed layout wins at
    every measured token count but 1024 and 4096 (the canonical one, by 2.7 % and 5.3 %), the canonical one
    second but at 16384 (0.2 % behind); where the caller allows fp8 activations, the W4A8 kernel wins from
    1024 tokens (where it is offered) but at 4096 (second, 4.1 % behind the canonical kernel). A layer's
    plan therefore takes the packed layout over every count and for small calls, the canonical one for
    calls of 1024 or 4096 tokens. cuBLAS wins mm."""
    h200 = tk.make_platform("sm90", device_name="NVIDIA H200")
    moe = {"activation": "swiglu", "clamp": True, "bias": True, "gate_up_interleaved": True, "layout": tk.ANY}
    hopper, packed, w4a8 = "hopper.moe_apply", "hopper.moe_apply_packed", "hopper.moe_apply_w4a8"
    for fp8 in (False, True):
        traits = {**moe, "fp8_activations": tk.ANY} if fp8 else moe
        ranked = {}
        for tokens in (1, 2, 4, 8, 64, 256, 512, 1024, 2048, 4096, 16384):
            cands = tk.explain_selection("moe_apply", ("bf16", "mxfp4"), traits, sizes={"tokens": tokens},
                                         platform=h200)  # fmt: skip
            ranked[tokens] = [c.name for c in cands if c.eligible][:2]
        want = {t: [hopper, packed] if t in (1024, 4096) else [packed, hopper] for t in ranked}
        if fp8:
            want.update({1024: [w4a8, hopper], 2048: [w4a8, packed], 4096: [hopper, w4a8], 16384: [w4a8, packed]})
        assert ranked == want, (fp8, ranked)
    w = tk.MoEWeights(
        w13=torch.zeros(128, 5760, 1440, dtype=torch.uint8), w2=torch.zeros(128, 2880, 1440, dtype=torch.uint8),
        w13_scale=torch.zeros(128, 5760, 90, dtype=torch.uint8), w2_scale=torch.zeros(128, 2880, 90, dtype=torch.uint8),
        w13_bias=torch.zeros(128, 5760, dtype=torch.bfloat16), w2_bias=torch.zeros(128, 2880, dtype=torch.bfloat16),
        format="mxfp4", gate_up_interleaved=True,
    )  # fmt: skip
    with tk.fake_platform(h200):
        assert tk.moe_plan(w, tk.MoEActivation()).layout == packed
        assert tk.moe_plan(w, tk.MoEActivation(), tokens=1).layout == packed
        assert tk.moe_plan(w, tk.MoEActivation(), tokens=4096).layout == "canonical"
        assert tk.moe_plan(w, tk.MoEActivation(), tokens=4096, fp8_activations=True).layout == "canonical"
    for m in (1, 64, 4096):
        assert _ranked("mm", {"bias": True}, h200, m=m)[0] == "cublas.mm_bf16"


def test_gdn_prefill_follows_the_table(env, measured_kernels):
    """Measured 2026-12-01 (docs/benchmarks/h200-2026-12-01/gdn/call4-bench-gdn_chunk_prefill.json): the
    Triton gated delta rule is faster than flash-linear-attention at 4096 .. 16384 tokens; without the
    table fla's band (PERFORMANT) would put it first."""
    h200 = tk.make_platform("sm90", device_name="NVIDIA H200")
    traits = {"head_dim": 128, "head_dim_v": 128, "qk_l2norm": True}
    for tokens in (4096, 16384):
        assert _ranked("gdn_chunk_prefill", traits, h200, tokens=tokens)[:2] == [
            "triton.gdn_chunk_prefill",
            "fla.gdn_chunk_prefill",
        ]
    env.setenv("TOKENSPEED_KERNEL_ORACLE", "none")
    selection.reload_settings()
    assert _ranked("gdn_chunk_prefill", traits, h200, tokens=16384)[0] == "fla.gdn_chunk_prefill"


def test_the_h100_table_ranks_eager_mm_by_its_eager_scores_and_captured_mm_by_device_time(env, measured_kernels):
    """Measured 2026-12-06 (docs/benchmarks/h100-2026-12-06/sel, sets A-C: GPT-OSS's QKV, O, router and unembedding
    GEMMs, bench --graph --eager): the Triton mm's public call (the dense GEMV at M <= 2) is 1.25-1.86x faster
    eager than cuBLAS's below M = 64, and faster up to M = 127 (bias) / 255 (no bias), where cuBLAS is as fast or
    faster by device time; from M = 128 (bias) / 512 (no bias) cuBLAS wins both."""
    h100 = tk.make_platform("sm90", device_name="NVIDIA H100 80GB HBM3")
    for bias in (True, False):
        for m in (1, 2, 8, 32):
            assert _ranked("mm", {"bias": bias}, h100, m=m)[0] == "triton.mm", (bias, m)
            graph = tk.explain_selection("mm", ("bf16",) * 3, {"bias": bias}, sizes={"m": m}, platform=h100,
                                         captured=True)  # fmt: skip
            assert next(c.name for c in graph if c.selected) == "cublas.mm_bf16", (bias, m)
        for m in (512, 4096):
            assert _ranked("mm", {"bias": bias}, h100, m=m)[0] == "cublas.mm_bf16", (bias, m)
    with tk.fake_platform(h100):
        selection.clear_selection_cache()
        sel = tk.select_spec("mm", ("bf16",) * 3, {"bias": True}, sizes={"m": 1})
        assert sel.spec.name == "triton.mm" and sel.captured.spec.name == "cublas.mm_bf16"

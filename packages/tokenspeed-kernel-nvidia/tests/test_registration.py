"""The nvidia plugin registers FA3 only when installed, with exactly its capabilities (CPU test)."""

from __future__ import annotations

import importlib.util

import pytest

import tokenspeed_kernel as tk

GPT_OSS = {"head_dim": 64, "gqa_group": 8, "window": True, "sinks": True}
needs_fa3 = pytest.mark.skipif(importlib.util.find_spec("flash_attn_interface") is None, reason="tokenspeed-fa3 absent")


def test_plugin_loads_without_importing_vendor_libraries():
    import sys

    report = tk.plugin_reports()["nvidia"]
    assert report.status == "loaded", report.error
    assert "flash_attn_interface" not in sys.modules and "flashinfer" not in sys.modules


@needs_fa3
@pytest.mark.parametrize("op", ["mha_prefill", "mha_extend_with_kvcache", "mha_decode_with_kvcache"])
def test_fa3_selected_on_hopper_only(op):
    traits = dict(GPT_OSS)
    if op != "mha_prefill":
        traits["page_size"] = 16
    sig = ("bf16", "bf16")
    # explain_selection decides without importing the library (this runs on a CPU).
    chosen = [c.name for c in tk.explain_selection(op, sig, traits, platform=tk.make_platform("sm90")) if c.selected]
    assert chosen == [f"fa3.{op}"]
    for arch, reason in (("sm100", "needs arch <= sm90"), ("sm80", "needs arch >= sm90"), ("gfx950", "needs vendor")):
        cands = {c.name: c for c in tk.explain_selection(op, sig, traits, platform=tk.make_platform(arch))}
        assert reason in cands[f"fa3.{op}"].reason


@needs_fa3
def test_fa3_declares_only_what_the_build_supports():
    sm90 = tk.make_platform("sm90")
    base = ("bf16", "bf16")
    reasons = {}
    for label, sig, traits in (
        ("softcap", base, {**GPT_OSS, "logit_cap": True}),  # this build has FLASHATTENTION_DISABLE_SOFTCAP
        ("hdim96", base, {**GPT_OSS, "head_dim": 96}),  # and FLASHATTENTION_DISABLE_HDIM96
        ("fp32", ("fp32", "fp32"), GPT_OSS),
        ("page24", base, {**GPT_OSS, "page_size": 24}),
    ):
        op = "mha_decode_with_kvcache" if label == "page24" else "mha_prefill"
        cands = {c.name: c for c in tk.explain_selection(op, sig, traits, platform=sm90)}
        reasons[label] = cands[f"fa3.{op}"].reason
    assert reasons["softcap"] == "trait logit_cap=True (supports False)"
    assert reasons["hdim96"].startswith("trait head_dim=96")
    assert reasons["fp32"].startswith("formats q=fp32")
    assert reasons["page24"].startswith("trait page_size=24")


def test_cublas_mm_routes_by_format():
    sm90 = tk.make_platform("sm90")

    def chosen(sig, traits=None):
        cands = tk.explain_selection("mm", sig, traits or {}, platform=sm90)
        return next(c.name for c in cands if c.selected)

    assert chosen(("bf16", "bf16", "bf16"), {"bias": True}) == "cublas.mm_bf16"
    assert chosen(("fp8_e4m3:per_token", "fp8_e4m3:per_channel", "bf16")) == "cublas.mm_fp8"
    # cuBLASLt has no 1x128 block scales and no MXFP4: those go to another kernel.
    assert not chosen(("fp8_e4m3:block128", "fp8_e4m3:block128", "bf16")).startswith("cublas")
    assert not chosen(("bf16", "mxfp4", "bf16")).startswith("cublas")
    assert not chosen(("bf16", "bf16", "fp32")).startswith("cublas")  # out dtype differs from a

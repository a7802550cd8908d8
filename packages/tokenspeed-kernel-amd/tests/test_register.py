"""Registration of the amd plugin: what is registered, with which metadata, and where
selection picks (or rejects, with a capability reason) each kernel. CPU only."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.core.registry import Priority, registry, unregister_kernel
from tokenspeed_kernel_amd import _register

ARCHS = ("gfx950", "gfx942")
OPS = ("mha_prefill", "mha_decode_with_kvcache", "rmsnorm")
BF16 = ("bf16", "bf16")
#: GPT-OSS attention calls: head_dim 64, 64 query / 8 KV heads, sinks; sliding layers
#: use a 128-key window (window_left 127), full layers none.
GPT_OSS_SLIDING = {"head_dim": 64, "gqa_group": 8, "window": True, "sinks": True, "causal": True}
GPT_OSS_FULL = {**GPT_OSS_SLIDING, "window": False}
GPT_OSS_DECODE = {"head_dim": 64, "gqa_group": 8, "window": True, "sinks": True, "page_size": 16}


def _amd_specs():
    return [s for s in registry.all() if s.source == "amd"]


def _candidates(op, sig, traits, arch):
    return {c.name: c for c in tk.explain_selection(op, sig, traits, platform=tk.make_platform(arch))}


def test_plugin_loaded_with_every_gluon_kernel():
    report = tk.plugin_reports()["amd"]
    assert report.status == "loaded", report.error
    expected = {f"amd.{arch}.{op}" for arch in ARCHS for op in OPS}
    assert expected <= set(report.kernels)


def test_registration_imports_neither_triton_nor_aiter():
    code = (
        "import sys\n"
        "from tokenspeed_kernel_amd._register import register\n"
        "register()\n"
        "print(sorted(m for m in ('triton', 'aiter') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("op", OPS)
def test_metadata(arch, op):
    spec = registry.get(f"amd.{arch}.{op}")
    assert spec is not None and spec.source == "amd"
    assert spec.solution == "gluon"
    assert spec.priority == Priority.PERFORMANT
    assert spec.hardware_validated is False  # no AMD GPU has run these kernels
    assert spec.impl == f"tokenspeed_kernel_amd.{arch}.{'norm' if op == 'rmsnorm' else 'attention'}:{op}"
    cap = spec.capability
    assert cap.vendors == {"amd"} and cap.min_arch == cap.max_arch == arch
    assert "gluon" in cap.features and "buffer_load" in cap.features
    if op != "rmsnorm":
        assert "mfma" in cap.features
        assert ("async_copy" in cap.features) == (arch == "gfx950")


def test_every_amd_spec_says_it_has_not_run_on_hardware():
    specs = _amd_specs()
    assert specs
    assert all(s.hardware_validated is False for s in specs)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("traits", [GPT_OSS_SLIDING, GPT_OSS_FULL], ids=["sliding", "full"])
def test_gpt_oss_prefill_selects_the_arch_kernel(arch, traits):
    with tk.fake_platform(arch):
        fn = tk.select_kernel("mha_prefill", BF16, traits)
    assert fn.__module__ == f"tokenspeed_kernel_amd.{arch}.attention" and fn.__name__ == "mha_prefill"
    cands = _candidates("mha_prefill", BF16, traits, arch)
    assert [n for n, c in cands.items() if c.selected] == [f"amd.{arch}.mha_prefill"]
    other = "gfx942" if arch == "gfx950" else "gfx950"
    bound = "<= gfx942" if arch == "gfx950" else ">= gfx950"
    assert not cands[f"amd.{other}.mha_prefill"].eligible
    assert f"needs arch {bound}" in cands[f"amd.{other}.mha_prefill"].reason


@pytest.mark.parametrize("arch", ARCHS)
def test_gpt_oss_decode_and_rmsnorm_select_the_arch_kernel(arch):
    for op, sig, traits in (
        ("mha_decode_with_kvcache", BF16, GPT_OSS_DECODE),
        ("rmsnorm", ("bf16",), {"fused_residual": True}),
    ):
        chosen = [n for n, c in _candidates(op, sig, traits, arch).items() if c.selected]
        expected = f"amd.{arch}.{op}"
        if op == "rmsnorm" and _register.aiter_available():
            expected = "aiter.rmsnorm"
        assert chosen == [expected]


@pytest.mark.parametrize("platform", ["sm90", "cpu"])
@pytest.mark.parametrize(
    "op,sig,traits",
    [
        ("mha_prefill", BF16, GPT_OSS_SLIDING),
        ("mha_decode_with_kvcache", BF16, GPT_OSS_DECODE),
        ("rmsnorm", ("bf16",), {}),
    ],
)
def test_rejected_off_amd_with_a_capability_reason(platform, op, sig, traits):
    cands = _candidates(op, sig, traits, platform)
    vendor = "nvidia" if platform == "sm90" else "cpu"
    for arch in ARCHS:
        cand = cands[f"amd.{arch}.{op}"]
        assert not cand.eligible and not cand.selected
        assert cand.reason == f"needs vendor amd, platform is {vendor}"


@pytest.mark.parametrize(
    "op,sig,traits,reason",
    [
        ("mha_prefill", BF16, {**GPT_OSS_SLIDING, "head_dim": 96}, "trait head_dim=96"),
        ("mha_prefill", BF16, {**GPT_OSS_SLIDING, "gqa_group": 6}, "trait gqa_group=6"),
        ("mha_prefill", BF16, {**GPT_OSS_SLIDING, "gqa_group": 32}, "trait gqa_group=32"),
        ("mha_prefill", ("fp32", "fp32"), GPT_OSS_SLIDING, "formats q=fp32"),
        ("mha_decode_with_kvcache", ("bf16", "fp8_e4m3"), GPT_OSS_DECODE, "formats q=bf16, kv=fp8_e4m3"),
        ("mha_decode_with_kvcache", ("bf16", "fp16"), GPT_OSS_DECODE, "formats q=bf16, kv=fp16"),
        ("mha_decode_with_kvcache", BF16, {**GPT_OSS_DECODE, "gqa_group": 65}, "trait gqa_group=65"),
    ],
)
def test_declared_traits_and_formats_are_exact(op, sig, traits, reason):
    for arch in ARCHS:
        cand = _candidates(op, sig, traits, arch)[f"amd.{arch}.{op}"]
        assert not cand.eligible and cand.reason.startswith(reason), cand.reason


@pytest.mark.parametrize("arch", ARCHS)
def test_supported_variants_are_eligible(arch):
    cases = [
        ("mha_prefill", ("fp16", "fp16"), {**GPT_OSS_FULL, "head_dim": 128, "gqa_group": 16, "causal": False,
                                            "logit_cap": True, "return_lse": True}),
        ("mha_prefill", BF16, {**GPT_OSS_FULL, "gqa_group": 1, "sinks": False}),
        ("mha_decode_with_kvcache", BF16, {**GPT_OSS_DECODE, "gqa_group": 64, "page_size": 1, "return_lse": True}),
        ("mha_decode_with_kvcache", BF16, {**GPT_OSS_DECODE, "gqa_group": 6, "page_size": 4096, "logit_cap": True}),
        ("rmsnorm", ("fp32",), {"fused_residual": False}),
    ]  # fmt: skip
    for op, sig, traits in cases:
        cand = _candidates(op, sig, traits, arch)[f"amd.{arch}.{op}"]
        assert cand.eligible, (op, traits, cand.reason)


@pytest.mark.parametrize("arch", ARCHS)
def test_entry_points_take_exactly_the_public_op_arguments(arch):
    from importlib import import_module

    for op, module in (("mha_prefill", "attention"), ("mha_decode_with_kvcache", "attention"), ("rmsnorm", "norm")):
        entry = getattr(import_module(f"tokenspeed_kernel_amd.{arch}.{module}"), op)
        public = inspect.signature(getattr(tk, op))
        # Hints (an attention plan) reach only kernels that name them; these read lengths on the device.
        skip = ("solution", "override", *getattr(tk, op).hints)
        params = [p for p in public.parameters.values() if p.name not in skip]
        got = list(inspect.signature(entry).parameters.values())
        assert [(p.name, p.kind, p.default) for p in got] == [(p.name, p.kind, p.default) for p in params]


def test_aiter_wrappers_registered_only_when_aiter_is_found(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    names = ("aiter.rmsnorm", "aiter.mha_decode_with_kvcache")
    if real_find_spec("aiter") is None:
        assert all(registry.get(n) is None for n in names)
    monkeypatch.setattr(_register, "_register_gluon", lambda: None)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "aiter" else real_find_spec(name, *a)
    )
    already = [n for n in names if registry.get(n) is not None]
    for n in already:
        unregister_kernel(n)
    try:
        _register.register()
        specs = [registry.get(n) for n in names]
        assert all(s is not None and s.solution == "aiter" and not s.hardware_validated for s in specs)
        assert all(isinstance(s.impl, str) and s.capability.vendors == {"amd"} for s in specs)
        assert "aiter" not in sys.modules or already
        decode = _candidates("mha_decode_with_kvcache", BF16, GPT_OSS_DECODE, "gfx950")
        # AITER's paged kernel has no sinks: GPT-OSS decode stays on the Gluon kernel.
        assert decode["aiter.mha_decode_with_kvcache"].reason.startswith("trait")
        assert decode["amd.gfx950.mha_decode_with_kvcache"].selected
    finally:
        for n in names:
            if registry.get(n) is not None and n not in already:
                unregister_kernel(n)


def test_aiter_decode_wrapper_refuses_what_it_cannot_do():
    from tokenspeed_kernel_amd.aiter.attention import mha_decode_with_kvcache

    q = torch.zeros(1, 8, 64, dtype=torch.bfloat16)
    cache = torch.zeros(1, 16, 1, 64, dtype=torch.bfloat16)
    args = (q, cache, cache, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32))
    for bad in ({"sinks": torch.zeros(8)}, {"window_left": 127}, {"return_lse": True}):
        with pytest.raises(ValueError, match="not supported"):
            mha_decode_with_kvcache(*args, **bad)


def test_aiter_rmsnorm_keeps_fp32_weight_numerics(recorded_launches):
    """A weight in another dtype goes to the Gluon kernel (AITER would round it)."""
    from tokenspeed_kernel_amd.aiter.norm import rmsnorm

    x = torch.randn(4, 256, dtype=torch.bfloat16)
    rmsnorm(x, torch.randn(256), 1e-5)
    [launch] = recorded_launches
    assert launch.fn.__name__ == "_rmsnorm_kernel" and launch.args[1].dtype == torch.float32

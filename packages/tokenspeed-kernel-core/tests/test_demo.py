"""``tokenspeed-kernel demo``: the layer mode and the whole-model mode run on CPU, and a wrong kernel is caught."""

from __future__ import annotations

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.cli import main
from tokenspeed_kernel.reference.norm import rmsnorm as reference_rmsnorm

MODEL_ARGS = ["demo", "--model", "gpt-oss", "--device", "cpu", "--layers", "2", "--seqlens", "9,4", "--new-tokens", "3"]


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def broken_rmsnorm():
    """An rmsnorm kernel that forgets the weight, ranked above the reference on every platform."""

    def forgets_weight(x, weight, eps, *, residual=None, out=None):
        return reference_rmsnorm(x, torch.ones_like(weight), eps, residual=residual, out=out)

    tk.load_plugins()
    tk.register_kernel(
        "rmsnorm",
        name="demo_test.rmsnorm",
        solution="demo_test",
        formats=[{"x": ("bf16", "fp32")}],
        traits={"fused_residual": (False, True)},
        priority=tk.Priority.SPECIALIZED,
        impl=forgets_weight,
    )
    yield
    tk.unregister_kernel("demo_test.rmsnorm")


def test_layer_demo(capsys):
    assert main(["demo", "--device", "cpu", "--seqlens", "9,3"]) == 0
    out = capsys.readouterr().out
    assert "reference.moe_apply" in out and "mha_decode_with_kvcache" in out
    assert out.rstrip().endswith("OK")


def test_model_demo(capsys):
    assert main(MODEL_ARGS) == 0
    out = capsys.readouterr().out
    for op in ("mha_prefill", "mha_decode_with_kvcache", "kvcache_store", "moe_apply", "moe_route", "argmax", "mm"):
        assert f"reference.{op}" in out, op
    assert "2 layer(s)" in out and "prefill: 13 tokens" in out
    assert "relative error median 0" in out and "greedy tokens equal to the reference's argmax: 6 of 6" in out
    assert out.rstrip().endswith("OK")


def test_model_demo_sampling(capsys):
    assert main([*MODEL_ARGS, "--temperature", "0.8", "--top-k", "5", "--top-p", "0.9"]) == 0
    out = capsys.readouterr().out
    assert "reference.top_k_top_p_sample" in out and "top-k 5" in out


def test_model_demo_catches_a_wrong_kernel(capsys, broken_rmsnorm):
    assert main(MODEL_ARGS) == 1
    out = capsys.readouterr().out
    assert "demo_test.rmsnorm" in out
    assert "MISMATCH" in out

"""``tokenspeed-kernel demo``: the layer mode and the whole-model mode run on CPU, and a wrong kernel is caught."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.cli import main
from tokenspeed_kernel.reference.norm import rmsnorm as reference_rmsnorm

# In-process runs keep to the references (--no-interpret): a test process must not switch Triton's interpreter on.
MODEL_ARGS = ["demo", "--model", "gpt-oss", "--device", "cpu", "--layers", "2", "--seqlens", "9,4", "--new-tokens", "3",
              "--no-interpret"]  # fmt: skip
HAS_TRITON_KERNELS = bool(importlib.util.find_spec("tokenspeed_kernel_triton") and importlib.util.find_spec("triton"))


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
    assert main(["demo", "--device", "cpu", "--seqlens", "9,3", "--no-interpret"]) == 0
    out = capsys.readouterr().out
    assert "reference.moe_apply" in out and "mha_decode_with_kvcache" in out
    # It says what it compares: the reference with itself, error 0 by construction, one time column.
    assert (
        "compares: --no-interpret: every op runs its PyTorch reference, so the comparison checks the reference" in out
    )
    assert "(every op ran its reference: the error below is 0 by construction)" in out
    row = next(ln for ln in out.splitlines() if ln.startswith("moe_apply "))
    assert row.split()[1] == "reference.moe_apply" and row.endswith("(same)")
    assert out.rstrip().endswith("OK")


def _demo_process(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "KINETO_LOG_LEVEL")}
    return subprocess.run(
        [sys.executable, "-m", "tokenspeed_kernel", "demo", *argv], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.slow
def test_layer_demo_on_a_cpu_runs_the_triton_kernels_under_the_interpreter():
    """Before: on a CPU the demo compared the reference with itself (error 0 by construction), printed two time
    columns of the same kernel 9x apart, and the profiler wrote USDT lines on stderr."""
    proc = _demo_process("--device", "cpu", "--seqlens", "5,3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no profiler chatter, no warning
    out = proc.stdout
    ops = set(tk.all_contracts())
    kernels = {ln.split()[0]: ln.split()[1] for ln in out.splitlines() if ln.split()[:1] and ln.split()[0] in ops}
    if HAS_TRITON_KERNELS:
        assert "compares: Triton kernels run under Triton's interpreter (TRITON_INTERPRET=1) against the PyTorch" in out
        for op in ("moe_apply", "mha_prefill", "mha_decode_with_kvcache", "mm", "rmsnorm", "kvcache_store"):
            assert kernels[op] == f"triton.{op}", (op, out)
        err = [float(ln.split("median ")[1].split(",")[0]) for ln in out.splitlines() if "vs reference:" in ln]
        assert len(err) == 2 and all(0 < e < 0.05 for e in err)  # a real comparison, within the bf16 bound
    else:
        assert "compares: no Triton package installed (pip install tokenspeed-kernel-triton): every op runs" in out
        assert kernels["moe_apply"] == "reference.moe_apply"
    assert out.rstrip().endswith("OK")


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--device", "cuda"], "--device cuda: no CUDA device here (torch.cuda.is_available() is False); use --device cpu"),
        (["--device", "tpu"], "--device: expected cpu or cuda, got 'tpu'"),
        (["--layer", "99"], "--layer: expected 0..3 (the tiny config has 4 layers), got 99"),
        (["--layer", "-1"], "--layer: expected 0..3 (the tiny config has 4 layers), got -1"),
        (["--seqlens", "4,0"], "--seqlens: expected comma-separated lengths >= 1 (e.g. 40,7,25), got '4,0'"),
        (["--model", "gpt-oss", "--layers", "9"], "--layers: expected 1..4 (tiny), got 9"),
        (["--model", "gpt-oss", "--new-tokens", "0"], "--new-tokens: expected >= 1, got 0"),
        (["--model", "gpt-oss", "--top-p", "1.5"], "--top-p: expected in (0, 1] (1 = off), got 1.5"),
    ],
)  # fmt: skip
def test_bad_demo_options_are_one_line_errors(capsys, argv, message):
    """Before: --device cuda without a GPU and --layer 99 ended in tracebacks."""
    if argv[:2] == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    if argv[0] != "--device":
        argv = ["--device", "cpu", *argv]
    assert main(["demo", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == f"tokenspeed-kernel demo: error: {message}"


def test_model_demo(capsys):
    assert main(MODEL_ARGS) == 0
    out = capsys.readouterr().out
    for op in (
        "mha_prefill",
        "mha_decode_append_kvcache",  # (generation's decode: the rotation, the cache write and the attention)
        "kvcache_store",
        "moe_apply",
        "moe_gate",
        "argmax",
        "mm",
    ):
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

"""bench: timer, cost models, selection/regret, peers, JSON/Markdown/PNG reports, CLI (CPU, wall clock)."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import sys
import time

import pytest
import torch

from tokenspeed_kernel import ANY, register_kernel, registry, unregister_kernel
from tokenspeed_kernel.benchmark import bench, time_fn
from tokenspeed_kernel.benchmark import cli as bench_cli
from tokenspeed_kernel.benchmark.ceilings import Ceilings
from tokenspeed_kernel.benchmark.report import markdown, write_json, write_markdown, write_plot
from tokenspeed_kernel.core.plugins import ensure_loaded
from tokenspeed_kernel.numerics import Case, get_op_cases
from tokenspeed_kernel.numerics.cases.attention import attention_pairs
from tokenspeed_kernel.numerics.inputs import make_generator

FAST = {"warmup_ms": 1.0, "rep_ms": 5.0, "progress": False, "ceilings": Ceilings(copy_tbps=0.01, bf16_tflops=0.05)}


def _slow_rmsnorm(x, weight, eps, *, residual=None, out=None):
    """Correct but slow: selected (higher band) although the reference is faster."""
    from tokenspeed_kernel.reference.norm import rmsnorm

    time.sleep(0.003)
    return rmsnorm(x, weight, eps, residual=residual, out=out)


@pytest.fixture
def slow_kernel():
    ensure_loaded()
    name = "test.rmsnorm_slow"
    register_kernel("rmsnorm", name=name, solution="test", impl=_slow_rmsnorm, formats=[{"x": ("fp32", "bf16")}],
                    traits={"fused_residual": ANY}, priority=150)  # fmt: skip
    yield name
    if registry.get(name) is not None:
        unregister_kernel(name)


def _rmsnorm_case(label: str = "", **kw) -> Case:
    return Case.make("rmsnorm", "fp32", {**get_op_cases("rmsnorm").defaults, "tokens": 8, "hidden": 256, **kw}, label)


def test_wall_clock_timer_measures_a_known_sleep():
    t = time_fn(lambda: time.sleep(0.002), device="cpu", warmup_ms=2, rep_ms=30, min_repeats=5)
    assert t.method == "wall-clock" and t.repeats >= 5
    assert 2000 <= t.p10_us <= t.median_us <= t.p90_us
    assert t.median_us < 20000


def test_graph_timing_needs_cuda():
    with pytest.raises(ValueError, match="CUDA"):
        time_fn(lambda: None, device="cpu", graph=True)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [-1, 0, 3, 100])
def test_attention_pairs_match_an_explicit_mask(causal, window):
    lq, lk = (5, 1, 9), (12, 1, 9)
    expected = 0
    for q, k in zip(lq, lk):
        pos = torch.arange(k - q, k)[:, None]
        key = torch.arange(k)[None, :]
        mask = torch.ones(q, k, dtype=torch.bool)
        if causal:
            mask &= key <= pos
        if window >= 0:
            mask &= key >= pos - window
        expected += int(mask.sum())
    assert attention_pairs(lq, lk, causal=causal, window=window) == expected


def test_prefill_flops_count_the_causal_half_and_decode_bytes_the_kv_read():
    dev = torch.device("cpu")
    oc = get_op_cases("mha_prefill")
    case = Case.make(
        "mha_prefill", "bf16", {**oc.defaults, "seqlens_q": (64,), "heads_q": 8, "heads_kv": 2, "head_dim": 32}
    )
    call = oc.make(case, dev, make_generator(dev, 0))
    cost = oc.cost(case, call, {"out": torch.empty_like(call["q"])})
    assert cost.flops == 4 * 32 * 8 * (64 * 65 // 2)
    assert cost.bytes == 2 * (64 * 8 * 32 * 2) + 2 * (64 * 2 * 32 * 2)
    od = get_op_cases("mha_decode_with_kvcache")
    case = Case.make("mha_decode_with_kvcache", "bf16", {**od.defaults, "cache_lens": (10, 300), "window_left": 127})
    call = od.make(case, dev, make_generator(dev, 0))
    keys = 10 + 128
    assert od.cost(case, call, {}).bytes == 2 * keys * case["heads_kv"] * case["head_dim"] * 2


def test_moe_cost_counts_only_active_experts_at_storage_size():
    pytest.importorskip("tokenspeed_kernel.reference.quantization")
    dev = torch.device("cpu")
    oc = get_op_cases("moe_apply")
    case = Case.make("moe_apply", "bf16", {**oc.defaults, "tokens": 1, "top_k": 2, "experts": 8, "hidden": 64,
                                           "inter": 32, "weight_format": "mxfp4", "bias": False})  # fmt: skip
    call = oc.make(case, dev, make_generator(dev, 0))
    cost = oc.cost(case, call, {"out": torch.empty_like(call["x"])})
    per_expert = (2 * 32 * 64 + 64 * 32) * (0.5 + 1 / 32)  # 4.25 bits a value
    assert cost.bytes == pytest.approx(
        2 * per_expert + call["x"].nbytes * 2 + call["topk_ids"].nbytes + call["topk_weights"].nbytes
    )
    assert cost.flops == 2 * 2 * (2 * 32 * 64 + 32 * 64)


def test_bench_reports_selection_regret_peers_and_rates(slow_kernel):
    report = bench("rmsnorm", cases=[_rmsnorm_case()], device="cpu", peers=True, **FAST)
    [res] = report.results
    assert res.selected == slow_kernel
    assert res.fastest == "reference.rmsnorm"
    slow, ref = res.entry(slow_kernel), res.entry("reference.rmsnorm")
    assert slow.timing.median_us >= 3000
    assert res.regret == pytest.approx(slow.timing.median_us / ref.timing.median_us)
    assert res.regret > 3
    peer = res.entry("torch.rms_norm")
    assert peer is not None and peer.kind == "peer" and peer.timing is not None
    # bytes: x read + weight read + y written (fp32).
    assert res.bytes == 4 * (8 * 256 + 256 + 8 * 256)
    assert ref.tbps == pytest.approx(res.bytes / (ref.timing.median_us * 1e-6) / 1e12)
    assert ref.bound == "memory" and ref.pct_ceiling == pytest.approx(100 * ref.tbps / 0.01)
    unavailable = report.unavailable
    assert all("cpu" in why for why in unavailable.values())


def test_reports_json_markdown_png(slow_kernel, tmp_path):
    report = bench("rmsnorm", cases=[_rmsnorm_case(), _rmsnorm_case(residual=True, label="with residual")], device="cpu",
                   peers=True, **FAST)  # fmt: skip
    write_json(report, str(tmp_path / "b.json"))
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["schema"] == 1 and len(data["results"]) == 2
    entries = {e["name"]: e for e in data["results"][0]["entries"]}
    assert entries[slow_kernel]["median_us"] > entries["reference.rmsnorm"]["median_us"]
    assert data["results"][1]["entries"][-1]["note"] == "residual added unfused"
    write_markdown(report, str(tmp_path / "b.md"), command="tokenspeed-kernel bench rmsnorm")
    md = (tmp_path / "b.md").read_text()
    assert "## rmsnorm" in md and "| shape |" in md and "torch.rms_norm (peer)" in md
    row = next(line for line in md.splitlines() if line.startswith("| with residual"))
    assert slow_kernel in row and f"{data['results'][1]['regret']:.2f}" in row
    pytest.importorskip("matplotlib")
    write_plot(report, str(tmp_path / "b.png"))
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_markdown_marks_errors_and_skips():
    def broken(*a, **k):
        raise RuntimeError("no luck")

    ensure_loaded()
    register_kernel("rmsnorm", name="test.rmsnorm_broken", solution="test", impl=broken, formats=[{"x": "fp32"}])
    try:
        report = bench("rmsnorm", cases=[_rmsnorm_case(), _rmsnorm_case(residual=True)], device="cpu", **FAST)
    finally:
        unregister_kernel("test.rmsnorm_broken")
    first, second = report.results
    assert first.entry("test.rmsnorm_broken").status == "error"
    assert "no luck" in first.entry("test.rmsnorm_broken").reason
    assert second.entry("test.rmsnorm_broken").status == "skipped"  # declares no fused_residual
    md = markdown(report)
    assert "| error |" in md and "| skipped |" in md
    assert "RuntimeError: no luck" in md and "trait fused_residual=True" in md


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenspeed-kernel")
    bench_cli.add_parser(parser.add_subparsers(dest="command"))
    return parser


def test_cli_writes_all_outputs(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = {ext: tmp_path / f"b.{ext}" for ext in ("json", "md", "png")}
    args = _parser().parse_args([
        "bench", "rmsnorm", "--shape", "tokens=4", "hidden=128", "--dtype", "fp32", "--peers", "--no-ceilings",
        "--device", "cpu",  # the references the test reads run on a CPU (a GPU machine would default to cuda)
        "--warmup-ms", "1", "--rep-ms", "5", "--quiet",
        "--json", str(out["json"]), "--md", str(out["md"]), "--plot", str(out["png"]),
    ])  # fmt: skip
    assert args.func(args) == 0
    data = json.loads(out["json"].read_text())
    assert data["results"][0]["case"]["params"]["hidden"] == 128
    assert "reference.rmsnorm" in out["md"].read_text()
    assert out["png"].read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "selected reference.rmsnorm" in printed and "regret 1.00" in printed


def test_cli_plot_without_matplotlib_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    args = _parser().parse_args(["bench", "rmsnorm", "--plot", str(tmp_path / "p.png")])
    assert args.func(args) == 2
    assert "pip install matplotlib" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()


def test_progress_bar_goes_to_stderr(capsys):
    bench("rmsnorm", cases=[_rmsnorm_case()], device="cpu", warmup_ms=1, rep_ms=3, ceilings=False)
    err = capsys.readouterr().err
    assert "[" in err and "] 1/" in err and "reference.rmsnorm" in err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("columns", [80, 40])
def test_progress_bar_fits_the_terminal_width(columns, monkeypatch):
    """Before: every redraw was padded to 160 columns and wrapped on an 80-column terminal."""
    from tokenspeed_kernel.benchmark.progress import Progress

    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=(80, 24): os.terminal_size((columns, 24)))
    term = _Terminal()
    bar = Progress(3, stream=term)
    for label in ("reference.rmsnorm " * 10, "short", "mid " * 5):
        bar.step(label)
    bar.close()
    redraws = term.getvalue().split("\r")[1:]
    assert len(redraws) == 3
    assert all(len(r.rstrip("\n")) <= columns - 1 for r in redraws)
    assert redraws[0].startswith("[########................] 1/3") and len(redraws[0]) == columns - 1  # cut
    # A shorter line clears what the longer one before it left on the row, and no more.
    second = redraws[1].rstrip()
    assert second.startswith("[################........] 2/3") and ("short".startswith(second.split()[-1]))
    assert len(redraws[1]) == columns - 1
    assert term.getvalue().endswith("\n")
    plain = io.StringIO()  # not a terminal (CI logs): whole lines, never cut
    Progress(1, stream=plain).step("x" * 300)
    assert plain.getvalue().endswith("x" * 300 + "\n")


def test_cpu_ceilings_are_measured_and_positive():
    from tokenspeed_kernel.benchmark import measure_ceilings

    c = measure_ceilings("cpu")
    assert c.copy_tbps > 0 and c.bf16_tflops > 0 and c.fp8_tflops is None
    assert math.isfinite(c.copy_tbps)


def test_top_level_cli_has_bench(tmp_path, capsys):
    cli = pytest.importorskip("tokenspeed_kernel.cli")
    out = tmp_path / "o.json"
    argv = ["bench", "reference.silu_and_mul", "--device", "cpu", "--shape", "tokens=2", "inter=8", "--dtype", "fp32", "--no-ceilings",
            "--quiet", "--warmup-ms", "1", "--rep-ms", "2", "--json", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    [res] = json.loads(out.read_text())["results"]
    assert res["op"] == "silu_and_mul" and res["entries"][0]["median_us"] > 0


def test_a_kernel_registered_as_peer_is_a_candidate_and_shown_as_the_peer():
    """A wrapper of the library users would call instead (peer=True): timed and selectable like any
    kernel, and marked as the peer in reports."""
    ensure_loaded()
    name = "libx.rmsnorm"
    register_kernel("rmsnorm", name=name, solution="libx", impl=_slow_rmsnorm, formats=[{"x": "fp32"}],
                    traits={"fused_residual": ANY}, priority=150, peer=True)  # fmt: skip
    try:
        report = bench("rmsnorm", cases=[_rmsnorm_case()], device="cpu", **FAST)
        [res] = report.results
        entry = res.entry(name)
        assert entry.kind == "kernel" and entry.peer and entry.timing is not None
        assert res.selected == name  # a candidate like any other (the highest band here)
        assert report.to_json()["results"][0]["entries"][[e.name for e in res.entries].index(name)]["peer"] is True
        header = next(ln for ln in markdown(report).splitlines() if ln.startswith("| shape"))
        assert f"{name} (peer)" in header and "reference.rmsnorm |" in header
    finally:
        unregister_kernel(name)

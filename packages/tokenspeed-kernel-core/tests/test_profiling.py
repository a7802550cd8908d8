"""Profiling: kernel_scope in torch.profiler and Proton, shape capture and replay, overhead when off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import types

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.benchmark import bench
from tokenspeed_kernel.benchmark import cli as bench_cli
from tokenspeed_kernel.benchmark.ceilings import Ceilings
from tokenspeed_kernel.core import profiling
from tokenspeed_kernel.numerics.cases import cases_from_capture

FAST = {"warmup_ms": 1.0, "rep_ms": 3.0, "progress": False, "ceilings": Ceilings()}


def _run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_import_and_profiling_checks_do_not_import_triton():
    r = _run_python(
        """
        import sys
        import tokenspeed_kernel
        from tokenspeed_kernel.core import profiling
        assert profiling.profiler_active() is False and profiling.proton_active() is False
        assert "triton" not in sys.modules, "triton imported"
        """
    )
    assert r.returncode == 0, r.stderr


def test_kernel_scope_names_the_op_and_kernel_in_torch_profiler():
    x, w = torch.randn(3, 32), torch.ones(32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        tk.rmsnorm(x, w)
    names = {e.name for e in prof.events()}
    assert "tokenspeed_kernel::rmsnorm::reference.rmsnorm" in names


def test_no_scope_when_no_profiler_runs(monkeypatch):
    entered = []
    from tokenspeed_kernel.core import op as op_module

    monkeypatch.setattr(op_module, "kernel_scope", lambda op, kernel: entered.append(op))
    tk.rmsnorm(torch.randn(2, 16), torch.ones(16))
    assert entered == []


def _fake_proton(on: bool, names: list[str]) -> tuple[types.ModuleType, types.ModuleType]:
    flags_mod = types.ModuleType("triton.profiler.flags")
    flags_mod.flags = types.SimpleNamespace(profiling_on=on)
    prof = types.ModuleType("triton.profiler")

    class scope:
        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self):
            names.append(self.name)
            return self

        def __exit__(self, *exc):
            return None

    prof.scope = scope
    return prof, flags_mod


@pytest.mark.parametrize("on", [True, False])
def test_proton_scope_when_a_session_is_on(monkeypatch, on):
    names: list[str] = []
    prof, flags_mod = _fake_proton(on, names)
    monkeypatch.setitem(sys.modules, "triton.profiler", prof)
    monkeypatch.setitem(sys.modules, "triton.profiler.flags", flags_mod)
    assert profiling.profiler_active() is on
    tk.rmsnorm(torch.randn(2, 16), torch.ones(16))
    assert names == (["tokenspeed_kernel::rmsnorm::reference.rmsnorm"] if on else [])


def test_real_proton_exposes_the_flag_we_read():
    flags = pytest.importorskip("triton.profiler.flags")
    assert isinstance(flags.flags.profiling_on, bool)
    import triton.profiler as proton

    assert callable(proton.scope)


def test_shape_capture_dedups_counts_and_writes_json(tmp_path):
    path = tmp_path / "calls.json"
    w = torch.ones(64)
    with profiling.capture_shapes(str(path)) as cap:
        for t in (1, 2, 2, 2, 3):
            tk.rmsnorm(torch.randn(t, 64), w)
        tk.rmsnorm(torch.randn(2, 64), w, residual=torch.randn(2, 64))
        assert profiling.dispatch_hook is cap
    assert profiling.dispatch_hook is None
    data = json.loads(path.read_text())
    assert data["total_calls"] == 6 and data["dropped_calls"] == 0
    entries = data["entries"]
    assert [e["count"] for e in entries] == [3, 1, 1, 1]
    top = entries[0]
    assert top["op"] == "rmsnorm" and top["args"][0] == {"tensor": [2, 64], "dtype": "fp32", "device": "cpu"}
    assert top["args"][2] == {"value": 1e-5} and top["traits"] == {"fused_residual": False}
    assert sum(e["traits"]["fused_residual"] for e in entries) == 1


def test_shape_capture_is_bounded():
    cap = profiling.ShapeCapture(max_entries=2).start()
    try:
        for t in range(1, 6):
            tk.rmsnorm(torch.randn(t, 8), torch.ones(8))
        tk.rmsnorm(torch.randn(1, 8), torch.ones(8))
    finally:
        cap.close()
    data = cap.to_json()
    assert len(data["entries"]) == 2 and data["total_calls"] == 6 and data["dropped_calls"] == 3
    assert sorted(e["count"] for e in data["entries"]) == [1, 2]


def test_capture_records_ragged_lengths_for_replay():
    q, k = torch.randn(10, 4, 64), torch.randn(10, 2, 64)
    cu = torch.tensor([0, 3, 10], dtype=torch.int32)
    with profiling.capture_shapes() as cap:
        tk.mha_prefill(q, k, k, cu, cu, 7, 7, window_left=2, sinks=torch.zeros(4))
    [(case, count)] = cases_from_capture(cap.to_json())
    assert count == 1
    assert case["seqlens_q"] == (3, 7) and case["seqlens_k"] is None
    assert (case["heads_q"], case["heads_kv"], case["head_dim"]) == (4, 2, 64)
    assert case["window_left"] == 2 and case["sinks"] is True and case.dtype == "fp32"


def test_env_var_capture_writes_at_exit(tmp_path):
    path = tmp_path / "env.json"
    r = _run_python(
        """
        import torch, tokenspeed_kernel as tk
        for t in (4, 4, 5):
            tk.silu_and_mul(torch.randn(t, 16))
        """,
        {"TOKENSPEED_KERNEL_CAPTURE_SHAPES": str(path)},
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(path.read_text())
    assert data["total_calls"] == 3
    assert sorted(e["count"] for e in data["entries"]) == [1, 2]


def test_replay_benchmarks_exactly_the_captured_calls(tmp_path, capsys):
    path = tmp_path / "calls.json"
    with profiling.capture_shapes(str(path)):
        for _ in range(3):
            tk.rmsnorm(torch.randn(5, 96, dtype=torch.bfloat16), torch.ones(96, dtype=torch.bfloat16))
        tk.swiglu(torch.randn(7, 64))
        tk.mm(torch.randn(3, 32), torch.randn(16, 32))
    data = json.loads(path.read_text())
    pairs = cases_from_capture(data)
    report = bench(cases=[c for c, _ in pairs], counts=dict(pairs), device="cpu", **FAST)
    got = {(r.op, r.count): r.case for r in report.results}
    assert set(got) == {("rmsnorm", 3), ("swiglu", 1), ("mm", 1)}
    norm = got[("rmsnorm", 3)]
    assert (norm.dtype, norm["tokens"], norm["hidden"]) == ("bf16", 5, 96)
    assert (got[("swiglu", 1)]["tokens"], got[("swiglu", 1)]["inter"]) == (7, 32)
    mm = got[("mm", 1)]
    assert (mm["m"], mm["n"], mm["k"], mm["b_format"]) == (3, 16, 32, "dense")
    for r in report.results:
        assert r.entry(f"reference.{r.op}").timing is not None
    # Through the command line.
    import argparse

    parser = argparse.ArgumentParser()
    bench_cli.add_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / "replay.json"
    args = parser.parse_args(["bench", "--replay", str(path), "--no-ceilings", "--quiet", "--warmup-ms", "1",
                              "--rep-ms", "3", "--json", str(out)])  # fmt: skip
    assert args.func(args) == 0
    replayed = json.loads(out.read_text())["results"]
    assert sorted((r["op"], r["count"]) for r in replayed) == [("mm", 1), ("rmsnorm", 3), ("swiglu", 1)]
    assert "(x3)" in capsys.readouterr().out


def _best_per_call(fns, n: int, trials: int = 7) -> list[float]:
    """Best time per call of each fn over interleaved trials (interleaving cancels machine drift)."""
    best = [float("inf")] * len(fns)
    for _ in range(trials):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / n)
    return best


def _noop_rmsnorm(x, weight, eps, *, residual=None, out=None):
    return x


def test_profiling_off_overhead_is_small(capsys):
    """What the dispatch path pays for profiling when nothing profiles: the ``profiler_active()``
    check (a C call and a dict lookup) and the ``capture_hook`` test; and the whole public-op
    path (validation, cached selection, hooks) over calling a no-op kernel directly."""
    from tokenspeed_kernel import register_kernel, unregister_kernel
    from tokenspeed_kernel.core.plugins import ensure_loaded

    assert profiling.dispatch_hook is None and not profiling.profiler_active()
    ensure_loaded()
    register_kernel("rmsnorm", name="test.rmsnorm_noop", solution="test", impl=_noop_rmsnorm, formats=[{"x": "fp32"}],
                    priority=400)  # fmt: skip
    try:
        x, w = torch.randn(1, 8), torch.ones(8)
        assert tk.rmsnorm(x, w) is x
        check, empty = _best_per_call([profiling.profiler_active, lambda: None], 20000)
        dispatched, direct = _best_per_call([lambda: tk.rmsnorm(x, w), lambda: _noop_rmsnorm(x, w, 1e-5)], 3000)
    finally:
        unregister_kernel("test.rmsnorm_noop")
    with capsys.disabled():
        print(
            f"\n[profiling off] profiler_active(): {(check - empty) * 1e9:.0f} ns/call; "
            f"public rmsnorm (validation + dispatch + hooks) over a no-op kernel: {(dispatched - direct) * 1e6:.2f} us/call"
        )
    # Generous bounds for a loaded 2-core CI machine (the H200 target is <= 3 us for the whole dispatch).
    assert check - empty < 2e-6
    assert dispatched - direct < 100e-6

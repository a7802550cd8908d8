"""Measured selection oracle: building from bench reports, ranking, persistence, activation (CPU)."""

from __future__ import annotations

import json
import math
import time

import pytest

import tokenspeed_kernel as tk
from tokenspeed_kernel.benchmark.oracle import MeasuredOracle, call_signature, shipped_oracle
from tokenspeed_kernel.core import selection
from tokenspeed_kernel.core.registry import Priority, register_kernel, registry, unregister_kernel
from tokenspeed_kernel.numerics import Case, get_op_cases

GPU = "Test GPU 9000"
FAST, SLOW = "fastlow.rmsnorm", "slowhigh.rmsnorm"


@pytest.fixture
def env(monkeypatch):
    """No oracle from the environment or set_selection_oracle; everything restored afterwards."""
    monkeypatch.delenv("TOKENSPEED_KERNEL_ORACLE", raising=False)
    selection.reload_settings()
    yield monkeypatch
    tk.set_selection_oracle(None)
    monkeypatch.undo()
    selection.reload_settings()


@pytest.fixture
def kernels(env):
    """Two rmsnorm kernels: FAST in a lower band than SLOW, so priority alone picks SLOW."""
    tk.load_plugins()
    for name, prio in ((FAST, Priority.PORTABLE), (SLOW, Priority.SPECIALIZED)):
        register_kernel("rmsnorm", name=name, solution=name.split(".")[0], impl=lambda *a, **k: None,
                        formats=[{"x": ("bf16", "fp32")}], traits={"fused_residual": (False, True)}, priority=prio)  # fmt: skip
    yield
    for name in (FAST, SLOW):
        if registry.get(name) is not None:
            unregister_kernel(name)


def _case(tokens: int, residual: bool = False) -> Case:
    return Case.make("rmsnorm", "bf16", {**get_op_cases("rmsnorm").defaults, "tokens": tokens, "residual": residual})


def _report(rows, *, name: str = GPU, arch: str = "sm90", date: str = "2026-01-01 00:00:00 UTC") -> dict:
    """A bench --json report: rows of (case, {kernel: median_us or (median_us, graph_median_us)})."""
    results = []
    for case, times in rows:
        entries = []
        for kernel, t in times.items():
            median, graph = t if isinstance(t, tuple) else (t, None)
            entries.append({"name": kernel, "kind": "kernel", "solution": kernel.split(".")[0], "status": "ok",
                            "median_us": median, "graph_median_us": graph, "method": "cuda-events"})  # fmt: skip
        # A peer faster than every kernel: not selectable, so it must not set the case's best time.
        entries.append({"name": "torch.rms_norm", "kind": "peer", "status": "ok", "median_us": 0.01})
        entries.append({"name": "broken.rmsnorm", "kind": "kernel", "status": "error", "median_us": None})
        results.append({"op": case.op, "case": case.to_json(), "label": case.label, "error": "", "entries": entries})
    return {
        "schema": 1,
        "device": {"arch": arch, "name": name, "date": date, "platform": f"{name} (nvidia {arch}; features: )"},
        "settings": {"seed": 0, "graph": True},
        "ceilings": {},
        "unavailable": {},
        "results": results,
    }


def _sm90(name: str = GPU):
    return tk.make_platform("sm90", device_name=name)


def _ranked(op, sig, traits, platform) -> list[tk.Candidate]:
    return [c for c in tk.explain_selection(op, sig, traits, platform=platform) if c.eligible]


def _rank_of(cands, name) -> int:
    return next(c.rank for c in cands if c.name == name)


# -- building and scoring -----------------------------------------------------------


def test_scores_are_geometric_means_of_ratios_to_the_fastest_kernel_per_case():
    table = MeasuredOracle.from_reports([_report([
        (_case(1), {FAST: (10.0, 4.0), SLOW: (5.0, 2.0)}),  # graph times for both: used (FAST 2.0x)
        (_case(64), {FAST: (10.0, 4.0), SLOW: 30.0}),  # SLOW has no graph time: plain medians (SLOW 3.0x)
        (_case(4096), {FAST: 8.0, SLOW: 8.0}),
    ])])  # fmt: skip
    [entry] = table.entries
    assert (entry.arch, entry.device, entry.op, entry.signature) == ("sm90", GPU, "rmsnorm", ("bf16",))
    assert entry.traits == {"fused_residual": False}
    assert entry.cases == 3 and entry.timing == "mixed"
    assert entry.scores[FAST] == pytest.approx((2.0 * 1.0 * 1.0) ** (1 / 3))
    assert entry.scores[SLOW] == pytest.approx((1.0 * 3.0 * 1.0) ** (1 / 3))
    assert set(entry.scores) == {FAST, SLOW}  # neither the peer nor the failed kernel


def test_kernels_missing_from_a_case_leave_the_group_and_single_kernel_groups_are_dropped():
    other = "third.rmsnorm"
    table = MeasuredOracle.from_reports([_report([
        (_case(1), {FAST: 1.0, SLOW: 2.0, other: 0.5}),  # other is fastest here but missing below
        (_case(64), {FAST: 1.0, SLOW: 4.0}),
        (_case(8, residual=True), {FAST: 1.0}),  # a group with one kernel ranks nothing
    ])])  # fmt: skip
    [entry] = table.entries
    assert entry.scores == pytest.approx({FAST: 1.0, SLOW: math.sqrt(2.0 * 4.0)})
    assert any("fused_residual" in n and "no ranking" in n for n in table.notes)


def test_the_same_case_measured_twice_counts_once_graph_timing_preferred():
    eager = _report([(_case(1), {FAST: 1.0, SLOW: 3.0})], date="2026-02-01 00:00:00 UTC")
    graph = _report([(_case(1), {FAST: (9.0, 6.0), SLOW: (9.0, 2.0)})], date="2026-01-01 00:00:00 UTC")
    table = MeasuredOracle.from_reports([graph, eager])
    [entry] = table.entries
    assert entry.cases == 1 and entry.timing == "graph"
    assert entry.scores == pytest.approx({FAST: 3.0, SLOW: 1.0})
    assert [s["cases_used"] for s in table.sources] == [1, 0]


def test_call_signature_reads_the_ops_dispatch_for_a_large_gpt_oss_decode_case():
    # 256 sequences x 2048 tokens (a 512 MiB cache): built on fake tensors, read at dispatch.
    case = Case.make(
        "mha_decode_with_kvcache",
        "bf16",
        {**get_op_cases("mha_decode_with_kvcache").defaults, "cache_lens": (2048,) * 256, "heads_q": 64,
         "heads_kv": 8, "head_dim": 64, "sinks": True, "window_left": 127, "page_size": 16},
    )  # fmt: skip
    t0 = time.perf_counter()
    sig, traits = call_signature(case)
    assert time.perf_counter() - t0 < 60
    assert sig == ("bf16", "bf16")
    assert traits == {"head_dim": 64, "gqa_group": 8, "window": True, "sinks": True, "logit_cap": False,
                      "return_lse": False, "page_size": 16}  # fmt: skip


# -- selection ----------------------------------------------------------------------


def test_measured_table_changes_the_selection_and_explain_says_measured(kernels):
    plat = _sm90()
    before = _ranked("rmsnorm", ("bf16",), {}, plat)
    assert before[0].name == SLOW and all(c.score is None for c in before)
    table = MeasuredOracle.from_reports(
        [_report([(_case(1), {FAST: 2.0, SLOW: 3.0}), (_case(64), {FAST: 5.0, SLOW: 9.0})])]
    )
    tk.set_selection_oracle(table)
    after = _ranked("rmsnorm", ("bf16",), {}, plat)
    assert [c.name for c in after[:2]] == [FAST, SLOW]
    assert after[0].selected and after[0].score == pytest.approx(1.0)
    assert after[1].score == pytest.approx(math.sqrt(1.5 * 1.8))
    assert after[1].reason.startswith("measured 1.643; priority 300")
    with tk.fake_platform(plat):
        selection.clear_selection_cache()
        assert tk.select_spec("rmsnorm", ("bf16",), {}).spec.name == FAST
    # The format signature and the traits are part of the key: bf16 only was measured.
    assert _ranked("rmsnorm", ("fp32",), {}, plat)[0].name == SLOW


def test_group_without_data_falls_back_to_priority(kernels):
    tk.set_selection_oracle(MeasuredOracle.from_reports([_report([(_case(1), {FAST: 1.0, SLOW: 3.0})])]))
    cands = _ranked("rmsnorm", ("bf16",), {"fused_residual": True}, _sm90())
    assert cands[0].name == SLOW
    assert all(c.score is None and "measured" not in c.reason for c in cands)
    # Another arch has no data either.
    assert _ranked("rmsnorm", ("bf16",), {}, tk.make_platform("sm100"))[0].name == SLOW


def test_the_platforms_own_device_is_preferred_over_other_devices_of_the_arch(kernels):
    a = _report([(_case(1), {FAST: 1.0, SLOW: 2.0})], name="GPU A")
    b = _report([(_case(1), {FAST: 2.0, SLOW: 1.0})], name="GPU B")
    tk.set_selection_oracle(MeasuredOracle.from_reports([a, b]))
    assert _ranked("rmsnorm", ("bf16",), {}, _sm90("GPU B"))[0].name == SLOW
    assert _ranked("rmsnorm", ("bf16",), {}, _sm90("GPU A"))[0].name == FAST
    assert _ranked("rmsnorm", ("bf16",), {}, _sm90("GPU C"))[0].name == FAST  # another device: the first measured


# -- persistence and activation -----------------------------------------------------


def test_save_load_round_trip(tmp_path):
    table = MeasuredOracle.from_reports(
        [_report([(_case(1), {FAST: 1.0, SLOW: 1.7}), (_case(9), {FAST: 2.0, SLOW: 3.0})])]
    )
    path = tmp_path / "t.json"
    table.save(path)
    loaded = MeasuredOracle.load(path)
    assert loaded.entries == table.entries and loaded.sources == table.sources and loaded.created == table.created
    assert loaded.sources[0]["date"] == "2026-01-01 00:00:00 UTC" and loaded.sources[0]["device"] == GPU
    data = json.loads(path.read_text())
    assert data["kind"] == "tokenspeed-kernel-oracle" and data["created"]
    data["kind"] = "something-else"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="not a TokenSpeed-kernel oracle table"):
        MeasuredOracle.load(path)


def test_environment_variable_names_tables_or_turns_measuring_off(kernels, env, tmp_path):
    path = tmp_path / "t.json"
    MeasuredOracle.from_reports([_report([(_case(1), {FAST: 1.0, SLOW: 5.0})])]).save(path)
    env.setenv("TOKENSPEED_KERNEL_ORACLE", str(path))
    selection.reload_settings()
    top = _ranked("rmsnorm", ("bf16",), {}, _sm90())[0]
    assert top.name == FAST and top.reason.startswith("measured 1; ")
    # A later table wins for a group both hold.
    flipped = tmp_path / "u.json"
    MeasuredOracle.from_reports([_report([(_case(1), {FAST: 5.0, SLOW: 1.0})])]).save(flipped)
    env.setenv("TOKENSPEED_KERNEL_ORACLE", f"{path},{flipped}")
    selection.reload_settings()
    assert _ranked("rmsnorm", ("bf16",), {}, _sm90())[0].name == SLOW
    # set_selection_oracle takes precedence over the environment.
    tk.set_selection_oracle(lambda spec, sig, traits, plat: None)
    assert _ranked("rmsnorm", ("bf16",), {}, _sm90())[0].score is None
    tk.set_selection_oracle(None)
    env.setenv("TOKENSPEED_KERNEL_ORACLE", "none")
    selection.reload_settings()
    assert _ranked("rmsnorm", ("bf16",), {}, _sm90())[0].name == SLOW
    env.setenv("TOKENSPEED_KERNEL_ORACLE", str(tmp_path / "missing.json"))
    with pytest.raises(FileNotFoundError, match="TOKENSPEED_KERNEL_ORACLE: no such file"):
        selection.reload_settings()
    (tmp_path / "bad.json").write_text('{"kind": "tokenspeed-kernel-oracle", "schema": 1, "entries": [{}]}')
    env.setenv("TOKENSPEED_KERNEL_ORACLE", str(tmp_path / "bad.json"))
    with pytest.raises(ValueError, match=r"TOKENSPEED_KERNEL_ORACLE: .*bad.json"):
        selection.reload_settings()


def test_cli_build_and_show(kernels, tmp_path, capsys):
    from tokenspeed_kernel import cli

    report, table = tmp_path / "r.json", tmp_path / "t.json"
    report.write_text(json.dumps(_report([(_case(1), {FAST: 1.0, SLOW: 2.0})])))
    assert cli.main(["oracle", "build", str(report), "-o", str(table)]) == 0
    assert MeasuredOracle.load(table).entries[0].scores == pytest.approx({FAST: 1.0, SLOW: 2.0})
    assert cli.main(["oracle", "show", str(table)]) == 0
    out = capsys.readouterr().out
    assert f"{GPU} rmsnorm bf16 {{fused_residual=False}}" in out and "2.000  slowhigh.rmsnorm" in out
    report.write_text("{}")
    assert cli.main(["oracle", "build", str(report), "-o", str(table)]) == 2


def _slow_reference_rmsnorm(x, weight, eps, *, residual=None, out=None):
    from tokenspeed_kernel.reference.norm import rmsnorm

    time.sleep(0.003)
    return rmsnorm(x, weight, eps, residual=residual, out=out)


def test_bench_oracle_out_ranks_the_measured_faster_kernel_first(env, tmp_path):
    from tokenspeed_kernel import cli

    tk.load_plugins()
    slow = "test.rmsnorm_sleepy"
    register_kernel("rmsnorm", name=slow, solution="test", impl=_slow_reference_rmsnorm, priority=Priority.SPECIALIZED,
                    formats=[{"x": ("fp32",)}], traits={"fused_residual": (False, True)})  # fmt: skip
    try:
        table = tmp_path / "t.json"
        argv = ["bench", "rmsnorm", "--shape", "tokens=8", "hidden=256", "--dtype", "fp32", "--no-ceilings",
                "--quiet", "--warmup-ms", "1", "--rep-ms", "10", "--oracle-out", str(table)]  # fmt: skip
        assert cli.main(argv) == 0
        cpu = tk.make_platform("cpu", device_name="cpu")
        assert _ranked("rmsnorm", ("fp32",), {}, cpu)[0].name == slow  # by priority
        tk.set_selection_oracle(MeasuredOracle.load(table))
        cands = _ranked("rmsnorm", ("fp32",), {}, cpu)
        assert cands[0].name == "reference.rmsnorm" and cands[0].reason.startswith("measured 1;")
        assert _rank_of(cands, slow) > 1 and next(c for c in cands if c.name == slow).score > 2
    finally:
        unregister_kernel(slow)


# -- the shipped H200 table ---------------------------------------------------------

_H200_KERNELS = (
    "triton.mha_decode_with_kvcache",
    "fa3.mha_decode_with_kvcache",
    "triton.mha_prefill",
    "fa3.mha_prefill",
)
GPT_OSS = {"head_dim": 64, "gqa_group": 8, "sinks": True}


def test_shipped_h200_table_loads_with_its_sources():
    table = shipped_oracle("NVIDIA H200")
    assert table is not None and len(table) >= 3
    assert shipped_oracle("NVIDIA H100 80GB HBM3") is None
    assert all(s["device"] == "NVIDIA H200" and s["date"].startswith("2026-") for s in table.sources)
    assert {e.op for e in table.entries} >= {"mha_prefill", "mha_decode_with_kvcache"}
    assert all(min(e.scores.values()) == pytest.approx(1.0) for e in table.entries)


def test_shipped_h200_table_ranks_triton_for_decode_and_fa3_for_full_causal_prefill(env):
    tk.load_plugins()
    missing = [k for k in _H200_KERNELS if registry.get(k) is None]
    if missing:
        pytest.skip(f"kernels not registered here: {missing} (the triton/nvidia plugins or tokenspeed-fa3 absent)")
    for name in _H200_KERNELS:  # a selection elsewhere on this CPU machine may have failed to load FA3
        env.delitem(selection._broken, name, raising=False)
    sig = ("bf16", "bf16")
    h200 = _sm90("NVIDIA H200")
    for window in (False, True):
        decode = _ranked("mha_decode_with_kvcache", sig, {**GPT_OSS, "window": window, "page_size": 16}, h200)
        assert decode[0].name == "triton.mha_decode_with_kvcache" and decode[0].reason.startswith("measured")
        assert _rank_of(decode, "fa3.mha_decode_with_kvcache") == 2
    prefill = _ranked("mha_prefill", sig, {**GPT_OSS, "window": False}, h200)
    assert [c.name for c in prefill[:2]] == ["fa3.mha_prefill", "triton.mha_prefill"]
    windowed = _ranked("mha_prefill", sig, {**GPT_OSS, "window": True}, h200)
    assert [c.name for c in windowed[:2]] == ["triton.mha_prefill", "fa3.mha_prefill"]
    # Unnamed sm90 platforms, and TOKENSPEED_KERNEL_ORACLE=none, keep the priority order.
    assert _ranked("mha_prefill", sig, {**GPT_OSS, "window": True}, _sm90(""))[0].name == "fa3.mha_prefill"
    env.setenv("TOKENSPEED_KERNEL_ORACLE", "none")
    selection.reload_settings()
    assert _ranked("mha_prefill", sig, {**GPT_OSS, "window": True}, h200)[0].name == "fa3.mha_prefill"
    # `default` applies the shipped tables to any device of their arch.
    env.setenv("TOKENSPEED_KERNEL_ORACLE", "default")
    selection.reload_settings()
    assert _ranked("mha_prefill", sig, {**GPT_OSS, "window": True}, _sm90(""))[0].name == "triton.mha_prefill"

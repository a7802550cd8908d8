"""Measured tables: building from bench reports, ranking by size bucket, persistence, activation (CPU)."""

from __future__ import annotations

import functools
import json
import math
import time

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.benchmark.oracle import build_table, call_key
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
    """A bench --json report: rows of (case, {kernel: median_us or (median_us, graph_median_us[, eager_us])})."""
    results = []
    for case, times in rows:
        entries = []
        for kernel, t in times.items():
            median, graph, eager = (*t, None)[:3] if isinstance(t, tuple) else (t, None, None)
            entries.append({"name": kernel, "kind": "kernel", "solution": kernel.split(".")[0], "status": "ok",
                            "median_us": median, "graph_median_us": graph, "method": "cuda-events",
                            "eager_us": eager})  # fmt: skip
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
    table = build_table([_report([
        (_case(4), {FAST: (10.0, 4.0), SLOW: (5.0, 2.0)}),  # graph times for both: used (FAST 2.0x)
        (_case(5), {FAST: (10.0, 4.0), SLOW: 30.0}),  # SLOW has no graph time: plain medians (SLOW 3.0x)
        (_case(7), {FAST: 8.0, SLOW: 8.0}),  # 4, 5, 7 rows: one power-of-two bucket (4..7)
    ])])  # fmt: skip
    [entry] = table.entries
    assert (entry.arch, entry.device, entry.op, entry.signature) == ("sm90", GPU, "rmsnorm", ("bf16",))
    assert entry.traits == {"fused_residual": False} and entry.buckets == {"rows": 3}
    assert entry.cases == 3 and entry.timing == "mixed"
    assert entry.scores[FAST] == pytest.approx((2.0 * 1.0 * 1.0) ** (1 / 3))
    assert entry.scores[SLOW] == pytest.approx((1.0 * 3.0 * 1.0) ** (1 / 3))
    assert set(entry.scores) == {FAST, SLOW}  # neither the peer nor the failed kernel


def test_kernels_missing_from_a_case_leave_the_group_and_single_kernel_groups_are_dropped():
    other = "third.rmsnorm"
    table = build_table([_report([
        (_case(64), {FAST: 1.0, SLOW: 2.0, other: 0.5}),  # other is fastest here but missing below
        (_case(100), {FAST: 1.0, SLOW: 4.0}),
        (_case(8, residual=True), {FAST: 1.0}),  # a group with one kernel ranks nothing
    ])])  # fmt: skip
    [entry] = table.entries
    assert entry.scores == pytest.approx({FAST: 1.0, SLOW: math.sqrt(2.0 * 4.0)})
    assert any("fused_residual" in n and "no ranking" in n for n in table.notes)


def test_the_same_case_measured_twice_counts_once_graph_timing_preferred():
    eager = _report([(_case(1), {FAST: 1.0, SLOW: 3.0})], date="2026-02-01 00:00:00 UTC")
    graph = _report([(_case(1), {FAST: (9.0, 6.0), SLOW: (9.0, 2.0)})], date="2026-01-01 00:00:00 UTC")
    table = build_table([graph, eager])
    [entry] = table.entries
    assert entry.cases == 1 and entry.timing == "graph"
    assert entry.scores == pytest.approx({FAST: 3.0, SLOW: 1.0})
    assert [s["cases_used"] for s in table.sources] == [1, 0]


def test_each_size_bucket_is_its_own_group_and_lookup_takes_the_nearest_measured(kernels):
    table = build_table([_report([
        (_case(1), {FAST: 1.0, SLOW: 3.0}),  # rows bucket 1: FAST 3x faster
        (_case(4096), {FAST: 4.0, SLOW: 1.0}),  # rows 4096..8191: SLOW 4x faster
    ])])  # fmt: skip
    assert sorted(e.buckets["rows"] for e in table.entries) == [1, 13]
    plat = _sm90()
    tk.set_selection_oracle(table)
    try:
        for rows, best in ((1, FAST), (2, FAST), (20, FAST), (4096, SLOW), (100_000, SLOW), (300, SLOW)):
            cands = [c for c in tk.explain_selection("rmsnorm", ("bf16",), {}, sizes={"rows": rows}, platform=plat)
                     if c.eligible]  # fmt: skip
            assert cands[0].name == best, rows
        nearest = tk.explain_selection("rmsnorm", ("bf16",), {}, sizes={"rows": 3000}, platform=plat)
        assert "rows=4096..8191 (nearest measured)" in nearest[0].reason
        # No sizes (moe_plan without a token count): the geometric mean over the buckets.
        both = _ranked("rmsnorm", ("bf16",), {}, plat)
        assert [c.name for c in both[:2]] == [SLOW, FAST] and "2 size buckets aggregated" in both[0].reason
        assert both[0].score == pytest.approx(math.sqrt(3.0 * 1.0)) and both[1].score == pytest.approx(2.0)
    finally:
        tk.set_selection_oracle(None)


def test_call_key_reads_the_op_objects_checks_for_a_large_gpt_oss_decode_case():
    # 256 sequences x 2048 tokens (a 512 MiB cache): built on fake tensors, read at dispatch.
    case = Case.make(
        "mha_decode_with_kvcache",
        "bf16",
        {**get_op_cases("mha_decode_with_kvcache").defaults, "cache_lens": (2048,) * 256, "heads_q": 64,
         "heads_kv": 8, "head_dim": 64, "sinks": True, "window_left": 127, "page_size": 16},
    )  # fmt: skip
    t0 = time.perf_counter()
    sig, traits, buckets = call_key(case)
    assert time.perf_counter() - t0 < 60
    assert sig == ("bf16", "bf16")
    assert traits == {"head_dim": 64, "gqa_group": 8, "window": True, "sinks": True, "logit_cap": False,
                      "return_lse": False, "page_size": 16}  # fmt: skip
    # batch 256 -> bucket 9 (256..511); context: 128 pages of 16 = 2048 slots -> bucket 12 (2048..4095)
    assert buckets == {"batch": 9, "context": 12}


# -- selection ----------------------------------------------------------------------


def test_measured_table_changes_the_selection_and_explain_says_measured(kernels):
    plat = _sm90()
    before = _ranked("rmsnorm", ("bf16",), {}, plat)
    assert before[0].name == SLOW and all(c.score is None for c in before)
    table = build_table([_report([(_case(64), {FAST: 2.0, SLOW: 3.0}), (_case(65), {FAST: 5.0, SLOW: 9.0})])])
    tk.set_selection_oracle(table)
    after = _ranked("rmsnorm", ("bf16",), {}, plat)
    assert [c.name for c in after[:2]] == [FAST, SLOW]
    assert after[0].selected and after[0].score == pytest.approx(1.0)
    assert after[1].score == pytest.approx(math.sqrt(1.5 * 1.8))
    assert after[1].reason.startswith("measured 1.64 (Test GPU 9000, rows=64..127); priority 300")
    with tk.fake_platform(plat):
        selection.clear_selection_cache()
        assert tk.select_spec("rmsnorm", ("bf16",), {}).spec.name == FAST
    # The format signature and the traits are part of the key: bf16 only was measured.
    assert _ranked("rmsnorm", ("fp32",), {}, plat)[0].name == SLOW


def test_group_without_data_falls_back_to_priority(kernels):
    tk.set_selection_oracle(build_table([_report([(_case(1), {FAST: 1.0, SLOW: 3.0})])]))
    cands = _ranked("rmsnorm", ("bf16",), {"fused_residual": True}, _sm90())
    assert cands[0].name == SLOW
    assert all(c.score is None and "measured" not in c.reason for c in cands)
    # Another arch has no data either.
    assert _ranked("rmsnorm", ("bf16",), {}, tk.make_platform("sm100"))[0].name == SLOW


def test_the_platforms_own_device_is_preferred_over_other_devices_of_the_arch(kernels):
    a = _report([(_case(1), {FAST: 1.0, SLOW: 2.0})], name="GPU A")
    b = _report([(_case(1), {FAST: 2.0, SLOW: 1.0})], name="GPU B")
    tk.set_selection_oracle(build_table([a, b]))
    assert _ranked("rmsnorm", ("bf16",), {}, _sm90("GPU B"))[0].name == SLOW
    assert _ranked("rmsnorm", ("bf16",), {}, _sm90("GPU A"))[0].name == FAST
    assert _ranked("rmsnorm", ("bf16",), {}, _sm90("GPU C"))[0].name == FAST  # another device: the first measured


# -- persistence and activation -----------------------------------------------------


def test_save_load_round_trip(tmp_path):
    table = build_table([_report([(_case(1), {FAST: 1.0, SLOW: 1.7}), (_case(9), {FAST: 2.0, SLOW: 3.0})])])
    path = tmp_path / "t.json"
    table.save(path)
    loaded = tk.MeasuredTable.load(path)
    assert loaded.entries == table.entries and loaded.sources == table.sources and loaded.created == table.created
    assert loaded.sources[0]["date"] == "2026-01-01 00:00:00 UTC" and loaded.sources[0]["device"] == GPU
    data = json.loads(path.read_text())
    assert data["kind"] == "tokenspeed-kernel-measured-table" and data["created"]
    assert data["entries"][0]["sizes"] == {"rows": "1"} and data["entries"][1]["sizes"] == {"rows": "8..15"}
    data["kind"] = "something-else"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="not a TokenSpeed-kernel measured table"):
        tk.MeasuredTable.load(path)


def test_environment_variable_names_tables_or_turns_measuring_off(kernels, env, tmp_path):
    path = tmp_path / "t.json"
    build_table([_report([(_case(1), {FAST: 1.0, SLOW: 5.0})])]).save(path)
    env.setenv("TOKENSPEED_KERNEL_ORACLE", str(path))
    selection.reload_settings()
    top = _ranked("rmsnorm", ("bf16",), {}, _sm90())[0]
    assert top.name == FAST and top.reason.startswith("measured 1 (")
    # A later table wins for a group both hold.
    flipped = tmp_path / "u.json"
    build_table([_report([(_case(1), {FAST: 5.0, SLOW: 1.0})])]).save(flipped)
    env.setenv("TOKENSPEED_KERNEL_ORACLE", f"{path},{flipped}")
    selection.reload_settings()
    assert _ranked("rmsnorm", ("bf16",), {}, _sm90())[0].name == SLOW
    # set_selection_oracle takes precedence over the environment.
    tk.set_selection_oracle(lambda op, sig, traits, buckets, plat: None)
    assert _ranked("rmsnorm", ("bf16",), {}, _sm90())[0].score is None
    tk.set_selection_oracle(None)
    env.setenv("TOKENSPEED_KERNEL_ORACLE", "none")
    selection.reload_settings()
    assert _ranked("rmsnorm", ("bf16",), {}, _sm90())[0].name == SLOW
    env.setenv("TOKENSPEED_KERNEL_ORACLE", str(tmp_path / "missing.json"))
    selection.reload_settings()
    with pytest.raises(tk.SettingsError, match="TOKENSPEED_KERNEL_ORACLE: no such file"):
        _ranked("rmsnorm", ("bf16",), {}, _sm90())
    (tmp_path / "bad.json").write_text('{"kind": "tokenspeed-kernel-measured-table", "schema": 2, "entries": [{}]}')
    env.setenv("TOKENSPEED_KERNEL_ORACLE", str(tmp_path / "bad.json"))
    selection.reload_settings()
    with pytest.raises(tk.SettingsError, match=r"TOKENSPEED_KERNEL_ORACLE: .*bad.json"):
        _ranked("rmsnorm", ("bf16",), {}, _sm90())


def test_cli_build_and_show(kernels, tmp_path, capsys):
    from tokenspeed_kernel import cli

    report, table = tmp_path / "r.json", tmp_path / "t.json"
    report.write_text(json.dumps(_report([(_case(1), {FAST: 1.0, SLOW: 2.0})])))
    assert cli.main(["oracle", "build", str(report), "-o", str(table)]) == 0
    assert tk.MeasuredTable.load(table).entries[0].scores == pytest.approx({FAST: 1.0, SLOW: 2.0})
    assert cli.main(["oracle", "show", str(table)]) == 0
    out = capsys.readouterr().out
    assert f"{GPU} rmsnorm bf16 {{fused_residual=False}} [rows=1]" in out and "2.000  slowhigh.rmsnorm" in out
    report.write_text("{}")
    assert cli.main(["oracle", "build", str(report), "-o", str(table)]) == 2


def _slow_reference_rmsnorm(x, weight, eps, *, residual=None, out=None):
    from tokenspeed_kernel.reference.norm import rmsnorm

    time.sleep(0.003)
    return rmsnorm(x, weight, eps, residual=residual, out=out)


def test_bench_oracle_out_ranks_the_measured_faster_kernel_first_and_eager_times_the_public_op(env, tmp_path):
    from tokenspeed_kernel import cli

    tk.load_plugins()
    slow = "test.rmsnorm_sleepy"
    register_kernel("rmsnorm", name=slow, solution="test", impl=_slow_reference_rmsnorm, priority=Priority.SPECIALIZED,
                    formats=[{"x": ("fp32",)}], traits={"fused_residual": (False, True)})  # fmt: skip
    try:
        out, table, md = tmp_path / "r.json", tmp_path / "t.json", tmp_path / "r.md"
        argv = ["bench", "rmsnorm", "--shape", "tokens=8", "hidden=256", "--dtype", "fp32", "--no-ceilings",
                "--quiet", "--warmup-ms", "1", "--rep-ms", "10", "--eager", "--json", str(out), "--device", "cpu",
                "--md", str(md),
                "--oracle-out", str(table)]  # fmt: skip
        assert cli.main(argv) == 0
        [res] = json.loads(out.read_text())["results"]
        eager = {e["name"]: e["eager_us"] for e in res["entries"]}
        assert eager[slow] > 3000 > eager["reference.rmsnorm"] > 0  # the 3 ms sleep, through the public op
        assert f"eager {eager[slow]:.1f} us" in md.read_text()  # the report shows it
        cpu = tk.make_platform("cpu", device_name="cpu")
        assert _ranked("rmsnorm", ("fp32",), {}, cpu)[0].name == slow  # by priority
        tk.set_selection_oracle(tk.MeasuredTable.load(table))
        [entry] = tk.MeasuredTable.load(table).entries
        assert entry.scores[slow] > 2 and entry.scores["reference.rmsnorm"] == 1.0
        assert entry.eager_scores[slow] > 2 and entry.eager_scores["reference.rmsnorm"] == 1.0
        # The measured time says the reference is faster, but the reference is the last resort:
        # it never outranks a kernel that can run the call.
        tk.set_selection_oracle(tk.MeasuredTable.load(table))
        cands = _ranked("rmsnorm", ("fp32",), {}, cpu)
        assert cands[0].name == slow and cands[-1].name == "reference.rmsnorm"
    finally:
        unregister_kernel(slow)


# -- eager scores: eager and captured calls ---------------------------------------------


def _eager_table():
    """Device time favours SLOW (2x); the eager public op favours FAST (3x): a host-bound call."""
    return build_table([_report([
        (_case(1), {FAST: (9.0, 4.0, 10.0), SLOW: (9.0, 2.0, 30.0)}),
        (_case(1, residual=True), {FAST: (9.0, 4.0), SLOW: (9.0, 2.0)}),  # no eager times: no eager scores
    ])])  # fmt: skip


def test_eager_times_give_eager_scores_which_persist(tmp_path):
    table = build_table([_report([
        (_case(64), {FAST: (9.0, 4.0, 10.0), SLOW: (9.0, 2.0, 30.0)}),
        (_case(65), {FAST: (9.0, 4.0, 20.0), SLOW: (9.0, 2.0, 10.0)}),
        (_case(66), {FAST: (9.0, 4.0, 10.0), SLOW: (9.0, 2.0)}),  # SLOW has no eager time here
    ]), _report([(_case(1), {FAST: (1.0, 1.0, 5.0), SLOW: (1.0, 2.0)})])])  # fmt: skip
    by_rows = {e.buckets["rows"]: e for e in table.entries}
    # SLOW lacks an eager time in one case of the 64..127 group: FAST alone ranks nothing, so no eager scores.
    assert by_rows[7].scores == pytest.approx({FAST: 2.0, SLOW: 1.0}) and by_rows[7].eager_scores == {}
    assert by_rows[1].eager_scores == {}
    two = build_table([_report([
        (_case(64), {FAST: (9.0, 4.0, 10.0), SLOW: (9.0, 2.0, 30.0)}),
        (_case(65), {FAST: (9.0, 4.0, 20.0), SLOW: (9.0, 2.0, 10.0)}),
    ])])  # fmt: skip
    [entry] = two.entries
    assert entry.scores == pytest.approx({FAST: 2.0, SLOW: 1.0})
    assert entry.eager_scores == pytest.approx({FAST: math.sqrt(1.0 * 2.0), SLOW: math.sqrt(3.0 * 1.0)})
    path = tmp_path / "t.json"
    two.save(path)
    [loaded] = tk.MeasuredTable.load(path).entries
    assert loaded.eager_scores == pytest.approx(entry.eager_scores) and loaded.scores == pytest.approx(entry.scores)
    assert "eager" in two.describe()
    table.save(path)
    assert all("eager_scores" not in e for e in json.loads(path.read_text())["entries"])


def test_eager_calls_rank_by_eager_scores_and_captured_calls_by_device_time(kernels, env):
    plat = _sm90()
    tk.set_selection_oracle(_eager_table())
    eager = _ranked("rmsnorm", ("bf16",), {}, plat)
    assert eager[0].name == FAST and eager[0].selected and ", eager" in eager[0].reason
    assert eager[1].score == pytest.approx(3.0)
    graph = [c for c in tk.explain_selection("rmsnorm", ("bf16",), {}, platform=plat, captured=True) if c.eligible]
    assert graph[0].name == SLOW and graph[0].selected and "eager" not in graph[0].reason
    with tk.fake_platform(plat):
        selection.clear_selection_cache()
        sel = tk.select_spec("rmsnorm", ("bf16",), {}, sizes={"rows": 1})
        assert sel.spec.name == FAST and sel.captured.spec.name == SLOW and sel.for_graph.spec.name == SLOW
        # A group without eager scores ranks eager calls by device time: one pick, no captured one.
        res = tk.select_spec("rmsnorm", ("bf16",), {"fused_residual": True}, sizes={"rows": 1})
        assert res.spec.name == SLOW and res.captured is None and res.for_graph is res
        # An override decides both modes.
        forced = tk.select_spec("rmsnorm", ("bf16",), {}, sizes={"rows": 1}, override=FAST)
        assert forced.spec.name == FAST and forced.captured is None
    # TOKENSPEED_KERNEL_EAGER_SCORES=0: device time ranks both modes (one pick).
    env.setenv("TOKENSPEED_KERNEL_EAGER_SCORES", "0")
    selection.reload_settings()
    assert _ranked("rmsnorm", ("bf16",), {}, plat)[0].name == SLOW
    with tk.fake_platform(plat):
        sel = tk.select_spec("rmsnorm", ("bf16",), {}, sizes={"rows": 1})
        assert sel.spec.name == SLOW and sel.captured is None
    env.setenv("TOKENSPEED_KERNEL_EAGER_SCORES", "maybe")
    with pytest.raises(tk.SettingsError, match="TOKENSPEED_KERNEL_EAGER_SCORES: expected 1 or 0"):
        selection.reload_settings()


def test_explain_captured_ranks_as_a_captured_call(kernels, env, tmp_path, capsys):
    from tokenspeed_kernel import cli

    path = tmp_path / "t.json"
    _eager_table().save(path)
    env.setenv("TOKENSPEED_KERNEL_ORACLE", str(path))
    selection.reload_settings()
    picks = {}
    for flag in ((), ("--captured",)):
        capsys.readouterr()
        code = cli.main(["explain", "rmsnorm", "--platform", "sm90", "--dtype", "bf16", "--size", "rows=1", *flag])
        out = capsys.readouterr().out
        assert code == 0, out
        picks[flag] = next(line.split()[2] for line in out.splitlines() if line.startswith("*"))
        assert ("a call captured in a CUDA graph" in out) == bool(flag)
    assert picks == {(): FAST, ("--captured",): SLOW}


@pytest.fixture
def tagged(env):
    """FAST and SLOW rmsnorm kernels that return their own names (the table decides which runs); yields the list of
    the kernels' runs, in order."""
    tk.load_plugins()
    ran: list[str] = []

    def impl(*a, _n, **k):
        ran.append(_n)
        return _n

    for name, prio in ((FAST, Priority.PORTABLE), (SLOW, Priority.SPECIALIZED)):
        register_kernel("rmsnorm", name=name, solution=name.split(".")[0], impl=functools.partial(impl, _n=name),
                        formats=[{"x": ("bf16", "fp32")}], traits={"fused_residual": (False, True)}, priority=prio)  # fmt: skip
    yield ran
    for name in (FAST, SLOW):
        unregister_kernel(name)


def test_a_call_runs_the_captured_pick_only_while_its_stream_is_captured(tagged, monkeypatch):
    from tokenspeed_kernel.core import op as op_module

    ran = tagged
    x, w = torch.randn(1, 64, dtype=torch.bfloat16), torch.ones(64, dtype=torch.bfloat16)
    capturing = [False]
    checks = []

    def is_capturing():
        checks.append(1)
        return capturing[0]

    monkeypatch.setattr(op_module, "_is_capturing", is_capturing)
    tk.set_selection_oracle(_eager_table())
    with tk.fake_platform(_sm90()):
        # The first eager call also runs the captured pick once, first (a capture must not be its first run).
        assert tk.rmsnorm(x, w) == FAST and ran == [SLOW, FAST]
        assert tk.rmsnorm(x, w) == FAST and ran == [SLOW, FAST, FAST]
        prepared = tk.rmsnorm.prepare(x, w)
        assert prepared.kernel == FAST and prepared.captured_call.kernel == SLOW
        assert f"{SLOW} when captured" in repr(prepared)
        ran.clear()
        assert prepared(x, w) == FAST and prepared._served(x, w) == FAST and ran == [SLOW, FAST, FAST]
        capturing[0] = True
        ran.clear()
        assert tk.rmsnorm(x, w) == SLOW
        assert prepared(x, w) == SLOW and prepared._served(x, w) == SLOW and prepared._run(x, w) == SLOW
        with monkeypatch.context() as m:  # the checked path (debug mode, a profiler, a dispatch hook) routes too
            m.setattr(op_module, "debug_checks_enabled", lambda: True)
            assert prepared(x, w) == SLOW
        assert ran == [SLOW] * 5
        capturing[0] = False
        ran.clear()
        assert tk.rmsnorm(x, w) == FAST and prepared._run(x, w) == FAST and ran == [FAST, FAST]
        # A prepared call whose first eager call takes the checked path warms the captured pick there.
        other = tk.rmsnorm.prepare(x, w)
        ran.clear()
        with monkeypatch.context() as m:
            m.setattr(op_module, "debug_checks_enabled", lambda: True)
            assert other(x, w) == FAST and ran == [SLOW, FAST]
        # Calls whose selection does not differ by mode never check.
        checks.clear()
        r = torch.randn(1, 64, dtype=torch.bfloat16)
        assert tk.rmsnorm(x, w, residual=r) == SLOW
        assert tk.rmsnorm.prepare(x, w, residual=r)(x, w, residual=r) == SLOW
        assert checks == []


def test_ops_that_write_in_place_are_not_split_by_mode(tagged):
    assert not tk.kvcache_store.rerunnable and not tk.apply_rotary_and_store.rerunnable and tk.mm.rerunnable
    tk.set_selection_oracle(_eager_table())
    object.__setattr__(tk.rmsnorm, "rerunnable", False)  # (as an op that mutates an argument)
    try:
        with tk.fake_platform(_sm90()):
            selection.clear_selection_cache()
            sel = tk.select_spec("rmsnorm", ("bf16",), {}, sizes={"rows": 1})
            assert sel.spec.name == SLOW and sel.captured is None  # device time decides both modes
            assert _ranked("rmsnorm", ("bf16",), {}, _sm90())[0].name == SLOW  # and explain says so
    finally:
        object.__setattr__(tk.rmsnorm, "rerunnable", True)
        selection.clear_selection_cache()


@pytest.mark.gpu
def test_a_cuda_graph_captures_the_captured_pick_and_eager_calls_run_the_eager_one(env):
    """On the GPU: eager calls (plain, then served) run the eager pick; a call captured in a CUDA graph, plain or
    served or prepared, records the captured pick (two stand-in kernels whose outputs differ say which ran)."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    tk.load_plugins()
    one, two = "eagerpick.rmsnorm", "graphpick.rmsnorm"
    for name, prio, k in ((one, Priority.PORTABLE, 1.0), (two, Priority.SPECIALIZED, 2.0)):
        register_kernel("rmsnorm", name=name, solution=name.split(".")[0], formats=[{"x": ("bf16",)}],
                        traits={"fused_residual": (False,)}, priority=prio,
                        impl=lambda x, weight, eps, residual=None, out=None, _k=k: x * _k)  # fmt: skip
    try:
        plat = tk.current_platform()
        tk.set_selection_oracle(build_table([_report(
            [(_case(1), {one: (9.0, 4.0, 10.0), two: (9.0, 2.0, 30.0)})], name=plat.device_name, arch=plat.arch,
        )]))  # fmt: skip
        x = torch.randn(1, 256, dtype=torch.bfloat16, device="cuda")
        w = torch.ones(256, dtype=torch.bfloat16, device="cuda")
        for _ in range(4):  # plain, prepared, served...
            assert torch.equal(tk.rmsnorm(x, w), x)
        prepared = tk.rmsnorm.prepare(x, w)
        assert torch.equal(prepared(x, w), x)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            tk.rmsnorm(x, w)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            served, direct = tk.rmsnorm(x, w), prepared(x, w)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(served, x * 2) and torch.equal(direct, x * 2)
        assert torch.equal(tk.rmsnorm(x, w), x)  # eager again after the capture
    finally:
        for name in (one, two):
            unregister_kernel(name)

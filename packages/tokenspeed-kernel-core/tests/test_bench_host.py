"""``tokenspeed-kernel bench --host`` on CPU: its JSON and Markdown, and the flags it refuses."""

from __future__ import annotations

import json

from tokenspeed_kernel.benchmark import cli
from tokenspeed_kernel.benchmark.host import HOST_CASES, TORCH_EQUIVALENTS


def test_host_bench_writes_every_column_for_the_decode_step_cases(tmp_path):
    out_json, out_md = tmp_path / "host.json", tmp_path / "host.md"
    rc = cli.main(["--host", "rmsnorm", "--calls", "5", "--quiet", "--json", str(out_json), "--md", str(out_md)])
    assert rc == 0
    data = json.loads(out_json.read_text())
    rows = data["rows"]
    assert len(rows) == len(HOST_CASES["rmsnorm"])  # the decode step's calls: plain and with a residual
    for r in rows:
        assert r["kernel"] == "reference.rmsnorm" and "tokens=1 hidden=2880" in r["case"]
        for col in ("public_us", "public_before_us", "direct_us", "prepared_us"):
            assert r[col] > 0, (col, r)
        assert abs(r["dispatch_us"] - (r["public_us"] - r["direct_us"])) < 1e-9
        assert "graph_us" not in r  # CPU: no graph column
    plain = next(r for r in rows if "residual" not in r["case"])
    assert plain["torch"] == TORCH_EQUIVALENTS["rmsnorm"][0] and plain["torch_us"] > 0
    assert "launch_cache" in data and data["meta"]["calls"] == 5
    md = out_md.read_text()
    assert "| rmsnorm |" in md and "before (JIT launch, no eager graph)" in md and "bench --host rmsnorm" in md
    assert "prepared call" in md


def test_host_bench_refuses_flags_it_does_not_take(capsys):
    assert cli.main(["--host", "rmsnorm", "--graph"]) == 2
    assert "--host does not take --graph" in capsys.readouterr().err
    assert cli.main(["--host", "rmsnorm", "--calls", "0"]) == 2
    assert "--calls" in capsys.readouterr().err
    assert cli.main(["--host", "not_an_op"]) == 2

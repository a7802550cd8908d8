"""``tools/gpt_oss_throughput.py`` on CPU with the tiny config: every stage runs and the report holds together.

The H200 numbers come from running the tool there; this only guards its code paths
(prefill and decode timing, kernel listing, per-op times, JSON + Markdown, an
unavailable configuration reported instead of aborting the run).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib

import pytest
import torch

TOOL = pathlib.Path(__file__).resolve().parents[3] / "tools" / "gpt_oss_throughput.py"

pytestmark = [
    pytest.mark.skipif(not TOOL.exists(), reason="tools/ is not part of this checkout"),
    # Under the Triton interpreter "full" selection would run interpreted Triton kernels: minutes, not seconds.
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="TRITON_INTERPRET=1 makes this slow"),
]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("gpt_oss_throughput", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_smoke_run(tool, tmp_path, capsys):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        args = ["--out", str(tmp_path), "--config", "tiny", "--device", "cpu", "--layers", "1"]
        args += ["--prefill", "1x8,2x8", "--decode-batches", "1,2", "--context", "8", "--decode-steps", "2"]
        args += ["--prefill-iters", "1", "--configs", "full,triton,reference"]
        assert tool.main(args) == 0
    finally:
        torch.set_num_threads(n)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["meta"]["layers"] == 1 and results["meta"]["shapes"] == "tiny"
    full, triton, ref = (results["configs"][c] for c in ("full", "triton", "reference"))
    # On a CPU without the Triton interpreter, forcing Triton cannot be served: reported, not fatal.
    assert (
        triton["errors"] and triton["errors"][0]["stage"] == "build" and "OverrideError" in triton["errors"][0]["error"]
    )
    for res in (full, ref):
        assert not res["errors"]
        assert [(r["batch"], r["length"], r["tokens"]) for r in res["prefill"]] == [(1, 8, 8), (2, 8, 16)]
        assert [(r["batch"], r["context"]) for r in res["decode"]] == [(1, 8), (2, 8)]
        assert all(r["tokens_per_s"] > 0 and not r["cuda_graph"] for r in res["decode"])
        ops = res["kernels"]
        for op in (
            "mha_prefill",
            "mha_decode_append_kvcache",  # (decode: the rotation and the cache write inside the attention's call)
            "kvcache_store",
            "moe_apply",
            "moe_gate",
            "mm",
            "argmax",
        ):
            assert ops[op]["kernels"] == [f"reference.{op}"], op
        assert ops["mm"]["calls"] > ops["moe_apply"]["calls"] > 0
        assert set(res["decode_op_us"]["ops"]) >= {"mha_decode_append_kvcache", "moe_apply"}
    rows = {r["case"]: r for r in results["rows"]}
    assert set(rows) == {"prefill 1x8", "prefill 2x8", "decode batch 1 @ 8", "decode batch 2 @ 8"}
    row = rows["prefill 2x8"]
    assert row["full_over_reference"] == pytest.approx(row["full_tokens_per_s"] / row["reference_tokens_per_s"])
    assert "full_over_triton" not in row
    md = (tmp_path / "results.md").read_text()
    assert "| prefill 2x8 |" in md and "| moe_apply | reference.moe_apply | - | reference.moe_apply |" in md
    assert "triton, build: OverrideError" in md
    assert "decode batch 2 @ 8" in capsys.readouterr().out

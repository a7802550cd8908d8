"""``tools/op_spin.py`` on the CPU: every case is a well-formed call of its public op (what its GPU run under py-spy
relies on), and bad arguments are refused by name."""

from __future__ import annotations

import pathlib
import sys

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[3] / "tools"

pytestmark = pytest.mark.skipif(not (TOOLS / "op_spin.py").exists(), reason="tools/ is not in this checkout")


def test_every_case_runs_on_cpu(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(TOOLS))
    import op_spin

    try:
        for case in op_spin.CASES:
            assert op_spin.main([case, "--device", "cpu"]) == 0
            assert f"{case}: ran on cpu" in capsys.readouterr().out
        assert op_spin.main(["moe_route", "--device", "cpu", "--seconds", "0.05"]) == 0  # spins on the CPU too
        assert "calls spun" in capsys.readouterr().out
        with pytest.raises(SystemExit, match="--seconds"):
            op_spin.main(["rmsnorm", "--device", "cpu", "--seconds", "0"])
        with pytest.raises(SystemExit):
            op_spin.main(["no_such_case", "--device", "cpu"])
    finally:
        sys.modules.pop("op_spin", None)

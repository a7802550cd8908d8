"""``tools/gate_tile_probe.py`` on the CPU (the interpreter, ``--smoke``): it runs, writes its JSON, and finds the
experts split across programs bit-equal to one program with the same K step (what its GPU run relies on)."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[3] / "tools"

pytestmark = pytest.mark.skipif(not (TOOLS / "gate_tile_probe.py").exists(), reason="tools/ is not in this checkout")


def test_smoke_split_equals_one_program(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TOOLS))
    import gate_tile_probe

    assert gate_tile_probe.main(
        ["--smoke", "--out", str(tmp_path), "--experts", "14", "--tokens", "1,3", "--tiles", "2,32,0;2,32,4;table"]
    ) == 0  # fmt: skip
    results = json.loads((tmp_path / "gate_tile_probe.json").read_text())["results"]
    assert len(results) == 4  # 2 token counts x (plain, norm)
    for row in results:
        assert row["tiles"]["2,32,4"]["same_bits_as_first"] is True, row
        assert row["tiles"]["table"]["same_bits_as_first"] is True, row  # the interpreter's table: 2,32 split by 4
    with pytest.raises(SystemExit, match="--tiles"):
        gate_tile_probe.main(["--smoke", "--tiles", "1,2"])
    with pytest.raises(SystemExit, match="--host"):
        gate_tile_probe.main(["--smoke", "--host"])
    sys.modules.pop("gate_tile_probe", None)

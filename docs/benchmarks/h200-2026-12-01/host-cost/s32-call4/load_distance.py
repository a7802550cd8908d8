"""Session 32 (development machine, no GPU): how many SASS instructions separate each ``LDG.128`` of the fp32 GEMV
launches (20B layer, one token, the default tiles) from the first instruction that reads its registers, at ptxas's
default register budget and under a ``maxnreg`` cap.

    PYTHONPATH=$(ls -d packages/*/src | tr '\\n' ':') python3 docs/benchmarks/h200-2026-12-01/host-cost/s32-call4/load_distance.py
"""

import re
import sys

sys.path.insert(0, "packages/tokenspeed-kernel-nvidia/tests")

import test_hopper_moe as t  # the tests' launch capture
from _pytest.monkeypatch import MonkeyPatch
from triton.tools.disasm import get_sass

from tokenspeed_kernel.testing import compile_launch


def distances(sass: str) -> list[int]:
    """For each ``LDG.E.128``: instructions to the first later one naming one of its four registers as a source."""
    ins = [line.split("\t", 1)[1] if "\t" in line else line for line in sass.splitlines()]
    ins = [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*", "", x).strip() for x in ins]
    ins = [x for x in ins if x and re.match(r"^[@A-Z]", x)]
    out = []
    for i, x in enumerate(ins):
        m = re.search(r"LDG\.E\.128\s+R(\d+)", x)
        if m:
            regs = {f"R{int(m.group(1)) + j}" for j in range(4)}
            for j in range(i + 1, min(i + 400, len(ins))):
                sources = ins[j].split(",", 1)[1] if "," in ins[j] else ""
                if regs & set(re.findall(r"\bR\d+\b", sources)):
                    out.append(j - i)
                    break
    return sorted(out)


def main():
    calls = t._launches(MonkeyPatch(), 1, e=32, gemv=True, k=4)
    for extra in ({}, {"maxnreg": 128}, {"maxnreg": 168}):
        for fn, _grid, args, kw in calls:
            ck = compile_launch(fn, args, {**kw, **extra}, "sm90")
            d = distances(get_sass(ck.asm["cubin"]))
            gemm = "gate_up" if kw["GATE_UP"] else "down"
            print(extra, gemm, "n", len(d), "median", d[len(d) // 2] if d else None, "min", d[:5])


if __name__ == "__main__":
    main()

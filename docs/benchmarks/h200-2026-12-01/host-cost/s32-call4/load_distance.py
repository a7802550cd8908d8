"""Session 32 (development machine, no GPU): how many SASS instructions separate each LDG.128 of the fp32 GEMV
launches (20B layer, one token, the default tiles) from the first instruction that reads its registers, at ptxas's
default register budget and under a maxnreg cap. Run from the repository root with the packages on PYTHONPATH."""
import sys, re
sys.path.insert(0, "/work/main/packages/tokenspeed-kernel-nvidia/tests")
from _pytest.monkeypatch import MonkeyPatch
import test_hopper_moe as t
from tokenspeed_kernel.testing import compile_launch
from triton.tools.disasm import get_sass
mp = MonkeyPatch()
calls = t._launches(mp, 1, e=32, gemv=True, k=4)
def dist(sass):
    ins = [l.split('\t',1)[1] if '\t' in l else l for l in sass.splitlines()]
    ins = [re.sub(r"^\s*/\*[0-9a-f]+\*/\s*", "", x).strip() for x in ins]
    ins = [x for x in ins if x and re.match(r"^[@A-Z]", x)]
    ds = []
    for i, x in enumerate(ins):
        m = re.search(r"LDG\.E\.128\s+(R\d+)", x)
        if m:
            r = int(m.group(1)[1:]); regs = {f"R{r+j}" for j in range(4)}
            for j in range(i+1, min(i+400, len(ins))):
                toks = re.findall(r"\bR\d+\b", ins[j].split(",",1)[1] if "," in ins[j] else "")
                if regs & set(toks): ds.append(j-i); break
    return ds
for extra in ({}, {"maxnreg": 128}, {"maxnreg": 168}):
    for fn, grid, args, kw in calls:
        kw = dict(kw); kw.update(extra)
        ck = compile_launch(fn, args, kw, "sm90")
        d = dist(get_sass(ck.asm["cubin"]))
        d.sort()
        print(extra, "gate_up" if kw["GATE_UP"] else "down", "n", len(d), "median", d[len(d)//2] if d else None, "min", d[:5])

"""tools/host_probe.py with hopper.moe_apply's CUDA-core path on: GEMV_TILES set, for 1 and 2 tokens, to the
configuration of moe_gemv_probe.json (argv[1]) with the fastest layer time where it beats the decode table's; the
rest of argv goes to host_probe. Prints what it set."""

import json
import runpy
import sys
from collections import defaultdict

from tokenspeed_kernel_nvidia.hopper.moe import layer
from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile

rows = json.load(open(sys.argv[1]))["layer"]
best = defaultdict(dict)
for r in rows:
    best[r["tokens"]][r["config"]] = min(r["us"], best[r["tokens"]].get(r["config"], 1e9))
table = []
for t in sorted(best):
    if t > 2:
        continue
    name, us = min(((c, v) for c, v in best[t].items() if c.startswith("gemv")), key=lambda cv: cv[1])
    print(f"tokens {t}: {name} {us:.2f} us against the table's {best[t]['table']:.2f}", flush=True)
    if us < best[t]["table"]:
        gu, dn = name.split()[1].split("/")
        table.append((t, tuple(GemvTile(*(int(v) for v in s.split(","))) for s in (gu, dn))))
layer.GEMV_TILES = tuple(table)
print("GEMV_TILES =", layer.GEMV_TILES, flush=True)
if not table and "--always" not in sys.argv:
    sys.exit("no configuration faster than the table's: the step would be the MMA path's (s26-call3 on: skipped)")
sys.argv = [a for a in sys.argv if a != "--always"]
sys.argv = ["host_probe.py", *sys.argv[2:]]
runpy.run_path("tools/host_probe.py", run_name="__main__")

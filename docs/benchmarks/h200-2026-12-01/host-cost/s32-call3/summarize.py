"""Session 32, call 3: each kernel's stall samples in ncu's ``--page source --csv`` export, by reason, before / in /
after its loop, and the instructions holding the most.

    gunzip -k r/ncu-tc-sass.csv.gz r/ncu-fp32-sass.csv.gz
    python3 summarize.py r/ncu-tc-sass.csv r/ncu-fp32-sass.csv
"""

import collections
import csv
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def kernels(path):
    """The export's kernels: ``[{"name", "rows": [{column: value}]}]``."""
    out, cur, hdr = [], None, None
    for r in csv.reader(open(path)):
        if r and r[0] == "Kernel Name":
            cur = {"name": r[1], "rows": []}
            out.append(cur)
            hdr = None
        elif r and r[0] == "Address":
            hdr = r
        elif cur is not None and hdr and len(r) == len(hdr):
            cur["rows"].append(dict(zip(hdr, r)))
    return out


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def summarize(path):
    for ki, k in enumerate(kernels(path)):
        rows = k["rows"]
        tot = sum(num(r[SAMPLES]) for r in rows)
        stalls = [h for h in rows[0] if h.startswith("stall_") and "Not Issued" not in h]
        agg = collections.Counter()
        for r in rows:
            for h in stalls:
                agg[h] += num(r[h])
        print(f"== {path} kernel {ki} {k['name']}: {len(rows)} instrs, samples {tot:.0f}")
        print("   by reason:", ", ".join(f"{h[6:]} {100 * v / tot:.1f}%" for h, v in agg.most_common(8)))
        addrs = [int(r["Address"], 16) for r in rows]
        loop = None  # the last backward branch: (target, branch)
        for a, r in zip(addrs, rows):
            t = re.search(r"BRA\s+(0x[0-9a-f]+)", r["Source"])
            if t and int(t.group(1), 16) < a:
                loop = (int(t.group(1), 16), a)
        if loop:
            pre = sum(num(r[SAMPLES]) for a, r in zip(addrs, rows) if a < loop[0])
            inside = sum(num(r[SAMPLES]) for a, r in zip(addrs, rows) if loop[0] <= a <= loop[1])
            print(
                f"   loop {hex(loop[0])}-{hex(loop[1])}: before {100 * pre / tot:.1f}%  in loop "
                f"{100 * inside / tot:.1f}%  after {100 * (tot - pre - inside) / tot:.1f}%"
            )
        for r in sorted(rows, key=lambda r: -num(r[SAMPLES]))[:14]:
            why = max(stalls, key=lambda h: num(r[h]))
            print(f"   {r['Address']:>8} {100 * num(r[SAMPLES]) / tot:5.1f}%  {why[6:]:<14} {r['Source'][:80]}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        summarize(p)

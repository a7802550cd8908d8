"""Session 32, call 3: per-kernel stall samples of ncu's --page source CSV (by reason, before/in/after the loop,
the top instructions).  python3 summarize.py r/ncu-tc-sass.csv ...  (gunzip the CSVs first)."""
import csv, sys, re, collections
def kernels(path):
    rows = list(csv.reader(open(path)))
    out = []; cur = None; hdr = None
    for r in rows:
        if r and r[0] == "Kernel Name":
            cur = {"name": r[1], "rows": []}; out.append(cur); hdr = None; continue
        if r and r[0] == "Address": hdr = r; continue
        if cur is not None and hdr and len(r) == len(hdr):
            cur["rows"].append(dict(zip(hdr, r)))
    return out
def num(x):
    try: return float(x.replace(",", ""))
    except: return 0.0
for path in sys.argv[1:]:
    for ki, k in enumerate(kernels(path)):
        rows = k["rows"]
        tot = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in rows)
        stalls = [h for h in rows[0] if h.startswith("stall_") and "Not Issued" not in h]
        agg = collections.Counter()
        for r in rows:
            for h in stalls: agg[h] += num(r[h])
        print(f"== {path} kernel {ki} {k['name']}: {len(rows)} instrs, samples {tot:.0f}")
        print("   by reason:", ", ".join(f"{h[6:]} {100*v/tot:.1f}%" for h, v in agg.most_common(8)))
        # regions: find loop (first backward branch)
        addrs = [int(r["Address"], 16) if r["Address"].startswith("0x") else int(r["Address"]) for r in rows]
        loop = None
        for i, r in enumerate(rows):
            m = re.search(r"BRA\s+`?\(?\.?L_x_(\d+)|BRA\s+(0x[0-9a-f]+)", r["Source"])
            if "BRA" in r["Source"]:
                t = re.search(r"(0x[0-9a-f]+)", r["Source"])
                if t and int(t.group(1), 16) < addrs[i]:
                    loop = (int(t.group(1), 16), addrs[i]); 
        if loop:
            pre = sum(num(r["Warp Stall Sampling (All Samples)"]) for a, r in zip(addrs, rows) if a < loop[0])
            inl = sum(num(r["Warp Stall Sampling (All Samples)"]) for a, r in zip(addrs, rows) if loop[0] <= a <= loop[1])
            post = tot - pre - inl
            print(f"   loop {hex(loop[0])}-{hex(loop[1])}: before {100*pre/tot:.1f}%  in loop {100*inl/tot:.1f}%  after {100*post/tot:.1f}%")
        top = sorted(rows, key=lambda r: -num(r["Warp Stall Sampling (All Samples)"]))[:14]
        for r in top:
            s = num(r["Warp Stall Sampling (All Samples)"])
            why = max(stalls, key=lambda h: num(r[h]))
            print(f"   {r['Address']:>8} {100*s/tot:5.1f}%  {why[6:]:<14} {r['Source'][:80]}")

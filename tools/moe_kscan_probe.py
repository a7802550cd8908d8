#!/usr/bin/env python3
"""Time ``hopper.moe_apply``'s decode GEMMs at one token against their K and N (an H100/H200 probe; issue 13).

    python tools/moe_kscan_probe.py --out OUT [--ks 2880,1472,704,320] [--ns 2880,1440,720]

Each GEMM alone (the table's one-token tiles, programmatic launch off, one CUDA graph, L2 flushed and not) on random
MXFP4 experts of K in ``--ks`` (N = 2880) and of N in ``--ns`` (K = 2880), four distinct experts of 32. A line
through the times against K splits a GEMM into what its K loop costs per K block and what does not scale with K
(the launch, the prologue's expert scan, the ring's fill, the epilogue); against N, what one more wave of programs
costs. Writes ``OUT/moe_kscan_probe.json``.
"""

# ruff: noqa: B023 - every closure below is timed within the loop iteration that defines it

from __future__ import annotations

import argparse
import json
import os
import sys

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--ks", default="2880,1472,704,320")
    p.add_argument("--ns", default="2880,1440,720")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.hopper.moe import decode, layer

    tk.load_plugins()
    act = tk.MoEActivation(alpha=1.702, limit=7.0, up_offset=1.0)
    gen = torch.Generator().manual_seed(7)
    e = 32
    ids = torch.tensor([3, 7, 11, 19], dtype=torch.int32, device="cuda")
    tw = torch.full((4,), 0.25, device="cuda")
    gu, dn = layer._tiles(1)
    common = dict(pairs=4, k=4, activation=act, two_step=False, packed=False)
    res = {"device": torch.cuda.get_device_name(), "tiles": [list(gu), list(dn)], "rows": []}

    def ri(lo, hi, *shape):
        return torch.randint(lo, hi, shape, generator=gen, dtype=torch.uint8).cuda()

    shapes = [(k, 2880) for k in map(int, args.ks.split(","))] + [(2880, n) for n in map(int, args.ns.split(","))]
    decode.PDL_ENABLED = False
    for k, n in dict.fromkeys(shapes):
        # gate/up: 2n rows of k; down: n rows of k (its K is the intermediate size)
        w13, s13 = ri(0, 256, e, 2 * n, k // 2), ri(118, 128, e, 2 * n, k // 32)
        b13 = torch.randn(e, 2 * n, generator=gen).to(torch.bfloat16).cuda()
        w2, s2 = ri(0, 256, e, n, k // 2), ri(118, 128, e, n, k // 32)
        b2 = torch.randn(e, n, generator=gen).to(torch.bfloat16).cuda()
        x = torch.randn(1, k, generator=gen).to(torch.bfloat16).cuda()
        inter = torch.randn(4, k, generator=gen).to(torch.bfloat16).cuda()
        out_gu = torch.empty(4, n, dtype=torch.bfloat16, device="cuda")
        out_dn = torch.empty(dn[4], 4, n, dtype=torch.float32, device="cuda")
        for name, fn in (
            ("gate_up", lambda: layer._launch(x, ids, w13, s13, b13, tw, out_gu, gate_up=True, interleaved=True,
                                              tile=gu, **common)),
            ("down", lambda: layer._launch(inter, ids, w2, s2, b2, tw, out_dn, gate_up=False, interleaved=True,
                                           tile=dn, **common)),
        ):  # fmt: skip
            row = {"gemm": name, "k": k, "n": n}
            for flush in (True, False):
                row["flushed_us" if flush else "hot_us"] = time_fn(
                    fn, device="cuda", graph=True, warmup_ms=5, rep_ms=30, flush_l2=flush
                ).median_us
            res["rows"].append(row)
            print("kscan", name, k, n, round(row["flushed_us"], 2), round(row["hot_us"], 2), flush=True)
    # one tiny kernel in a graph: the floor of every row above
    s = torch.empty(1, device="cuda")
    res["tiny_kernel_us"] = time_fn(lambda: s.add_(1), device="cuda", graph=True, warmup_ms=5, rep_ms=30).median_us
    print("tiny kernel", round(res["tiny_kernel_us"], 2), flush=True)
    with open(os.path.join(args.out, "moe_kscan_probe.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

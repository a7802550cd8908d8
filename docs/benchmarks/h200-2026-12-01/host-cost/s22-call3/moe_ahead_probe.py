#!/usr/bin/env python3
"""``hopper.moe_apply``'s decode path across versions and scale-request depths (an H100/H200 probe; issue 13).

Record of session 22's call 3: it ran as ``tools/moe_ahead_probe.py`` at commits 7009b61 (first try) and 2070aee
(second try), whose ``layer.SCALES_AHEAD`` became the tile field ``DecodeTile.scales_ahead`` in dba7da0. On later
commits it finds no ``layer.SCALES_AHEAD`` and runs the table's tiles only, as it did on the old wheels.

    python tools/moe_ahead_probe.py --out OUT --tag after [--tokens 1,2,4] [--rounds 2] [--experts 32]
        [--gate-up-alt 32,8,1,4,1]

Runs on any version of the package (the old wheels of ``tools/gpu_session.sh host-before`` too), so that two
processes compare versions; in a version with ``layer.SCALES_AHEAD`` it also compares depths 3 and 6 (how many K
blocks of scale bytes a decode GEMM requests ahead of their use) in the same process. GPT-OSS layer shapes (H = I =
2880, top-4, MXFP4 experts with bf16 biases, interleaved gate/up; ``--experts`` 32 = 20B), fixed seeds:

- **Bits**: each depth's ``moe_apply`` output is saved as ``OUT/bits-{tag}-d{depth}-t{tokens}.pt``; the call script
  compares the files of every process and depth (the same inputs in each).
- **The layer**: ``moe_route`` + ``moe_apply``, one CUDA graph, L2 flushed before each replay, the depths taking
  turns for ``--rounds`` rounds.
- **Each GEMM alone** (the table's tiles, programmatic launch off), L2 flushed and not, and flushed clean: the timer
  flushes L2 by zeroing a buffer twice its size, which leaves L2 full of dirty lines that a kernel's reads must first
  write back; ``clean_us`` flushes by reading that buffer instead (as a decode step's previous layer leaves L2: full
  of clean weight lines).

``--gate-up-alt``: a second gate/up tile (``block_m,tokens,warps,stages,ksplit``), timed alone and in the layer with
the table's down tile (configuration ``alt``).

Writes ``OUT/moe_ahead_probe-{tag}.json``.
"""

# ruff: noqa: B023 - every closure below is timed within the loop iteration that defines it

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hopper_moe_h200 as base


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--tag", required=True)
    p.add_argument("--tokens", default="1,2,4")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--gate-up-alt", default="")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.hopper.moe import decode, layer

    alt = layer.DecodeTile(*map(int, args.gate_up_alt.split(","))) if args.gate_up_alt else None
    tk.load_plugins()
    act = tk.MoEActivation(alpha=1.702, limit=7.0, up_offset=1.0)
    gen = torch.Generator().manual_seed(1234)
    e = args.experts
    w = base._weights(e, base.H, base.I, gen)
    depths = [3, 6] if hasattr(layer, "SCALES_AHEAD") else [None]
    res = {"device": torch.cuda.get_device_name(), "tag": args.tag, "depths": depths, "layer": [], "gemm": []}
    default = getattr(layer, "SCALES_AHEAD", None)

    def run(depth, fn):
        if depth is not None:
            layer.SCALES_AHEAD = depth
        try:
            return fn()
        finally:
            if depth is not None:
                layer.SCALES_AHEAD = default

    from tokenspeed_kernel.benchmark.timer import _flush_buffer

    flush_buf = _flush_buffer(torch.device("cuda")).view(torch.int64)

    def clean_us(fn, reps=60):
        """Median us of a CUDA graph of ``fn``, L2 flushed by a read of the flush buffer before each replay."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        sink = torch.empty((), dtype=torch.int64, device="cuda")
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for a, b in pairs:
            torch.sum(flush_buf, dim=0, out=sink)
            a.record()
            graph.replay()
            b.record()
        torch.cuda.synchronize()
        times = sorted(a.elapsed_time(b) * 1e3 for a, b in pairs)
        return times[len(times) // 2]

    for t in [int(v) for v in args.tokens.split(",")]:
        g = torch.Generator().manual_seed(100 + t)
        x = torch.randn(t, base.H, generator=g).to(torch.bfloat16).cuda()
        logits = torch.randn(t, e, generator=g).cuda()
        tw, ids = tk.moe_route(logits, 4)
        for d in depths:
            o = run(d, lambda: layer.moe_apply(x, tw, ids, w, act, graphs=False))
            torch.save(o.cpu(), os.path.join(args.out, f"bits-{args.tag}-d{d or 3}-t{t}.pt"))
        out = torch.empty_like(x)
        table = layer._tiles(t)
        configs = [(d, name) for d in depths for name in (["table", "alt"] if alt else ["table"])]
        tiles_of = {"table": table, "alt": (alt, table[1])}

        def layer_fn():
            tw2, ids2 = tk.moe_route(logits, 4)
            return layer.moe_apply(x, tw2, ids2, w, act, out=out, graphs=False, tiles=tiles_of[name])

        for r in range(args.rounds):
            for d, name in configs if r % 2 == 0 else configs[::-1]:
                us = run(d, lambda: time_fn(layer_fn, device="cuda", graph=True, warmup_ms=5, rep_ms=40).median_us)
                res["layer"].append({"tokens": t, "depth": d, "config": name, "round": r, "us": us})
                print("layer", args.tag, t, d, name, r, round(us, 2), flush=True)
        # each GEMM alone
        pairs = 4 * t
        flat_ids, flat_w = ids.reshape(-1).contiguous(), tw.reshape(-1).contiguous()
        inter = torch.randn(pairs, base.I, generator=g).to(torch.bfloat16).cuda()
        gu, dn = table
        common = dict(pairs=pairs, k=4, activation=act, two_step=False, packed=False)

        def gate_up_out(tile):
            return (torch.empty(pairs, base.I, dtype=torch.bfloat16, device="cuda") if tile[4] == 1 else
                    torch.empty(tile[4], pairs, 2 * base.I, dtype=torch.float32, device="cuda"))  # fmt: skip

        y = torch.empty(dn[4], pairs, base.H, dtype=torch.float32, device="cuda")
        pdl = decode.PDL_ENABLED
        decode.PDL_ENABLED = False  # alone in a graph: nothing to overlap
        try:
            for d in depths:
                for name, tile in (("gate_up", gu), ("down", dn), ("gate_up_alt", alt)):
                    if tile is None:
                        continue
                    if name == "down":
                        fn = functools.partial(layer._launch, inter, flat_ids, w.w2, w.w2_scale, w.w2_bias, flat_w, y,
                                               gate_up=False, interleaved=True, tile=tile, **common)  # fmt: skip
                    else:
                        fn = functools.partial(layer._launch, x, flat_ids, w.w13, w.w13_scale, w.w13_bias, flat_w,
                                               gate_up_out(tile), gate_up=True, interleaved=True, tile=tile, **common)  # fmt: skip
                    row = {"tokens": t, "gemm": name, "tile": list(tile)[:5], "depth": d}
                    for flush in (True, False):
                        row["flushed_us" if flush else "hot_us"] = run(d, lambda: time_fn(
                            fn, device="cuda", graph=True, warmup_ms=5, rep_ms=30, flush_l2=flush).median_us)  # fmt: skip
                    row["clean_us"] = run(d, lambda: clean_us(fn))
                    res["gemm"].append(row)
                    print(
                        "gemm", args.tag, t, name, d, round(row["flushed_us"], 2), round(row["hot_us"], 2),
                        round(row["clean_us"], 2), flush=True,
                    )  # fmt: skip
        finally:
            decode.PDL_ENABLED = pdl
    with open(os.path.join(args.out, f"moe_ahead_probe-{args.tag}.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

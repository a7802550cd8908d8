#!/usr/bin/env python3
"""``hopper.moe_apply``'s CUDA-core path (``hopper/moe/gemv.py``) against its MMA decode path: an H100/H200 probe
(issue 13).

    python tools/moe_gemv_probe.py --out OUT [--tokens 1,2,4] [--rounds 2] [--experts 32]
        [--gemv "16,8,4/8,8,4;..."] [--budget-s 300]

A ``--gemv`` entry is ``gate/up tile/down tile``, each ``rows,blocks,warps`` (:class:`GemvTile`). GPT-OSS layer
shapes (H = I = 2880, top-4, MXFP4 experts with bf16 biases, interleaved gate/up; ``--experts`` 32 = 20B). At each
token count:

- **Numerics**: every configuration's ``moe_apply`` (canonical weights; the first CUDA-core entry on the packed
  layout too) against the fp32 reference (relative Frobenius error; the GPU tests' bound is 1e-2) and the largest
  difference from the decode table's output (the two paths sum in different orders: reported, not asserted);
- **``moe_apply`` alone** (one CUDA graph, L2 flushed before each replay and not) for the decode table's tiles and
  each CUDA-core entry;
- **The layer** (``moe_route`` + ``moe_apply``, one CUDA graph, L2 flushed), the configurations taking turns for
  ``--rounds``.

Writes ``OUT/moe_gemv_probe.json``.
"""

# ruff: noqa: B023 - every closure below is timed within the loop iteration that defines it

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hopper_moe_h200 as base


def _gemv_entries(text: str):
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile

    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        gu, dn = part.split("/")
        out.append(tuple(GemvTile(*(int(v) for v in s.split(","))) for s in (gu, dn)))
    return out


def _name(tiles) -> str:
    return "/".join(",".join(str(v) for v in t) for t in tiles)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--tokens", default="1,2,4")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--gemv", default="16,16,4/8,8,4")
    p.add_argument("--budget-s", type=float, default=300.0)
    args = p.parse_args(argv)
    entries = _gemv_entries(args.gemv)
    if not entries:
        p.error("--gemv: expected at least one 'rows,blocks,warps/rows,blocks,warps' entry")
    os.makedirs(args.out, exist_ok=True)
    deadline = time.time() + args.budget_s
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.hopper.moe import layer
    from tokenspeed_kernel_nvidia.hopper.moe.packed import preprocess_weights

    tk.load_plugins()
    act = tk.MoEActivation(alpha=1.702, limit=7.0, up_offset=1.0)
    gen = torch.Generator().manual_seed(1234)
    w = base._weights(args.experts, base.H, base.I, gen)
    wp = preprocess_weights(w)
    res = {"device": torch.cuda.get_device_name(), "experts": args.experts, "numerics": [], "apply": [], "layer": []}
    path = os.path.join(args.out, "moe_gemv_probe.json")

    def save():
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    for t in [int(v) for v in args.tokens.split(",")]:
        if time.time() > deadline:
            print("budget spent before tokens", t, flush=True)
            break
        configs = {"table": layer._tiles(t), **{f"gemv {_name(e)}": e for e in entries}}
        x = torch.randn(t, base.H, generator=gen).to(torch.bfloat16).cuda()
        logits = torch.randn(t, args.experts, generator=gen).cuda()
        tw, ids = tk.moe_route(logits, 4)
        ref = base._ref(x, tw, ids, w, act)
        outs = {}
        for name, tiles in configs.items():
            for label, weights in (("canonical", w), ("packed", wp)):
                if label == "packed" and name not in ("table", f"gemv {_name(entries[0])}"):
                    continue
                o = layer.moe_apply(x, tw, ids, weights, act, tiles=tiles, graphs=False)
                outs[(name, label)] = o
                rel = float((o.float() - ref).norm() / ref.norm())
                row = {"tokens": t, "config": name, "layout": label, "rel_err_vs_fp32": rel,
                       "max_abs_diff_vs_table": float((o.float() - outs[("table", label)].float()).abs().max())}  # fmt: skip
                res["numerics"].append(row)
                print("numerics", t, name, label, f"{rel:.2e}", row["max_abs_diff_vs_table"], flush=True)
        out = torch.empty_like(x)
        for name, tiles in configs.items():
            if time.time() > deadline:
                break

            def fn():
                return layer.moe_apply(x, tw, ids, w, act, out=out, tiles=tiles, graphs=False)

            row = {"tokens": t, "config": name}
            for flush in (True, False):
                row["flushed_us" if flush else "hot_us"] = time_fn(
                    fn, device="cuda", graph=True, warmup_ms=5, rep_ms=30, flush_l2=flush
                ).median_us
            res["apply"].append(row)
            print("apply", t, name, round(row["flushed_us"], 2), round(row["hot_us"], 2), flush=True)
        save()
        base.layer_rounds(res, t, list(configs), args.rounds, deadline, lambda name, tw2, ids2: layer.moe_apply(
            x, tw2, ids2, w, act, out=out, tiles=configs[name], graphs=False), logits)  # fmt: skip
        save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""``hopper.moe_apply``'s decode GEMMs with register caps (``DecodeTile.maxnreg``): an H100/H200 probe (issue 13).

    python tools/moe_regcap_probe.py --out OUT [--tokens 1,2,4] [--rounds 2] [--experts 32]
        [--gate-up "32,8,1,8,1,0,128;..."] [--down "32,8,1,4,4,0,168;..."] [--budget-s 300]

A tile is ``block_m,tokens,warps,stages,ksplit,fused,maxnreg[,scales_ahead]`` (``maxnreg`` 0: uncapped; call s22-1
ran before ``scales_ahead`` existed, with three scale stages throughout). GPT-OSS layer shapes
(H = I = 2880, top-4, MXFP4 experts with bf16 biases, interleaved gate/up; ``--experts`` 32 = 20B).

Uncapped, a one-warp decode program takes about 250 registers, so 8 share an SM; session 6's profile of the gate/up
GEMM (``docs/benchmarks/h200-2026-12-01/hopper-moe/session6/call1/ncu-1.txt``) found its schedulers idle half the
cycles with 1.83 warps each. This probe asks whether more resident programs (capped registers, more K splits to
fill them) make the GEMMs faster despite ptxas's spills:

- **Each GEMM alone** (``--gate-up`` / ``--down`` tiles and the table's), one CUDA graph, programmatic launch off,
  L2 flushed before each replay and not, at each token count;
- **Numerics**: each variant's ``moe_apply`` against the table's (bit-equal when only the cap differs: a cap changes
  register allocation, not arithmetic) and against the fp32 reference (relative Frobenius error, bound 1e-2);
- **The layer** (``moe_route`` + ``moe_apply``, one CUDA graph, L2 flushed): the table's tiles, the table's with
  each cap, and the fastest gate/up with the fastest down by the flushed GEMM times, taking turns for ``--rounds``.

Writes ``OUT/moe_regcap_probe.json``.
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


def _tiles(text: str):
    from tokenspeed_kernel_nvidia.hopper.moe.layer import DecodeTile

    out = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        v = [int(x) for x in part.split(",")]
        cap = (v[6] or None) if len(v) > 6 else None
        out.append(DecodeTile(*v[:5], bool(v[5]) if len(v) > 5 else False, cap, *v[7:8]))
    return out


def _name(tile) -> str:
    return ",".join(str(int(x)) if x is not None else "0" for x in tile)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--tokens", default="1,2,4")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--gate-up", default="")
    p.add_argument("--down", default="")
    p.add_argument("--caps", default="168,128", help="caps applied to the table's own tiles in the layer runs")
    p.add_argument("--budget-s", type=float, default=300.0)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    deadline = time.time() + args.budget_s
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.hopper.moe import decode, layer
    from tokenspeed_kernel_nvidia.hopper.moe.layer import DecodeTile

    tk.load_plugins()
    act = tk.MoEActivation(alpha=1.702, limit=7.0, up_offset=1.0)
    gen = torch.Generator().manual_seed(1234)
    e = args.experts
    w = base._weights(e, base.H, base.I, gen)
    caps = [int(c) for c in args.caps.split(",") if c]
    res = {"device": torch.cuda.get_device_name(), "experts": e, "gemm": [], "numerics": [], "layer": []}
    path = os.path.join(args.out, "moe_regcap_probe.json")

    def save():
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    def capped(tile, cap):
        return DecodeTile(*tile[:6], cap, *tile[7:])

    for t in [int(v) for v in args.tokens.split(",")]:
        if time.time() > deadline:
            print("budget spent before tokens", t, flush=True)
            break
        table = layer._tiles(t)
        gus = [table[0], *_tiles(args.gate_up)]
        dns = [table[1], *_tiles(args.down)]
        x = torch.randn(t, base.H, generator=gen).to(torch.bfloat16).cuda()
        logits = torch.randn(t, e, generator=gen).cuda()
        tw, ids = tk.moe_route(logits, 4)
        pairs = 4 * t
        flat_ids, flat_w = ids.reshape(-1).contiguous(), tw.reshape(-1).contiguous()
        inter = torch.randn(pairs, base.I, generator=gen).to(torch.bfloat16).cuda()
        common = dict(pairs=pairs, k=4, activation=act, two_step=False, packed=False)
        # -- each GEMM alone --------------------------------------------------------------------
        pdl = decode.PDL_ENABLED
        decode.PDL_ENABLED = False  # alone in a graph: nothing to overlap
        best = {}
        try:
            for gemm, tiles in (("gate_up", gus), ("down", dns)):
                for tile in dict.fromkeys(tiles):
                    if time.time() > deadline:
                        break
                    if gemm == "gate_up":
                        out = (torch.empty(pairs, base.I, dtype=torch.bfloat16, device="cuda") if tile[4] == 1 else
                               torch.empty(tile[4], pairs, 2 * base.I, dtype=torch.float32, device="cuda"))  # fmt: skip

                        def fn():
                            layer._launch(x, flat_ids, w.w13, w.w13_scale, w.w13_bias, flat_w, out, gate_up=True,
                                          interleaved=True, tile=tile, **common)  # fmt: skip
                    else:
                        out = torch.empty(tile[4], pairs, base.H, dtype=torch.float32, device="cuda")

                        def fn():
                            layer._launch(inter, flat_ids, w.w2, w.w2_scale, w.w2_bias, flat_w, out, gate_up=False,
                                          interleaved=True, tile=tile, **common)  # fmt: skip

                    row = {"tokens": t, "gemm": gemm, "tile": _name(tile), "table": tile == (table[0] if gemm ==
                           "gate_up" else table[1])}  # fmt: skip
                    for flush in (True, False):
                        row["flushed_us" if flush else "hot_us"] = time_fn(
                            fn, device="cuda", graph=True, warmup_ms=5, rep_ms=30, flush_l2=flush
                        ).median_us
                    res["gemm"].append(row)
                    print(
                        "gemm", t, gemm, row["tile"], round(row["flushed_us"], 2), round(row["hot_us"], 2), flush=True
                    )
                    if gemm not in best or row["flushed_us"] < best[gemm][1]:
                        best[gemm] = (tile, row["flushed_us"])
        finally:
            decode.PDL_ENABLED = pdl
        save()
        # -- numerics and the layer -------------------------------------------------------------
        pairs_list = {"table": table}
        for cap in caps:
            pairs_list[f"table@{cap}"] = (capped(table[0], cap), capped(table[1], cap))
        if best:
            pairs_list["best"] = (best.get("gate_up", (table[0],))[0], best.get("down", (table[1],))[0])
        names = list(dict.fromkeys(pairs_list))
        ref = base._ref(x, tw, ids, w, act)
        outs = {}
        for name in names:
            o = layer.moe_apply(x, tw, ids, w, act, tiles=pairs_list[name], graphs=False)
            outs[name] = o
            rel = float((o.float() - ref).norm() / ref.norm())
            row = {"tokens": t, "config": name, "tiles": [_name(v) for v in pairs_list[name]],
                   "equal_to_table": bool(torch.equal(o, outs["table"])), "rel_err_vs_fp32": rel}  # fmt: skip
            res["numerics"].append(row)
            print("numerics", t, name, row["tiles"], row["equal_to_table"], f"{rel:.2e}", flush=True)
        out = torch.empty_like(x)
        base.layer_rounds(res, t, names, args.rounds, deadline, lambda name, tw2, ids2: layer.moe_apply(
            x, tw2, ids2, w, act, out=out, tiles=pairs_list[name], graphs=False), logits,
            extra=lambda name: {"tiles": [_name(v) for v in pairs_list[name]]})  # fmt: skip
        save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""One MoE layer call (``moe_route`` + ``moe_apply``) on the GPT-OSS-120B shapes, for a profiler.

    ncu --profile-from-start off --section SpeedOfLight ... python tools/ncu_moe.py --tokens 1
    python tools/ncu_moe.py --tokens 1,4 --kernel hopper.moe_apply --graphs   # per-kernel times, no ncu
    python tools/ncu_moe.py --tokens 1 --gemv 2,4/8 --graphs                  # the GEMV path at one token

The call is warmed up first (compiles, caches), then run once between
``cudaProfilerStart`` / ``cudaProfilerStop``, so ``--profile-from-start off`` captures exactly
its launches. ``--graphs`` instead prints each launch's device time from the torch profiler over
20 replays of a CUDA graph of the call (no L2 flush; a breakdown, not a benchmark).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

E, K_TOP, H, I = 128, 4, 2880, 2880


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", default="1")
    p.add_argument("--kernel", default="hopper.moe_apply")
    p.add_argument("--fp8", action="store_true", help="allow fp8 activations (the W4A8 kernels)")
    p.add_argument("--graphs", action="store_true", help="per-launch device times of a graph replay (torch profiler)")
    p.add_argument("--json", help="with --graphs: write the rows here")
    p.add_argument(
        "--gemv",
        default="",
        help="hopper.moe_apply's GEMV path at 1 token, tiles 'feats,warps/feats' "
        "(a TcTile: 'tG,W[:KS]' gate/up, 'tG:KS' down)",
    )
    args = p.parse_args(argv)
    if args.gemv:
        import os

        from tokenspeed_kernel_nvidia.hopper.moe import layer

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from moe_gemv_probe import _tile  # the probe's tile syntax

        gu, dn = args.gemv.split("/")
        layer.GEMV_MAX_TOKENS = 1
        layer.GEMV_TILES = (_tile(gu), _tile(dn))

    import tokenspeed_kernel as tk

    gen = torch.Generator().manual_seed(0)

    def ri(lo, hi, *shape):
        return torch.randint(lo, hi, shape, generator=gen, dtype=torch.uint8).cuda()

    w = tk.MoEWeights(
        w13=ri(0, 256, E, 2 * I, H // 2), w2=ri(0, 256, E, H, I // 2), format="mxfp4",
        w13_scale=ri(118, 128, E, 2 * I, H // 32), w2_scale=ri(118, 128, E, H, I // 32),
        w13_bias=(torch.randn(E, 2 * I, generator=gen) * 0.1).to(torch.bfloat16).cuda(),
        w2_bias=(torch.randn(E, H, generator=gen) * 0.1).to(torch.bfloat16).cuda(), gate_up_interleaved=True,
    )  # fmt: skip
    act = tk.MoEActivation(kind="swiglu", alpha=1.702, limit=7.0, up_offset=1.0)
    # The kernel's layout (hopper.moe_apply_packed, triton_kernels), converted once as an engine does.
    plan = tk.moe_plan(w, act, dtype=torch.bfloat16, override=args.kernel, fp8_activations=args.fp8)
    w = tk.moe_process_weights(plan, w)
    extra = {"fp8_activations": True} if args.fp8 else {}
    rows = []
    for t in (int(v) for v in args.tokens.split(",")):
        x = torch.randn(t, H, generator=gen).to(torch.bfloat16).cuda()
        logits = torch.randn(t, E, generator=gen).cuda()
        out = torch.empty_like(x)

        def call(x=x, logits=logits, out=out):
            tw, ids = tk.moe_route(logits, K_TOP)
            return tk.moe_apply(x, tw, ids, w, act, out=out, override=args.kernel, **extra)

        for _ in range(3):
            call()
        torch.cuda.synchronize()
        if not args.graphs:
            torch.cuda.cudart().cudaProfilerStart()
            call()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            print(f"tokens {t}: profiled one call of {args.kernel}", flush=True)
            continue
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            call()
            with torch.cuda.graph(g, stream=s):
                call()
        torch.cuda.current_stream().wait_stream(s)
        for _ in range(5):
            g.replay()
        torch.cuda.synchronize()
        reps = 20
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                g.replay()
            torch.cuda.synchronize()
        kernels: dict[str, list[float]] = {}
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                kernels.setdefault(ev.name, []).append(ev.device_time)
        total = 0.0
        for name, times in kernels.items():
            per = sum(times) / reps
            total += per
            rows.append({"tokens": t, "kernel": name[:120], "launches": len(times) // reps, "us": round(per, 2)})
            print(f"tokens {t}: {per:8.2f} us  x{len(times) // reps}  {name[:100]}", flush=True)
        print(f"tokens {t}: {total:8.2f} us  sum of launches ({args.kernel})", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

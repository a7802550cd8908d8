#!/usr/bin/env python3
"""The decode path of ``hopper.moe_apply`` with and without L2 prefetch of its weights (issue 13; an H100/H200 probe).

Record of session 21's call 1: it ran as ``tools/moe_prefetch_probe.py`` at commit fb62686, whose
``layer.DECODE_PREFETCH`` modes and ``PREFETCH`` kernel code were removed after the call measured every mode slower
(``../README.md``, "Session 21"). It does not run on later commits.

    python tools/moe_prefetch_probe.py --out OUT [--tokens 1,2,3,4] [--modes 0,1,2,3] [--rounds 2] [--experts 32]

GPT-OSS layer shapes (H = I = 2880, top-4, MXFP4 experts with bf16 biases, interleaved gate/up;
``--experts`` 32 = 20B, 128 = 120B: a token reads the same bytes). ``layer.DECODE_PREFETCH`` modes
(:mod:`tokenspeed_kernel_nvidia.hopper.moe.decode`, "L2 prefetch"): 0 none, 1 each GEMM's tiles prefetch their
rows, 2 / 3 the gate/up programs also prefetch the down GEMM's weights at their start / end.

- **Bits**: every mode's output equals mode 0's, bit for bit, at each token count (the prefetch moves no data a
  kernel reads; it only warms L2).
- **Time**: ``moe_route`` + ``moe_apply`` in one CUDA graph, L2 flushed before each replay (``time_fn``), the modes
  taking turns for ``--rounds`` rounds; and each GEMM alone (mode 0) with and without the flush, which brackets
  what the weights' bytes cost against the rest of a GEMM's work.

Writes ``OUT/moe_prefetch_probe.json``.
"""

# ruff: noqa: B023 - every closure below is timed within the loop iteration that defines it

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hopper_moe_h200 as base


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--tokens", default="1,2,3,4")
    p.add_argument("--modes", default="0,1,2,3")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--experts", type=int, default=32)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    tk.load_plugins()
    act = tk.MoEActivation(alpha=1.702, limit=7.0, up_offset=1.0)
    gen = torch.Generator().manual_seed(1234)
    e = args.experts
    w = base._weights(e, base.H, base.I, gen)
    tokens = [int(v) for v in args.tokens.split(",")]
    modes = [int(v) for v in args.modes.split(",")]
    res = {"device": torch.cuda.get_device_name(), "experts": e, "modes": modes, "bits": [], "layer": [], "gemm": []}
    default = layer.DECODE_PREFETCH

    def run(mode, fn):
        layer.DECODE_PREFETCH = mode
        try:
            return fn()
        finally:
            layer.DECODE_PREFETCH = default

    for t in tokens:
        x = torch.randn(t, base.H, generator=gen).to(torch.bfloat16).cuda()
        logits = torch.randn(t, e, generator=gen).cuda()
        tw, ids = tk.moe_route(logits, 4)
        outs = {m: run(m, lambda: layer.moe_apply(x, tw, ids, w, act, graphs=False)) for m in modes}
        for m in modes:
            same = bool(torch.equal(outs[m], outs[modes[0]]))
            res["bits"].append({"tokens": t, "mode": m, "equal_to_mode": modes[0], "equal": same})
            print("bits", t, m, same, flush=True)
        out = torch.empty_like(x)

        def layer_fn():
            tw2, ids2 = tk.moe_route(logits, 4)
            return layer.moe_apply(x, tw2, ids2, w, act, out=out, graphs=False)

        for r in range(args.rounds):
            for m in modes if r % 2 == 0 else modes[::-1]:
                us = run(m, lambda: time_fn(layer_fn, device="cuda", graph=True, warmup_ms=5, rep_ms=40).median_us)
                res["layer"].append({"tokens": t, "mode": m, "round": r, "us": us})
                print("layer", t, m, r, round(us, 2), flush=True)
    # each GEMM alone, mode 0, L2 flushed or not (one token)
    from tokenspeed_kernel_nvidia.hopper.moe import decode

    ids = torch.tensor([3, 7, 11, 19], dtype=torch.int32, device="cuda") % e
    flat_w = torch.full((4,), 0.25, device="cuda")
    x = torch.randn(1, base.H, generator=gen).to(torch.bfloat16).cuda()
    inter = torch.randn(4, base.I, generator=gen).to(torch.bfloat16).cuda()
    gu, dn = layer._tiles(1)
    common = dict(pairs=4, k=4, activation=act, two_step=False, packed=False)
    ws = torch.empty(4, base.I, dtype=torch.bfloat16, device="cuda") if gu[4] == 1 else torch.empty(
        gu[4], 4, 2 * base.I, dtype=torch.float32, device="cuda")  # fmt: skip
    y = torch.empty(dn[4], 4, base.H, dtype=torch.float32, device="cuda")
    pdl = decode.PDL_ENABLED
    decode.PDL_ENABLED = False  # alone in a graph: nothing to overlap
    try:
        for m in modes[:2]:
            for flush in (True, False):
                for name, fn in (
                    ("gate_up", lambda: layer._launch(x, ids, w.w13, w.w13_scale, w.w13_bias, flat_w, ws, gate_up=True,
                                                      interleaved=True, tile=gu, prefetch=m, **common)),
                    ("down", lambda: layer._launch(inter, ids, w.w2, w.w2_scale, w.w2_bias, flat_w, y, gate_up=False,
                                                   interleaved=True, tile=dn, prefetch=m, **common)),
                ):  # fmt: skip
                    us = time_fn(fn, device="cuda", graph=True, warmup_ms=5, rep_ms=40, flush_l2=flush).median_us
                    res["gemm"].append({"gemm": name, "mode": m, "flush_l2": flush, "us": us})
                    print("gemm", name, m, flush, round(us, 2), flush=True)
    finally:
        decode.PDL_ENABLED = pdl
    with open(os.path.join(args.out, "moe_prefetch_probe.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

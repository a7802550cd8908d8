#!/usr/bin/env python3
"""The sm90 SASS of ``hopper.moe_apply``'s GEMV launches, counted on the CPU (no GPU: cross-compiled, issue 13).

    python tools/gemv_sass_counts.py [--experts 32] [--tokens 1] [--k 4] [--out OUT] PAIR [PAIR ...]

``PAIR``: ``gate_up/down`` tiles in ``tools/moe_gemv_probe.py``'s syntax (e.g. ``1,8/d1,4,1,3@128``,
``i1,8/pi1,8``). For each GEMV launch of one GPT-OSS layer call (H = I = 2880, MXFP4, the weights' code bytes zeros:
the launches are compiled, not run) it prints the registers a thread, the instructions a thread and a weight value
(the values a thread multiplies: its row pairs' blocks over the passes, slots and sub-tiles), the grid's warps, and
the counts of the instructions that tell the kernels apart (conversions, fp32 and f16 FMAs, integer ops). These are
static counts: what a launch issues, not how fast it runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_gemv_probe import _name, _tile

H = I = 2880
GROUPS = {
    "cvt_e4m3 (F2FP.E4M3)": r"F2FP\.F16\.E4M3",
    "cvt_f16_f32 (HADD2.F32)": r"HADD2\.F32",
    "fp32_fma (FFMA)": r"FFMA",
    "f16x2_fma (HFMA2, HMUL2)": r"HFMA2|HMUL2",
    "int (LOP3, SHF, PRMT, IMAD, LEA)": r"LOP3|SHF|PRMT|IMAD|LEA",
    "loads_16B (LDG.E.128)": r"LDG\.E\.128",
    "shared (LDS, STS)": r"LDS|STS",
}


class _Recorder:
    def __init__(self, fn, calls):
        self.fn, self.calls = fn, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.fn, grid, args, kwargs))


def launches(tiles, experts: int, tokens: int, k: int):
    """The recorded launches of one ``layer.moe_apply`` call with ``tiles``."""
    import tokenspeed_kernel as tk
    from tokenspeed_kernel_nvidia.hopper.moe import decode, layer
    from tokenspeed_kernel_nvidia.hopper.moe import gemv as gemv_module

    calls = []
    saved = {n: getattr(layer, n) for n in ("moe_gemv", "combine_slots")}
    layer.moe_gemv = _Recorder(gemv_module.moe_gemv, calls)
    layer.combine_slots = _Recorder(decode.combine_slots, calls)
    try:
        g = torch.Generator().manual_seed(0)
        w = tk.MoEWeights(
            w13=torch.zeros(experts, 2 * I, H // 2, dtype=torch.uint8),
            w2=torch.zeros(experts, H, I // 2, dtype=torch.uint8),
            w13_scale=torch.randint(118, 128, (experts, 2 * I, H // 32), dtype=torch.uint8, generator=g),
            w2_scale=torch.randint(118, 128, (experts, H, I // 32), dtype=torch.uint8, generator=g),
            w13_bias=torch.zeros(experts, 2 * I, dtype=torch.bfloat16),
            w2_bias=torch.zeros(experts, H, dtype=torch.bfloat16),
            format="mxfp4",
            gate_up_interleaved=True,
        )
        x = torch.randn(tokens, H, generator=g).to(torch.bfloat16)
        tw, ids = tk.moe_route(torch.randn(tokens, experts, generator=g), k, solution="reference")
        act = tk.MoEActivation(alpha=1.702, limit=7.0, up_offset=1.0)
        layer.moe_apply(x, tw, ids, w, act, tiles=tiles, graphs=False)
    finally:
        for n, v in saved.items():
            setattr(layer, n, v)
    return calls


def count(fn, grid, args, kwargs) -> dict:
    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel.testing import sass as sm90_sass

    ck = compile_launch(fn, args, dict(kwargs), "sm90")
    body = [
        ln.split("\t", 1)[1].strip().rstrip(";").strip() for ln in sm90_sass(ck.asm["cubin"]).splitlines() if "\t" in ln
    ]
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", b).split()[0] for b in body)
    regs = max(int(r) for r in re.findall(r"\bR(\d+)\b", "\n".join(body))) + 1
    np_ = -(-(kwargs["K"] // 32) // 32)  # passes
    values = kwargs["FEATS"] * 2 * 32 * np_ * kwargs["SUB"]  # a thread's weight values (a block a pass and row)
    warps = grid[0] * grid[1] * kwargs["WARPS"]
    row = {
        "kernel": "gate_up" if kwargs["GATE_UP"] else ("down (pairs)" if kwargs.get("PAIRS") else "down"),
        "registers": regs,
        "instructions": len(body),
        "values_a_thread": values,
        "instructions_a_value": round(len(body) / values, 2),
        "warps": warps,
        "warp_instructions_M": round(warps * len(body) / 1e6, 2),
    }
    for label, pattern in GROUPS.items():
        row[label] = sum(v for op, v in ops.items() if re.match(f"(?:{pattern})", op))
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("pairs", nargs="+")
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    rows = []
    for pair in args.pairs:
        gu, dn = (_tile(t) for t in pair.split("/"))
        for fn, grid, a, kw in launches((gu, dn), args.experts, args.tokens, args.k):
            if "GATE_UP" not in kw:
                continue  # combine_slots: a Triton kernel of a few instructions a value of the output
            row = {"tiles": _name((gu, dn)), **count(fn, grid, a, kw)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

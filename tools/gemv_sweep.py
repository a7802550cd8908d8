#!/usr/bin/env python3
"""The dense bf16 GEMV (``tokenspeed_kernel_triton.mm``, ``MMConfig(gemv=True)``) against cuBLAS at GPT-OSS's
decode GEMMs, on a GPU machine.

    python tools/gemv_sweep.py --out OUT [--budget-s 200] [--configs 2/4/512/4,...]

Shapes (``[M, K] @ [N, K].T``, bf16, bias where GPT-OSS has one): QKV 2880 -> 5120, O 4096 -> 2880, the router
2880 -> 32 and the unembedding 2880 -> 201088, at M = 1; QKV and O also at M = 2 and 4. Per shape: cuBLAS
(``F.linear``, what ``cublas.mm_bf16`` calls), the MMA tile the table had for M <= 16 before the GEMV row, and each
GEMV tile of the grid (BLOCK_N x BLOCK_K x warps; M > 1 also BLOCK_M), each GEMV checked against cuBLAS's result in
fp32 (max error over max |result|).

Timing: ``tokenspeed_kernel.benchmark.timer.time_fn(graph=True, graph_calls=10)``: ten calls in a CUDA graph, each
after an in-graph L2 flush, less the flushes alone (device time, cold L2). Writes ``gemv_sweep.json`` (every row) and
prints the best tile per shape with its ratio to cuBLAS.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import torch

SHAPES = {  # name -> (N, K, bias)
    "qkv": (5120, 2880, True),
    "o": (2880, 4096, True),
    "router": (32, 2880, True),
    "unembed": (201088, 2880, False),
}
ROWS = {"qkv": (1, 2, 4), "o": (1, 2, 4), "router": (1,), "unembed": (1,)}
#: the MMA tile the table gave M <= 16 before the GEMV row (timed beside it)
TILE = None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--budget-s", type=float, default=200.0, help="stop timing new tiles after this long")
    p.add_argument("--configs", default="", help="only these GEMV tiles: BLOCK_M/BLOCK_N/BLOCK_K/WARPS,... (M > 1 "
                   "rows use BLOCK_M = M)")  # fmt: skip
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_triton import mm

    global TILE
    TILE = mm.MMConfig(16, 16, 256, num_warps=4, num_stages=4)
    dev = torch.device("cuda")
    grid = [
        (bn, bk, w)
        for bn, bk, w in itertools.product((4, 8, 16, 32), (256, 512, 1024), (2, 4, 8))
        if 8 <= bn * bk // (32 * w) <= 128  # fp32 products a thread holds
    ]
    if args.configs:
        grid = [tuple(int(v) for v in c.split("/"))[1:] for c in args.configs.split(",")]
    t0 = time.perf_counter()
    rows = []

    def timed(fn) -> float:
        return time_fn(fn, device=dev, graph=True, graph_calls=10, warmup_ms=5, rep_ms=30).median_us

    for name, (n, k, has_bias) in SHAPES.items():
        torch.manual_seed(0)
        b = torch.randn(n, k, device=dev, dtype=torch.bfloat16) / k**0.5
        bias = torch.randn(n, device=dev, dtype=torch.bfloat16) if has_bias else None
        for m in ROWS[name]:
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            want = torch.nn.functional.linear(a, b, bias)
            scale = want.float().abs().max().item()
            base = timed(lambda a=a, b=b, bias=bias: torch.nn.functional.linear(a, b, bias))
            rows.append({"shape": name, "m": m, "n": n, "k": k, "kernel": "cublas", "us": base})

            def tile(a=a, b=b, bias=bias):
                return mm.mm_with_config(a, b, bias, a_scale=None, b_scale=None, out_dtype=torch.bfloat16, out=None,
                                         config=TILE)  # fmt: skip

            tile_us = timed(tile)
            rows.append(
                {"shape": name, "m": m, "n": n, "k": k, "kernel": "tile", "us": tile_us, "vs_cublas": tile_us / base}
            )
            print(f"{name} M={m}: cuBLAS {base:.2f} us, the M <= 16 MMA tile {tile_us:.2f} us", flush=True)
            best = None
            for bn, bk, w in grid:
                if time.perf_counter() - t0 > args.budget_s:
                    break
                for bm in sorted({1, m}) if m > 1 else (1,):
                    cfg = mm.MMConfig(bm, bn, bk, num_warps=w, num_stages=1, gemv=True)

                    def run(a=a, b=b, bias=bias, cfg=cfg):
                        return mm.mm_with_config(a, b, bias, a_scale=None, b_scale=None, out_dtype=torch.bfloat16,
                                                 out=None, config=cfg)  # fmt: skip

                    err = ((run().float() - want.float()).abs().max().item()) / scale
                    us = timed(run)
                    row = {"shape": name, "m": m, "n": n, "k": k, "kernel": "gemv", "block_m": bm, "block_n": bn,
                           "block_k": bk, "num_warps": w, "us": us, "vs_cublas": us / base, "max_err": err}  # fmt: skip
                    rows.append(row)
                    if err < 2e-2 and (best is None or us < best["us"]):
                        best = row
            if best is not None:
                print(f"  best GEMV {best['us']:.2f} us ({best['vs_cublas']:.3f}x cuBLAS): block_m {best['block_m']} "
                      f"block_n {best['block_n']} block_k {best['block_k']} warps {best['num_warps']} "
                      f"(err {best['max_err']:.1e})", flush=True)  # fmt: skip
    with open(os.path.join(args.out, "gemv_sweep.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

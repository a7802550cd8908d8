#!/usr/bin/env python3
"""The W4A8 prefill path of ``hopper.moe_apply`` (``fp8=True``: e4m3 activations, fp8 wgmma) on an H200.

    python tools/hopper_w4a8_h200.py --out OUT [--tokens 1024,2048,4096,8192,16384] [--tiles 'T;T']

Layer and weights as ``tools/hopper_moe_h200.py`` (GPT-OSS-120B: 128 experts, top-4, H = I = 2880,
random MXFP4 codes, scale bytes 118-127, bf16 biases). Two parts:

- numerics: the W4A8 output against two float32 references: the layer with W4A8 semantics
  (``tokenspeed_kernel.reference.moe.moe_apply_w4a8``: activations rounded per row to E4M3, the
  SwiGLU output to E4M3 times ``w4a8_inter_scale``) and the exact layer (bf16 activations); the bf16
  path's error next to it. Relative Frobenius errors; two calls bit-identical; a graph replay equal.
- timing: ``moe_apply`` alone (routing precomputed), CUDA graph, L2 flushed
  (``tokenspeed_kernel.benchmark.timer.time_fn``): the bf16 path at its table's tiles, the W4A8
  path at each tile of ``--tiles`` and at its table's, and ``triton_kernels.moe_apply`` (the peer)
  in the same process.

Writes ``OUT/hopper_w4a8.json``.
"""

# ruff: noqa: B023 - every closure below is timed within the loop iteration that defines it

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hopper_moe_h200 as base

E, K_TOP, H, I = base.E, base.K_TOP, base.H, base.I

# (label, experts, tokens, routing, weight kwargs, forced tile or None)
CASES = [
    ("120b_T2048", 128, 2048, "random", {}, None),
    ("120b_T4096", 128, 4096, "random", {}, None),
    ("20b_T1500", 32, 1500, "random", {}, None),
    ("120b_T1024_one_hot_expert", 128, 1024, "hot", {}, None),
    ("120b_T300_ragged_tile_16", 128, 300, "random", {}, (64, 16, 4, 4, 4)),
    ("no_bias_not_interleaved_T1024", 128, 1024, "random", {"bias": False, "interleaved": False}, None),
    ("wide_scales_100_127_T2048", 128, 2048, "random", {"scale_lo": 100}, None),
    ("scales_above_128_T1024", 128, 1024, "random", {"scale_lo": 120, "scale_hi": 140}, None),
    # Smaller weights: gate/up pre-activations of order 1, so the clamp rarely binds.
    ("small_scales_108_117_T2048", 128, 2048, "random", {"scale_lo": 108, "scale_hi": 118}, None),
]


def numerics(act, log):
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.reference.moe import moe_apply_w4a8
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    rows = []
    for label, e, t, routing, wkw, tile in CASES:
        gen = torch.Generator().manual_seed(300 + len(rows))
        tiles = None if tile is None else (layer.PrefillTile(*tile), layer.PrefillTile(*tile))
        try:
            w = base._weights(e, H, I, gen, **wkw)
            x = torch.randn(t, H, generator=gen).to(torch.bfloat16).cuda()
            logits = torch.randn(t, e, generator=gen).cuda()
            if routing == "hot":
                logits[:, 3] += 100.0
            tw, ids = tk.moe_route(logits, K_TOP, solution="reference")
            got = layer.moe_apply(x, tw, ids, w, act, tiles=tiles, fp8=True)
            again = layer.moe_apply(x, tw, ids, w, act, tiles=tiles, fp8=True)
            out = torch.empty_like(x)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                layer.moe_apply(x, tw, ids, w, act, tiles=tiles, fp8=True, out=out)
            out.zero_()
            g.replay()
            bf16 = layer.moe_apply(x, tw, ids, w, act, tiles=tiles)
            torch.cuda.synchronize()
            ref8 = moe_apply_w4a8(x.float(), tw, ids, w, act)  # upcasts the biases itself
            ref = base._ref(x, tw, ids, w, act)

            def rel(a, b):
                return ((a.float() - b).norm() / b.norm()).item()

            rows.append({
                "case": label, "tokens": t, "experts": e,
                "w4a8_vs_w4a8_reference": rel(got, ref8), "w4a8_vs_exact": rel(got, ref),
                "w4a8_reference_vs_exact": rel(ref8, ref), "bf16_path_vs_exact": rel(bf16, ref),
                "deterministic": bool(torch.equal(got, again)), "graph_equal": bool(torch.equal(got, out)),
                "finite": bool(torch.isfinite(got).all()),
            })  # fmt: skip
        except Exception as exc:
            rows.append({"case": label, "error": f"{type(exc).__name__}: {exc}"})
            traceback.print_exc()
        log(f"  numerics {rows[-1]}")
    return rows


def timing(act, tokens_list, tiles_list, log):
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    gen = torch.Generator().manual_seed(1234)
    w = base._weights(E, H, I, gen)
    wtk = None
    if any(s.name == "triton_kernels.moe_apply" for s in tk.registry.for_op("moe_apply")):
        plan = tk.moe_plan(w, act, dtype=torch.bfloat16, override="triton_kernels.moe_apply")
        wtk = tk.moe_process_weights(plan, w)
    rows = []
    for t in tokens_list:
        x = torch.randn(t, H, generator=gen).to(torch.bfloat16).cuda()
        tw, ids = tk.moe_route(torch.randn(t, E, generator=gen).cuda(), K_TOP)
        out = torch.empty_like(x)
        row = {"tokens": t, "bf16_tiles": [list(v) for v in layer._prefill_tiles(t * K_TOP, E)],
               "fp8_table_tiles": [list(v) for v in layer._fp8_tiles(t * K_TOP, E)]}  # fmt: skip
        fns = {
            "hopper_bf16": lambda: layer.moe_apply(x, tw, ids, w, act, out=out),
            "hopper_w4a8_table": lambda: layer.moe_apply(x, tw, ids, w, act, out=out, fp8=True),
        }
        for cfg in tiles_list:
            gu, dn = cfg if isinstance(cfg[0], tuple) else (cfg, cfg)
            pair = (layer.PrefillTile(*gu), layer.PrefillTile(*dn))
            name = "_".join(map(str, gu)) + ("" if gu == dn else "__" + "_".join(map(str, dn)))
            fns["hopper_w4a8_" + name] = lambda pair=pair: layer.moe_apply(
                x, tw, ids, w, act, out=out, fp8=True, tiles=pair
            )
        if wtk is not None:
            fns["triton_kernels"] = lambda: tk.moe_apply(x, tw, ids, wtk, act, out=out,
                                                         override="triton_kernels.moe_apply")  # fmt: skip
        for name, fn in fns.items():
            try:
                row[name] = time_fn(fn, device="cuda", graph=True, warmup_ms=10, rep_ms=60).median_us
            except Exception as exc:
                row[name] = None
                row[name + "_error"] = str(exc)[:300]
        log(f"  timing {row}")
        rows.append(row)
    return rows


def _parse_tile(text):
    """'b,t,w,s[,u]' for both GEMMs, or 'gate_up/down'."""
    parts = [tuple(int(v) for v in p.split(",")) for p in text.split("/")]
    return parts[0] if len(parts) == 1 else (parts[0], parts[1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--tokens", default="1024,2048,4096,8192,16384")
    p.add_argument("--tiles", default="128,128,8,2;128,128,8,4,2;64,64,4,2,2;64,128,4,2",
                   help="W4A8 tiles to time, ';'-separated PrefillTile fields ('gate_up/down' for two)")  # fmt: skip
    p.add_argument("--skip-numerics", action="store_true")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    import tokenspeed_kernel as tk

    tk.load_plugins()
    act = tk.MoEActivation()
    base.GPT_OSS = act
    t0 = time.time()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}

    def log(msg):
        print(msg, flush=True)

    def save():
        with open(os.path.join(args.out, "hopper_w4a8.json"), "w") as f:
            json.dump(result, f, indent=1)

    if not args.skip_numerics:
        result["numerics"] = numerics(act, log)
        save()
    tiles = [_parse_tile(c) for c in args.tiles.split(";") if c]
    result["timing"] = timing(act, [int(v) for v in args.tokens.split(",")], tiles, log)
    result["wall_s"] = time.time() - t0
    save()
    bad = [r for r in result.get("numerics", []) if "error" in r or r["w4a8_vs_w4a8_reference"] > 1e-2]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

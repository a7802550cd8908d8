#!/usr/bin/env python3
"""``hopper.moe_apply``'s GEMV path (``hopper/moe/gemv.py``) against its MMA decode path: an H100/H200 probe (issue 13).

    python tools/moe_gemv_probe.py --out OUT [--stages numerics,kernels,apply,sweep,layer,eager] [--experts 32,128]
        [--tokens 1,2] [--gate-up "1,8,1;1,4,2;..."] [--down "1,4;2,4;..."] [--gemv-tiles "1,8,1/1,4"]
        [--default-gemv] [--numerics-cases a,b] [--skip-mma] [--tag=-x] [--budget-s 300]

Tiles: ``[p][h|i][d]feats,warps[,sub[,ahead]]`` a ``GemvTile`` (fp32 GEMV; ``p``: a down program a pair, the slots
summed by a second launch, or by the token's last program with ``GEMV_FUSED_COMBINE``; ``h``/``i``: f16 pairs, the
e4m3/integer decode; ``d``: activations not staged), ``t[i]G,W[:KS]`` a gate/up ``TcTile`` and ``t[i]G:KS`` a down one (tensor-core GEMV, ``hopper/moe/gemv_tc.py``; ``i``:
the integer decode), each with an optional ``@R`` (its ``maxnreg``); a pair is ``gate_up/down``, and may mix the two
kernels.

GPT-OSS layer shapes (H = I = 2880, top-4, MXFP4 experts with bf16 biases, interleaved gate/up; ``--experts`` 32 =
20B, 128 = 120B). Stages, in order (each row is written to ``OUT/moe_gemv_probe.json`` as it comes):

- ``numerics``: the GEMV path (``GEMV_TILES``, or ``--gemv-tiles``) against the fp32 reference (relative Frobenius
  error, bound 1e-2) and the MMA path (largest absolute difference), its determinism and a CUDA-graph replay, on:
  1 token (20B and 120B), no bias and gate/up not interleaved, 3 tokens, top-3 and top-2 routing, and gate/up scale
  bytes 246-252 (the two-step scale; 6 * 2**125 is the largest fp32 weight the reference can hold) with activations
  scaled by 2**-124, and activations scaled by 2**20 and 2**-30 (the tensor-core GEMV's f16 row scale);
- ``kernels``: each GEMV kernel alone (one CUDA graph, programmatic launch off), L2 flushed and not, 20B layer, one
  token: the tiles of ``--kernel-gate-up`` and ``--kernel-down`` (either kernel's);
- ``apply``: ``moe_apply`` alone (one CUDA graph, programmatic launch on), L2 flushed and not, the MMA decode tiles
  (``DECODE_TILES``, forced; not with ``--skip-mma``) against ``GEMV_TILES`` at each ``--tokens`` and ``--experts``;
- ``sweep``: the gate/up tiles of ``--gate-up`` with the table's down tile, then the down tiles of ``--down`` with the
  fastest gate/up (flushed), at one token, first ``--experts``;
- ``layer``: ``moe_route`` + ``moe_apply`` (one graph, L2 flushed), MMA against the sweep's best, two rounds taking
  turns;
- ``eager``: the public ``tk.moe_apply`` (``override="hopper.moe_apply"``) 400 calls back to back then one sync, median
  of 5 rounds, at one token: the MMA path (the process sets ``GEMV_MAX_TOKENS = 0``), or with ``--default-gemv`` the
  GEMV path (``GEMV_MAX_TOKENS`` at least 1, and the sweep's best tiles when the sweep ran).
"""

# ruff: noqa: B023 - every closure below is timed within the loop iteration that defines it

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hopper_moe_h200 as base


def _tile(text: str):
    """``[p][h|i][d]feats,warps[,sub[,ahead]][@R]``: a ``GemvTile`` (``p``: ``pairs``; ``h``/``i``: ``dot``
    f16/f16i; ``d``: not staged); ``t[i]G,W[:KS][@R]``: a gate/up
    ``TcTile``; ``t[i]G:KS[@R]``: a down ``TcTile`` (``i``: the integer decode; ``@R``: the tile's ``maxnreg``)."""
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile, TcTile

    text, _, reg = text.strip().partition("@")
    maxnreg = int(reg) if reg else None
    if text.startswith("t"):
        decode = "int" if text.startswith("ti") else "e4m3"
        head, _, ks = text[2 if decode == "int" else 1 :].partition(":")
        g, _, w = head.partition(",")
        return TcTile(int(g), int(w) if w else None, int(ks or 1), maxnreg, decode)
    pairs = text.startswith("p")
    text = text.removeprefix("p")
    dot = {"h": "f16", "i": "f16i"}.get(text[:1], "f32")
    text = text if dot == "f32" else text[1:]
    staged = not text.startswith("d")
    fields = [int(v) for v in text.removeprefix("d").split(",")]
    return GemvTile(*fields, *(1, 8, 1, 1)[len(fields) :], maxnreg, staged, dot, pairs)


def _gemv_tiles(gate_up: str, down: str):
    gus = [_tile(p) for p in gate_up.split(";") if p.strip()]
    dns = [_tile(p) for p in down.split(";") if p.strip()]
    return gus, dns


def _name(tiles) -> str:
    from tokenspeed_kernel_nvidia.hopper.moe.layer import TcTile

    def one(t):
        if isinstance(t, TcTile):
            t0 = "ti" if t.decode == "int" else "t"
            head = f"{t0}{t.groups},{t.warps}" if t.warps is not None else f"{t0}{t.groups}"
            head = head if t.warps is not None and t.ksplit == 1 else f"{head}:{t.ksplit}"
            return head if t.maxnreg is None else f"{head}@{t.maxnreg}"
        head = ("p" if t.pairs else "") + {"f16": "h", "f16i": "i"}.get(t.dot, "") + ("" if t.staged else "d")
        head += ",".join(str(v) for v in (t[:3] if t.ahead == 1 else t[:4]))
        return head if t.maxnreg is None else f"{head}@{t.maxnreg}"

    return "/".join(one(t) for t in tiles)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--stages", default="numerics,kernels,apply,sweep,layer,eager")
    p.add_argument("--experts", default="32,128")
    p.add_argument("--tokens", default="1,2")
    p.add_argument("--gate-up", default="1,8,1;1,8,2;1,4,2;1,4,4")
    p.add_argument("--down", default="1,4;1,8;2,4;1,2", help="down tiles: feats,warps")
    p.add_argument("--kernel-gate-up", default="1,8,1;1,8,2;1,4,2;1,4,4;2,4,1;1,16,1")
    p.add_argument("--kernel-down", default="1,4;1,8;2,4;1,2;2,2;1,16")
    p.add_argument("--default-gemv", action="store_true")
    p.add_argument("--gemv-tiles", default="", help="GEMV_TILES for every stage, as gate_up feats,warps/down feats")
    p.add_argument("--numerics-cases", default="", help="the numerics stage's cases to run, by label (default all)")
    p.add_argument("--tag", default="")
    p.add_argument("--skip-mma", action="store_true", help="the apply stage times the GEMV tiles only")
    p.add_argument("--budget-s", type=float, default=300.0)
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    deadline = time.time() + args.budget_s
    stages = args.stages.split(",")
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    tk.load_plugins()
    act = tk.MoEActivation(alpha=1.702, limit=7.0, up_offset=1.0)
    experts = [int(v) for v in args.experts.split(",")]
    res = {"device": torch.cuda.get_device_name(), "tag": args.tag, "numerics": [], "apply": [], "sweep": [],
           "layer": [], "eager": []}  # fmt: skip
    path = os.path.join(args.out, f"moe_gemv_probe{args.tag}.json")

    def save():
        with open(path, "w") as f:
            json.dump(res, f, indent=1)

    gen = torch.Generator().manual_seed(1234)
    weights = {e: base._weights(e, base.H, base.I, gen) for e in experts}

    def inputs(e, t, k=4, scale=1.0):
        x = (torch.randn(t, base.H, generator=gen) * scale).to(torch.bfloat16).cuda()
        logits = torch.randn(t, e, generator=gen).cuda()
        tw, ids = tk.moe_route(logits, k)
        return x, logits, tw, ids

    if args.gemv_tiles:
        gu_text, dn_text = args.gemv_tiles.split("/")
        layer.GEMV_TILES = (_gemv_tiles(gu_text, dn_text)[0][0], _gemv_tiles(gu_text, dn_text)[1][0])
    gemv_tiles = layer.GEMV_TILES
    mma = None  # the table's tiles (DECODE_TILES by tokens)
    # -- numerics ---------------------------------------------------------------------------------
    if "numerics" in stages:
        cases = [("20b_T1", experts[0], 1, 4, {}, 1.0), ("120b_T1", 128, 1, 4, {}, 1.0),
                 ("no_bias_not_interleaved_T1", experts[0], 1, 4, {"bias": False, "interleaved": False}, 1.0),
                 ("20b_T3", experts[0], 3, 4, {}, 1.0), ("top3_T2", experts[0], 2, 3, {}, 1.0),
                 ("top2_T1", experts[0], 1, 2, {}, 1.0),
                 ("scales_246_252_T1", experts[0], 1, 4, {"scale_lo": 246, "scale_hi": 253}, 2.0**-124),
                 ("x_times_2pow20_T1", experts[0], 1, 4, {}, 2.0**20), ("x_times_2pow-30_T2", experts[0], 2, 4, {},
                                                                        2.0**-30)]  # fmt: skip
        if args.numerics_cases:  # a subset, by label
            wanted = args.numerics_cases.split(",")
            if unknown := sorted(set(wanted) - {c[0] for c in cases}):
                p.error(f"--numerics-cases: no case {', '.join(unknown)} (cases: {', '.join(c[0] for c in cases)})")
            cases = [c for c in cases if c[0] in wanted]
        for label, e, t, k, wkw, scale in cases:
            try:
                w = weights[e] if not wkw and e in weights else base._weights(e, base.H, base.I, gen, **wkw)
                if "scale_lo" in wkw:  # large gate/up scales only: the down GEMM's output stays finite
                    w = replace(w, w2_scale=weights[e].w2_scale)
                x, _, tw, ids = inputs(e, t, k, scale)
                got = layer.moe_apply(x, tw, ids, w, act, tiles=gemv_tiles, graphs=False)
                ref = base._ref(x, tw, ids, w, act)
                rel = float((got.float() - ref).norm() / ref.norm())
                other = layer.moe_apply(x, tw, ids, w, act, graphs=False, tiles=layer._tiles(t, layer._two_step(w)))
                again = layer.moe_apply(x, tw, ids, w, act, tiles=gemv_tiles, graphs=False)
                graph = torch.cuda.CUDAGraph()
                out = torch.empty_like(got)
                with torch.cuda.graph(graph):
                    layer.moe_apply(x, tw, ids, w, act, tiles=gemv_tiles, graphs=False, out=out)
                graph.replay()
                torch.cuda.synchronize()
                row = {"case": label, "rel_err_vs_fp32": rel, "mma_rel_err": float((other.float() - ref).norm() /
                       ref.norm()), "max_abs_vs_mma": float((got.float() - other.float()).abs().max()),
                       "deterministic": bool(torch.equal(again, got)), "graph_replay_equal": bool(torch.equal(out, got)),
                       "finite": bool(torch.isfinite(got).all())}  # fmt: skip
            except Exception as exc:  # recorded; the other cases go on
                row = {"case": label, "error": f"{type(exc).__name__}: {exc}"[:400]}
            res["numerics"].append(row)
            print("numerics", json.dumps(row), flush=True)
            save()
    # -- moe_apply alone --------------------------------------------------------------------------

    def apply_alone(w, x, tw, ids, tiles):
        out = torch.empty_like(x)
        if tiles is None:  # the MMA decode path
            tiles = layer._tiles(x.shape[0], layer._two_step(w))

        def fn():
            layer.moe_apply(x, tw, ids, w, act, tiles=tiles, graphs=False, out=out)

        flushed = time_fn(fn, device="cuda", graph=True, warmup_ms=5, rep_ms=30, flush_l2=True).median_us
        hot = time_fn(fn, device="cuda", graph=True, warmup_ms=5, rep_ms=30, flush_l2=False).median_us
        return flushed, hot

    if "apply" in stages:
        for e in experts:
            for t in [int(v) for v in args.tokens.split(",")]:
                if time.time() > deadline:
                    break
                x, _, tw, ids = inputs(e, t)
                configs = (("mma", mma),) * (not args.skip_mma) + (("gemv " + _name(gemv_tiles), gemv_tiles),)
                for name, tiles in configs:
                    f, h = apply_alone(weights[e], x, tw, ids, tiles)
                    row = {"experts": e, "tokens": t, "config": name, "flushed_us": f, "hot_us": h}
                    res["apply"].append(row)
                    print("apply", e, t, name, round(f, 2), round(h, 2), flush=True)
                save()
    if "kernels" in stages and time.time() < deadline:
        from tokenspeed_kernel_nvidia.hopper.moe import decode

        res["kernels"] = []
        e = experts[0]
        x, _, tw, ids = inputs(e, 1)
        flat_ids, flat_tw = ids.reshape(-1).contiguous(), tw.reshape(-1).contiguous()
        pdl = decode.PDL_ENABLED
        decode.PDL_ENABLED = False  # each kernel alone in a graph: nothing to overlap
        try:
            for gemm, variants in (("gate_up", args.kernel_gate_up), ("down", args.kernel_down)):
                for v in filter(None, (q.strip() for q in variants.split(";"))):
                    if time.time() > deadline:
                        break
                    tile = _tile(v)
                    tc = isinstance(tile, layer.TcTile)
                    if gemm == "gate_up":
                        inter = torch.empty(4, base.I, dtype=torch.bfloat16 if tc else torch.float32, device="cuda")
                        gate_up = layer._tc_gate_up if tc else layer._gemv_gate_up

                        def fn():
                            gate_up(x, flat_ids, weights[e], act, inter, tile, 4)
                    else:
                        inter = torch.randn(4, base.I, generator=gen).to(torch.bfloat16).cuda()
                        # as the layer stores it: fp32 for a staged fp32 down, else bf16
                        inter = inter.float() if not tc and tile.staged and tile.dot == "f32" else inter
                        out = torch.empty_like(x)
                        down = layer._tc_down if tc else layer._gemv_down
                        # a pairs down sums its slots as the layer does (GEMV_FUSED_COMBINE)
                        opts = {} if tc else {"fused": layer.GEMV_FUSED_COMBINE}

                        def fn():
                            down(inter, flat_ids, flat_tw, weights[e], out, tile, 4, **opts)

                    row = {"gemm": gemm, "variant": v}
                    for flush in (True, False):
                        row["flushed_us" if flush else "hot_us"] = time_fn(
                            fn, device="cuda", graph=True, warmup_ms=5, rep_ms=30, flush_l2=flush
                        ).median_us
                    res["kernels"].append(row)
                    print("kernel", gemm, v, round(row["flushed_us"], 2), round(row["hot_us"], 2), flush=True)
        finally:
            decode.PDL_ENABLED = pdl
        save()
    best = gemv_tiles
    if "sweep" in stages and time.time() < deadline:
        e = experts[0]
        x, _, tw, ids = inputs(e, 1)
        gus, dns = _gemv_tiles(args.gate_up, args.down)
        timed = {}
        for gu in gus:
            if time.time() > deadline:
                break
            tiles = (gu, best[1])
            timed[tiles] = apply_alone(weights[e], x, tw, ids, tiles)
            res["sweep"].append({"tiles": _name(tiles), "flushed_us": timed[tiles][0], "hot_us": timed[tiles][1]})
            print("sweep", _name(tiles), *(round(v, 2) for v in timed[tiles]), flush=True)
        if timed:
            best = min(timed, key=lambda v: timed[v][0])
        for dn in dns:
            if time.time() > deadline:
                break
            tiles = (best[0], dn)
            if tiles not in timed:
                timed[tiles] = apply_alone(weights[e], x, tw, ids, tiles)
                res["sweep"].append({"tiles": _name(tiles), "flushed_us": timed[tiles][0], "hot_us": timed[tiles][1]})
                print("sweep", _name(tiles), *(round(v, 2) for v in timed[tiles]), flush=True)
        best = min(timed, key=lambda v: timed[v][0]) if timed else best
        res["best"] = _name(best)
        print("best", _name(best), flush=True)
        save()
    if "layer" in stages and time.time() < deadline:
        for e in experts:
            x, logits, _, _ = inputs(e, 1)
            out = torch.empty_like(x)
            configs = {"mma": layer._tiles(1, layer._two_step(weights[e])), "gemv " + _name(best): best}
            base.layer_rounds(res, 1, list(configs), 2, deadline, lambda name, tw2, ids2: layer.moe_apply(
                x, tw2, ids2, weights[e], act, out=out, tiles=configs[name], graphs=False), logits,
                extra=lambda name: {"experts": e})  # fmt: skip
            save()
    if "eager" in stages and time.time() < deadline:
        if args.default_gemv:
            layer.GEMV_MAX_TOKENS = max(layer.GEMV_MAX_TOKENS, 1)
            layer.GEMV_TILES = best
        else:
            layer.GEMV_MAX_TOKENS = 0  # the MMA decode path
        for e in experts:
            x, _, tw, ids = inputs(e, 1)

            def public():
                return tk.moe_apply(x, tw, ids, weights[e], act, override="hopper.moe_apply")

            for _ in range(20):
                public()
            torch.cuda.synchronize()
            rounds = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(400):
                    public()
                torch.cuda.synchronize()
                rounds.append((time.perf_counter() - t0) / 400 * 1e6)
            graph_us = time_fn(public, device="cuda", graph=True, warmup_ms=5, rep_ms=30, flush_l2=False).median_us
            row = {"experts": e, "path": "gemv " + _name(best) if args.default_gemv else "mma",
                   "eager_us": sorted(rounds)[2], "rounds_us": rounds, "graph_hot_us": graph_us}  # fmt: skip
            res["eager"].append(row)
            print("eager", json.dumps(row), flush=True)
            save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())

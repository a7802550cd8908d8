#!/usr/bin/env python3
"""The Hopper MXFP4 MoE (``hopper.moe_apply``) on an H200: numerics, tile sweep, layer bench.

    python tools/hopper_moe_h200.py --out OUT [--tokens 1,2,4,8,16,32,64,128,256,512] [--sweep] [--budget-s 240]

Layer: GPT-OSS-120B (128 experts, top-4, H = I = 2880, MXFP4 experts with bf16 biases,
interleaved gate/up, SwiGLU alpha 1.702, clamp 7, up + 1). "Layer" = ``moe_route``
(softmax top-k of random logits) + ``moe_apply``, captured in one CUDA graph, L2 flushed
before every replay (``tokenspeed_kernel.benchmark.timer.time_fn``), for every
``moe_apply`` kernel registered on the machine: ``hopper.moe_apply`` (this package),
``triton.moe_apply`` (portable), ``triton_kernels.moe_apply`` (the peer, on its own
layout). Weight TB/s = MXFP4 bytes (codes + scales + biases) of the experts the routing
touches / layer time. ``--grouped-mm`` adds the bf16 column: the same routing's two GEMMs
alone (``torch._grouped_mm`` on bf16 copies of the experts; the x gather included, the
route, SwiGLU and combine not), an MMA-rate reference for the large token counts.

Numerics: each case against the fp32 reference ``moe_apply`` (relative Frobenius error;
the bound, 1e-2, is the GPU tests'): GPT-OSS-120B and -20B shapes, every routing shape
(one hot expert, ties), no bias / not interleaved / silu, scale bytes above 128 (the
two-multiply decode).

Writes ``OUT/hopper_moe.json`` and prints a table.
"""

# ruff: noqa: B023 - every closure below is timed within the loop iteration that defines it

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import replace

import torch

E, K_TOP, H, I = 128, 4, 2880, 2880
GPT_OSS = None  # set in main (import after argparse)


def _weights(e, h, i, gen, *, scale_lo=118, scale_hi=128, bias=True, interleaved=True):
    import tokenspeed_kernel as tk

    def ri(lo, hi, *shape):
        return torch.randint(lo, hi, shape, generator=gen, dtype=torch.uint8).cuda()

    w = tk.MoEWeights(
        w13=ri(0, 256, e, 2 * i, h // 2), w2=ri(0, 256, e, h, i // 2), format="mxfp4",
        w13_scale=ri(scale_lo, scale_hi, e, 2 * i, h // 32), w2_scale=ri(scale_lo, scale_hi, e, h, i // 32),
        w13_bias=(torch.randn(e, 2 * i, generator=gen) * 0.1).to(torch.bfloat16).cuda() if bias else None,
        w2_bias=(torch.randn(e, h, generator=gen) * 0.1).to(torch.bfloat16).cuda() if bias else None,
        gate_up_interleaved=interleaved,
    )  # fmt: skip
    w.validate()
    return w


def _expert_bytes(h, i):
    values = 2 * i * h + h * i
    return values / 2 + values / 32 + (2 * i + h) * 2


def _ref(x, tw, ids, w, act):
    import tokenspeed_kernel as tk

    wf = replace(
        w,
        w13_bias=None if w.w13_bias is None else w.w13_bias.float(),
        w2_bias=None if w.w2_bias is None else w.w2_bias.float(),
    )
    return tk.moe_apply(x.float(), tw, ids, wf, act, solution="reference")


def numerics(log):
    import tokenspeed_kernel as tk
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    rows = []
    silu = tk.MoEActivation(kind="silu", alpha=1.0, limit=None, up_offset=0.0)
    cases = [
        # (label, E, T, routing, weights kwargs, activation)
        ("120b-T1", 128, 1, "random", {}, GPT_OSS),
        ("120b-T3", 128, 3, "random", {}, GPT_OSS),
        ("120b-T8", 128, 8, "random", {}, GPT_OSS),
        ("120b-T64", 128, 64, "random", {}, GPT_OSS),
        ("120b-T200", 128, 200, "random", {}, GPT_OSS),
        ("20b-T1", 32, 1, "random", {}, GPT_OSS),
        ("20b-T37", 32, 37, "random", {}, GPT_OSS),
        ("120b-T40-one-hot-expert", 128, 40, "hot", {}, GPT_OSS),
        ("120b-T9-no-bias-not-interleaved-silu", 128, 9, "random", {"bias": False, "interleaved": False}, silu),
        ("120b-T5-not-interleaved", 128, 5, "random", {"interleaved": False}, GPT_OSS),
        ("120b-T6-scales-above-128", 128, 6, "random", {"scale_lo": 120, "scale_hi": 136}, GPT_OSS),
        ("120b-T2-k-split-4", 128, 2, "random", {"tiles": (64, 8, 4, 4, 4)}, GPT_OSS),
        (
            "120b-T3-k-split-3-not-interleaved",
            128,
            3,
            "random",
            {"tiles": (64, 8, 4, 6, 3), "interleaved": False},
            GPT_OSS,
        ),
    ]
    for label, e, t, routing, wkw, act in cases:
        wkw = dict(wkw)
        tiles = wkw.pop("tiles", None)
        tiles = None if tiles is None else (layer.DecodeTile(*tiles), layer.DecodeTile(*tiles))
        gen = torch.Generator().manual_seed(len(rows) + 1)
        try:
            w = _weights(e, H, I, gen, **wkw)
            x = torch.randn(t, H, generator=gen).to(torch.bfloat16).cuda()
            logits = torch.randn(t, e, generator=gen).cuda()
            if routing == "hot":
                logits[:, 3] += 100.0  # every token's first expert is 3: 40 pairs of one expert
            tw, ids = tk.moe_route(logits, K_TOP, solution="reference")
            got = layer.moe_apply(x, tw, ids, w, act, tiles=tiles)
            via_op = (
                layer.moe_apply(x, tw, ids, w, act, tiles=tiles)
                if tiles
                else tk.moe_apply(x, tw, ids, w, act, override="hopper.moe_apply")
            )
            ref = _ref(x, tw, ids, w, act)
            err = ((got.float() - ref).norm() / ref.norm()).item()
            rows.append({"case": label, "rel_err": err, "ok": err < 1e-2, "op_equal": bool(torch.equal(got, via_op)),
                         "two_step": layer._two_step(w)})  # fmt: skip
        except Exception as exc:
            rows.append({"case": label, "error": f"{type(exc).__name__}: {exc}"})
            traceback.print_exc()
        log(f"  numerics {rows[-1]}")
    return rows


PREFILL_CASES = [
    # (label, E, T, routing, weights kwargs, activation name, tile or None)
    ("120b-T256", 128, 256, "random", {}, "gpt_oss", None),
    ("120b-T600", 128, 600, "random", {}, "gpt_oss", None),
    ("120b-T2048", 128, 2048, "random", {}, "gpt_oss", None),
    ("20b-T700", 32, 700, "random", {}, "gpt_oss", None),
    ("120b-T300-one-hot-expert", 128, 300, "hot", {}, "gpt_oss", None),
    ("120b-T300-no-bias-not-interleaved-silu", 128, 300, "random", {"bias": False, "interleaved": False}, "silu", None),
    ("120b-T300-not-interleaved", 128, 300, "random", {"interleaved": False}, "gpt_oss", None),
    ("120b-T300-scales-above-128", 128, 300, "random", {"scale_lo": 120, "scale_hi": 136}, "gpt_oss", None),
    ("120b-T5-prefill-tiles-empty-experts", 128, 5, "random", {}, "gpt_oss", (128, 16, 8, 4)),
    ("120b-T300-bt32-4warps", 128, 300, "random", {}, "gpt_oss", (64, 32, 4, 3)),
    ("120b-T1000-2-stages", 128, 1000, "random", {}, "gpt_oss", (128, 64, 8, 2)),
    ("120b-T3000-bt128", 128, 3000, "random", {}, "gpt_oss", (128, 128, 8, 2)),
]


def prefill_numerics(log):
    """The prefill path against the fp32 reference; two calls and a graph replay bit-identical."""
    import tokenspeed_kernel as tk
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    acts = {"gpt_oss": GPT_OSS, "silu": tk.MoEActivation(kind="silu", alpha=1.0, limit=None, up_offset=0.0)}
    rows = []
    for label, e, t, routing, wkw, act, tile in PREFILL_CASES:
        gen = torch.Generator().manual_seed(100 + len(rows))
        act = acts[act]
        tiles = None if tile is None else (layer.PrefillTile(*tile), layer.PrefillTile(*tile))
        try:
            w = _weights(e, H, I, gen, **wkw)
            x = torch.randn(t, H, generator=gen).to(torch.bfloat16).cuda()
            logits = torch.randn(t, e, generator=gen).cuda()
            if routing == "hot":
                logits[:, 3] += 100.0
            tw, ids = tk.moe_route(logits, K_TOP, solution="reference")
            got = layer.moe_apply(x, tw, ids, w, act, tiles=tiles)
            again = layer.moe_apply(x, tw, ids, w, act, tiles=tiles)
            out = torch.empty_like(x)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                layer.moe_apply(x, tw, ids, w, act, tiles=tiles, out=out)
            out.zero_()
            g.replay()
            torch.cuda.synchronize()
            ref = _ref(x, tw, ids, w, act)
            err = ((got.float() - ref).norm() / ref.norm()).item()
            rows.append({"case": label, "rel_err": err, "ok": err < 1e-2, "deterministic": bool(torch.equal(got, again)),
                         "graph_equal": bool(torch.equal(got, out)), "two_step": layer._two_step(w)})  # fmt: skip
        except Exception as exc:
            rows.append({"case": label, "error": f"{type(exc).__name__}: {exc}"})
            traceback.print_exc()
        log(f"  prefill numerics {rows[-1]}")
    return rows


def prefill_stages(log, t=300, tile=(128, 64, 8, 4)):
    """Each launch of the prefill path against torch (debugging): the gathered activations, the
    intermediate (un-permuted) and the down GEMM's rows."""
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.reference.moe import dequantize_expert_weights
    from tokenspeed_kernel_nvidia.hopper.moe import layer, prefill

    gen = torch.Generator().manual_seed(7)
    w = _weights(E, H, I, gen)
    x = torch.randn(t, H, generator=gen).to(torch.bfloat16).cuda()
    tw, ids = tk.moe_route(torch.randn(t, E, generator=gen).cuda(), K_TOP, solution="reference")
    perm_h = torch.tensor([prefill.kperm(c) for c in range(H)], device="cuda")
    perm_i = torch.tensor([prefill.kperm(c) for c in range(I)], device="cuda")
    rows = []
    sc = {}
    got = torch.empty_like(x)
    pt = layer.PrefillTile(*tile)
    prefill.run_prefill(x, tw, ids, w, GPT_OSS, got, tiles=(pt, pt), two_step=layer._two_step(w),
                        scratch=sc)  # fmt: skip
    torch.cuda.synchronize()
    order = sc["order"].long()
    flat = ids.reshape(-1).long()
    xs_ref = torch.empty_like(sc["xs"])
    xs_ref[:, perm_h] = x[order // K_TOP]
    inter = sc["inter"][:, perm_i].float()
    inter_ref = torch.zeros_like(inter)
    y_ref = torch.zeros_like(sc["y"])
    ex = flat[order]
    for e in range(E):
        sel = (ex == e).nonzero().flatten()
        if sel.numel() == 0:
            continue
        w13, w2 = dequantize_expert_weights(w, e)
        h = x[order[sel] // K_TOP].float() @ w13.T + w.w13_bias[e].float()
        gate, up = h[:, 0::2], h[:, 1::2]
        gate = gate.clamp(max=GPT_OSS.limit)
        up = up.clamp(-GPT_OSS.limit, GPT_OSS.limit)
        hv = (up + GPT_OSS.up_offset) * gate * torch.sigmoid(GPT_OSS.alpha * gate)
        inter_ref[sel] = hv
        # The down GEMM from the kernel's own intermediate: isolates the second GEMM.
        y_ref[order[sel]] = (inter[sel] @ w2.T + w.w2_bias[e].float()) * tw.reshape(-1)[order[sel], None]

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    ref = _ref(x, tw, ids, w, GPT_OSS)
    rows.append({"xs_equal": bool(torch.equal(sc["xs"], xs_ref)),
                 "inter_rel": rel(inter, inter_ref), "inter_nan": int(inter.isnan().sum()),
                 "y_rel": rel(sc["y"], y_ref), "out_rel": rel(got, ref),
                 "offsets_ok": bool(torch.equal(sc["offsets"].long(),
                                                torch.searchsorted(flat.sort().values, torch.arange(E + 1, device="cuda"))))})  # fmt: skip
    log(f"  prefill stages {rows[-1]}")
    return rows


#: (gate/up tile, down tile); a single tile serves both GEMMs.
PREFILL_SWEEP = [
    (128, 32, 8, 4), (128, 64, 8, 4), (128, 128, 8, 2), (128, 128, 8, 3), (64, 64, 4, 3), (64, 128, 4, 3),
    ((128, 128, 8, 3), (128, 64, 8, 4)),
]  # fmt: skip


def _parse_tiles(text):
    """``'128,64,8,4'`` (both GEMMs) or ``'128,128,8,2/128,64,8,4'`` (gate/up / down)."""
    parts = [tuple(int(v) for v in half.split(",")) for half in text.split("/")]
    if len(parts) > 2:
        raise SystemExit(f"--prefill-tiles: expected one tile or 'gate_up/down', got {text!r}")
    return parts[0] if len(parts) == 1 else tuple(parts)


def prefill_breakdown(w, gen, tokens_list, log):
    """Each launch of the prefill path alone at the table's tiles (graph replay, L2 flushed), with
    each GEMM's TFLOP/s (2 * pairs * N * K over its time)."""
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.hopper.moe import decode, layer, prefill

    rows = []
    for t in tokens_list:
        x = torch.randn(t, H, generator=gen).to(torch.bfloat16).cuda()
        tw, ids = tk.moe_route(torch.randn(t, E, generator=gen).cuda(), K_TOP)
        gu, dn = layer._prefill_tiles(t * K_TOP, E)
        out = torch.empty_like(x)
        sc = {}
        two_step = layer._two_step(w)
        prefill.run_prefill(x, tw, ids, w, GPT_OSS, out, tiles=(gu, dn), two_step=two_step, scratch=sc)
        pairs = ids.numel()
        order, offsets, xs, inter, y = (sc[k] for k in ("order", "offsets", "xs", "inter", "y"))
        twf = tw.reshape(-1).contiguous()
        common = dict(pairs=pairs, experts=E, activation=GPT_OSS, two_step=two_step)
        d_xs, d_in = prefill._descriptor(xs, gu[1]), prefill._descriptor(inter, dn[1])
        y3 = y.unsqueeze(0)
        parts = {
            "sort": lambda: prefill.sort_by_expert(ids.reshape(-1).contiguous(), E),  # the path's own sort
            "gather": lambda: prefill.cached(prefill.gather_rows)[(pairs, 3)](x, x.stride(0), order, xs, H,
                                                                              TOP_K=K_TOP, BLOCK=1024),
            "gate_up": lambda: prefill._launch(d_xs, offsets, order, w.w13, w.w13_scale, w.w13_bias, twf, inter,
                                               gate_up=True, interleaved=True, tile=gu, **common),
            "down": lambda: prefill._launch(d_in, offsets, order, w.w2, w.w2_scale, w.w2_bias, twf, y,
                                            gate_up=False, interleaved=True, tile=dn, **common),
            "combine": lambda: decode.combine_slots[(t, 3)](y3, out, out.stride(0), y3.stride(0), H, TOP_K=K_TOP,
                                                            KSPLIT=1, BLOCK=1024),
            "apply": lambda: layer.moe_apply(x, tw, ids, w, GPT_OSS, out=out),
        }  # fmt: skip
        row = {"tokens": t, "tiles": [list(gu), list(dn)]}
        for name, fn in parts.items():
            row[name] = time_fn(fn, device="cuda", graph=True, warmup_ms=5, rep_ms=30).median_us
        row["gate_up_tflops"] = 2 * pairs * 2 * I * H / row["gate_up"] / 1e6
        row["down_tflops"] = 2 * pairs * H * I / row["down"] / 1e6
        log(f"  prefill breakdown {row}")
        rows.append(row)
    return rows


def prefill_sweep(w, gen, tokens_list, log, deadline, layouts=("canonical",)):
    """``moe_apply`` alone (no route), each tile for both GEMMs, on the weights of each of ``layouts``
    (``canonical``; ``packed``: converted once by ``hopper.moe_apply_packed``'s plan)."""
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    weights = {}
    for lay in layouts:
        if lay == "canonical":
            weights[lay] = w
        elif lay == "packed":
            plan = tk.moe_plan(w, GPT_OSS, dtype=torch.bfloat16, override="hopper.moe_apply_packed")
            weights[lay] = tk.moe_process_weights(plan, w)
        else:
            raise SystemExit(f"--prefill-layouts: expected canonical or packed, got {lay!r}")
    res = []
    for t in tokens_list:
        x = torch.randn(t, H, generator=gen).to(torch.bfloat16).cuda()
        tw, ids = tk.moe_route(torch.randn(t, E, generator=gen).cuda(), K_TOP)
        out = torch.empty_like(x)
        for cfg in PREFILL_SWEEP:
            pair = cfg if isinstance(cfg[0], tuple) else (cfg, cfg)
            tiles = (layer.PrefillTile(*pair[0]), layer.PrefillTile(*pair[1]))
            for lay, wl in weights.items():
                if time.time() > deadline:
                    log("  prefill sweep: budget spent")
                    return res
                row = {"tokens": t, "tiles": [list(tiles[0]), list(tiles[1])], "layout": lay}
                try:
                    tm = time_fn(lambda: layer.moe_apply(x, tw, ids, wl, GPT_OSS, tiles=tiles, out=out),
                                 device="cuda", graph=True, warmup_ms=5, rep_ms=40)  # fmt: skip
                    row["apply_us"] = tm.median_us
                except Exception as exc:
                    row["error"] = str(exc)[:300]
                res.append(row)
                log(f"  prefill sweep {res[-1]}")
    return res


def _apply_best_prefill(rows, log):
    """Point layer.PREFILL_TILES at the sweep's fastest tiles per token count (for the bench below; the
    table's bounds are loads, ``tokens * K_TOP / E`` here)."""
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    best = {}
    for r in rows:
        if r.get("layout") != rows[0].get("layout"):  # the table follows the first layout swept
            continue
        if "apply_us" in r and (r["tokens"] not in best or r["apply_us"] < best[r["tokens"]]["apply_us"]):
            best[r["tokens"]] = r
    if not best:
        return None
    ts = sorted(best)
    table = []
    for n, t in enumerate(ts):
        bound = None if n == len(ts) - 1 else t * K_TOP / E
        table.append((bound, tuple(layer.PrefillTile(*v) for v in best[t]["tiles"])))
    layer.PREFILL_TILES = tuple(table)
    log(f"  prefill tiles used: {table}")
    return [[b, [list(v) for v in tl]] for b, tl in table]


def layer_rounds(res, t, names, rounds, deadline, apply, logits, extra=lambda name: {}):
    """The layer (``moe_route`` + ``apply(name, tw, ids)``, one CUDA graph, L2 flushed) of every configuration in
    ``names``, taking turns for ``rounds`` (every other round reversed); rows into ``res["layer"]``."""
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn

    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            if time.time() > deadline:
                return

            def layer_fn():
                tw, ids = tk.moe_route(logits, K_TOP)
                return apply(name, tw, ids)

            us = time_fn(layer_fn, device="cuda", graph=True, warmup_ms=5, rep_ms=40).median_us
            res["layer"].append({"tokens": t, "config": name, **extra(name), "round": r, "us": us})
            print("layer", t, name, r, round(us, 2), flush=True)


def _layer_fn(kernel, x, logits, w, act, out):
    import tokenspeed_kernel as tk

    # The W4A8 kernel runs only for callers that allow fp8 activations.
    fp8 = {"fp8_activations": True} if kernel.endswith("_w4a8") else {}

    def fn():
        tw, ids = tk.moe_route(logits, K_TOP)
        return tk.moe_apply(x, tw, ids, w, act, out=out, override=kernel, **fp8)

    return fn


def sweep(w, gen, tokens_list, log, deadline, tiles_list=None):
    """The decode tiles at each token count: each GEMM's tile with the other at the default, or, with
    ``tiles_list`` (``--sweep-tiles``), the given tiles for both GEMMs (rows ``gemm: "both"``)."""
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    grid = []
    for cfg in tiles_list or (
        (64, 8, 4, 6, 1),
        (64, 8, 4, 6, 2),
        (64, 8, 4, 6, 3),
        (64, 8, 4, 4, 4),
        (64, 8, 4, 4, 6),
        (32, 8, 1, 4, 4),
    ):
        # a tile for both GEMMs, or (gate/up tile, down tile)
        grid.append(tuple(layer.DecodeTile(*c) for c in cfg) if isinstance(cfg[0], tuple) else layer.DecodeTile(*cfg))
    res = []
    for t in tokens_list:
        x = torch.randn(t, H, generator=gen).to(torch.bfloat16).cuda()
        tw, ids = tk.moe_route(torch.randn(t, E, generator=gen).cuda(), K_TOP)
        for which in ("both",) if tiles_list else ("gate_up", "down"):
            for tile in grid:
                if time.time() > deadline:
                    log("  sweep: budget spent")
                    return res
                base = layer.DecodeTile(64, 8, 4, 6, 1)
                pair = isinstance(tile[0], tuple)
                tiles = tile if pair else {"both": (tile, tile), "gate_up": (tile, base), "down": (base, tile)}[which]
                label = [list(v) for v in tile] if pair else list(tile)
                try:
                    tm = time_fn(lambda: layer.moe_apply(x, tw, ids, w, GPT_OSS, tiles=tiles), device="cuda",
                                 graph=True, warmup_ms=5, rep_ms=30)  # fmt: skip
                    res.append({"tokens": t, "gemm": which, "tile": label, "layer_us": tm.median_us})
                except Exception as exc:
                    res.append({"tokens": t, "gemm": which, "tile": label, "error": str(exc)[:200]})
                log(f"  sweep {res[-1]}")
    return res


def breakdown(w, gen, tokens_list, log):
    """Each launch of the layer alone (graph replay, L2 flushed): route, gate/up, down, combine."""
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.hopper.moe import decode, layer

    rows = []
    for t in tokens_list:
        x = torch.randn(t, H, generator=gen).to(torch.bfloat16).cuda()
        logits = torch.randn(t, E, generator=gen).cuda()
        tw, ids = tk.moe_route(logits, K_TOP)
        pairs = t * K_TOP
        flat_ids, flat_w = ids.reshape(-1).contiguous(), tw.reshape(-1).contiguous()
        inter = torch.empty(pairs, I, dtype=torch.bfloat16, device="cuda")
        y = torch.empty(1, pairs, H, dtype=torch.float32, device="cuda")
        out = torch.empty_like(x)
        gu, dn = (layer.DecodeTile(*v[:4], 1, *v[5:]) for v in layer._tiles(t))  # one K split: each GEMM whole
        common = dict(pairs=pairs, k=K_TOP, activation=GPT_OSS, two_step=False, packed=False)
        parts = {
            "route": lambda: tk.moe_route(logits, K_TOP),
            "gate_up": lambda: layer._launch(x, flat_ids, w.w13, w.w13_scale, w.w13_bias, flat_w, inter,
                                             gate_up=True, interleaved=True, tile=gu, **common),
            "down": lambda: layer._launch(inter, flat_ids, w.w2, w.w2_scale, w.w2_bias, flat_w, y, gate_up=False,
                                          interleaved=True, tile=dn, **common),
            "combine": lambda: decode.combine_slots[(t, 3)](y, out, out.stride(0), y.stride(0), H, TOP_K=K_TOP,
                                                            KSPLIT=1, BLOCK=1024),
        }  # fmt: skip
        row = {"tokens": t}
        for name, fn in parts.items():
            row[name] = time_fn(fn, device="cuda", graph=True, warmup_ms=5, rep_ms=30).median_us
        log(f"  breakdown {row}")
        rows.append(row)
    return rows


def _apply_best(rows, log):
    """Make this process's hopper.moe_apply use the sweep's fastest tiles at each swept token count
    (the layer time of each GEMM's best tile; the other GEMM at the default) for the bench below."""
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    best = {}
    for r in rows:
        if "layer_us" not in r:
            continue
        key = (r["tokens"], r["gemm"])
        if key not in best or r["layer_us"] < best[key][0]:
            best[key] = (r["layer_us"], tuple(r["tile"]))
    default = layer.DECODE_TILES[-1][1]
    table = []
    for t in sorted({k[0] for k in best}):
        if (t, "both") in best:
            tile = best[(t, "both")][1]
            pair = tile if isinstance(tile[0], list) else (tile, tile)  # (gate/up, down) or one tile for both
            table.append((t, tuple(layer.DecodeTile(*v) for v in pair)))
            continue
        gu = layer.DecodeTile(*best[(t, "gate_up")][1]) if (t, "gate_up") in best else default[0]
        dn = layer.DecodeTile(*best[(t, "down")][1]) if (t, "down") in best else default[1]
        table.append((t, (gu, dn)))
    layer.DECODE_TILES = (*table, (None, default))
    used = [[t, list(g), list(d)] for t, (g, d) in table]
    log(f"  tiles used by the bench (tokens <= bound: gate_up, down): {used}")
    return used


def _torch_sort_by_expert(ids, experts):
    """The torch sort the two-launch sort replaced (session 13): ``torch.sort`` + ``searchsorted``."""
    sorted_ids, order = torch.sort(ids, stable=True)
    bounds = torch.arange(experts + 1, dtype=torch.int32, device=ids.device)
    return order.to(torch.int32), torch.searchsorted(sorted_ids, bounds, out_int32=True)


def sort_bench(pairs_list, log):
    """The prefill path's sort by expert at each pair count: ``sort_pairs`` (one launch, up to 4096 pairs),
    the two-launch sort (``block_histograms`` + ``scatter_sorted``) and the torch sort, each alone in a CUDA
    graph (L2 flushed), us; each checked against torch's stable sort."""
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.hopper.moe import prefill

    rows = []
    bound = prefill.SORT_MAX_PAIRS
    for pairs in pairs_list:
        ids = torch.randint(0, E, (pairs,), dtype=torch.int32, device="cuda")
        want = torch.sort(ids.long(), stable=True)[1]
        row = {"pairs": pairs}
        ways = {"torch": lambda: _torch_sort_by_expert(ids, E), "two_launch": -1}
        if pairs <= 4096:
            ways["sort_pairs"] = 1 << 30
        for name, way in ways.items():
            if callable(way):
                fn = way
            else:
                prefill.SORT_MAX_PAIRS = way
                fn = lambda: prefill.sort_by_expert(ids, E)
            order, off = fn()
            row[f"{name}_ok"] = bool(torch.equal(order.long(), want)) and int(off[-1]) == pairs
            row[name] = time_fn(fn, device="cuda", graph=True, warmup_ms=5, rep_ms=30).median_us
            prefill.SORT_MAX_PAIRS = bound
        log(f"  sort {row}")
        rows.append(row)
    return rows


def _grouped_mm_fn(x, ids, w13b, w2b):
    """The two bf16 grouped GEMMs of one routing (x gathered by expert; no route/SwiGLU/combine)."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    rows = (order // K_TOP).contiguous()
    offs = torch.bincount(flat, minlength=E).cumsum(0).to(torch.int32)
    inter = torch.randn(flat.numel(), I, device="cuda").to(torch.bfloat16)

    def fn():
        xs = x.index_select(0, rows)
        torch._grouped_mm(xs, w13b, offs=offs)
        return torch._grouped_mm(inter, w2b, offs=offs)

    return fn


def _bf16_experts(w):
    """bf16 [E, K, N] views (column-major, as grouped GEMMs take weights) of the MXFP4 experts."""
    import tokenspeed_kernel as tk

    def dense(codes, scales):  # [E, N, K/2] codes -> [E, K, N] bf16 (a transposed view of [E, N, K])
        return tk.dequantize_mxfp4(codes, scales, dtype=torch.bfloat16).transpose(-2, -1)

    return dense(w.w13, w.w13_scale), dense(w.w2, w.w2_scale)


def bench(w, converted, gen, tokens_list, log, grouped=None, pdl_ab=False, fused_ab=False):
    """The layer (route + apply) per kernel at each token count (``converted``: kernel -> its weights when
    they are not the canonical ``w``, from ``moe_process_weights``); ``pdl_ab``: ``hopper.moe_apply`` also with
    programmatic dependent launch off (column ``hopper.moe_apply_no_pdl``), in the same process; ``fused_ab``:
    both hopper bf16 kernels also with every decode tile's epilogues fused and with none fused (columns
    ``..._fused`` and ``..._separate``: ``layer.DECODE_TILES`` with the flags set)."""
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.hopper.moe import decode, layer
    from tokenspeed_kernel_nvidia.hopper.moe.layer import FP8_MIN_TOKENS, PREFILL_MIN_TOKENS

    names = [s.name for s in tk.registry.for_op("moe_apply")]
    kernels = [n for n in ("hopper.moe_apply", "hopper.moe_apply_packed", "hopper.moe_apply_w4a8", "triton.moe_apply",
                         "triton_kernels.moe_apply") if n in names]  # fmt: skip
    rows = []
    pdl_default = decode.PDL_ENABLED
    table = layer.DECODE_TILES
    flagged = {
        f: tuple((b, tuple(layer.DecodeTile(*v[:5], f, *v[6:]) for v in p)) for b, p in table) for f in (False, True)
    }
    for t in tokens_list:
        x = torch.randn(t, H, generator=gen).to(torch.bfloat16).cuda()
        logits = torch.randn(t, E, generator=gen).cuda()
        _, ids = tk.moe_route(logits, K_TOP)
        touched = int(torch.unique(ids).numel())
        row = {"tokens": t, "touched_experts": touched}
        out = torch.empty_like(x)
        runs = [(k, k, pdl_default, table) for k in kernels]
        if pdl_ab and "hopper.moe_apply" in kernels:
            runs.insert(1, ("hopper.moe_apply_no_pdl", "hopper.moe_apply", False, table))
        if fused_ab and t < PREFILL_MIN_TOKENS:  # the epilogues of the decode path
            for k in ("hopper.moe_apply_packed", "hopper.moe_apply"):
                if k in kernels:
                    at = [r[0] for r in runs].index(k) + 1
                    runs[at:at] = [(f"{k}_fused", k, pdl_default, flagged[True]),
                                   (f"{k}_separate", k, pdl_default, flagged[False])]  # fmt: skip
        for column, kernel, pdl, tiles in runs:
            if kernel.endswith("_w4a8") and t < FP8_MIN_TOKENS:
                continue  # offered from FP8_MIN_TOKENS tokens (_register)
            weights = converted.get(kernel, w)
            decode.PDL_ENABLED = pdl
            layer.DECODE_TILES = tiles
            try:
                tm = time_fn(_layer_fn(kernel, x, logits, weights, GPT_OSS, out), device="cuda", graph=True,
                             warmup_ms=10, rep_ms=60)  # fmt: skip
                row[column] = tm.median_us
            except Exception as exc:
                row[column] = None
                row[f"{column}_error"] = str(exc)[:300]
            finally:
                decode.PDL_ENABLED = pdl_default
                layer.DECODE_TILES = table
        if grouped is not None:
            try:
                row["grouped_mm_bf16"] = time_fn(_grouped_mm_fn(x, ids, *grouped), device="cuda", graph=True,
                                                 warmup_ms=10, rep_ms=60).median_us  # fmt: skip
            except Exception as exc:
                row["grouped_mm_bf16"] = None
                row["grouped_mm_bf16_error"] = str(exc)[:300]
        us = row.get("hopper.moe_apply")
        if us:
            row["hopper_tbs"] = touched * _expert_bytes(H, I) / (us * 1e-6) / 1e12
        log(f"  bench {row}")
        rows.append(row)
    return rows


def main(argv=None) -> int:
    global GPT_OSS
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256,512,1024,4096")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--sweep-tokens", default="1,4,16,64")
    p.add_argument(
        "--sweep-tiles",
        help="decode tiles, ';'-separated 'block_m,tokens,warps,stages,ksplit[,fused]' for both GEMMs or 'gate_up/down'",
    )
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--skip-numerics", action="store_true")
    p.add_argument("--skip-breakdown", action="store_true")
    p.add_argument("--prefill", action="store_true", help="the prefill path's numerics and tile sweep")
    p.add_argument("--prefill-tokens", default="512,4096,16384")
    p.add_argument("--prefill-only-numerics", action="store_true", help="stop after the prefill numerics")
    p.add_argument("--skip-prefill-numerics", action="store_true", help="with --prefill: the sweep only")
    p.add_argument(
        "--prefill-tiles",
        help="the sweep's tiles, ';'-separated: 'block_m,block_t,warps,stages[,unroll[,chunks]]' "
        "for both GEMMs or 'gate_up/down' (default: PREFILL_SWEEP)",
    )
    p.add_argument(
        "--prefill-layouts",
        default="canonical",
        help="the sweep's weight layouts, ','-separated: canonical, packed (the table follows the first)",
    )
    p.add_argument("--prefill-breakdown", metavar="TOKENS", help="each prefill launch alone at these token counts")
    p.add_argument("--sort-bench", metavar="PAIRS", help="the prefill path's sort alone at these pair counts")
    p.add_argument("--grouped-mm", action="store_true", help="add the bf16 torch._grouped_mm column (GEMMs only)")
    p.add_argument(
        "--pdl-ab", action="store_true", help="also time hopper.moe_apply with programmatic dependent launch off"
    )
    p.add_argument(
        "--fused-ab", action="store_true", help="also time the decode path with every tile fused and none fused"
    )
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    import tokenspeed_kernel as tk

    tk.load_plugins()
    GPT_OSS = tk.MoEActivation()

    def log(msg):
        print(msg, flush=True)

    def save():  # after every stage: a fault later keeps what was measured
        with open(os.path.join(args.out, "hopper_moe.json"), "w") as f:
            json.dump(result, f, indent=1)

    t0 = time.time()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import triton

    result["triton"] = triton.__version__
    if not args.skip_numerics:
        result["numerics"] = numerics(log)
    gen = torch.Generator().manual_seed(1234)
    if args.prefill_tiles:
        global PREFILL_SWEEP
        PREFILL_SWEEP = [_parse_tiles(t) for t in args.prefill_tiles.split(";")]
    if args.prefill and not args.skip_prefill_numerics:
        try:
            result["prefill_stages"] = prefill_stages(log)
        except Exception as exc:
            result["prefill_stages"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        save()
        result["prefill_numerics"] = prefill_numerics(log)
        save()
        if args.prefill_only_numerics:
            return 0
    w = _weights(E, H, I, gen)
    if args.prefill:
        result["prefill_sweep"] = prefill_sweep(w, gen, [int(v) for v in args.prefill_tokens.split(",")], log,
                                                t0 + args.budget_s, tuple(args.prefill_layouts.split(",")))  # fmt: skip
        result["prefill_tiles_used"] = _apply_best_prefill(result["prefill_sweep"], log)
        save()
    if args.prefill_breakdown:
        result["prefill_breakdown"] = prefill_breakdown(w, gen, [int(v) for v in args.prefill_breakdown.split(",")],
                                                        log)  # fmt: skip
        save()
    if args.sort_bench:
        result["sort"] = sort_bench([int(v) for v in args.sort_bench.split(",")], log)
        save()
    if args.sweep:
        tiles_list = [_parse_tiles(c) for c in args.sweep_tiles.split(";")] if args.sweep_tiles else None
        result["sweep"] = sweep(w, gen, [int(v) for v in args.sweep_tokens.split(",")], log,
                                t0 + args.budget_s * 0.5, tiles_list)  # fmt: skip
        result["tiles_used"] = _apply_best(result["sweep"], log)
    if not args.skip_breakdown:
        result["breakdown"] = breakdown(w, gen, [1, 8, 64], log)
    converted = {}  # the kernels of another layout, on their weights (converted once, as an engine does)
    for s in tk.registry.for_op("moe_apply"):
        if s.name in ("triton_kernels.moe_apply", "hopper.moe_apply_packed"):
            plan = tk.moe_plan(w, GPT_OSS, dtype=torch.bfloat16, override=s.name)
            converted[s.name] = tk.moe_process_weights(plan, w)
    grouped = _bf16_experts(w) if args.grouped_mm else None
    result["bench"] = bench(
        w, converted, gen, [int(v) for v in args.tokens.split(",")], log, grouped, args.pdl_ab, args.fused_ab
    )
    result["wall_s"] = time.time() - t0
    with open(os.path.join(args.out, "hopper_moe.json"), "w") as f:
        json.dump(result, f, indent=1)
    bad = [r for r in result.get("numerics", []) + result.get("prefill_numerics", []) if not r.get("ok")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

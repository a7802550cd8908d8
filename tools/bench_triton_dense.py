#!/usr/bin/env python3
"""Benchmark the portable Triton dense kernels at GPT-OSS shapes, next to their PyTorch anchors.

    python tools/bench_triton_dense.py --out OUT [--quick] [--sweep] [--budget-min 8]

Rows (docs: shared/design/PERFORMANCE.md, GPT_OSS.md; hidden 2880, 64 q / 8 kv heads
of 64, vocab 201088):

- ``rmsnorm`` (+ residual), 4096 and 16384 tokens x 2880, bf16: TB/s of the bytes
  that must move (x and y; plus residual and the sum with a residual); target
  >= 3.6 TB/s; anchor: the same math in eager PyTorch.
- ``mm`` bf16 with bias: QKV 2880 -> 5120 (64*64 + 2*8*64) and O 4096 -> 2880, M in
  1, 64, 4096; anchor ``torch.mm`` (+ bias; cuBLAS); target >= 0.97x of the anchor
  for the best kernel selection picks (the portable path is reported, not judged).
- ``mm`` fp8 e4m3, per-token ``a`` / per-channel ``b`` scales, bf16 out, same shapes;
  anchor ``torch._scaled_mm`` with row-wise scales.
- ``mm`` MXFP4 weights (bf16 ``a``), QKV and O shapes at M = 1 and 64: weight TB/s
  (codes + scales streamed once); anchor ``torch.mm`` on the same weights
  dequantised to bf16 (what running without MXFP4 support costs).
- ``argmax`` and ``top_k_top_p_sample`` at 64 x 201088 bf16: top-k 50 + top-p 0.9, top-p
  0.9 alone, temperature alone, and top-k 50 at batch 1 (no anchor: reported).
- ``rmsnorm`` rows also time device copies of the same bytes (``y.copy_(x)``; with a
  residual, two copies), the ceiling under this timing.

Timing: the benchmark harness (``tokenspeed_kernel.benchmark.timer.time_fn``); the kernel
functions are called directly (no selection/dispatch). "us" is its per-call CUDA-event
median, L2 flushed before each call (the method of ``triton.testing.do_bench``, with
its 10 ms / 50 ms budgets): events around a Python call, so when the call's CPU work
(wrappers, one Triton launch ~10-20 us each, allocations) outlasts the L2-flush memset
queued before it (a 2 x L2 buffer, some tens of us), the GPU waits and the row shows
CPU time. Every row therefore also has "graph us" (``time_fn(graph=True,
graph_calls=10)``): ten calls captured in a CUDA graph, each after an in-graph L2 flush,
minus the same graph without the calls (GPU time only, cold L2; what a CUDA-graph
decode step pays). Every row also checks the result against the anchor (max relative
difference) so a fast wrong kernel shows. ``--sweep`` times a grid of tile configs
(graph timing) for bf16/MXFP4 ``mm`` (decode rows with split-K and, for MXFP4, the
GEMV) and ``rmsnorm`` (rows x warps x one or two tiles) and prints the best per shape,
ready to paste into ``tokenspeed_kernel_triton/mm.py`` (``MMConfig``) and
``tokenspeed_kernel_triton/rmsnorm.py`` (``RowConfig``).

Writes ``OUT/triton_dense.json`` and ``OUT/triton_dense.md`` (``OUT/triton_dense_sweep.json``
with ``--sweep``) and prints the compact table.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from tokenspeed_kernel.benchmark.timer import time_fn

HIDDEN = 2880
QKV_N = 64 * 64 + 2 * 8 * 64  # 5120
O_K = 64 * 64  # 4096
VOCAB = 201088
MM_SHAPES = {"qkv": (QKV_N, HIDDEN), "o": (HIDDEN, O_K)}  # name -> (N, K)
MM_TOKENS = (1, 64, 4096)
MXFP4_TOKENS = (1, 64)
NORM_TOKENS = (4096, 16384)
TARGET_RMSNORM_TBS = 3.6
TARGET_MM_RATIO = {"bf16": 0.97, "fp8": 0.95}


def _log(msg: str) -> None:
    print(msg, flush=True)


#: Budgets of the per-call timing (the ``triton.testing.do_bench`` budgets these rows were first measured with).
TIMING = {"device": "cuda", "warmup_ms": 10.0, "rep_ms": 50.0}
#: The in-graph timing: ten calls a replay, about 15 replays for the largest rows.
GRAPH_TIMING = {"device": "cuda", "graph": True, "graph_calls": 10, "warmup_ms": 5.0, "rep_ms": 20.0, "min_repeats": 15}


def _times(fn: Callable[[], Any]) -> tuple[float, float | None]:
    """(per-call us, in-graph us or None when ``fn`` cannot be captured), both from
    :func:`tokenspeed_kernel.benchmark.timer.time_fn`."""
    us = time_fn(fn, **TIMING).median_us
    try:
        graph_us = time_fn(fn, **GRAPH_TIMING).median_us
    except Exception:  # not capturable (host syncs)
        graph_us = None
    return us, graph_us


def _rel_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30))


def _row(
    op: str,
    shape: str,
    variant: str,
    us: float | tuple[float, float | None],
    anchor: str | None,
    anchor_us: float | tuple[float, float | None] | None,
    **extra,
) -> dict:
    """A result row; ``us`` / ``anchor_us`` are per-call us or (per-call us, graph us), as :func:`_times` gives."""
    us, graph_us = us if isinstance(us, tuple) else (us, None)
    r = {"op": op, "shape": shape, "variant": variant, "us": us, **extra}
    if graph_us is not None:
        r["graph_us"] = graph_us
    if anchor is not None and anchor_us is not None:
        anchor_us, anchor_graph_us = anchor_us if isinstance(anchor_us, tuple) else (anchor_us, None)
        r |= {"anchor": anchor, "anchor_us": anchor_us, "speedup_vs_anchor": anchor_us / us}
        if anchor_graph_us is not None and graph_us:
            r |= {"anchor_graph_us": anchor_graph_us, "graph_speedup_vs_anchor": anchor_graph_us / graph_us}
    return r


# --------------------------------------------------------------------------- rows


def bench_rmsnorm(gen: torch.Generator) -> list[dict]:
    from tokenspeed_kernel_triton.rmsnorm import rmsnorm

    rows = []
    for tokens, residual in itertools.product(NORM_TOKENS, (False, True)):
        x = torch.randn(tokens, HIDDEN, generator=gen).to("cuda", torch.bfloat16)
        r = torch.randn(tokens, HIDDEN, generator=gen).to("cuda", torch.bfloat16) if residual else None
        w = torch.randn(HIDDEN, generator=gen).to("cuda", torch.bfloat16)

        def ours(x=x, w=w, r=r):
            return rmsnorm(x, w, 1e-5, residual=r)

        def anchor(x=x, w=w, r=r):
            s = x + r if r is not None else x
            sf = s.float()
            y = (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()).to(s.dtype)
            return (y, s) if r is not None else y

        got, want = ours(), anchor()
        diff = _rel_diff(got[0], want[0]) if residual else _rel_diff(got, want)
        out, out2 = torch.empty_like(x), torch.empty_like(x)

        def copy(x=x, r=r, out=out, out2=out2):
            # the same bytes: read x (and r), write y (and s)
            out.copy_(x)
            if r is not None:
                out2.copy_(r)

        (us, graph_us), (copy_us, copy_graph_us) = _times(ours), _times(copy)
        anchor_us = time_fn(anchor, **TIMING).median_us
        moved = (4 if residual else 2) * tokens * HIDDEN * 2
        extra = {"graph_tbs": moved / graph_us / 1e6} if graph_us else {}
        if copy_graph_us:
            extra["copy_graph_tbs"] = moved / copy_graph_us / 1e6
        rows.append(
            _row(
                "rmsnorm", f"{tokens}x{HIDDEN}", "+residual" if residual else "plain", (us, graph_us), "torch eager",
                anchor_us, tbs=moved / us / 1e6, copy_tbs=moved / copy_us / 1e6, max_rel_diff=diff, **extra,
            )
        )  # fmt: skip
    return rows


def bench_mm_bf16(gen: torch.Generator, tokens: tuple[int, ...]) -> list[dict]:
    from tokenspeed_kernel_triton.mm import mm

    rows = []
    for (name, (n, k)), m in itertools.product(MM_SHAPES.items(), tokens):
        a = torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16)
        b = (torch.randn(n, k, generator=gen) / k**0.5).to("cuda", torch.bfloat16)
        bias = torch.randn(n, generator=gen).to("cuda", torch.bfloat16)

        def ours(a=a, b=b, bias=bias):
            return mm(a, b, bias, a_scale=None, b_scale=None, out_dtype=torch.bfloat16, out=None)

        def anchor(a=a, b=b, bias=bias):
            return torch.addmm(bias, a, b.T)

        diff = _rel_diff(ours(), anchor())
        us, anchor_us = _times(ours), _times(anchor)
        rows.append(
            _row(
                "mm", f"{name} M={m} N={n} K={k}", "bf16+bias", us, "torch.addmm (cuBLAS)", anchor_us,
                tflops=2 * m * n * k / us[0] / 1e6, max_rel_diff=diff,
            )
        )  # fmt: skip
    return rows


def bench_mm_fp8(gen: torch.Generator, tokens: tuple[int, ...]) -> list[dict]:
    from tokenspeed_kernel_triton.mm import mm
    from tokenspeed_kernel_triton.quantization import quantize_fp8

    rows = []
    for (name, (n, k)), m in itertools.product(MM_SHAPES.items(), tokens):
        a = torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16)
        b = (torch.randn(n, k, generator=gen) / k**0.5).to("cuda", torch.bfloat16)
        qa, sa = quantize_fp8(a, granularity="per_token", scale=None)  # [M, 1]
        qb, sb = quantize_fp8(b, granularity="per_token", scale=None)  # [N, 1]: per channel

        def ours(qa=qa, qb=qb, sa=sa, sb=sb):
            return mm(qa, qb, None, a_scale=sa, b_scale=sb, out_dtype=torch.bfloat16, out=None)

        def anchor(qa=qa, qb=qb, sa=sa, sb=sb):
            # row-wise scaling: scale_a [M, 1], scale_b [1, N]; b column-major
            return torch._scaled_mm(qa, qb.T, scale_a=sa, scale_b=sb.T, out_dtype=torch.bfloat16)

        try:
            want = anchor()
            anchor_us = _times(anchor)
            anchor_name = "torch._scaled_mm rowwise"
        except Exception as exc:  # the anchor's own limits (e.g. M not a multiple of 16 on some builds)
            want = (qa.float() * sa) @ (qb.float() * sb).T
            anchor_us, anchor_name = None, f"unavailable ({type(exc).__name__})"
        diff = _rel_diff(ours(), want)
        us = _times(ours)
        rows.append(
            _row(
                "mm", f"{name} M={m} N={n} K={k}", "fp8 token/channel", us, anchor_name, anchor_us,
                tflops=2 * m * n * k / us[0] / 1e6, max_rel_diff=diff,
            )
        )  # fmt: skip
    return rows


def bench_mm_mxfp4(gen: torch.Generator, tokens: tuple[int, ...]) -> list[dict]:
    from tokenspeed_kernel_triton.mm import mm
    from tokenspeed_kernel_triton.quantization import dequantize_mxfp4, quantize_mxfp4

    rows = []
    for (name, (n, k)), m in itertools.product(MM_SHAPES.items(), tokens):
        w = (torch.randn(n, k, generator=gen) / k**0.5).to("cuda", torch.bfloat16)
        blocks, scales = quantize_mxfp4(w)
        w_deq = dequantize_mxfp4(blocks, scales, dtype=torch.bfloat16)
        a = torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16)

        def ours(a=a, blocks=blocks, scales=scales):
            return mm(a, blocks, None, a_scale=None, b_scale=scales, out_dtype=torch.bfloat16, out=None)

        def anchor(a=a, w_deq=w_deq):
            return torch.mm(a, w_deq.T)

        diff = _rel_diff(ours(), anchor())
        us, anchor_us = _times(ours), _times(anchor)
        weight_bytes = n * k // 2 + n * k // 32
        best = us[1] or us[0]
        rows.append(
            _row(
                "mm", f"{name} M={m} N={n} K={k}", "mxfp4 weights", us, "torch.mm bf16 dequantised", anchor_us,
                weight_tbs=weight_bytes / best / 1e6, tflops=2 * m * n * k / best / 1e6, max_rel_diff=diff,
            )
        )  # fmt: skip
    return rows


def bench_sampling(gen: torch.Generator) -> list[dict]:
    from tokenspeed_kernel_triton.sampling import argmax, top_k_top_p_sample

    batch = 64
    logits = (torch.randn(batch, VOCAB, generator=gen) * 3).to("cuda", torch.bfloat16)
    uniform = torch.rand(batch, generator=gen).to("cuda")
    temperature = torch.full((batch,), 0.8, device="cuda")
    got = argmax(logits)
    ok = bool(torch.equal(got, logits.float().argmax(-1)))
    rows = [
        _row("argmax", f"{batch}x{VOCAB}", "bf16", _times(lambda: argmax(logits)), "torch.argmax",
             _times(lambda: logits.argmax(-1)), matches_anchor=ok)
    ]  # fmt: skip
    for variant, k, p, b in (
        ("k=50 p=0.9 t=0.8", 50, 0.9, batch),
        ("p=0.9 t=0.8", 0, 0.9, batch),
        ("t=0.8 only", 0, 1.0, batch),
        ("k=50 p=0.9 t=0.8", 50, 0.9, 1),
    ):
        top_k = torch.full((b,), k, dtype=torch.int32, device="cuda")
        top_p = torch.full((b,), p, device="cuda")
        args = (logits[:b], top_k, top_p, temperature[:b], uniform[:b])
        from tokenspeed_kernel.reference import sampling as ref

        same = int((top_k_top_p_sample(*args) == ref.top_k_top_p_sample(*args)).sum())
        rows.append(
            _row("top_k_top_p_sample", f"{b}x{VOCAB}", variant, _times(lambda args=args: top_k_top_p_sample(*args)),
                 None, None, matches_reference=f"{same}/{b}")
        )  # fmt: skip
    return rows


# --------------------------------------------------------------------------- sweep


def _mm_grid(m: int, quick: bool, kind: str) -> list[Any]:
    from tokenspeed_kernel_triton.mm import MMConfig

    if m <= 64:
        # decode: narrow N tiles put more programs on the SMs (N = 2880 / 32 is only 90);
        # split-K multiplies them again (fixed slice counts here: split_target = 0)
        shapes = [(16, 16), (16, 32), (16, 64), (32, 64)] if m <= 16 else [(64, 64), (64, 128), (32, 64), (64, 32)]
        ks, stages, warps, splits = (128, 256), (3, 4), (4,), (1, 2, 4)
    else:
        shapes = [(128, 128), (128, 256), (256, 128), (64, 256)]
        ks, stages, warps, splits = (64,), (3, 4), (4, 8), (1,)
    grid = [
        MMConfig(bm, bn, bk, num_warps=w, num_stages=s, split_k=sk)
        for (bm, bn), bk, s, w, sk in itertools.product(shapes, ks, stages, warps, splits)
    ]
    if kind == "mxfp4" and m <= 4:
        # the MMA-free GEMV: rows of weights per program x K per step x K slices x warps
        grid += [
            MMConfig(4, bn, bk, num_warps=w, num_stages=1, gemv=True, split_k=sk)
            for bn, bk, sk, w in itertools.product((16, 32, 64), (256, 512), (1, 2, 4, 8), (2, 4))
        ]
    return grid[:: 3 if quick else 1]


def _sweep_time(fn: Callable[[], Any]) -> dict[str, float]:
    """Graph time (GPU only, cold L2) when capturable, else the per-call time; plus the per-call
    time (``do_bench_us``, the name kept from when ``triton.testing.do_bench`` took it)."""
    us, graph_us = _times(fn)
    return {"us": graph_us if graph_us is not None else us, "do_bench_us": us}


def sweep(gen: torch.Generator, quick: bool, deadline: float) -> dict[str, Any]:
    from tokenspeed_kernel_triton.mm import mm, mm_with_config
    from tokenspeed_kernel_triton.quantization import quantize_mxfp4
    from tokenspeed_kernel_triton.rmsnorm import RowConfig, rmsnorm_with_config

    results: list[dict[str, Any]] = []
    for kind, (name, (n, k)), m in itertools.product(("16bit", "mxfp4"), MM_SHAPES.items(), MM_TOKENS):
        if kind == "mxfp4" and m > 64:
            continue
        a = torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16)
        w = (torch.randn(n, k, generator=gen) / k**0.5).to("cuda", torch.bfloat16)
        if kind == "mxfp4":
            b, b_scale = quantize_mxfp4(w)
        else:
            b, b_scale = w, None
        want = mm(a, b, None, a_scale=None, b_scale=b_scale, out_dtype=torch.bfloat16, out=None)
        for cfg in _mm_grid(m, quick, kind):
            if time.monotonic() > deadline:
                _log("sweep: time budget spent, stopping")
                return {"results": results, "best": _best(results)}
            if kind == "mxfp4" and cfg.block_k % 32:
                continue

            def fn(cfg=cfg, a=a, b=b, b_scale=b_scale):
                return mm_with_config(
                    a, b, None, a_scale=None, b_scale=b_scale, out_dtype=torch.bfloat16, out=None, config=cfg
                )

            try:
                diff = _rel_diff(fn(), want)
                results.append(
                    {
                        "kernel": f"mm {kind}",
                        "shape": f"{name} M={m}",
                        **_sweep_time(fn),
                        "config": dataclasses.asdict(cfg),
                        "max_rel_diff": diff,
                    }
                )
            except Exception as exc:  # out of shared memory and the like
                results.append(
                    {
                        "kernel": f"mm {kind}",
                        "shape": f"{name} M={m}",
                        "config": dataclasses.asdict(cfg),
                        "error": str(exc)[:200],
                    }
                )
    for tokens, residual in itertools.product(NORM_TOKENS, (False, True)):
        x = torch.randn(tokens, HIDDEN, generator=gen).to("cuda", torch.bfloat16)
        r = torch.randn_like(x) if residual else None
        wt = torch.randn(HIDDEN, generator=gen).to("cuda", torch.bfloat16)
        for warps, rows_, two in itertools.product((2, 4, 8, 16), (1, 2, 4), (False, True)):
            cfg = RowConfig(block=4096, num_warps=warps, rows=rows_, two_tiles=two)

            def fn(cfg=cfg, x=x, r=r, wt=wt):
                return rmsnorm_with_config(x, wt, 1e-5, residual=r, out=None, config=cfg)

            timing = _sweep_time(fn)
            moved = (4 if residual else 2) * tokens * HIDDEN * 2
            results.append(
                {
                    "kernel": "rmsnorm",
                    "shape": f"{tokens}{' +res' if residual else ''}",
                    **timing,
                    "tbs": moved / timing["us"] / 1e6,
                    "do_bench_tbs": moved / timing["do_bench_us"] / 1e6,
                    "config": dataclasses.asdict(cfg),
                }
            )
    return {"results": results, "best": _best(results)}


def _best(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results:
        if "us" in r and r.get("max_rel_diff", 0.0) < 2e-2:
            key = (r["kernel"], r["shape"])
            if key not in best or r["us"] < best[key]["us"]:
                best[key] = r
    return list(best.values())  # fmt: skip


# --------------------------------------------------------------------------- report


_COLUMNS = (
    ("op", "op", "s", 18), ("shape", "shape", "s", 26), ("variant", "variant", "s", 18), ("us", "us", ".1f", 9),
    ("graph_us", "graph us", ".1f", 9), ("anchor_us", "anchor us", ".1f", 10),
    ("anchor_graph_us", "anch grph", ".1f", 9), ("speedup_vs_anchor", "vs anchor", ".2f", 9),
    ("graph_speedup_vs_anchor", "vs (grph)", ".2f", 9), ("tbs", "TB/s", ".2f", 6), ("graph_tbs", "grph TB/s", ".2f", 9),
    ("copy_tbs", "copy TB/s", ".2f", 9), ("copy_graph_tbs", "copy grph", ".2f", 9), ("weight_tbs", "w TB/s", ".2f", 7),
    ("tflops", "TFLOP/s", ".1f", 8), ("max_rel_diff", "rel diff", ".1e", 8),
)  # fmt: skip


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [" ".join(title.rjust(w) if fmt != "s" else title.ljust(w) for _, title, fmt, w in _COLUMNS)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['op']:<18} {r.get('shape', ''):<26} error: {r['error'][:120]}")
            continue
        cells = []
        for key, _, fmt, w in _COLUMNS:
            v = r.get(key)
            cells.append(
                "-".rjust(w) if v is None else (format(v, fmt).ljust(w) if fmt == "s" else format(v, fmt).rjust(w))
            )
        lines.append(" ".join(cells))
    return "\n".join(lines)


def _targets(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in rows:
        if r.get("op") == "rmsnorm" and "tbs" in r:
            ok = r["tbs"] >= TARGET_RMSNORM_TBS
            graph = f"; graph {r['graph_tbs']:.2f}" if "graph_tbs" in r else ""
            copy = f"; a copy of the same bytes: {r['copy_tbs']:.2f}" if "copy_tbs" in r else ""
            copy += f" (graph {r['copy_graph_tbs']:.2f})" if "copy_graph_tbs" in r else ""
            lines.append(
                f"rmsnorm {r['shape']} {r['variant']}: {r['tbs']:.2f} TB/s{graph} (target >= {TARGET_RMSNORM_TBS}) "
                f"{'ok' if ok else 'MISS'}{copy}"
            )
        if r.get("op") == "mm" and "speedup_vs_anchor" in r and r["variant"] != "mxfp4 weights":
            kind = "fp8" if r["variant"].startswith("fp8") else "bf16"
            ratio = r["speedup_vs_anchor"]
            graph = f", graph {r['graph_speedup_vs_anchor']:.2f}x" if "graph_speedup_vs_anchor" in r else ""
            lines.append(
                f"mm {kind} {r['shape']}: {ratio:.2f}x anchor{graph} (selected-kernel target >= {TARGET_MM_RATIO[kind]}x)"
            )
    return lines  # fmt: skip


def _environment() -> dict[str, Any]:
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": props.name,
        "sms": props.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "command": " ".join(sys.argv),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out", help="output directory")
    parser.add_argument("--quick", action="store_true", help="M = 1 and 4096 only; a third of the sweep grid")
    parser.add_argument("--sweep", action="store_true", help="also sweep tile configs of mm and rmsnorm")
    parser.add_argument("--sweep-only", action="store_true", help="only the config sweep")
    parser.add_argument("--budget-min", type=float, default=8.0, help="stop sweeping after this many minutes")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA/ROCm device", file=sys.stderr)
        return 2
    start = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    env = _environment()
    _log(f"{env['device']} torch {env['torch']} triton {env['triton']}")
    tokens = (1, 4096) if args.quick else MM_TOKENS
    report: dict[str, Any] = {"environment": env, "rows": []}
    if not args.sweep_only:
        for name, fn in (
            ("rmsnorm", lambda: bench_rmsnorm(gen)),
            ("mm bf16", lambda: bench_mm_bf16(gen, tokens)),
            ("mm fp8", lambda: bench_mm_fp8(gen, tokens)),
            ("mm mxfp4", lambda: bench_mm_mxfp4(gen, MXFP4_TOKENS)),
            ("sampling", lambda: bench_sampling(gen)),
        ):
            try:
                report["rows"] += fn()
            except Exception as exc:  # keep the other sections' numbers
                traceback.print_exc()
                report["rows"].append({"op": name, "error": f"{type(exc).__name__}: {exc}"})
            torch.cuda.empty_cache()
        table = _table(report["rows"])
        report["targets"] = _targets(report["rows"])
        _log(table)
        for line in report["targets"]:
            _log(line)
        with open(os.path.join(args.out, "triton_dense.json"), "w") as f:
            json.dump(report, f, indent=1)
        with open(os.path.join(args.out, "triton_dense.md"), "w") as f:
            f.write(f"# Triton dense kernels, {env['device']}, {env['date']}\n\n`{env['command']}`\n\n")
            f.write("```\n" + table + "\n```\n\n" + "\n".join(f"- {t}" for t in report["targets"]) + "\n")
    if args.sweep or args.sweep_only:
        result = sweep(gen, args.quick, start + args.budget_min * 60)
        _log("best per (kernel, shape):")
        for b in result["best"]:
            extra = f" {b['tbs']:.2f} TB/s" if "tbs" in b else ""
            _log(f"  {b['kernel']:<10} {b['shape']:<16} {b['us']:8.1f} us{extra}  {b['config']}")
        with open(os.path.join(args.out, "triton_dense_sweep.json"), "w") as f:
            json.dump({"environment": env, **result}, f, indent=1)
    _log(f"done in {time.monotonic() - start:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

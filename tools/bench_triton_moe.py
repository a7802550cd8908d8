#!/usr/bin/env python3
"""Benchmark the portable Triton MoE layer at GPT-OSS-120B shapes, next to bf16 ``torch._grouped_mm``.

    python tools/bench_triton_moe.py --out OUT [--tokens 1,8,64,512,4096,16384] [--sweep] [--quick]

Layer (docs: shared/design/PERFORMANCE.md, GPT_OSS.md): 128 experts, top-4, hidden =
intermediate = 2880, MXFP4 expert weights with bf16 biases, interleaved gate/up,
SwiGLU alpha 1.702, clamp 7, +1 on up. Ours = the full layer: ``moe_route`` (fused
softmax top-k) + ``moe_apply`` (both GEMMs, SwiGLU, combine), timed from a CUDA graph
(what a decode engine runs; eager times, which add Python launch cost, are reported
too). Anchor = the same layer in PyTorch with bf16 weights (the MXFP4 weights
dequantised exactly): softmax top-k, sort by expert, two ``torch._grouped_mm`` calls,
SwiGLU, weighted combine; ``anchor_gemm_us`` is the two grouped GEMMs alone (what
PERFORMANCE.md's anchor table lists). Routing is random (balanced on average); the
same routing feeds both.

Timing: the benchmark harness (``tokenspeed_kernel.benchmark.timer.time_fn``): CUDA-event
median with the L2 flushed before each call or graph replay (the method of
``triton.testing.do_bench``, with its 10 ms / 60 ms budgets); "ours" is ``graph=True``
(one graph replay per sample), "eager" and the anchors are plain calls.
Metrics: weight TB/s = MXFP4 bytes of the experts the tokens touch (codes + scales +
biases) / time; TFLOP/s = 2 * T * k * 3 * H * I / time. Targets (portable path):
1 token <= 40 us (full layer); <= 64 tokens weight streaming >= 3.2 TB/s (the
selected-kernel target, shown for reference).

``--sweep``: times each GEMM alone for a small grid of tile configs (tiny path: MMA
with swapped operands or GEMV, MXFP4 decoders; grouped path: tile sizes) at the
``--sweep-tokens`` counts, and prints the best per (GEMM, tokens), ready to paste
into ``tokenspeed_kernel_triton/moe/configs.py``. ``--quick`` trims both grids.

Writes ``OUT/triton_moe.json`` (``OUT/triton_moe_sweep.json`` with --sweep) and prints
a compact table.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
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

E, TOP_K, H, I = 128, 4, 2880, 2880
DEVICE = "cuda"
TOKENS = [1, 8, 64, 512, 4096, 16384]
SWEEP_TOKENS = [1, 8, 512, 16384]
TARGET_1_TOKEN_US = 40.0
TARGET_STREAM_TBS = 3.2
#: Budgets of every timing here (the ``triton.testing.do_bench`` budgets these numbers were first measured with).
TIMING = {"device": DEVICE, "warmup_ms": 10.0, "rep_ms": 60.0}


def _log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- inputs


def _weights(gen: torch.Generator) -> Any:
    """Random GPT-OSS-shaped MXFP4 experts: every code, scales 2**-9 .. 2**-5, bf16 biases."""
    from tokenspeed_kernel.ops.moe import MoEWeights

    def randint(lo: int, hi: int, *shape: int) -> torch.Tensor:
        return torch.randint(lo, hi, shape, generator=gen, dtype=torch.uint8).to(DEVICE)

    w = MoEWeights(
        w13=randint(0, 256, E, 2 * I, H // 2),
        w2=randint(0, 256, E, H, I // 2),
        w13_scale=randint(118, 123, E, 2 * I, H // 32),
        w2_scale=randint(118, 123, E, H, I // 32),
        w13_bias=(torch.randn(E, 2 * I, generator=gen) * 0.1).to(torch.bfloat16).to(DEVICE),
        w2_bias=(torch.randn(E, H, generator=gen) * 0.1).to(torch.bfloat16).to(DEVICE),
        format="mxfp4",
        gate_up_interleaved=True,
    )
    w.validate()
    return w


def _bf16_weights(w: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The MXFP4 experts dequantised exactly to bf16 (products of E2M1 values and powers of two)."""
    from tokenspeed_kernel.reference.quantization import mxfp4_to_float

    w13 = torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device=DEVICE)
    w2 = torch.empty(E, H, I, dtype=torch.bfloat16, device=DEVICE)
    for e in range(E):
        w13[e] = mxfp4_to_float(w.w13[e], w.w13_scale[e]).to(torch.bfloat16)
        w2[e] = mxfp4_to_float(w.w2[e], w.w2_scale[e]).to(torch.bfloat16)
    return w13, w2


def _expert_bytes() -> float:
    """MXFP4 bytes of one expert: codes (half a byte a value), E8M0 scales, bf16 biases."""
    values = 2 * I * H + H * I
    return values / 2 + values / 32 + (2 * I + H) * 2


# --------------------------------------------------------------------------- layers


def _ours(logits: torch.Tensor, x: torch.Tensor, w: Any, act: Any, out: torch.Tensor) -> Callable[[], Any]:
    from tokenspeed_kernel_triton.moe import experts, route

    def layer() -> Any:
        tw, ids = route.moe_route(logits, TOP_K)
        return experts.moe_apply(x, tw, ids, w, act, out=out)

    return layer


def _anchor(
    logits: torch.Tensor, x: torch.Tensor, w: Any, w13: torch.Tensor, w2: torch.Tensor, act: Any
) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(full bf16 layer in PyTorch, its two grouped GEMMs alone on pre-sorted rows)."""
    t = x.shape[0]
    w13_t, w2_t = w13.transpose(1, 2), w2.transpose(1, 2)  # [E, K, N] views, column-major

    def layer() -> torch.Tensor:
        top, ids = torch.topk(logits, TOP_K, dim=-1)
        weights = torch.softmax(top, dim=-1)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(E, dtype=torch.int32, device=DEVICE).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32)
        )
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        expert = flat[order]
        h = torch._grouped_mm(x[order // TOP_K], w13_t, offs=offs) + w.w13_bias[expert]
        gate, up = h[:, 0::2].float(), h[:, 1::2].float()
        gate = gate.clamp(max=act.limit)
        up = up.clamp(-act.limit, act.limit)
        y = ((up + act.up_offset) * gate * torch.sigmoid(act.alpha * gate)).to(torch.bfloat16)
        o = torch._grouped_mm(y, w2_t, offs=offs) + w.w2_bias[expert]
        o = o.float() * weights.reshape(-1)[order, None]
        return torch.zeros(t, H, dtype=torch.float32, device=DEVICE).index_add_(0, order // TOP_K, o).to(x.dtype)

    _, ids = torch.topk(logits, TOP_K, dim=-1)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
    rows = x[order // TOP_K].contiguous()
    inter = torch.randn(rows.shape[0], I, device=DEVICE).to(torch.bfloat16)

    def gemms() -> torch.Tensor:
        torch._grouped_mm(rows, w13_t, offs=offs)
        return torch._grouped_mm(inter, w2_t, offs=offs)

    return layer, gemms


def bench_layer(
    tokens: list[int], w: Any, bf16: tuple[torch.Tensor, torch.Tensor] | None, gen: torch.Generator
) -> list[dict]:
    from tokenspeed_kernel.ops.moe import MoEActivation

    act = MoEActivation()
    rows = []
    for t in tokens:
        row: dict[str, Any] = {"tokens": t}
        try:
            logits = torch.randn(t, E, generator=gen).to(DEVICE)
            x = torch.randn(t, H, generator=gen).to(torch.bfloat16).to(DEVICE)
            out = torch.empty_like(x)
            ours = _ours(logits, x, w, act, out)
            experts_hit = int(torch.topk(logits, TOP_K, dim=-1).indices.unique().numel())
            flops = 2.0 * t * TOP_K * 3 * H * I
            nbytes = experts_hit * _expert_bytes()
            row.update(experts_hit=experts_hit, flops=flops, weight_bytes=nbytes)
            row["ours_us"] = time_fn(ours, graph=True, **TIMING).median_us
            row["ours_eager_us"] = time_fn(ours, **TIMING).median_us
            row["ours_tbs"] = nbytes / row["ours_us"] / 1e6
            row["ours_tflops"] = flops / row["ours_us"] / 1e6
            if bf16 is not None:
                layer, gemms = _anchor(logits, x, w, *bf16, act)
                row["anchor_us"] = time_fn(layer, **TIMING).median_us
                row["anchor_gemm_us"] = time_fn(gemms, **TIMING).median_us
                row["anchor_tflops"] = flops / row["anchor_us"] / 1e6
                row["speedup_vs_anchor"] = row["anchor_us"] / row["ours_us"]
                ref = layer().float()
                row["max_rel_diff_vs_anchor"] = float((ours().float() - ref).abs().max() / ref.abs().max())
        except Exception as exc:  # one failing size must not hide the others
            row["error"] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        rows.append(row)
        _log(_fmt_row(row))
        torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------- sweep


def _sweep_grid(path: str, gemm: str, quick: bool) -> list[Any]:
    """Candidate GemmConfigs for one GEMM on one path (block_k 64 divides 2880: no K mask)."""
    from tokenspeed_kernel_triton.moe.configs import GemmConfig

    out = []
    if path == "tiny":
        decodes = ("bits",) if quick else ("bits", "dot_scaled")
        for bn, stages, swap, decode in itertools.product((32, 64, 128), (3, 5), (False, True), decodes):
            out.append(GemmConfig(block_n=bn, block_k=64, swap_ab=swap, decode=decode, num_stages=stages))
        for bn, warps in itertools.product((16, 32, 64), (4,) if quick else (4, 8)):
            out.append(GemmConfig(block_n=bn, block_k=64, use_dot=False, num_warps=warps, num_stages=3))
        return out
    shapes = [(16, 64, 4), (16, 128, 4), (64, 128, 4), (64, 128, 8), (128, 128, 8), (128, 256, 8)]
    if not quick:
        shapes += [(128, 64, 4), (64, 256, 8), (256, 128, 8)]
    for (bm, bn, warps), stages in itertools.product(shapes[::2] if quick else shapes, (3,) if quick else (3, 4)):
        out.append(GemmConfig(block_m=bm, block_n=bn, block_k=64, swap_ab=bm == 16, num_warps=warps, num_stages=stages))
    if not quick:
        out.append(GemmConfig(block_m=128, block_n=128, block_k=64, decode="dot_scaled", num_warps=8, num_stages=3))
        out.append(GemmConfig(block_m=64, block_n=128, block_k=64, decode="dot_scaled", num_warps=4, num_stages=4))
    return out


def sweep(tokens: list[int], w: Any, quick: bool, gen: torch.Generator, deadline: float) -> dict[str, Any]:
    from tokenspeed_kernel.ops.moe import MoEActivation
    from tokenspeed_kernel_triton.moe import configs, dispatch, experts, gemm, route

    act = MoEActivation()
    w13, w2 = experts.expert_operand(w, "w13"), experts.expert_operand(w, "w2")
    results: list[dict[str, Any]] = []
    for t in tokens:
        path = configs.apply_path("nvidia" if torch.version.hip is None else "amd", t)
        logits = torch.randn(t, E, generator=gen).to(DEVICE)
        x = torch.randn(t, H, generator=gen).to(torch.bfloat16).to(DEVICE)
        tw, ids = route.moe_route(logits, TOP_K)
        pairs = t * TOP_K
        inter = torch.randn(pairs, I, device=DEVICE).to(torch.bfloat16)
        y = torch.empty(pairs, H, dtype=torch.bfloat16, device=DEVICE)
        if path == "tiny":
            row_map, perm, mode, bm = ids, None, gemm.ROWS_TINY, max(16, 1 << (t - 1).bit_length())
        else:
            (row_map, perm), mode, bm = dispatch.sort_pairs(ids, E), gemm.ROWS_GATHER, None
        for name in ("gate_up", "down"):
            for cfg in _sweep_grid(path, name, quick):
                if time.monotonic() > deadline:
                    _log("  sweep: time budget spent, stopping")
                    return {"results": results, "best": _best(results)}
                if path == "grouped" and cfg.block_m > 16 and pairs < 256:
                    continue
                kw = {"rows_mode": mode, "num_pairs": pairs, "num_experts": E, "cfg": cfg, "block_m": bm}
                if name == "gate_up":
                    fn = functools.partial(
                        experts.launch_gate_up, x, row_map, perm, w13, act, True, inter, top_k=TOP_K, **kw
                    )
                else:
                    fn = functools.partial(experts.launch_down, inter, row_map, perm, tw, w2, y, **kw)
                try:
                    us = time_fn(fn, graph=True, **TIMING).median_us
                except Exception as exc:  # e.g. out of shared memory for a large tile
                    us = None
                    _log(f"    failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                results.append({"tokens": t, "path": path, "gemm": name, "config": dataclasses.asdict(cfg), "us": us})
                _log(f"  {path:<8}{name:<8}T={t:<6}{_cfg_text(cfg, path):<50}{us if us is None else round(us, 1)}")
        torch.cuda.empty_cache()
    return {"results": results, "best": _best(results)}


def _cfg_text(cfg: Any, path: str) -> str:
    flags = ("swap " if cfg.swap_ab else "") + ("gemv " if not cfg.use_dot else "") + cfg.decode
    rows = f"m{cfg.block_m} " if path == "grouped" else ""
    return f"{rows}n{cfg.block_n} k{cfg.block_k} w{cfg.num_warps} s{cfg.num_stages} {flags}"


def _best(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    best: dict[tuple, dict[str, Any]] = {}
    for r in results:
        key = (r["tokens"], r["gemm"])
        if r["us"] is not None and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    return [best[k] for k in sorted(best)]


# --------------------------------------------------------------------------- report


def _header() -> str:
    return (
        f"{'tokens':>7} {'experts':>7} {'ours us':>9} {'eager us':>9} {'TB/s':>6} {'TFLOP/s':>8} "
        f"{'anchor us':>10} {'gemm us':>9} {'TFLOP/s':>8} {'speedup':>8} {'rel diff':>9}"
    )


def _fmt_row(r: dict[str, Any]) -> str:
    if "error" in r and "ours_us" not in r:
        return f"{r['tokens']:>7} error: {r['error'][:100]}"

    def f(key: str, fmt: str, width: int) -> str:
        return format(r[key], fmt).rjust(width) if key in r else "-".rjust(width)

    return " ".join(
        (
            f("tokens", "d", 7), f("experts_hit", "d", 7), f("ours_us", ".1f", 9), f("ours_eager_us", ".1f", 9),
            f("ours_tbs", ".2f", 6), f("ours_tflops", ".1f", 8), f("anchor_us", ".1f", 10),
            f("anchor_gemm_us", ".1f", 9), f("anchor_tflops", ".1f", 8), f("speedup_vs_anchor", ".2f", 8),
            f("max_rel_diff_vs_anchor", ".1e", 9),
        )
    )  # fmt: skip


def _check_targets(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in rows:
        if "ours_us" not in r:
            continue
        if r["tokens"] == 1:
            ok = r["ours_us"] <= TARGET_1_TOKEN_US
            lines.append(
                f"1 token: {r['ours_us']:.1f} us (portable target <= {TARGET_1_TOKEN_US}) {'ok' if ok else 'MISS'}"
            )
        if r["tokens"] <= 64:
            ok = r["ours_tbs"] >= TARGET_STREAM_TBS
            lines.append(
                f"{r['tokens']} token(s): {r['ours_tbs']:.2f} TB/s weight streaming "
                f"(selected-kernel target >= {TARGET_STREAM_TBS}) {'ok' if ok else 'below'}"
            )
    return lines


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
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out", help="output directory (JSON results)")
    parser.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="token counts of the layer table")
    parser.add_argument("--no-anchor", action="store_true", help="do not time the bf16 torch._grouped_mm layer")
    parser.add_argument("--sweep", action="store_true", help="also sweep GEMM tile configs")
    parser.add_argument("--sweep-only", action="store_true", help="only the config sweep")
    parser.add_argument("--sweep-tokens", default=",".join(map(str, SWEEP_TOKENS)), help="token counts to sweep")
    parser.add_argument("--quick", action="store_true", help="smaller sweep grids")
    parser.add_argument("--budget-min", type=float, default=9.0, help="stop sweeping after this many minutes")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA/ROCm device", file=sys.stderr)
        return 2
    start = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    env = _environment()
    _log(f"{env['device']} torch {env['torch']} triton {env['triton']}")
    w = _weights(gen)
    report: dict[str, Any] = {"environment": env, "shapes": {"E": E, "top_k": TOP_K, "H": H, "I": I}}
    if not args.sweep_only:
        bf16 = None if args.no_anchor else _bf16_weights(w)
        _log(_header())
        rows = bench_layer([int(v) for v in args.tokens.split(",")], w, bf16, gen)
        report["layer"] = rows
        report["targets"] = _check_targets(rows)
        for line in report["targets"]:
            _log(line)
        with open(os.path.join(args.out, "triton_moe.json"), "w") as f:
            json.dump(report, f, indent=1)
        del bf16
        torch.cuda.empty_cache()
    if args.sweep or args.sweep_only:
        deadline = start + args.budget_min * 60
        result = sweep([int(v) for v in args.sweep_tokens.split(",")], w, args.quick, gen, deadline)
        _log("best per (tokens, GEMM):")
        for b in result["best"]:
            _log(f"  T={b['tokens']:<6}{b['path']:<8}{b['gemm']:<8}{b['us']:8.1f} us  GemmConfig(**{b['config']})")
        with open(os.path.join(args.out, "triton_moe_sweep.json"), "w") as f:
            json.dump({"environment": env, **result}, f, indent=1)
    _log(f"done in {time.monotonic() - start:.0f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

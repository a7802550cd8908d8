#!/usr/bin/env python3
"""Benchmark the portable Triton attention kernels at GPT-OSS shapes, side by side with FA3.

    python tools/bench_triton_attention.py --out OUT [--ops prefill,extend,decode] [--sweep] [--quick]

Shapes (docs: shared/design/PERFORMANCE.md): GPT-OSS-120B attention (64 query heads, 8
KV heads, head_dim 64, bf16, sinks). Prefill: causal, and window 128 (window_left=127),
at 1x1024 .. 8x8192. Decode: paged cache, page 16, batch x context 1x8192, 32x4096,
64x8192, 256x2048 (pages shuffled over the cache, as an engine's allocator leaves them).

Timing: the benchmark harness (``tokenspeed_kernel.benchmark.timer.time_fn``: CUDA-event
median, L2 flushed between runs, the method of ``triton.testing.do_bench``). Triton and FA3
(``tokenspeed_kernel_nvidia.fa3``, present when ``flash_attn_interface`` imports) run
in the same process, one shape after the other, so compare the ratios. Metrics:
prefill TFLOP/s counts only visible (query, key) pairs, i.e. the causal half (4 * D
FLOPs per pair per head); decode TB/s counts K + V bytes read once.

``--sweep`` (or ``--sweep-only``, with ``--sweep-ops prefill|decode`` and ``--quick`` to
fit one 10-minute call) times every tile configuration of a small grid on
representative shapes and prints the best per op, ready to paste into
``tokenspeed_kernel_triton/attention/configs.py``.

Writes ``OUT/triton_attention.json`` (and ``OUT/triton_attention_sweep.json`` with
``--sweep``) and prints a compact table. Targets checked (portable path): prefill
>= 0.8x FA3; decode >= 2.8 TB/s at batch >= 32, context >= 2048.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import itertools
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from tokenspeed_kernel.benchmark.timer import time_fn

HQ, HKV, HEAD_DIM = 64, 8, 64
PAGE = 16
DEVICE = "cuda"
PREFILL_SHAPES = [(1, 1024), (1, 4096), (1, 8192), (4, 2048), (16, 1024), (8, 8192)]
DECODE_SHAPES = [(1, 8192), (32, 4096), (64, 8192), (256, 2048)]
# Chunked prefill: (batch, new tokens per sequence, tokens already cached per sequence).
EXTEND_SHAPES = [(1, 2048, 6144), (4, 1024, 3072)]
QUICK = {"prefill": [(1, 4096)], "decode": [(32, 4096)], "extend": [(1, 2048, 6144)]}
WINDOW_LEFT = 127

PREFILL_TARGET = 0.8  # x FA3
DECODE_TARGET_TBS = 2.8


def _log(msg: str) -> None:
    print(msg, flush=True)


def _visible_pairs(q_len: int, k_len: int, window_left: int) -> int:
    """(query, key) pairs visible under the bottom-right causal mask (window included), q_len <= k_len."""
    if window_left < 0:
        first = k_len - q_len + 1  # keys seen by query 0
        return q_len * first + q_len * (q_len - 1) // 2
    w = window_left + 1
    return sum(min(p + 1, w) for p in range(k_len - q_len, k_len))


def _fa3() -> Any:
    try:
        return importlib.import_module("tokenspeed_kernel_nvidia.fa3.attention")
    except Exception as exc:  # FA3 is optional: the table then shows Triton alone
        _log(f"FA3 not available ({type(exc).__name__}: {exc}); timing Triton alone")
        return None


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def _sinks() -> dict[str, torch.Tensor]:
    """GPT-OSS sinks: float32 for our kernels, the same (bf16-exact) values in bf16 for FA3,
    whose build takes bf16 only (pre-cast so FA3's timing does not include a cast kernel)."""
    bf16 = torch.randn(HQ, device=DEVICE).to(torch.bfloat16)
    return {"sinks": bf16.float(), "sinks_bf16": bf16}


def _sinks_for(mod: Any, x: dict[str, Any]) -> torch.Tensor:
    return x["sinks"] if mod.__name__.startswith("tokenspeed_kernel_triton") else x["sinks_bf16"]


def _paged_cache(batch: int, tokens: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    pages_per_seq = -(-tokens // PAGE)
    num_pages = batch * pages_per_seq
    k_cache = torch.randn(num_pages, PAGE, HKV, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(num_pages, generator=gen).to(DEVICE, torch.int32)
    page_table = perm.view(batch, pages_per_seq).contiguous()
    return k_cache, v_cache, page_table


# --------------------------------------------------------------------------- prefill


def _prefill_inputs(batch: int, seqlen: int) -> dict[str, Any]:
    total = batch * seqlen
    q = torch.randn(total, HQ, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16)
    k = torch.randn(total, HKV, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    cu = torch.arange(0, total + 1, seqlen, device=DEVICE, dtype=torch.int32)
    return {"q": q, "k": k, "v": v, "cu": cu, "seqlen": seqlen, **_sinks()}


def _prefill_call(mod: Any, x: dict[str, Any], window_left: int, **extra: Any) -> Callable[[], Any]:
    def call() -> Any:
        return mod.mha_prefill(
            x["q"], x["k"], x["v"], x["cu"], x["cu"], x["seqlen"], x["seqlen"],
            causal=True, window_left=window_left, sinks=_sinks_for(mod, x), softmax_scale=HEAD_DIM**-0.5,
            logit_cap=0.0, return_lse=False, out=None, **extra,
        )  # fmt: skip

    return call


def bench_prefill(shapes: list[tuple[int, int]], fa3: Any) -> list[dict[str, Any]]:
    from tokenspeed_kernel_triton.attention import prefill

    rows = []
    for batch, seqlen in shapes:
        x = _prefill_inputs(batch, seqlen)
        for window_left in (-1, WINDOW_LEFT):
            pairs = batch * _visible_pairs(seqlen, seqlen, window_left)
            flops = 4.0 * HEAD_DIM * HQ * pairs
            row: dict[str, Any] = {
                "op": "prefill",
                "shape": f"{batch}x{seqlen}",
                "variant": "causal+sinks" if window_left < 0 else "window128+sinks",
                "flops": flops,
            }
            ours = _prefill_call(prefill, x, window_left)
            row["triton_ms"] = time_fn(ours, device=DEVICE).median_us / 1e3
            row["triton_tflops"] = flops / row["triton_ms"] / 1e9
            if fa3 is not None:
                theirs = _prefill_call(fa3, x, window_left)
                row["fa3_ms"] = time_fn(theirs, device=DEVICE).median_us / 1e3
                row["fa3_tflops"] = flops / row["fa3_ms"] / 1e9
                row["speedup_vs_fa3"] = row["fa3_ms"] / row["triton_ms"]
                row["max_abs_diff_vs_fa3"] = _max_diff(ours(), theirs())
            rows.append(row)
            _log(_fmt_row(row))
        del x
        torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------- extend


def _extend_inputs(batch: int, new: int, cached: int, gen: torch.Generator) -> dict[str, Any]:
    k_cache, v_cache, page_table = _paged_cache(batch, new + cached, gen)
    return {
        "q": torch.randn(batch * new, HQ, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "page_table": page_table,
        "seqlens": torch.full((batch,), new + cached, device=DEVICE, dtype=torch.int32),
        "cu": torch.arange(0, batch * new + 1, new, device=DEVICE, dtype=torch.int32),
        "new": new,
        **_sinks(),
    }


def _extend_call(mod: Any, x: dict[str, Any], window_left: int) -> Callable[[], Any]:
    def call() -> Any:
        return mod.mha_extend_with_kvcache(
            x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["seqlens"], x["cu"], x["new"],
            causal=True, window_left=window_left, sinks=_sinks_for(mod, x), softmax_scale=HEAD_DIM**-0.5, logit_cap=0.0,
            return_lse=False, out=None,
        )  # fmt: skip

    return call


def bench_extend(shapes: list[tuple[int, int, int]], fa3: Any, gen: torch.Generator) -> list[dict[str, Any]]:
    from tokenspeed_kernel_triton.attention import extend

    rows = []
    for batch, new, cached in shapes:
        x = _extend_inputs(batch, new, cached, gen)
        for window_left in (-1, WINDOW_LEFT):
            pairs = batch * _visible_pairs(new, new + cached, window_left)
            flops = 4.0 * HEAD_DIM * HQ * pairs
            row: dict[str, Any] = {
                "op": "extend",
                "shape": f"{batch}x{new}+{cached}",
                "variant": "causal+sinks" if window_left < 0 else "window128+sinks",
                "flops": flops,
            }
            ours = _extend_call(extend, x, window_left)
            row["triton_ms"] = time_fn(ours, device=DEVICE).median_us / 1e3
            row["triton_tflops"] = flops / row["triton_ms"] / 1e9
            if fa3 is not None:
                theirs = _extend_call(fa3, x, window_left)
                row["fa3_ms"] = time_fn(theirs, device=DEVICE).median_us / 1e3
                row["fa3_tflops"] = flops / row["fa3_ms"] / 1e9
                row["speedup_vs_fa3"] = row["fa3_ms"] / row["triton_ms"]
                row["max_abs_diff_vs_fa3"] = _max_diff(ours(), theirs())
            rows.append(row)
            _log(_fmt_row(row))
        del x
        torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------- decode


def _decode_inputs(batch: int, context: int, gen: torch.Generator) -> dict[str, Any]:
    k_cache, v_cache, page_table = _paged_cache(batch, context, gen)
    return {
        "q": torch.randn(batch, HQ, HEAD_DIM, device=DEVICE, dtype=torch.bfloat16),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "page_table": page_table,
        "seqlens": torch.full((batch,), context, device=DEVICE, dtype=torch.int32),
        **_sinks(),
    }


def _decode_call(mod: Any, x: dict[str, Any], window_left: int, **extra: Any) -> Callable[[], Any]:
    def call() -> Any:
        return mod.mha_decode_with_kvcache(
            x["q"], x["k_cache"], x["v_cache"], x["page_table"], x["seqlens"],
            window_left=window_left, sinks=_sinks_for(mod, x), softmax_scale=HEAD_DIM**-0.5, logit_cap=0.0,
            return_lse=False, out=None, **extra,
        )  # fmt: skip

    return call


def bench_decode(shapes: list[tuple[int, int]], fa3: Any, gen: torch.Generator) -> list[dict[str, Any]]:
    from tokenspeed_kernel_triton.attention import decode

    rows = []
    for batch, context in shapes:
        x = _decode_inputs(batch, context, gen)
        for window_left in (-1, WINDOW_LEFT):
            keys = context if window_left < 0 else min(context, window_left + 1)
            nbytes = 2.0 * batch * keys * HKV * HEAD_DIM * 2  # K + V, bf16
            row: dict[str, Any] = {
                "op": "decode",
                "shape": f"{batch}x{context}",
                "variant": "full+sinks" if window_left < 0 else "window128+sinks",
                "bytes": nbytes,
            }
            ours = _decode_call(decode, x, window_left)
            row["triton_ms"] = time_fn(ours, device=DEVICE).median_us / 1e3
            row["triton_tbs"] = nbytes / row["triton_ms"] / 1e9
            if fa3 is not None:
                theirs = _decode_call(fa3, x, window_left)
                row["fa3_ms"] = time_fn(theirs, device=DEVICE).median_us / 1e3
                row["fa3_tbs"] = nbytes / row["fa3_ms"] / 1e9
                row["speedup_vs_fa3"] = row["fa3_ms"] / row["triton_ms"]
                row["max_abs_diff_vs_fa3"] = _max_diff(ours(), theirs())
            rows.append(row)
            _log(_fmt_row(row))
        del x
        torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------- sweep

# Prefill: 24 points x 2 variants (causal, window) per shape, each a fresh compile (~2-4 s).
PREFILL_GRID = {"BLOCK_M": (64, 128), "BLOCK_N": (32, 64, 128), "num_warps": (4, 8), "num_stages": (2, 3)}
# Decode: ctas_per_sm changes only the split count (no recompile).
DECODE_GRID = {"BLOCK_N": (32, 64, 128), "num_warps": (4, 8), "num_stages": (2, 3, 4), "ctas_per_sm": (2, 4, 8)}


#: Shapes the sweep scores configs on (``--quick``: the first of each).
SWEEP_SHAPES: dict[str, list[tuple[int, int]]] = {
    "prefill": [(1, 8192), (16, 1024)],
    "decode": [(32, 4096), (1, 8192), (64, 8192)],
}


def _grid(grid: dict[str, tuple]) -> list[dict[str, Any]]:
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def _try(fn: Callable[[], Any]) -> float | None:
    """Median ms of ``fn``, None when it fails."""
    try:
        return time_fn(fn, device=DEVICE).median_us / 1e3
    except Exception as exc:  # e.g. out of shared memory for a large tile
        _log(f"    failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
        return None


def sweep(quick: bool, ops: list[str], gen: torch.Generator) -> dict[str, Any]:
    from tokenspeed_kernel_triton.attention import configs, decode, prefill

    dev = torch.device(DEVICE)
    out: dict[str, Any] = {"prefill": [], "decode": []}
    base = configs.prefill_config(dev, HEAD_DIM)
    prefill_shapes = [] if "prefill" not in ops else SWEEP_SHAPES["prefill"][: 1 if quick else None]
    for batch, seqlen in prefill_shapes:
        x = _prefill_inputs(batch, seqlen)
        for window_left in (-1, WINDOW_LEFT):
            for point in _grid(PREFILL_GRID):
                cfg = {**base, **point}
                ms = _try(_prefill_call(prefill, x, window_left, config=cfg))
                out["prefill"].append({"shape": f"{batch}x{seqlen}", "window_left": window_left, **point, "ms": ms})
                _log(f"  prefill {batch}x{seqlen} w={window_left} {point} -> {ms}")
        del x
        torch.cuda.empty_cache()
    base = configs.decode_config(dev, HEAD_DIM)
    decode_shapes = [] if "decode" not in ops else SWEEP_SHAPES["decode"][: 1 if quick else None]
    for batch, context in decode_shapes:
        x = _decode_inputs(batch, context, gen)
        for point in _grid(DECODE_GRID):
            cfg = {**base, **point}
            ms = _try(_decode_call(decode, x, -1, config=cfg))
            out["decode"].append({"shape": f"{batch}x{context}", **point, "ms": ms})
            _log(f"  decode {batch}x{context} {point} -> {ms}")
        del x
        torch.cuda.empty_cache()
    out["best"] = _best(out)
    return out


def _best(results: dict[str, Any]) -> dict[str, Any]:
    """Per op, the grid point with the lowest geometric mean time over the swept shapes."""
    best = {}
    for op, keys in (("prefill", PREFILL_GRID), ("decode", DECODE_GRID)):
        by_point: dict[tuple, list[float | None]] = {}
        for r in results[op]:
            by_point.setdefault(tuple(r[k] for k in keys), []).append(r["ms"])
        scored = [
            (math.exp(sum(math.log(t) for t in times) / len(times)), point)
            for point, times in by_point.items()
            if all(t is not None for t in times)
        ]
        if scored:
            score, point = min(scored)
            best[op] = {**dict(zip(keys, point)), "geomean_ms": score}
    return best


# --------------------------------------------------------------------------- report


def _fmt_row(r: dict[str, Any]) -> str:
    if r["op"] == "decode":
        ours, theirs, unit = r["triton_tbs"], r.get("fa3_tbs"), "TB/s"
    else:
        ours, theirs, unit = r["triton_tflops"], r.get("fa3_tflops"), "TFLOP/s"
    fa3 = f"{r['fa3_ms'] * 1e3:9.1f} {theirs:8.1f}" if theirs is not None else f"{'-':>9} {'-':>8}"
    ratio = f"{r['speedup_vs_fa3']:6.2f}x" if "speedup_vs_fa3" in r else "     -"
    diff = f"{r['max_abs_diff_vs_fa3']:.1e}" if "max_abs_diff_vs_fa3" in r else "-"
    return (
        f"{r['op']:<8}{r['shape']:<14}{r['variant']:<17}{r['triton_ms'] * 1e3:9.1f} {ours:8.2f} {fa3} "
        f"{ratio} {unit:<8}{diff}"
    )


def _header() -> str:
    return (
        f"{'op':<8}{'shape':<14}{'variant':<17}{'triton us':>9} {'rate':>8} {'fa3 us':>9} {'rate':>8} "
        f"{'vs fa3':>7} {'unit':<8}max|diff|"
    )


def _check_targets(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in rows:
        if r["op"] == "prefill" and r["variant"] == "causal+sinks" and "speedup_vs_fa3" in r:
            ok = r["speedup_vs_fa3"] >= PREFILL_TARGET
            lines.append(
                f"prefill {r['shape']}: {r['speedup_vs_fa3']:.2f}x FA3 (target >= {PREFILL_TARGET}) {'ok' if ok else 'MISS'}"
            )
        if r["op"] == "decode" and r["variant"] == "full+sinks":
            batch, context = (int(v) for v in r["shape"].split("x"))
            if batch >= 32 and context >= 2048:
                ok = r["triton_tbs"] >= DECODE_TARGET_TBS
                lines.append(
                    f"decode {r['shape']}: {r['triton_tbs']:.2f} TB/s (target >= {DECODE_TARGET_TBS}) {'ok' if ok else 'MISS'}"
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
    parser.add_argument(
        "--ops", default="prefill,extend,decode", help="comma-separated subset of prefill,extend,decode"
    )
    parser.add_argument("--quick", action="store_true", help="one shape per op")
    parser.add_argument("--sweep", action="store_true", help="also sweep tile configs (several minutes)")
    parser.add_argument("--sweep-only", action="store_true", help="only the config sweep")
    parser.add_argument("--sweep-ops", default="prefill,decode", help="ops to sweep (prefill ~4-8 min, decode ~2 min)")
    parser.add_argument("--no-fa3", action="store_true", help="do not time FA3")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA/ROCm device", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    env = _environment()
    _log(json.dumps(env))
    rc = 0
    t0 = time.time()
    if not args.sweep_only:
        fa3 = None if args.no_fa3 else _fa3()
        ops = [o.strip() for o in args.ops.split(",") if o.strip()]
        rows: list[dict[str, Any]] = []
        _log(_header())
        for op in ops:
            try:
                if op == "prefill":
                    rows += bench_prefill(QUICK["prefill"] if args.quick else PREFILL_SHAPES, fa3)
                elif op == "extend":
                    rows += bench_extend(QUICK["extend"] if args.quick else EXTEND_SHAPES, fa3, gen)
                elif op == "decode":
                    rows += bench_decode(QUICK["decode"] if args.quick else DECODE_SHAPES, fa3, gen)
                else:
                    _log(f"unknown op {op!r}")
                    rc = 2
            except Exception:
                traceback.print_exc()
                rc = 1
        targets = _check_targets(rows)
        _log("\n".join(["", "targets (portable path):", *targets]))
        path = os.path.join(args.out, "triton_attention.json")
        with open(path, "w") as f:
            json.dump({"environment": env, "rows": rows, "targets": targets}, f, indent=1)
        _log(f"wrote {path} ({time.time() - t0:.0f} s)")
    if args.sweep or args.sweep_only:
        result = sweep(args.quick, [o.strip() for o in args.sweep_ops.split(",")], gen)
        path = os.path.join(args.out, "triton_attention_sweep.json")
        with open(path, "w") as f:
            json.dump({"environment": env, **result}, f, indent=1)
        _log(f"best configs (paste into attention/configs.py): {json.dumps(result['best'])}")
        _log(f"wrote {path} ({time.time() - t0:.0f} s)")
    return rc


if __name__ == "__main__":
    sys.exit(main())

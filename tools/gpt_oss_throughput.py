#!/usr/bin/env python3
"""End-to-end GPT-OSS throughput through the public API: full selection vs Triton-only vs reference-only.

A GPT-OSS-20B-shaped model (hidden 2880, 64/8 heads of 64, 32 MXFP4 experts,
top-4, vocab 201088) with random weights and ``--layers`` layers (default all
24) runs, in one process and on the same weights, under three configurations:

- ``full``: what selection picks on this machine;
- ``triton``: every op forced to the Triton solution (``kernel_override("triton")``);
- ``reference``: every op forced to the PyTorch reference (slow: it is timed
  over fewer iterations and decode steps, and its decode runs eagerly, since the
  reference kernels synchronise with the host).

Measured per configuration:

- prefill tokens/s for each ``--prefill BxL`` (a packed batch of B prompts of L
  tokens; K/V written to the paged cache; logits of each prompt's last token),
  median of ``--prefill-iters`` runs after a warm-up run, CUDA events;
- decode tokens/s for each ``--decode-batches`` B at context ``--context``: the
  cache holds ``context`` tokens per sequence (random K/V), each step adds one
  token per sequence (greedy), the step is a CUDA graph (captured after an eager
  warm-up step, so every selection is cached and every kernel compiled), timed
  over ``--decode-steps`` replays; an eager step time is recorded too;
- the kernel each op ran (the ``tokenspeed_kernel::<op>::<kernel>`` profiler
  ranges of one eager prefill + decode step) and, per op, the device time of an
  eager prefill (first ``--prefill`` shape) and an eager decode step (largest batch).

Output: ``results.json`` and ``results.md`` in ``--out`` (rewritten after every
configuration, so a run cut short keeps what it measured) and a compact table
on stdout with the full / Triton-only ratios (PERFORMANCE.md's end-to-end
targets: decode at batch 64, context 2048 >= 2x; prefill 8 x 2048 >= 1.6x).

    python tools/gpt_oss_throughput.py --out /tmp/gpt_oss_e2e                 # H200: everything
    python tools/gpt_oss_throughput.py --out /tmp/e2e --layers 12 --configs full,triton
    python tools/gpt_oss_throughput.py --out /tmp/smoke --config tiny --device cpu \\
        --prefill 1x16,2x16 --decode-batches 1,2 --context 16 --decode-steps 3   # CPU smoke test
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import platform as host_platform
import subprocess
import sys
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.benchmark.timer import time_calls
from tokenspeed_kernel.models import gpt_oss as m

#: full_fp8: full selection with the MoE calls allowing fp8 activations (W4A8 kernels compete).
CONFIGS = ("full", "full_fp8", "triton", "reference")
TARGETS = {("decode", 64, 2048): 2.0, ("prefill", 8, 2048): 1.6}  # full / Triton-only, PERFORMANCE.md


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _error_text(exc: BaseException, *, full: bool = False) -> str:
    text = str(exc) if full else (str(exc).splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}"[: 4000 if full else 500]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------- kernels and op times


def profile_ops(fn: Callable[[], Any], device: torch.device, *, device_time: bool) -> dict[str, dict[str, Any]]:
    """``{op: {"kernels": [...], "calls": n, "us": t}}`` from the dispatch ranges of one run of ``fn``."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device_time and device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        _sync(device)
    ops: dict[str, dict[str, Any]] = defaultdict(lambda: {"kernels": [], "calls": 0, "us": 0.0})
    for ev in prof.key_averages():
        if not ev.key.startswith("tokenspeed_kernel::"):
            continue
        _, op, kernel = ev.key.split("::", 2)
        entry = ops[op]
        if kernel not in entry["kernels"]:
            entry["kernels"].append(kernel)
        entry["calls"] += ev.count
        entry["us"] += ev.device_time_total if (device_time and device.type == "cuda") else ev.cpu_time_total
    return {op: dict(v) for op, v in sorted(ops.items())}


def _packed_prompts(cfg: m.GptOssConfig, batch: int, length: int, device: torch.device, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    prompts = torch.randint(0, cfg.vocab_size, (batch, length), generator=g).tolist()
    return m.pack_prompts(prompts, device)


# ----------------------------------------------------------------------------- prefill


def time_prefill(
    model: m.GptOssModel, batch: int, length: int, *, iters: int, warmup: int, page_size: int
) -> dict[str, Any]:
    device = model.device
    cache = model.new_cache(batch, length, page_size=page_size)
    slots = torch.cat([cache.reserve(b, length) for b in range(batch)])
    tokens, positions, cu, last = _packed_prompts(model.cfg, batch, length, device)

    def run() -> torch.Tensor:
        # The same slots every time: each run rewrites the same K/V, as a fresh prefill would.
        return model.prefill(tokens, positions, cu, length, cache, slots, last_index=last)

    timing = time_calls(run, device=device, repeats=iters, warmup=warmup)
    times = [us / 1e3 for us in timing.samples_us]
    ms = timing.median_us / 1e3
    return {
        "batch": batch,
        "length": length,
        "tokens": batch * length,
        "ms": ms,
        "ms_all": times,
        "tokens_per_s": batch * length / (ms / 1e3),
        "iters": iters,
    }


# ----------------------------------------------------------------------------- decode


def _decode_setup(model: m.GptOssModel, batch: int, context: int, steps: int, page_size: int, *, cuda_graph: bool):
    device = model.device
    cache = model.new_cache(batch, context + steps + 4, page_size=page_size)
    for b in range(batch):
        cache.reserve(b, context + steps + 4)  # every page the timed steps touch, reserved up front
    g = torch.Generator(device=device).manual_seed(1)
    for k, v in zip(cache.k, cache.v):
        # A cache "holding" `context` tokens: values do not change the time, only the lengths do.
        k.normal_(generator=g)
        v.normal_(generator=g)
    sampler = m.Sampler(m.SamplingParams(), batch, device)
    runner = m.DecodeRunner(model, cache, batch, sampler, cuda_graph=cuda_graph, on_capture_error="warn")
    tokens = torch.randint(0, model.cfg.vocab_size, (batch,), device=device, generator=g)
    positions = torch.full((batch,), context, dtype=torch.int64, device=device)
    return cache, runner, tokens, positions


def time_decode(
    model: m.GptOssModel,
    batch: int,
    context: int,
    *,
    steps: int,
    eager_steps: int,
    page_size: int,
    cuda_graph: bool,
) -> dict[str, Any]:
    """Decode step time at ``context`` tokens already cached (the new token at position ``context``)."""
    device = model.device
    _, runner, tokens, positions = _decode_setup(model, batch, context, steps, page_size, cuda_graph=cuda_graph)
    runner.set_state(tokens, positions)
    runner.step()  # eager warm-up (and capture, when asked)
    if runner.graph is not None:
        runner.step()  # one replay, so the timed ones are steady
    _sync(device)

    def run_steps(n: int) -> Callable[[], None]:
        def go() -> None:
            for _ in range(n):
                runner.step()

        return go

    out: dict[str, Any] = {"batch": batch, "context": context, "cuda_graph": runner.graph is not None}
    if runner.capture_error:
        out["capture_error"] = runner.capture_error
    runner.set_state(tokens, positions)
    ms = time_calls(run_steps(steps), device=device, repeats=1).median_us / 1e3 / steps
    out.update({"ms": ms, "tokens_per_s": batch / (ms / 1e3), "steps": steps})
    if runner.graph is not None and eager_steps > 0:
        runner.graph = None
        runner.want_graph = False
        runner.set_state(tokens, positions)
        out["eager_ms"] = time_calls(run_steps(eager_steps), device=device, repeats=1).median_us / 1e3 / eager_steps
        out["eager_steps"] = eager_steps
    return out


def decode_op_times(model: m.GptOssModel, batch: int, context: int, page_size: int) -> dict[str, dict[str, Any]]:
    _, runner, tokens, positions = _decode_setup(model, batch, context, 2, page_size, cuda_graph=False)
    runner.set_state(tokens, positions)
    runner.step()  # warm-up
    runner.set_state(tokens, positions)
    return profile_ops(runner.step, model.device, device_time=True)


# ----------------------------------------------------------------------------- one configuration


def run_config(name: str, cfg: m.GptOssConfig, weights: m.GptOssWeights, args: argparse.Namespace) -> dict[str, Any]:
    device = weights.device
    reference = name == "reference"
    override = contextlib.nullcontext() if name.startswith("full") else tk.kernel_override(name)
    res: dict[str, Any] = {"prefill": [], "decode": [], "errors": []}
    max_len = max([length for _, length in args.prefill] + [args.context + args.decode_steps + 8])
    with override:
        t0 = time.perf_counter()
        try:
            model = m.GptOssModel(cfg, weights, max_positions=max(max_len, 64) + 8, fp8_activations=name == "full_fp8")
        except Exception as exc:
            res["errors"].append({"stage": "build", "error": _error_text(exc, full=True)})
            _log(f"{name}: model build failed: {_error_text(exc)}")
            return res
        res["moe_plans"] = sorted(set(model.kernel_plans()))
        res["build_s"] = time.perf_counter() - t0
        _log(f"{name}: model built in {res['build_s']:.1f} s (moe_apply plan: {', '.join(res['moe_plans'])})")

        try:
            short = [list(range(1, 33)), list(range(1, 17))]
            res["kernels"] = profile_ops(
                lambda: m.generate(model, short, 2, cuda_graph=False, page_size=args.page_size),
                device,
                device_time=False,
            )
            _log(f"{name}: kernels " + "; ".join(f"{op}={','.join(v['kernels'])}" for op, v in res["kernels"].items()))
        except Exception as exc:
            res["errors"].append({"stage": "kernels", "error": _error_text(exc)})
            _log(f"{name}: kernel listing failed: {_error_text(exc)}")
            traceback.print_exc()

        for batch, length in args.prefill:
            iters = args.reference_prefill_iters if reference else args.prefill_iters
            try:
                r = time_prefill(model, batch, length, iters=iters, warmup=1, page_size=args.page_size)
                res["prefill"].append(r)
                _log(f"{name}: prefill {batch}x{length}: {r['ms']:.2f} ms, {r['tokens_per_s']:,.0f} tokens/s")
            except Exception as exc:
                res["errors"].append({"stage": f"prefill {batch}x{length}", "error": _error_text(exc)})
                _log(f"{name}: prefill {batch}x{length} failed: {_error_text(exc)}")
                traceback.print_exc()
            gc.collect()

        for batch in args.decode_batches:
            steps = args.reference_decode_steps if reference else args.decode_steps
            try:
                r = time_decode(
                    model,
                    batch,
                    args.context,
                    steps=steps,
                    eager_steps=0 if reference else args.eager_decode_steps,
                    page_size=args.page_size,
                    cuda_graph=device.type == "cuda" and not reference,
                )
                res["decode"].append(r)
                graph = "CUDA graph" if r["cuda_graph"] else "eager"
                extra = f", eager {r['eager_ms']:.3f} ms" if "eager_ms" in r else ""
                _log(
                    f"{name}: decode batch {batch} @ {args.context}: {r['ms']:.3f} ms/step ({graph}{extra}), "
                    f"{r['tokens_per_s']:,.0f} tokens/s"
                )
            except Exception as exc:
                res["errors"].append({"stage": f"decode {batch}", "error": _error_text(exc)})
                _log(f"{name}: decode batch {batch} failed: {_error_text(exc)}")
                traceback.print_exc()
            gc.collect()

        if args.op_times and args.prefill and args.decode_batches:
            batch, length = args.prefill[0]
            dbatch = max(args.decode_batches)
            try:
                tokens, positions, cu, last = _packed_prompts(cfg, batch, length, device)
                cache = model.new_cache(batch, length, page_size=args.page_size)
                slots = torch.cat([cache.reserve(b, length) for b in range(batch)])
                res["prefill_op_us"] = {
                    "shape": f"{batch}x{length}",
                    "ops": profile_ops(
                        lambda: model.prefill(tokens, positions, cu, length, cache, slots, last_index=last),
                        device,
                        device_time=True,
                    ),
                }
                cache = None  # the prefill's cache goes before the decode's comes
                res["decode_op_us"] = {
                    "shape": f"batch {dbatch} @ {args.context}",
                    "ops": decode_op_times(model, dbatch, args.context, args.page_size),
                }
            except Exception as exc:
                res["errors"].append({"stage": "op times", "error": _error_text(exc)})
                _log(f"{name}: op times failed: {_error_text(exc)}")
        model = None  # free the converted expert weights before the next configuration
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


# ----------------------------------------------------------------------------- report


def _rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per case: tokens/s per configuration and the full / Triton-only ratio."""
    cases: dict[tuple, dict[str, Any]] = {}
    for cname, res in results["configs"].items():
        for r in res.get("prefill", []):
            key = ("prefill", r["batch"], r["length"])
            cases.setdefault(key, {})[cname] = r
        for r in res.get("decode", []):
            key = ("decode", r["batch"], r["context"])
            cases.setdefault(key, {})[cname] = r
    rows = []
    for key in sorted(cases, key=lambda k: (k[0] != "prefill", k[1], k[2])):
        kind, batch, n = key
        per = cases[key]
        row: dict[str, Any] = {
            "case": f"prefill {batch}x{n}" if kind == "prefill" else f"decode batch {batch} @ {n}",
            "kind": kind,
            "batch": batch,
            "n": n,
        }
        for c in CONFIGS:
            if c in per:
                row[f"{c}_tokens_per_s"] = per[c]["tokens_per_s"]
                row[f"{c}_ms"] = per[c]["ms"]
                if kind == "decode":
                    row[f"{c}_cuda_graph"] = per[c]["cuda_graph"]
        if "full" in per and "triton" in per:
            row["full_over_triton"] = per["full"]["tokens_per_s"] / per["triton"]["tokens_per_s"]
        if "full" in per and "reference" in per:
            row["full_over_reference"] = per["full"]["tokens_per_s"] / per["reference"]["tokens_per_s"]
        target = TARGETS.get(key)
        if target is not None:
            row["target_full_over_triton"] = target
        rows.append(row)
    return rows


def _fmt(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        "# GPT-OSS end to end through the public API",
        "",
        f"{meta['device']}; {meta['layers']} layer(s) of GPT-OSS-{meta['shapes']} shapes, random weights, bf16, "
        f"MXFP4 experts; page size {meta['page_size']}. torch {meta['torch']}, triton {meta['triton']}, "
        f"commit {meta['commit']}, {meta['date']}.",
        "",
        f"Command: `{meta['command']}`",
        "",
        "Prefill: a packed batch of B prompts of L tokens, K/V to the paged cache, last-token logits; "
        f"median of {meta['prefill_iters']} runs ({meta['reference_prefill_iters']} for reference). "
        f"Decode: one token per sequence with `context` tokens cached, CUDA graph (reference: eager), "
        f"{meta['decode_steps']} steps ({meta['reference_decode_steps']} for reference). Tokens/s:",
        "",
        "| case | full | Triton-only | reference-only | full / Triton | target |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in _rows(results):
        ratio = row.get("full_over_triton")
        target = row.get("target_full_over_triton")
        met = "" if target is None or ratio is None else (" (met)" if ratio >= target else " (not met)")
        lines.append(
            f"| {row['case']} | {_fmt(row.get('full_tokens_per_s'))} | {_fmt(row.get('triton_tokens_per_s'))} | "
            f"{_fmt(row.get('reference_tokens_per_s'))} | {_fmt(ratio, '.2f')} | "
            f"{'' if target is None else f'>= {target}x{met}'} |"
        )
    decode_rows = [r for r in _rows(results) if r["kind"] == "decode"]
    if decode_rows:
        lines += ["", "Decode step time, ms (CUDA graph replay; eager in brackets, the dispatch path included):", ""]
        lines += ["| case | " + " | ".join(CONFIGS) + " |", "| --- |" + " ---: |" * len(CONFIGS)]
        for row in decode_rows:
            cells = []
            for c in CONFIGS:
                r = next(
                    (d for d in results["configs"].get(c, {}).get("decode", []) if d["batch"] == row["batch"]), None
                )
                if r is None:
                    cells.append("-")
                else:
                    eager = f" ({r['eager_ms']:.3f})" if "eager_ms" in r else ""
                    cells.append(f"{r['ms']:.3f}{'' if r['cuda_graph'] else ' eager'}{eager}")
            lines.append(f"| {row['case']} | " + " | ".join(cells) + " |")
    ops = sorted({op for res in results["configs"].values() for op in res.get("kernels", {})})
    names = list(results["configs"])
    lines += ["", "Kernel each op ran:", "", "| op | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for op in ops:
        cells = [", ".join(results["configs"][c].get("kernels", {}).get(op, {}).get("kernels", ["-"])) for c in names]
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    for key, title in (("prefill_op_us", "eager prefill"), ("decode_op_us", "eager decode step")):
        shapes = {c: results["configs"][c][key]["shape"] for c in names if key in results["configs"][c]}
        if not shapes:
            continue
        shape = next(iter(shapes.values()))
        lines += ["", f"Device time per op, {title} ({shape}), us:", ""]
        lines += ["| op | " + " | ".join(shapes) + " |", "| --- |" + " ---: |" * len(shapes)]
        op_names = sorted({op for c in shapes for op in results["configs"][c][key]["ops"]})
        for op in op_names:
            cells = [_fmt(results["configs"][c][key]["ops"].get(op, {}).get("us"), ",.1f") for c in shapes]
            lines.append(f"| {op} | " + " | ".join(cells) + " |")
    errors = [(c, e) for c, res in results["configs"].items() for e in res.get("errors", [])]
    if errors:
        lines += ["", "Errors:", ""] + [f"- {c}, {e['stage']}: {e['error'].splitlines()[0]}" for c, e in errors]
    return "\n".join(lines) + "\n"


def print_table(results: dict[str, Any]) -> None:
    print(f"\n{'case':<24} {'full tok/s':>12} {'triton tok/s':>13} {'ref tok/s':>11} {'full/triton':>12}")
    for row in _rows(results):
        ratio = row.get("full_over_triton")
        target = row.get("target_full_over_triton")
        note = "" if target is None else f"  (target >= {target})"
        print(
            f"{row['case']:<24} {_fmt(row.get('full_tokens_per_s')):>12} {_fmt(row.get('triton_tokens_per_s')):>13} "
            f"{_fmt(row.get('reference_tokens_per_s')):>11} {_fmt(ratio, '.2f'):>12}{note}"
        )


def write(results: dict[str, Any], out: str) -> None:
    os.makedirs(out, exist_ok=True)
    results = {**results, "rows": _rows(results)}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(markdown(results))


# ----------------------------------------------------------------------------- main


def _shape(text: str) -> tuple[int, int]:
    b, _, length = text.lower().partition("x")
    return int(b), int(length)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (results.json, results.md)")
    p.add_argument("--config", choices=("20b", "tiny"), default="20b", help="model shapes (tiny: CPU smoke test)")
    p.add_argument("--layers", type=int, default=None, help="layers (default: all of the config)")
    p.add_argument("--configs", default="full,triton,reference", help="comma-separated subset of " + ",".join(CONFIGS))
    p.add_argument("--device", default=None, help="default: cuda when available")
    p.add_argument("--prefill", default="1x2048,8x2048", help="prefill shapes BxL")
    p.add_argument("--decode-batches", default="1,16,64")
    p.add_argument("--context", type=int, default=2048, help="tokens cached per sequence when decoding")
    p.add_argument("--decode-steps", type=int, default=64, help="timed decode steps (graph replays)")
    p.add_argument("--eager-decode-steps", type=int, default=8, help="timed eager decode steps (0: skip)")
    p.add_argument("--prefill-iters", type=int, default=5)
    p.add_argument("--reference-prefill-iters", type=int, default=1)
    p.add_argument("--reference-decode-steps", type=int, default=3)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--no-op-times", dest="op_times", action="store_false", help="skip the per-op device times")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--append",
        action="store_true",
        help="keep the other configurations of an existing OUT/results.json (to split a run across commands)",
    )
    args = p.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(args.configs) - set(CONFIGS)
    if unknown:
        p.error(f"--configs: unknown {sorted(unknown)}; choose from {CONFIGS}")
    args.prefill = [_shape(s) for s in args.prefill.split(",") if s.strip()]
    args.decode_batches = [int(b) for b in args.decode_batches.split(",") if b.strip()]
    return args


def _commit() -> str:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        # --dirty: a working tree that differs from HEAD (a copy of an uncommitted or newer tree) says so.
        out = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=here, capture_output=True, text=True)
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    base = m.GptOssConfig.gpt_oss_20b() if args.config == "20b" else m.GptOssConfig.tiny()
    layers = args.layers or base.num_hidden_layers
    cfg = base.with_layers(layers)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    platform = tk.current_platform() if device.type == "cuda" else tk.make_platform("cpu")
    results: dict[str, Any] = {
        "meta": {
            "device": platform.describe(),
            "shapes": "20B" if args.config == "20b" else "tiny",
            "layers": layers,
            "page_size": args.page_size,
            "context": args.context,
            "prefill_iters": args.prefill_iters,
            "reference_prefill_iters": args.reference_prefill_iters,
            "decode_steps": args.decode_steps,
            "reference_decode_steps": args.reference_decode_steps,
            "torch": torch.__version__,
            "triton": triton_version,
            "python": host_platform.python_version(),
            "commit": _commit(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(["python", "tools/gpt_oss_throughput.py", *(argv or sys.argv[1:])]),
            "plugins": {
                name: {"status": r.status, "version": r.version, "error": r.error}
                for name, r in tk.plugin_reports().items()
            },
        },
        "configs": {},
    }
    previous = os.path.join(args.out, "results.json")
    if args.append and os.path.exists(previous):
        with open(previous) as f:
            kept = {k: v for k, v in json.load(f).get("configs", {}).items() if k not in args.configs}
        results["configs"].update(kept)
        results["meta"]["appended_to"] = sorted(kept)
    _log(f"{platform.describe()}: GPT-OSS-{results['meta']['shapes']} shapes, {layers} layers, configs {args.configs}")
    t0 = time.perf_counter()
    weights = m.random_weights(cfg, device=device, seed=args.seed)
    _sync(device)
    _log(f"random weights in {time.perf_counter() - t0:.1f} s")
    for name in args.configs:
        t1 = time.perf_counter()
        results["configs"][name] = run_config(name, cfg, weights, args)
        results["configs"][name]["seconds"] = time.perf_counter() - t1
        write(results, args.out)
        _log(f"{name}: done in {results['configs'][name]['seconds']:.0f} s; wrote {args.out}/results.{{json,md}}")
    print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

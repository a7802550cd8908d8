#!/usr/bin/env python3
"""Shape-aware selection on the H200: measure, build the table, and judge it on held-out shapes.

Two stages:

``bench`` (on the GPU): times every registered kernel of ``mm``, ``mha_prefill``,
``mha_decode_with_kvcache`` and ``moe_apply`` at GPT-OSS shapes (``tokenspeed-kernel
bench`` with CUDA-graph timing, L2 flushed) on two case sets per op:

- set A, the measurement set: one size per power-of-two bucket (M = 1, 4, 16, ...);
- set B, the held-out set: other sizes inside those buckets (M = 3, 12, 48, ...),
  never used to build the table.

writing ``OUT/<op>-A.json`` and ``OUT/<op>-B.json`` (bench reports).

``report`` (anywhere, CPU is enough): builds the measured table from the A reports
(``tokenspeed-kernel oracle build``), then for every case of both sets looks up the
kernel the table makes selection pick for that call (its signature, traits and size
buckets) and its *regret*: its measured time over the fastest kernel's time in that
case. Writes the table and a Markdown report with regret per op and size bucket.

    python tools/selection_h200.py bench --out OUT [--ops mm moe_apply] [--quick]
    python tools/selection_h200.py report --runs OUT --table table.json --md selection.md
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from collections import defaultdict
from typing import Any

OPS = ("mm", "mha_prefill", "mha_decode_with_kvcache", "moe_apply")
GPT_OSS_ATTN = {"heads_q": 64, "heads_kv": 8, "head_dim": 64, "sinks": True}
#: GPT-OSS-20B projections: qkv (64 + 2 * 8 heads of 64 from 2880) and o (4096 -> 2880).
MM_SHAPES = {"qkv": (5120, 2880), "o": (2880, 4096)}


def _sizes(quick: bool) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """(set A, set B) of the swept size per op family."""
    if quick:
        return {"m": ((1, 64, 4096), (3, 96)), "tokens": ((1, 64, 4096), (3, 96))}
    a = (1, 16, 64, 256, 1024, 4096)
    b = (3, 48, 768)  # inside the buckets of 2, 32 and 512
    return {"m": (a, b), "tokens": (a, b)}


#: Set F: the buckets set A leaves unmeasured (measurement, like A).
FILL = {
    "m": (2, 4, 8, 32, 128, 512, 2048, 8192, 16384),
    "tokens": (2, 4, 8, 32, 128, 512, 2048, 8192, 16384),
    "prefill": ((1, 1024), (1, 4096), (1, 8192), (4, 4096)),
}


def cases(op: str, which: str, quick: bool) -> list[Any]:
    from tokenspeed_kernel.numerics.cases import custom_case

    sizes = _sizes(quick)
    if which == "F":
        sizes = {"m": (FILL["m"], ()), "tokens": (FILL["tokens"], ())}
    pick = 1 if which == "B" else 0
    out: list[Any] = []
    if op == "mm":
        for name, (n, k) in MM_SHAPES.items():
            for m in sizes["m"][pick]:
                [c] = custom_case("mm", {"m": m, "n": n, "k": k, "bias": True}, dtypes=["bf16"])
                out.append(dataclasses.replace(c, label=f"{name} M={m}"))
    elif op == "mha_prefill":
        shapes_a = ((1, 512), (1, 2048), (4, 8192), (16, 4096)) if not quick else ((1, 1024), (4, 2048))
        shapes_b = ((1, 700), (3, 1000), (6, 4000)) if not quick else ((1, 1500),)
        shapes = {"A": shapes_a, "B": shapes_b, "F": FILL["prefill"]}[which]
        for w in (-1, 127):
            for b, s in shapes:
                params = {"seqlens_q": (s,) * b, "window_left": w, **GPT_OSS_ATTN}
                [c] = custom_case(op, params, dtypes=["bf16"])
                out.append(dataclasses.replace(c, label=f"{b}x{s} w{w}"))
    elif op == "mha_decode_with_kvcache":
        batches = (
            ((1, 4, 16, 64, 256) if not quick else (1, 64))
            if which == "A"
            else ((3, 12, 48, 200) if not quick else (3,))
        )
        contexts = (2048, 8192) if which == "A" else (3000, 12000)
        for w in (-1, 127):
            for b in batches:
                for n in contexts:
                    params = {"cache_lens": (n,) * b, "window_left": w, "page_size": 16, **GPT_OSS_ATTN}
                    [c] = custom_case(op, params, dtypes=["bf16"])
                    out.append(dataclasses.replace(c, label=f"{b}x{n} w{w}"))
    elif op == "moe_apply":
        for t in sizes["tokens"][pick]:
            # From 1024 tokens the calls allow fp8 activations, so that the W4A8 kernel (offered there)
            # is measured beside the others; the table's rows hold for both kinds of caller (the trait
            # is not one of its groups, and the other kernels run as they do without it).
            params = {"tokens": t, "experts": 128, "top_k": 4, "hidden": 2880, "inter": 2880, "weight_format": "mxfp4",
                      "bias": True, "interleaved": True, "fp8_activations": t >= 1024}  # fmt: skip
            [c] = custom_case(op, params, dtypes=["bf16"])
            out.append(dataclasses.replace(c, label=f"GPT-OSS-120B layer T={t}"))
    else:
        raise ValueError(f"op: one of {OPS}, got {op!r}")
    return out


def stage_bench(args: argparse.Namespace) -> int:
    import torch

    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark import bench
    from tokenspeed_kernel.benchmark.report import write_json

    os.makedirs(args.out, exist_ok=True)
    tk.load_plugins()
    rc = 0
    for op in args.ops:
        for which in args.sets:
            t0 = time.time()
            report = bench(op, cases=cases(op, which, args.quick), graph=torch.cuda.is_available(), ceilings=which == "A" and op == args.ops[0],
                           warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, progress=False)  # fmt: skip
            path = os.path.join(args.out, f"{op}-{which}.json")
            write_json(report, path)
            errors = [
                (r.description, e.name, e.reason) for r in report.results for e in r.entries if e.status == "error"
            ]
            print(f"{op} set {which}: {len(report.results)} cases in {time.time() - t0:.0f} s -> {path}"
                  + (f"; {len(errors)} kernel errors, first: {errors[0]}" if errors else ""), flush=True)  # fmt: skip
            rc |= bool(errors)
    return rc


def _time(entry: dict[str, Any]) -> float | None:
    if entry.get("kind") != "kernel" or entry.get("status") != "ok":
        return None
    return entry.get("graph_median_us") or entry.get("median_us")


def _stand_ins(reports: list[dict]) -> list[str]:
    """Register a stand-in (same name, every trait) for each measured kernel not installed here
    (FA3 on a CPU machine): selection then ranks it by its measured score, as on the H200."""
    import tokenspeed_kernel as tk

    tk.load_plugins()
    added = []
    for data in reports:
        for r in data["results"]:
            for e in r["entries"]:
                name = e["name"]
                if e.get("kind") != "kernel" or tk.registry.get(name) is not None or name in added:
                    continue
                op = tk.get_contract(r["op"])
                traits = {t: tk.ANY for t in op.traits}
                formats = [{role: sorted(tk.core.formats.known_formats()) for role in op.roles}]
                tk.register_kernel(op.name, name=name, solution=name.split(".")[0], formats=formats, traits=traits,
                                   capability=tk.Capability(vendors=frozenset({"nvidia"})),
                                   priority=tk.Priority.PERFORMANT, impl=lambda *a, **k: None)  # fmt: skip
                added.append(name)
    return added


def stage_report(args: argparse.Namespace) -> int:
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.oracle import build_table
    from tokenspeed_kernel.core.contracts import describe_bucket, size_bucket
    from tokenspeed_kernel.numerics.cases import Case, case_call_key

    paths = {(op, w): os.path.join(args.runs, f"{op}-{w}.json") for op in args.ops for w in ("A", "B", "F")}
    present = {k: p for k, p in paths.items() if os.path.exists(p)}
    reports = {k: json.load(open(p)) for k, p in present.items()}
    stand_ins = _stand_ins(list(reports.values()))
    table = build_table([p for (op, w), p in present.items() if w in args.measure])
    if args.table:
        table.save(args.table)
    plat = tk.make_platform("sm90", device_name="NVIDIA H200")
    tk.set_selection_oracle(table)
    rows: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    detail = []
    for (op, which), data in sorted(reports.items()):
        for r in data["results"]:
            times = {e["name"]: t for e in r["entries"] if (t := _time(e)) is not None}
            if len(times) < 2:
                continue
            case = Case.from_json(r["case"])
            sig, traits, sizes = case_call_key(case)
            if "layout" in traits:
                # MoE: the layer's layout is moe_plan's choice (given the token count), so every
                # layout competes, as moe_plan(tokens=T) lets them.
                traits = {**traits, "layout": tk.ANY}
            cands = tk.explain_selection(op, sig, traits, sizes=sizes, platform=plat)
            chosen = next((c.name for c in cands if c.selected), None)
            best = min(times, key=times.get)
            regret = times[chosen] / times[best] if chosen in times else math.nan
            bucket = ", ".join(f"{k}={describe_bucket(size_bucket(n))}" for k, n in sizes.items())
            kind = "measured" if which in args.measure else "held out"
            rows[(op, bucket, kind)].append(regret)
            detail.append((op, kind, r.get("label") or r["description"], bucket, chosen, best, regret,
                           {k: round(v, 1) for k, v in sorted(times.items(), key=lambda kv: kv[1])}))  # fmt: skip
    tk.set_selection_oracle(None)
    for name in stand_ins:
        tk.unregister_kernel(name)
    lines = [
        f"Table from sets {', '.join(args.measure)}; stand-ins for kernels not installed where this ran: "
        f"{', '.join(stand_ins) or 'none'}.",
        "",
        "| op | size bucket | cases | worst regret | mean regret |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    worst = {"measured": 1.0, "held out": 1.0}
    for (op, bucket, kind), vals in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][1])):
        finite = [v for v in vals if math.isfinite(v)]
        if finite:
            worst[kind] = max(worst[kind], max(finite))
        w = f"{max(finite):.3f}" if finite else "-"
        m = f"{sum(finite) / len(finite):.3f}" if finite else "-"
        lines.append(f"| {op} | {bucket} ({kind}) | {len(vals)} | {w} | {m} |")
    lines += ["", "| op | set | case | bucket | selected | fastest | regret | times (us, CUDA graph) |",
              "| --- | --- | --- | --- | --- | --- | ---: | --- |"]  # fmt: skip
    for op, kind, label, bucket, chosen, best, regret, times in detail:
        lines.append(f"| {op} | {kind} | {label} | {bucket} | {chosen} | {best} | {regret:.3f} | {times} |")
    text = "\n".join(lines) + "\n"
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    print(text)
    print(f"worst regret: measured cases {worst['measured']:.3f}, held-out cases {worst['held out']:.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="stage", required=True)
    b = sub.add_parser("bench", help="time every kernel on sets A and B (GPU)")
    b.add_argument("--out", required=True)
    b.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    b.add_argument("--quick", action="store_true", help="a few sizes only")
    b.add_argument(
        "--sets", nargs="+", default=["A", "B"], choices=["A", "B", "F"], help="A, B, F (fill: more buckets)"
    )
    b.add_argument("--warmup-ms", type=float, default=10.0)
    b.add_argument("--rep-ms", type=float, default=40.0)
    r = sub.add_parser("report", help="build the table from set A and judge it on A and B")
    r.add_argument("--runs", required=True, help="the folder bench wrote")
    r.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    r.add_argument(
        "--measure", nargs="+", default=["A", "F"], help="the sets the table is built from (others held out)"
    )
    r.add_argument("--table", help="write the table here")
    r.add_argument("--md", help="write the report here")
    args = p.parse_args(argv)
    return stage_bench(args) if args.stage == "bench" else stage_report(args)


if __name__ == "__main__":
    sys.exit(main())

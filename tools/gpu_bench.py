#!/usr/bin/env python
"""GPU numerics + prefill benchmark run for the H200 (GPT-OSS shapes).

1. ``verify`` every registered kernel at the GPU shape set (GPT-OSS-120B/20B
   shapes, ragged and page-crossing batches, windows larger than the sequence),
   writing ``verify.txt`` / ``verify.json``;
2. ``bench`` ``mha_prefill`` on the PERFORMANCE.md GPT-OSS prefill shapes
   (1x1024 ... 8x8192; full causal and window 128, with sinks; plus full causal
   without sinks, the problem SDPA and FA3 solve exactly) with the external peers
   (SDPA flash and cuDNN, FlashAttention-3), writing ``prefill.json``, ``prefill.md``
   and ``prefill.png``;
3. print a short table.

Usage (from the repository root, packages installed)::

    python tools/gpu_bench.py --out docs/benchmarks/h200-$(date +%F)
    python tools/gpu_bench.py --out /tmp/run --skip-verify --graph
    python tools/gpu_bench.py --out /tmp/run --verify-target triton --bench-ops mha_prefill mha_decode_with_kvcache
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _import_tokenspeed() -> None:
    """Import the packages; from the source tree when they are not installed."""
    try:
        import tokenspeed_kernel
    except ImportError:
        for pkg in ("core", "triton", "nvidia"):
            sys.path.insert(0, os.path.join(ROOT, "packages", f"tokenspeed-kernel-{pkg}", "src"))
        import tokenspeed_kernel  # noqa: F401
    from tokenspeed_kernel.core.plugins import load_plugins

    reports = load_plugins()
    # Not installed (no entry point): register the in-tree plugins directly.
    for name, module in (
        ("triton", "tokenspeed_kernel_triton._register"),
        ("nvidia", "tokenspeed_kernel_nvidia._register"),
    ):
        if name in reports and reports[name].status == "loaded":
            continue
        try:
            import importlib

            importlib.import_module(module).register()
            print(f"note: registered the {name} plugin from source (not installed as a distribution)")
        except Exception as exc:
            print(f"note: {name} plugin unavailable: {type(exc).__name__}: {exc}")


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, s: str) -> int:
        for st in self.streams:
            st.write(s)
        return len(s)

    def flush(self) -> None:
        for st in self.streams:
            st.flush()


def _verify_one(op: str, device: str, json_path: str) -> int:
    """Child-process mode: verify one op (or kernel/solution) and write its JSON."""
    from tokenspeed_kernel.numerics import verify

    report = verify(op, shape_set="gpu" if device == "cuda" else "cpu", device=device)
    with open(json_path, "w") as f:
        json.dump(report.to_json(), f)
    return 0 if report.ok else 1


def run_verify(out_dir: str, device: str, target: str | None, ops: list[str] | None, isolate: bool) -> bool:
    """Verify each op in turn (each in its own process with ``isolate``, so that a kernel that
    corrupts the CUDA context fails only its own op); merge into verify.txt / verify.json."""
    from tokenspeed_kernel.numerics.runner import resolve_target

    targets = ops or ([target] if target else list(resolve_target(None)))
    results: list[dict] = []
    device_text = ""
    with open(os.path.join(out_dir, "verify.txt"), "w") as log:
        tee = _Tee(sys.stdout, log)
        for t in targets:
            t0 = time.perf_counter()
            part = os.path.join(out_dir, f".verify-{t}.json")
            if isolate:
                cmd = [sys.executable, os.path.abspath(__file__), "--out", out_dir, "--device", device,
                       "--verify-one", t, "--verify-json", part]  # fmt: skip
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                assert proc.stdout is not None
                for line in proc.stdout:
                    tee.write(line)
                rc = proc.wait()
            else:
                try:
                    rc = _verify_one(t, device, part)
                except Exception as exc:  # one op's tooling failure must not end the run
                    tee.write(f"verify {t}: {type(exc).__name__}: {exc}\n")
                    rc = 3
            got_json = os.path.exists(part)
            if got_json:
                with open(part) as f:
                    data = json.load(f)
                os.remove(part)
                results += data["results"]
                device_text = data["device"]
            if rc not in (0, 1) or not got_json:
                results.append({"op": t, "kernel": "-", "case": None, "status": "ERROR",
                                "reason": f"verify process ended with exit status {rc}", "checks": []})  # fmt: skip
            tee.write(f"-- {t}: {time.perf_counter() - t0:.1f} s\n")
        counts = {s: sum(1 for r in results if r["status"] == s) for s in ("PASS", "FAIL", "ERROR", "SKIP")}
        ok = counts["FAIL"] == 0 and counts["ERROR"] == 0
        summary = (f"verify on {device_text}: {counts['PASS']} passed, {counts['FAIL']} failed, "
                   f"{counts['ERROR']} errors, {counts['SKIP']} skipped")  # fmt: skip
        tee.write(summary + "\n")
    with open(os.path.join(out_dir, "verify.json"), "w") as f:
        json.dump({"device": device_text, "ok": ok, "summary": summary, "results": results}, f, indent=1)
    return ok


def prefill_cases(device: str):
    """The PERFORMANCE.md prefill shapes (with sinks; full and window 128) plus full causal without sinks."""
    from tokenspeed_kernel.numerics import standard_cases

    cases = standard_cases("mha_prefill", "bench-gpu" if device == "cuda" else "bench-cpu", device_type=device)
    no_sinks = [
        dataclasses.replace(c.replace(sinks=False), label=f"{c.label} no sinks".strip())
        for c in cases
        if c["window_left"] < 0 and c["sinks"]
    ]
    return cases + no_sinks


def run_bench(out_dir: str, device: str, ops: list[str], graph: bool, rep_ms: float):
    from tokenspeed_kernel.benchmark import bench
    from tokenspeed_kernel.benchmark.report import plot_available, write_json, write_markdown, write_plot

    reports = {}
    for op in ops:
        cases = prefill_cases(device) if op == "mha_prefill" else None
        report = bench(op, cases=cases, device=device, peers=True, graph=graph, rep_ms=rep_ms)
        base = os.path.join(out_dir, "prefill" if op == "mha_prefill" else op)
        command = "python tools/gpu_bench.py " + " ".join(sys.argv[1:])
        write_json(report, base + ".json")
        write_markdown(report, base + ".md", command=command)
        if plot_available():
            write_plot(report, base + ".png")
        else:
            print("note: matplotlib missing, no PNG (pip install matplotlib)")
        reports[op] = report
    return reports


def print_table(report, op: str) -> None:
    """Per shape: selected kernel, regret, and every kernel's and peer's rate (window rows: time)."""
    from tokenspeed_kernel.benchmark.models import PRIMARY_METRIC

    flops = PRIMARY_METRIC.get(op) == "tflops"
    cols: list[tuple[str, str]] = []
    for r in report.results:
        for e in r.entries:
            if (e.name, e.kind) not in cols:
                cols.append((e.name, e.kind))
    c = report.ceilings
    print(f"\n{op} on {report.device.get('name', report.device.get('device'))}: measured ceilings copy "
          f"{c.copy_tbps or 0:.2f} TB/s, bf16 {c.bf16_tflops or 0:.0f} TFLOP/s, fp8 {c.fp8_tflops or 0:.0f} TFLOP/s")  # fmt: skip
    print(
        f"cells: {'TFLOP/s' if flops else 'TB/s'} (rows with a window: median time in us); "
        "* = external peer; regret = selected / fastest registered kernel"
    )
    heads = [("*" + n.removeprefix("torch.") if k == "peer" else n.replace("." + op, ""))[:14] for n, k in cols]
    header = f"{'shape':<26} {'selected':<20} {'regret':>6} " + " ".join(f"{h:>14}" for h in heads)
    print(header)
    print("-" * len(header))
    for r in report.results:
        window = r.case.get("window_left", -1) >= 0
        cells = []
        for name, kind in cols:
            e = next((x for x in r.entries if x.name == name and x.kind == kind), None)
            if e is None or e.timing is None:
                cells.append(f"{(e.status if e else ''):>14}")
            elif window:
                cells.append(f"{e.timing.median_us:>11.1f} us")
            else:
                cells.append(f"{(e.tflops if flops else e.tbps) or 0:>14.2f}")
        regret = f"{r.regret:.2f}" if r.regret is not None else "-"
        label = (r.label or r.description)[:26]
        print(f"{label:<26} {(r.selected or '-').replace('.' + op, '')[:20]:<20} {regret:>6} " + " ".join(cells))
    for note in sorted({f"{e.name}: {e.note}" for r in report.results for e in r.entries if e.note}):
        print(f"  note {note}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--skip-verify", action="store_true")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--verify-target", help="op, kernel or solution to verify (default: everything)")
    p.add_argument("--verify-ops", nargs="+", help="verify these ops only, one after the other")
    p.add_argument("--bench-ops", nargs="+", default=["mha_prefill"], help="ops to benchmark (default: mha_prefill)")
    p.add_argument("--graph", action="store_true", help="also time under CUDA-graph replay")
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--device", default="cuda", help="cuda (default); cpu runs the small CPU sets (a smoke test)")
    p.add_argument("--no-isolate", action="store_true", help="verify every op in this process (faster, less robust)")
    p.add_argument("--verify-one", help=argparse.SUPPRESS)
    p.add_argument("--verify-json", help=argparse.SUPPRESS)
    args = p.parse_args()

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_bench: no CUDA device", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    _import_tokenspeed()
    if args.verify_one:
        return _verify_one(args.verify_one, args.device, args.verify_json)
    ok = True
    t0 = time.perf_counter()
    if not args.skip_verify:
        ok = run_verify(args.out, args.device, args.verify_target, args.verify_ops, not args.no_isolate)
        print(f"verify done in {time.perf_counter() - t0:.0f} s: {'all passed' if ok else 'FAILURES (see verify.txt)'}")
    if not args.skip_bench:
        with contextlib.redirect_stdout(sys.stderr):
            reports = run_bench(args.out, args.device, args.bench_ops, args.graph, args.rep_ms)
        for op, report in reports.items():
            print_table(report, op)
    print(f"\noutputs in {args.out}: {', '.join(sorted(os.listdir(args.out)))} ({time.perf_counter() - t0:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

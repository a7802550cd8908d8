"""``tokenspeed-kernel bench``: the command line of :func:`tokenspeed_kernel.benchmark.bench`;
``tokenspeed-kernel oracle``: measured selection tables from bench reports
(:mod:`tokenspeed_kernel.benchmark.oracle`)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Any

__all__ = ["add_parser", "run", "main"]

_DESCRIPTION = """\
Time every registered kernel matching TARGET (an op, a kernel or a solution
name; default: every op) on the op's bench shapes, custom shapes, or the calls a
shape capture recorded. GPU: CUDA events, L2 flushed between calls, median and
p10/p90; CPU: wall clock. Prints each kernel's time, TFLOP/s, TB/s and % of the
device ceilings measured at the start, the kernel selection would pick and its
regret (its time over the fastest registered kernel's).

examples:
  tokenspeed-kernel bench rmsnorm --json out.json --md out.md --plot out.png
  tokenspeed-kernel bench mha_prefill --peers --graph
  tokenspeed-kernel bench mm --shape m=4096 n=5120 k=2880
  tokenspeed-kernel bench mha_decode_with_kvcache --graph --oracle-out decode-oracle.json
  tokenspeed-kernel bench mm --shapes cases.json --graph --eager --oracle-out mm.json
  TOKENSPEED_KERNEL_CAPTURE_SHAPES=calls.json python serve.py ...; tokenspeed-kernel bench --replay calls.json
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``bench`` subcommand on an ``argparse`` subparsers object (handler: ``args.func``)."""
    p = subparsers.add_parser(
        "bench",
        help="time kernels (and external peers) on standard or captured shapes",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure(p)
    add_oracle_parser(subparsers)
    return p


_ORACLE_DESCRIPTION = """\
Measured selection tables. `build` reads bench JSON reports, rebuilds each case's
call to read its format signature and traits, and scores every kernel per
(arch, device, op, signature, traits) as the geometric mean of its time over the
fastest kernel's (CUDA-graph times when measured), and, from `bench --eager`
reports, the same of their eager public calls (eager scores: they rank eager
calls, device times rank calls captured in a CUDA graph). Selection ranks scored
kernels first, best score first, when TOKENSPEED_KERNEL_ORACLE names the table.

examples:
  tokenspeed-kernel oracle build prefill.json decode.json -o h200.json
  tokenspeed-kernel oracle show h200.json
  TOKENSPEED_KERNEL_ORACLE=h200.json python serve.py ...
"""


def add_oracle_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``oracle`` subcommand (``build``, ``show``)."""
    p = subparsers.add_parser(
        "oracle",
        help="build or show a measured selection table from bench reports",
        description=_ORACLE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="oracle_command", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="build a table from bench --json reports")
    b.add_argument("reports", nargs="+", metavar="REPORT.json", help="bench reports (tokenspeed-kernel bench --json)")
    b.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write the table (JSON)")
    b.set_defaults(func=_oracle_build)
    s = sub.add_parser("show", help="print a table's groups and scores")
    s.add_argument("table", metavar="TABLE.json")
    s.set_defaults(func=_oracle_show)
    return p


def _oracle_build(args: argparse.Namespace) -> int:
    from .oracle import build_table

    try:
        table = build_table(args.reports)
    except (ValueError, KeyError, FileNotFoundError, json.JSONDecodeError) as exc:
        print(f"tokenspeed-kernel oracle build: {exc}", file=sys.stderr)
        return 2
    table.save(args.output)
    print(table.describe())
    print(f"wrote {args.output}")
    return 0 if len(table) else 1


def _oracle_show(args: argparse.Namespace) -> int:
    from ..core.measured import MeasuredTable

    try:
        table = MeasuredTable.load(args.table)
    except (ValueError, KeyError, FileNotFoundError, json.JSONDecodeError) as exc:
        print(f"tokenspeed-kernel oracle show: {exc}", file=sys.stderr)
        return 2
    print(table.describe())
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", help="op, kernel or solution name (default: every op)")
    p.add_argument(
        "--shapes", metavar="SET|FILE", help="bench shape set (cpu, gpu) or a JSON file of cases / a capture"
    )
    p.add_argument("--shape", action="append", nargs="+", metavar="K=V", help="one custom case (repeat for more)")
    p.add_argument("--replay", metavar="FILE", help="benchmark exactly the calls of a shape-capture file")
    p.add_argument(
        "--dtype", action="extend", nargs="+", choices=["bf16", "fp16", "fp32"], help="dtype(s) of the standard sets"
    )
    p.add_argument("--peers", action="store_true", help="also time external peers (SDPA, FA3, torch._grouped_mm, ...)")
    p.add_argument("--graph", action="store_true", help="also time under CUDA-graph replay")
    p.add_argument(
        "--eager",
        action="store_true",
        help="also time each kernel's public call eager, calls back to back (the table's eager scores)",
    )
    p.add_argument("--include-reference", action="store_true", help="time the PyTorch references on a GPU too")
    p.add_argument("--no-ceilings", action="store_true", help="do not measure the device ceilings")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-ms", type=float, default=25.0)
    p.add_argument("--rep-ms", type=float, default=100.0)
    p.add_argument("--no-flush", action="store_true", help="do not flush L2 between timed calls")
    p.add_argument("--json", metavar="FILE", help="write the raw results as JSON")
    p.add_argument("--md", metavar="FILE", help="write a Markdown report")
    p.add_argument("--plot", metavar="FILE", help="write a PNG plot (needs matplotlib)")
    p.add_argument("--oracle-out", metavar="FILE", help="write a measured selection table (see `oracle`)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--host",
        action="store_true",
        help="host cost per call instead: public op eager, kernel called directly, graph replay, torch equivalent",
    )
    p.add_argument("--calls", type=int, default=400, help="--host: back-to-back calls per figure (default 400)")
    p.set_defaults(func=run)


def _cases(args: argparse.Namespace, device_type: str) -> tuple[Any, Any, str | None]:
    """(explicit cases or None, counts or None, standard set name or None)."""
    from ..numerics.cases import cases_from_capture, cases_from_file
    from ..numerics.cli import build_cases

    cases: list = []
    counts: dict = {}
    shape_set = None
    if args.replay:
        with open(args.replay) as f:
            data = json.load(f)
        if "entries" not in data:
            raise ValueError(f"--replay {args.replay}: not a shape-capture file (no 'entries')")
        for case, n in cases_from_capture(data):
            cases.append(case)
            counts[case] = counts.get(case, 0) + n
        if not cases:
            raise ValueError(f"--replay {args.replay}: no replayable call in the file")
    if args.shapes:
        if os.path.exists(args.shapes):
            cases += cases_from_file(args.shapes)
        elif args.shapes in ("cpu", "gpu"):
            shape_set = f"bench-{args.shapes}"
        else:
            raise ValueError(f"--shapes: {args.shapes!r} is neither a file nor a shape set (cpu, gpu)")
    if args.shape:
        cases += build_cases(args.target, args.shape, None, args.dtype, device_type) or []
    return (cases or None), (counts or None), shape_set


def _run_host(args: argparse.Namespace) -> int:
    """``bench --host`` (see :mod:`tokenspeed_kernel.benchmark.host`)."""
    from ..core.platform import current_platform, make_platform
    from ..numerics.cli import _device, build_cases
    from ..numerics.runner import default_device, resolve_target
    from .host import host_bench, write_host_json, write_host_markdown

    for flag in ("shapes", "replay", "peers", "graph", "eager", "include_reference", "oracle_out", "plot"):
        if getattr(args, flag):
            print(f"tokenspeed-kernel bench: --host does not take --{flag.replace('_', '-')}", file=sys.stderr)
            return 2
    if args.calls < 1:
        print(f"tokenspeed-kernel bench: --calls: expected an int >= 1, got {args.calls}", file=sys.stderr)
        return 2
    try:
        device = _device(args.device, default_device)
        ops = sorted(resolve_target(args.target))
        cases = None
        if args.shape:
            if len(ops) != 1:
                raise ValueError("--shape needs one op as the target")
            cases = {ops[0]: build_cases(ops[0], args.shape, None, args.dtype, device.type) or []}
    except (ValueError, KeyError) as exc:
        print(f"tokenspeed-kernel bench: {exc}", file=sys.stderr)
        return 2
    plat = current_platform() if device.type == "cuda" else make_platform("cpu")
    command = getattr(args, "command_line", None)
    if command is None and len(sys.argv) > 1:  # tokenspeed-kernel bench ...
        command = "tokenspeed-kernel bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    meta = {"device": plat.describe(), "calls": args.calls, "command": command, "torch": torch_version()}
    rows = host_bench(
        ops, device=device, cases=cases, calls=args.calls, seed=args.seed, progress=None if args.quiet else print
    )
    if args.json:
        write_host_json(rows, args.json, meta)
    if args.md:
        write_host_markdown(rows, args.md, meta)
    return 1 if any("error" in r for r in rows) else 0


def torch_version() -> str:
    import torch

    return torch.__version__


def run(args: argparse.Namespace) -> int:
    if args.host:
        return _run_host(args)
    from ..core.settings import settings
    from ..numerics.cli import _device
    from ..numerics.runner import default_device
    from .report import PLOT_HINT, plot_available, print_summary, write_json, write_markdown, write_plot
    from .runner import bench

    if args.plot and not plot_available():
        print(f"tokenspeed-kernel bench: --plot: {PLOT_HINT}", file=sys.stderr)
        return 2
    try:
        settings()  # a bad TOKENSPEED_KERNEL_* setting fails here, once
        device = _device(args.device, default_device)
        cases, counts, shape_set = _cases(args, device.type)
        report = bench(
            args.target,
            cases=cases,
            counts=counts,
            shape_set=shape_set,
            dtypes=args.dtype,
            device=device,
            peers=args.peers,
            graph=args.graph,
            eager=args.eager,
            include_reference=True if args.include_reference else None,
            ceilings=not args.no_ceilings,
            seed=args.seed,
            warmup_ms=args.warmup_ms,
            rep_ms=args.rep_ms,
            flush_l2=not args.no_flush,
            progress=not args.quiet,
        )
    except (ValueError, KeyError, FileNotFoundError) as exc:
        print(f"tokenspeed-kernel bench: {exc}", file=sys.stderr)
        return 2
    print_summary(report, sys.stdout)
    command = getattr(args, "command_line", None)
    if command is None and len(sys.argv) > 1:  # tokenspeed-kernel bench ...
        command = "tokenspeed-kernel bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    if args.json:
        write_json(report, args.json)
    if args.md:
        write_markdown(report, args.md, command=command)
    if args.plot:
        write_plot(report, args.plot)
    if args.oracle_out:
        from .oracle import build_table

        table = build_table([report.to_json()])
        if args.json:
            table.sources[0]["path"] = args.json
        table.save(args.oracle_out)
        print(f"oracle: {len(table)} group(s) with a ranking -> {args.oracle_out}")
    # A kernel that raised (not a peer, not a skip) makes the run fail.
    failed = [e for r in report.results for e in r.entries if e.status == "error" and e.kind == "kernel"]
    return 1 if failed or any(r.error for r in report.results) else 0


def main(argv: list[str] | None = None, *, prog: str = "tokenspeed-kernel bench") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=_DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    configure(parser)
    args = parser.parse_args(argv)
    args.command_line = " ".join([prog, *(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))])
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

"""``tokenspeed-kernel verify``: the command line of :func:`tokenspeed_kernel.numerics.verify`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser", "run", "main"]

_DESCRIPTION = """\
Run every registered kernel matching TARGET (an op, a kernel or a solution name;
default: all) against the PyTorch reference on the op's standard shapes (small
ones on CPU, GPT-OSS shapes on GPU) or on custom ones, and print PASS/FAIL per
kernel and shape with the largest errors and the worst elements. Kernels that
cannot run here are listed as skipped with the reason. Exit status 1 on any
failure.

examples:
  tokenspeed-kernel verify rmsnorm
  tokenspeed-kernel verify mha_prefill --dtype bf16 --shape seqlens_q=128,300 window_left=127 sinks=true
  tokenspeed-kernel verify triton --bisect
  tokenspeed-kernel verify --shapes captured.json
"""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``verify`` subcommand on an ``argparse`` subparsers object.

    The subcommand's handler is ``args.func(args) -> int`` (the exit status).
    """
    p = subparsers.add_parser(
        "verify",
        help="check kernels against the reference",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure(p)
    return p


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", help="op, kernel or solution name (default: every kernel)")
    p.add_argument("--dtype", action="extend", nargs="+", choices=["bf16", "fp16", "fp32"], help="activation dtype(s)")
    p.add_argument(
        "--shape",
        action="append",
        nargs="+",
        metavar="K=V",
        help="one custom case: the op's default parameters with these replaced (repeat for more cases)",
    )
    p.add_argument("--shapes", metavar="FILE", help="JSON file of cases, or a shape-capture file")
    p.add_argument("--set", dest="shape_set", choices=["cpu", "gpu"], help="standard shape set (default: by device)")
    p.add_argument("--bisect", action="store_true", help="shrink each kernel's first failing shape to a minimal one")
    p.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--seed", type=int, default=0, help="base seed of the input generators")
    p.add_argument("--no-reference", action="store_true", help="do not check the reference kernels themselves")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--list-params", action="store_true", help="print each op's case parameters and exit")
    p.set_defaults(func=run)


def _parse_shape(items: list[str]) -> dict[str, Any]:
    from .cases import parse_value

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--shape: expected K=V, got {item!r}")
        out[key.strip()] = parse_value(raw)
    return out


def build_cases(target: str | None, shapes: list[list[str]] | None, shapes_file: str | None, dtypes, device_type: str):
    """Explicit cases from ``--shape``/``--shapes``, or None for the standard sets."""
    from .cases import cases_from_file, custom_case, get_op_cases
    from .runner import resolve_target

    if not shapes and not shapes_file:
        return None
    cases = []
    if shapes_file:
        cases += cases_from_file(shapes_file)
    if shapes:
        ops = list(resolve_target(target))
        for items in shapes:
            params = _parse_shape(items)
            fitting = [op for op in ops if set(params) <= set(get_op_cases(op).defaults)]
            if not fitting:
                known = {op: sorted(get_op_cases(op).defaults) for op in ops}
                raise ValueError(
                    f"--shape {' '.join(items)}: no op in the target takes these parameters; parameters: {known}"
                )
            for op in fitting:
                cases += custom_case(op, params, dtypes=dtypes, device_type=device_type)
    return cases


def _device(text: str | None, default: Any) -> Any:
    """``--device``: a torch device that exists here (default: ``default()``)."""
    import torch

    if not text:
        return default()
    try:
        device = torch.device(text)
    except RuntimeError as exc:
        raise ValueError(f"--device: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {text}: no CUDA device here (torch.cuda.is_available() is False)")
    return device


def run(args: argparse.Namespace) -> int:
    from ..core.settings import settings
    from .cases import all_op_cases
    from .runner import default_device, verify

    if args.list_params:
        for op, oc in sorted(all_op_cases().items()):
            print(f"{op}: " + " ".join(f"{k}={v!r}" for k, v in oc.defaults.items()))
        return 0
    try:
        settings()  # a bad TOKENSPEED_KERNEL_* setting fails here, once, not in every case
        device = _device(args.device, default_device)
        cases = build_cases(args.target, args.shape, args.shapes, args.dtype, device.type)
        report = verify(
            args.target,
            dtypes=args.dtype,
            cases=cases,
            shape_set=args.shape_set,
            device=device,
            bisect=args.bisect,
            seed=args.seed,
            include_reference=not args.no_reference,
        )
    except (ValueError, KeyError, FileNotFoundError) as exc:
        print(f"tokenspeed-kernel verify: {exc}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_json(), f, indent=1)
    return 0 if report.ok else 1


def main(argv: list[str] | None = None, *, prog: str = "tokenspeed-kernel verify") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=_DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

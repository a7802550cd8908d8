#!/usr/bin/env python3
"""The SASS instruction mix of ``hopper.moe_apply``'s decode GEMMs, cross-compiled for sm90 (no GPU needed).

    python tools/decode_sass_counts.py [--tokens 1] [--packed]

Records the launches of one GPT-OSS-120B layer call at ``--tokens`` (the launch recorder of
``tokenspeed-kernel-nvidia/tests/test_hopper_moe.py``), compiles each decode GEMM for sm90, and prints the static
instruction counts before, in and after its K loop (the innermost loop: three K blocks an iteration) with the
loop's opcode mix. ``--packed``: on weights in the layout of ``hopper.moe_apply_packed``. Issue 11's report
(sessions 8 and 11) quotes its output.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

TESTS = pathlib.Path(__file__).resolve().parents[1] / "packages" / "tokenspeed-kernel-nvidia" / "tests"


def loop_counts(sass: str) -> dict:
    """Static counts of the innermost loop holding the HMMAs."""
    from tokenspeed_kernel.testing import sass_loop_counts

    try:
        return sass_loop_counts(sass, "HMMA")
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=1)
    p.add_argument("--packed", action="store_true", help="weights in the packed layout (hopper.moe_apply_packed)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(TESTS))
    import pytest
    import test_hopper_moe as t

    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel.testing import sass as sm90_sass
    from tokenspeed_kernel_nvidia.hopper.moe import decode

    with pytest.MonkeyPatch.context() as mp:
        calls = t._launches(mp, args.tokens, packed=args.packed)
    for fn, grid, kargs, kwargs in calls:
        if fn is not decode.moe_decode_gemm:
            continue
        ck = compile_launch(fn, kargs, dict(kwargs), "sm90")
        tile = {k: kwargs[k] for k in ("GATE_UP", "BLOCK_M", "TOKENS", "WARPS", "STAGES", "KSPLIT")}
        print(f"grid {tuple(grid)} {tile}")
        c = loop_counts(sm90_sass(ck.asm["cubin"]))
        print(f"  static instructions: before the K loop {c['before']}, K loop {c['loop']}, after {c['after']}")
        print(f"  K loop mix: {c['mix']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

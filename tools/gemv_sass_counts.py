#!/usr/bin/env python3
"""The sm90 cost of ``hopper.moe_apply``'s CUDA-core GEMMs (``hopper/moe/gemv.py``), cross-compiled (no GPU needed).

    python tools/gemv_sass_counts.py [--tiles "16,16,4/8,8,4;..."] [--two-step] [--packed] [--mix]

For each ``gate/up tile/down tile`` (``rows,blocks,warps``, :class:`GemvTile`) at GPT-OSS's layer shapes (H = I =
2880, top-4, one token), compiles both launches for sm90 as the host makes them and prints the registers a thread
(``ptxas -v``), the local-memory instructions (spills), the static instructions of the K loop and those per value a
thread (the loop's values: slots x rows x blocks x 32 over the program's threads). ``--mix``: the loop's opcodes.
The host-cost report's session 26 quotes it.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

TOOLS = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(TOOLS), "packages", "tokenspeed-kernel-nvidia", "tests")


def registers(ptx: str) -> int:
    """Registers a thread, from ``ptxas -v`` on ``ptx`` for sm_90a."""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        r = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                           capture_output=True, text=True, check=True)  # fmt: skip
    finally:
        os.unlink(f.name)
    return int(re.search(r"Used (\d+) registers", r.stdout + r.stderr).group(1))


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--tiles", default="16,16,4/8,8,4;32,16,8/8,16,8")
    p.add_argument("--two-step", action="store_true", help="scale bytes above 128 (the two-multiply decode)")
    p.add_argument("--packed", action="store_true", help="weights in the layout of hopper.moe_apply_packed")
    p.add_argument("--mix", action="store_true", help="print the K loop's opcodes")
    args = p.parse_args(argv)
    sys.path[:0] = [TOOLS, TESTS]
    import pytest
    import test_hopper_moe as t
    import torch
    from moe_gemv_probe import _gemv_entries
    from triton.tools.disasm import get_sass

    import tokenspeed_kernel as tk
    from tokenspeed_kernel.testing import compile_launch, sass_loop_counts
    from tokenspeed_kernel_nvidia.hopper.moe import gemv, layer

    entries = _gemv_entries(args.tiles)
    if not entries:
        p.error("--tiles: expected at least one 'rows,blocks,warps/rows,blocks,warps' entry")
    w = t._weights(32, 2880, 2880, packed=args.packed, scale_hi=140 if args.two_step else 128)
    x = torch.randn(1, 2880).to(torch.bfloat16)
    tw, ids = tk.moe_route(torch.randn(1, 32), 4, solution="reference")

    class Recorder:
        """Stands in for the kernel: records ``moe_gemv[grid](*args, **kwargs)`` into ``calls``."""

        def __init__(self, calls):
            self.calls = calls

        def __getitem__(self, grid):
            return lambda *a, **kw: self.calls.append((grid, a, kw))

    for tiles in entries:
        calls = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(layer, "moe_gemv", Recorder(calls))
            mp.setattr(layer.triton.knobs.runtime, "interpret", False)
            layer.moe_apply(x, tw, ids, w, t.GPT_OSS, tiles=tiles, graphs=False)
        for (grid, kargs, kwargs), tile in zip(calls, tiles):
            ck = compile_launch(gemv.moe_gemv, kargs, dict(kwargs), "sm90")
            sass = get_sass(ck.asm["cubin"])
            c = sass_loop_counts(sass, "FFMA")
            values = kwargs["SLOTS"] * tile[0] * tile[1] * 32 // (32 * tile[2])
            gemm = "gate/up" if kwargs["GATE_UP"] else "down"
            spills = len(re.findall(r"\b(?:STL|LDL)\b", sass))
            print(f"{gemm:7s} tile {','.join(map(str, tile)):8s} grid {tuple(grid)}: {registers(ck.asm['ptx'])} "
                  f"registers, {spills} spill instructions, K loop {c['loop']} "
                  f"instructions for {values} values a thread ({c['loop'] / values:.2f} a value)")  # fmt: skip
            if args.mix:
                print(f"  mix {c['mix']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

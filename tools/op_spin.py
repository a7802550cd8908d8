#!/usr/bin/env python3
"""One public op called back to back for a while, inside ``spin()``: for a sampling profiler (issue 13).

    py-spy record --native --idle -r 500 -f raw -o spy.txt -- python tools/op_spin.py moe_gate_norm --seconds 6
    python tools/spy_table.py spy.txt --by function        # (spy_table's default --under is spin)

Cases (GPT-OSS-20B's decode shapes, one token): ``rmsnorm``, ``moe_gate``, ``moe_gate_norm`` (with the norm and a
residual), ``apply_rotary``, ``moe_route``. Each call's outputs are dropped, as a served public call's caller
would. Prints the microseconds a call (calls back to back, a sync every 100) before ``spin()`` and after it.
``--device cpu`` without ``--seconds`` runs a few calls of the case (the CPU kernels): a check that it is well
formed; with ``--seconds`` it spins on the CPU too.
"""

from __future__ import annotations

import argparse
import time

import torch

CASES = ("rmsnorm", "moe_gate", "moe_gate_norm", "apply_rotary", "moe_route")


def make(case: str, device: str):
    """The zero-argument call of ``case``."""
    import tokenspeed_kernel as tk

    g = torch.Generator(device="cpu").manual_seed(0)
    bf = torch.bfloat16

    def rand(*shape, dtype=bf, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)

    h, e = 2880, 32
    x, res = rand(1, h), rand(1, h)
    if case == "rmsnorm":
        w = rand(h)
        return lambda: tk.rmsnorm(x, w, 1e-5)
    if case in ("moe_gate", "moe_gate_norm"):
        wr, br, nw = rand(e, h, scale=0.02), rand(e, scale=0.1), rand(h)
        if case == "moe_gate":
            return lambda: tk.moe_gate(x, wr, br, 4)
        return lambda: tk.moe_gate(x, wr, br, 4, norm_weight=nw, norm_eps=1e-5, residual=res)
    if case == "apply_rotary":
        qkv = rand(1, 80 * 64)
        q, k, _ = qkv.view(1, 80, 64).split_with_sizes([64, 8, 8], dim=1)
        cs = rand(4096, 64, dtype=torch.float32)
        pos = torch.tensor([2000], device=device)
        return lambda: tk.apply_rotary(q, k, cs, pos)
    if case == "moe_route":
        logits = rand(1, e)
        return lambda: tk.moe_route(logits, 4)
    raise SystemExit(f"case: expected one of {', '.join(CASES)}, got {case!r}")


def per_call_us(fn, n: int, sync) -> float:
    t = time.perf_counter()
    for i in range(n):
        fn()
        if i % 100 == 99:
            sync()
    sync()
    return (time.perf_counter() - t) / n * 1e6


def spin(fn, seconds: float, sync) -> int:
    """Calls back to back (a sync every 100) for ``seconds``; returns how many."""
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(100):
            fn()
        sync()
        n += 100
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("case", choices=CASES)
    p.add_argument("--seconds", type=float, default=None, help="how long spin() runs (default 5 on a GPU)")
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    if args.seconds is not None and args.seconds <= 0:
        raise SystemExit(f"--seconds: expected > 0, got {args.seconds}")
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no GPU here (--device cpu checks the cases)")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    fn = make(args.case, args.device)
    for _ in range(3 if not cuda else 50):  # (the first two sightings of a call pattern: served from the third)
        fn()
    if not cuda and args.seconds is None:
        print(f"{args.case}: ran on {args.device}")
        return 0
    before = per_call_us(fn, 1000, sync)
    n = spin(fn, 5.0 if args.seconds is None else args.seconds, sync)
    after = per_call_us(fn, 1000, sync)
    print(f"{args.case}: {before:.2f} us a call before spin(), {after:.2f} after; {n} calls spun")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

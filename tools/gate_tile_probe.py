#!/usr/bin/env python3
"""``moe_gate``'s decode tiles side by side: the experts split across programs against one program (issue 13).

    python tools/gate_tile_probe.py --out OUT [--experts 32,128] [--tokens 1,2,4,8] [--rounds 3]
        [--tiles "table;1,256,0;1,1024,0"] [--host]

A tile is ``block_t,block_k,e_block`` for the CUDA-core path (``e_block`` 0: every expert in one program; ``table``:
``GATE_TILES``' row for the token count). For each GPT-OSS router (H = 2880, top-4, bf16 with a bias; ``--experts``
32 = 20B, 128 = 120B), each token count, plain and with the post-attention norm (``norm_weight``, ``residual``):

- **Numerics**: whether each tile's outputs are the first tile's bits (they must be for the same ``block_k``: the
  split keeps the K order; another ``block_k`` sums in another order);
- **Device time**: one call per replay of a CUDA graph of 20 calls, each after an L2 flush, less the flushes alone
  (``time_fn(graph=True, graph_calls=20)``), the tiles taking turns for ``--rounds``;
- **Host cost** (``--host``): the Triton wrapper's eager time (400 calls back to back, one sync) and its host time
  alone (100 calls into a drained device, not waited for), us a call: what the split's stream buffers and counters
  cost (session 25: a prepared ``moe_gate`` 22.3 / 31.7 us back to back, plain / with the norm; 14.5 / 20.7 before the
  split).

Writes ``OUT/gate_tile_probe.json`` and prints one line per case. ``--smoke`` runs a tiny case on the CPU (the
interpreter; numerics only), which the CPU tests use.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch


def _tiles(text: str) -> list[tuple[int, int, int] | None]:
    out: list[tuple[int, int, int] | None] = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        if part == "table":
            out.append(None)
            continue
        v = [int(x) for x in part.split(",")]
        if len(v) != 3 or min(v[:2]) < 1 or v[2] < 0:
            raise SystemExit(f"--tiles: expected 'table' or block_t,block_k,e_block (e_block >= 0), got {part!r}")
        out.append((v[0], v[1], v[2]))
    if not out:
        raise SystemExit("--tiles: no tile given")
    return out


def _host_us(fn) -> tuple[float, float]:
    """(eager us a call: 400 calls back to back then one sync; host us a call: 100 calls into a drained device)."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(400):
        fn()
    torch.cuda.synchronize()
    eager = (time.perf_counter() - t) / 400 * 1e6
    t = time.perf_counter()
    for _ in range(100):
        fn()
    host = (time.perf_counter() - t) / 100 * 1e6
    torch.cuda.synchronize()
    return eager, host


def _name(tile: tuple[int, int, int] | None) -> str:
    return "table" if tile is None else ",".join(map(str, tile))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--experts", default="32,128")
    p.add_argument("--tokens", default="1,2,4,8")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tiles", default="table;1,256,0;1,1024,0")
    p.add_argument("--smoke", action="store_true", help="a tiny case on the CPU, numerics only")
    p.add_argument(
        "--host", action="store_true",
        help="also each tile's eager time (400 calls of the Triton wrapper back to back, one sync) and host time only "
        "(100 calls, the device drained first and not waited for), us a call",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit(f"--rounds: expected >= 1, got {args.rounds}")
    if args.host and args.smoke:
        raise SystemExit("--host: a GPU timing, not with --smoke (the CPU run checks numerics only)")
    tiles = _tiles(args.tiles)

    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_triton._interpreter import apply_interpreter_fixes
    from tokenspeed_kernel_triton.moe import configs, route

    apply_interpreter_fixes()  # (TRITON_INTERPRET=1 only: --smoke outside the tests' conftest)

    device = torch.device("cpu" if args.smoke else "cuda")
    family = configs.family_of(device)
    hidden = 40 if args.smoke else 2880
    table = configs.GATE_TILES[family]
    results: list[dict] = []
    g = torch.Generator(device="cpu").manual_seed(0)
    for e in (int(x) for x in args.experts.split(",")):
        w = (torch.randn(e, hidden, generator=g) * 0.02).to(torch.bfloat16).to(device)
        b = (torch.randn(e, generator=g) * 0.1).to(torch.bfloat16).to(device)
        for t in (int(x) for x in args.tokens.split(",")):
            x = torch.randn(t, hidden, generator=g).to(torch.bfloat16).to(device)
            res = torch.randn(t, hidden, generator=g).to(torch.bfloat16).to(device)
            nw = (1 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16).to(device)
            for norm in (False, True):
                kw = dict(norm_weight=nw, norm_eps=1e-5, residual=res) if norm else {}
                calls = {}
                first = None
                row: dict = {"experts": e, "tokens": t, "norm": norm, "tiles": {}}
                for tile in tiles:
                    patched = table if tile is None else ((None, (tile[0], tile[1], False, tile[2])),)
                    configs.GATE_TILES[family] = patched
                    try:
                        out = route.moe_gate(x, w, b, 4, **kw)
                    finally:
                        configs.GATE_TILES[family] = table
                    same = None if first is None else all(torch.equal(a, c) for a, c in zip(out, first, strict=True))
                    first = out if first is None else first
                    row["tiles"][_name(tile)] = {"same_bits_as_first": same, "us": []}
                    if args.host:
                        row["tiles"][_name(tile)] |= {"eager_us": [], "host_us": []}

                    def call(patched=patched, kw=kw, x=x, w=w, b=b):
                        configs.GATE_TILES[family] = patched
                        try:
                            route.moe_gate(x, w, b, 4, **kw)
                        finally:
                            configs.GATE_TILES[family] = table

                    calls[_name(tile)] = call
                if not args.smoke:
                    for _ in range(args.rounds):
                        for name, call in calls.items():
                            timing = time_fn(call, device=device, graph=True, graph_calls=20, rep_ms=60)
                            row["tiles"][name]["us"].append(round(timing.median_us, 2))
                        if args.host:
                            for tile in tiles:
                                r = row["tiles"][_name(tile)]
                                patched = table if tile is None else ((None, (tile[0], tile[1], False, tile[2])),)
                                configs.GATE_TILES[family] = patched
                                try:
                                    eager, host = _host_us(
                                        lambda kw=kw, x=x, w=w, b=b: route.moe_gate(x, w, b, 4, **kw)
                                    )
                                finally:
                                    configs.GATE_TILES[family] = table
                                r["eager_us"].append(round(eager, 2))
                                r["host_us"].append(round(host, 2))
                for r in row["tiles"].values():
                    r["median_us"] = round(statistics.median(r["us"]), 2) if r["us"] else None
                    for k in ("eager_us", "host_us"):
                        if r.get(k):
                            r[f"median_{k}"] = round(statistics.median(r[k]), 2)
                results.append(row)
                print(
                    f"E={e:3d} T={t:2d} norm={int(norm)}: "
                    + "  ".join(
                        f"{n}: {r['median_us']} us {r['us']} same={r['same_bits_as_first']}"
                        + (
                            f" eager {r['median_eager_us']} host {r['median_host_us']}"
                            if "median_eager_us" in r
                            else ""
                        )
                        for n, r in row["tiles"].items()
                    ),
                    flush=True,
                )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gate_tile_probe.json"), "w") as fo:
        json.dump({"family": family, "table": [list(map(str, r)) for r in table], "results": results}, fo, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

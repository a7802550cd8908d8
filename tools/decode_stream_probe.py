#!/usr/bin/env python3
"""What bounds the decode GEMMs of ``hopper.moe_apply`` at one token (an H200 probe, issue 11).

    python tools/decode_stream_probe.py --out OUT

GPT-OSS-120B layer weights (``tools/hopper_moe_h200.py``), one token routed to 4 experts. Each
kernel below runs alone in a CUDA graph with the L2 flushed (``time_fn``) and reads the same bytes:
the gate/up codes of the 4 experts (4 x 5760 rows x 1440 bytes = 33.2 MB; the down GEMM: 16.6 MB):

- ``stream``: a plain streaming read of each expert's codes, 16 bytes a lane, many programs;
- ``pattern``: the decode GEMM's grid and addresses (32 rows x 6 K blocks of 64 bytes a program, one
  warp, 4 K splits) with no decode, no MMA and no activations: what its access pattern costs;
- ``persistent``: the same work items, loads only, in persistent programs (8-24 per SM) whose flat loop
  over their items' K blocks keeps four blocks in flight in registers across item boundaries (session 8);
- ``layer_persistent``: both GEMMs' codes (gate/up items first, then down items) as one flat item list in
  persistent programs, loads only: the streaming floor of a one-kernel layer (no wait between the GEMMs);
- ``gate_up`` / ``down``: the decode GEMMs themselves at the table's tile, PDL off (alone in the
  graph there is nothing to overlap).

Writes ``OUT/decode_stream_probe.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hopper_moe_h200 as base


@triton.jit
def _stream(w_ptr, experts_ptr, stride_e, out_ptr, n_words, WORDS: tl.constexpr, ITERS: tl.constexpr):
    """Program (expert slot, chunk): XOR of ``WORDS * ITERS`` consecutive int32 words of the expert's codes."""
    slot = tl.program_id(0)
    chunk = tl.program_id(1)
    e = tl.load(experts_ptr + slot)
    base = w_ptr + e.to(tl.int64) * stride_e
    acc = tl.zeros([WORDS], dtype=tl.int32)
    for i in range(ITERS):
        offs = (chunk * ITERS + i) * WORDS + tl.arange(0, WORDS)
        acc ^= tl.load(base + offs, mask=offs < n_words, other=0)
    tl.store(out_ptr + slot * tl.num_programs(1) + chunk, tl.reduce(acc, 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


@triton.jit
def _pattern(w_ptr, experts_ptr, stride_e, out_ptr, ROW_WORDS: tl.constexpr, NB: tl.constexpr,
             KSPLIT: tl.constexpr, BLOCK_M: tl.constexpr):  # fmt: skip
    """Program (expert slot, N tile, K split) of the decode GEMM's grid: its ``BLOCK_M`` rows, its K blocks
    (16 words a row and block), XORed."""
    slot = tl.program_id(0)
    n = tl.program_id(1)
    ks = tl.program_id(2)
    e = tl.load(experts_ptr + slot)
    base = w_ptr + e.to(tl.int64) * stride_e
    NBS: tl.constexpr = (NB + KSPLIT - 1) // KSPLIT
    rows = n * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, 16)
    acc = tl.zeros([BLOCK_M, 16], dtype=tl.int32)
    for b in range(NBS):
        blk = ks * NBS + b
        ok = blk < NB
        acc ^= tl.load(base + rows[:, None] * ROW_WORDS + blk * 16 + cols[None, :], mask=ok, other=0)
    tl.store(out_ptr + (slot * tl.num_programs(1) + n) * KSPLIT + ks, tl.reduce(tl.reduce(acc, 1, _xor), 0, _xor))


@triton.jit
def _step(w13_ptr, w2_ptr, experts_ptr, stride13, stride2, s, pid, progs, n13, n_items, ROW_WORDS: tl.constexpr,
          NB: tl.constexpr, NT13: tl.constexpr, NT2: tl.constexpr, KSPLIT: tl.constexpr,
          BLOCK_M: tl.constexpr):  # fmt: skip
    """Flat step ``s`` of program ``pid``: its item's K block of ``BLOCK_M`` rows (zeros past the last item). Items
    ``0 .. n13`` are (expert slot, N tile, K split) of ``w13``, the rest those of ``w2`` (both GEMMs have K = 2880,
    so the same row words and blocks); one GEMM alone: ``n13 = n_items``."""
    NBS: tl.constexpr = (NB + KSPLIT - 1) // KSPLIT
    item = pid + (s // NBS) * progs
    live = item < n_items
    gu = item < n13
    it = tl.where(gu, item, item - n13)
    nt = tl.where(gu, NT13, NT2)
    slot = it // (nt * KSPLIT)
    n = (it // KSPLIT) % nt
    blk = (it % KSPLIT) * NBS + s % NBS
    e = tl.load(experts_ptr + slot, mask=live, other=0)
    rows = n * BLOCK_M + tl.arange(0, BLOCK_M)
    base = tl.where(gu, w13_ptr, w2_ptr) + e.to(tl.int64) * tl.where(gu, stride13, stride2)
    ptrs = base + rows[:, None] * ROW_WORDS + blk * 16 + tl.arange(0, 16)[None, :]
    return tl.load(ptrs, mask=live & (blk < NB), other=0)


@triton.jit
def _persistent(w13_ptr, w2_ptr, experts_ptr, stride13, stride2, out_ptr, n13, n_items, progs,
                ROW_WORDS: tl.constexpr, NB: tl.constexpr, NT13: tl.constexpr, NT2: tl.constexpr,
                KSPLIT: tl.constexpr, BLOCK_M: tl.constexpr, ITEMS: tl.constexpr):  # fmt: skip
    """The decode GEMMs' work items (:func:`_step`), loads only, in persistent programs: program ``pid`` takes items
    ``pid, pid + progs, ...`` and runs their K blocks as one flat loop with four blocks in flight in registers, across
    item boundaries (the design a whole-layer streaming kernel would have). ``progs``: the grid size; ``ITEMS``:
    ``cdiv(n_items, progs)`` (a program's last item may not exist)."""
    pid = tl.program_id(0)
    NBS: tl.constexpr = (NB + KSPLIT - 1) // KSPLIT
    acc = tl.zeros([BLOCK_M, 16], dtype=tl.int32)
    a = (w13_ptr, w2_ptr, experts_ptr, stride13, stride2)
    c0 = _step(*a, 0, pid, progs, n13, n_items, ROW_WORDS, NB, NT13, NT2, KSPLIT, BLOCK_M)
    c1 = _step(*a, 1, pid, progs, n13, n_items, ROW_WORDS, NB, NT13, NT2, KSPLIT, BLOCK_M)
    c2 = _step(*a, 2, pid, progs, n13, n_items, ROW_WORDS, NB, NT13, NT2, KSPLIT, BLOCK_M)
    c3 = _step(*a, 3, pid, progs, n13, n_items, ROW_WORDS, NB, NT13, NT2, KSPLIT, BLOCK_M)
    for s in range(0, ITEMS * NBS, 4):
        acc ^= c0
        c0 = _step(*a, s + 4, pid, progs, n13, n_items, ROW_WORDS, NB, NT13, NT2, KSPLIT, BLOCK_M)
        acc ^= c1
        c1 = _step(*a, s + 5, pid, progs, n13, n_items, ROW_WORDS, NB, NT13, NT2, KSPLIT, BLOCK_M)
        acc ^= c2
        c2 = _step(*a, s + 6, pid, progs, n13, n_items, ROW_WORDS, NB, NT13, NT2, KSPLIT, BLOCK_M)
        acc ^= c3
        c3 = _step(*a, s + 7, pid, progs, n13, n_items, ROW_WORDS, NB, NT13, NT2, KSPLIT, BLOCK_M)
    tl.store(out_ptr + pid, tl.reduce(tl.reduce(acc, 1, _xor), 0, _xor))


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.hopper.moe import decode, layer

    tk.load_plugins()
    act = tk.MoEActivation()
    gen = torch.Generator().manual_seed(1234)
    w = base._weights(base.E, base.H, base.I, gen)
    experts = torch.tensor([3, 40, 77, 118], dtype=torch.int32, device="cuda")
    ids = experts.view(1, 4)
    tw = torch.full((1, 4), 0.25, device="cuda")
    x = torch.randn(1, base.H, generator=gen).to(torch.bfloat16).cuda()
    res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__}
    n13, k13 = w.w13.shape[1], w.w13.shape[2]  # rows, bytes a row
    n2, k2 = w.w2.shape[1], w.w2.shape[2]
    bytes13, bytes2 = 4 * n13 * k13, 4 * n2 * k2
    res["bytes"] = {"gate_up": bytes13, "down": bytes2}
    rows = {}

    def timed(name, fn, nbytes):
        us = time_fn(fn, device="cuda", graph=True, warmup_ms=5, rep_ms=40).median_us
        rows[name] = {"us": us, "tb_s": nbytes / (us * 1e-6) / 1e12}
        print(name, rows[name], flush=True)

    for label, wt, n, k, nbytes in (("gate_up", w.w13, n13, k13, bytes13), ("down", w.w2, n2, k2, bytes2)):
        words = n * k // 4
        w32 = wt.view(torch.int32)
        for wpp, iters in ((1024, 8), (2048, 4), (512, 16)):
            chunks = triton.cdiv(words, wpp * iters)
            out = torch.empty(4 * chunks, dtype=torch.int32, device="cuda")
            timed(f"{label}_stream_{wpp}x{iters}",
                  lambda out=out, chunks=chunks, wpp=wpp, iters=iters, w32=w32, words=words: _stream[(4, chunks)](
                      w32, experts, w32.stride(0), out, words, WORDS=wpp, ITERS=iters, num_warps=4),
                  nbytes)  # fmt: skip
        for block_m, ksplit, warps in ((32, 4, 1), (32, 1, 1), (64, 4, 4), (128, 2, 4)):
            nt = triton.cdiv(n, block_m)
            out = torch.empty(4 * nt * ksplit, dtype=torch.int32, device="cuda")
            timed(
                f"{label}_pattern_{block_m}rows_{ksplit}splits_{warps}warps",
                lambda out=out, nt=nt, block_m=block_m, ksplit=ksplit, warps=warps, w32=w32, k=k: _pattern[
                    (4, nt, ksplit)
                ](
                    w32,
                    experts,
                    w32.stride(0),
                    out,
                    ROW_WORDS=k // 4,
                    NB=k // 64,
                    KSPLIT=ksplit,
                    BLOCK_M=block_m,
                    num_warps=warps,
                ),
                4 * n * (k // 64) * 64,
            )  # fmt: skip  (the 32-byte K tail of a row is not read)
        for block_m, ksplit, progs, warps, stages in ((32, 4, 132 * 8, 1, 1), (32, 4, 132 * 16, 1, 1),
                                                      (32, 4, 132 * 24, 1, 1), (64, 4, 132 * 4, 4, 1),
                                                      (32, 1, 132 * 8, 1, 1)):  # fmt: skip
            nt = triton.cdiv(n, block_m)
            out = torch.empty(progs, dtype=torch.int32, device="cuda")
            timed(f"{label}_persistent_{block_m}rows_{ksplit}splits_{progs}progs_{warps}warps_{stages}stages",
                  lambda out=out, nt=nt, block_m=block_m, ksplit=ksplit, progs=progs, warps=warps, stages=stages,
                  w32=w32, k=k, items=4 * nt * ksplit: _persistent[(progs,)](
                      w32, w32, experts, w32.stride(0), w32.stride(0), out, items, items, progs, ROW_WORDS=k // 4,
                      NB=k // 64, NT13=nt, NT2=nt, KSPLIT=ksplit, BLOCK_M=block_m, ITEMS=triton.cdiv(items, progs),
                      num_warps=warps, num_stages=stages),
                  4 * n * (k // 64) * 64)  # fmt: skip
    assert k13 == k2, "the layer rows assume both GEMMs share K"
    w13_32, w2_32 = w.w13.view(torch.int32), w.w2.view(torch.int32)
    for block_m, ksplit, progs in ((32, 4, 132 * 8), (32, 4, 132 * 16), (32, 4, 132 * 24), (32, 2, 132 * 16)):
        nt13, nt2 = triton.cdiv(n13, block_m), triton.cdiv(n2, block_m)
        n13_items, n_items = 4 * nt13 * ksplit, 4 * (nt13 + nt2) * ksplit
        out = torch.empty(progs, dtype=torch.int32, device="cuda")
        timed(f"layer_persistent_{block_m}rows_{ksplit}splits_{progs}progs",
              lambda out=out, nt13=nt13, nt2=nt2, n13_items=n13_items, n_items=n_items, block_m=block_m,
              ksplit=ksplit, progs=progs: _persistent[(progs,)](
                  w13_32, w2_32, experts, w13_32.stride(0), w2_32.stride(0), out, n13_items, n_items, progs,
                  ROW_WORDS=k13 // 4, NB=k13 // 64, NT13=nt13, NT2=nt2, KSPLIT=ksplit, BLOCK_M=block_m,
                  ITEMS=triton.cdiv(n_items, progs), num_warps=1, num_stages=1),
              4 * (n13 + n2) * (k13 // 64) * 64)  # fmt: skip
    decode.PDL_ENABLED = False
    gu, dn = layer._tiles(1)
    flat_ids, flat_w = ids.reshape(-1).contiguous(), tw.reshape(-1).contiguous()
    ws = torch.empty(gu[4], 4, n13, dtype=torch.float32, device="cuda")
    inter = torch.randn(4, base.I, device="cuda").to(torch.bfloat16)
    y = torch.empty(dn[4], 4, base.H, dtype=torch.float32, device="cuda")
    common = dict(pairs=4, k=4, activation=act, two_step=False)
    timed("gate_up_gemm", lambda: layer._launch(x, flat_ids, w.w13, w.w13_scale, w.w13_bias, flat_w, ws, gate_up=True,
                                                interleaved=True, tile=gu, **common), bytes13)  # fmt: skip
    timed("down_gemm", lambda: layer._launch(inter, flat_ids, w.w2, w.w2_scale, w.w2_bias, flat_w, y, gate_up=False,
                                             interleaved=True, tile=dn, **common), bytes2)  # fmt: skip
    res["tiles"] = [list(gu), list(dn)]
    res["rows"] = rows
    with open(os.path.join(args.out, "decode_stream_probe.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

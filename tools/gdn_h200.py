#!/usr/bin/env python3
"""Gated delta rule on the H200: fp32 product modes probed for faults, and the prefill tiles swept
next to flash-linear-attention in the same process.

    python tools/gdn_h200.py probe --out OUT   # each (fp32 mode, shape) in its own process
    python tools/gdn_h200.py sweep --out OUT   # full-op time per tile config, fla beside it

probe: fp32 inputs through ``tokenspeed_kernel_triton.linear_attention`` with the dot mode
forced (0 = TF32 tensor cores, 1 = IEEE fp32; the 2026-12-01 run in
docs/benchmarks/h200-2026-12-01/gdn/ also probed a 3xTF32 mode, removed after it faulted),
in a child process each
(an illegal address poisons the CUDA context); reports the max error over the max of
the recurrence reference, or the crash.
sweep: Qwen3-Next shapes (16 q/k heads, 32 value heads, K = V = 128, l2norm, bf16, final
state); each kernel's tile varied with the other two at the table's, timed with
``time_fn`` (CUDA events, L2 flushed, median), the whole op; fla's chunk_gated_delta_rule
on the same inputs. Writes OUT/gdn_probe.json / OUT/gdn_sweep.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

PROBES = [
    (43, 2, 4, 16, 16, False),
    (70, 1, 2, 16, 32, False),
    (300, 4, 4, 64, 64, True),
    (4096, 16, 32, 128, 128, True),
]


def _probe_one(mode: int, shape: tuple) -> dict:
    import torch

    from tokenspeed_kernel.reference.linear_attention import gdn_recurrent
    from tokenspeed_kernel_triton import linear_attention as la

    la.dot_mode = lambda dtype, device: mode
    t, h, hv, dk, dv, varlen = shape
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(t, h, dk, device="cuda", generator=g)
    k = torch.randn(t, h, dk, device="cuda", generator=g)
    v = torch.randn(t, hv, dv, device="cuda", generator=g)
    gate = -(torch.rand(t, hv, device="cuda", generator=g) * 0.49 + 0.01)
    beta = torch.sigmoid(torch.randn(t, hv, device="cuda", generator=g))
    cu = torch.tensor([0, t // 3, t], dtype=torch.int32, device="cuda") if varlen else None
    o, f = la.gdn_chunk_prefill(q, k, v, gate, beta, scale=dk**-0.5, initial_state=None, cu_seqlens=cu,
                                output_final_state=True, use_qk_l2norm=True, out=None)  # fmt: skip
    torch.cuda.synchronize()
    ro, rf = gdn_recurrent(q, k, v, gate, beta, scale=dk**-0.5, cu_seqlens=cu, use_qk_l2norm=True)
    rel = lambda a, b: float((a - b).abs().max() / b.abs().max())
    rms = lambda a, b: float((a - b).abs().max() / b.pow(2).mean().sqrt())
    return {"out_rel_max": rel(o, ro), "out_err_over_rms": rms(o, ro), "state_err_over_rms": rms(f, rf)}


def probe(out: Path) -> None:
    results = []
    for mode in (0, 1):
        for shape in PROBES:
            code = f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import gdn_h200 as m; print(json.dumps(m._probe_one({mode}, {shape!r})))"
            run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
            row = {"mode": mode, "shape": shape}
            if run.returncode == 0:
                row.update(json.loads(run.stdout.strip().splitlines()[-1]))
            else:
                row["error"] = (
                    run.stderr.strip().splitlines()[-1][:300] if run.stderr.strip() else f"rc {run.returncode}"
                )
            print(json.dumps(row), flush=True)
            results.append(row)
    (out / "gdn_probe.json").write_text(json.dumps(results, indent=1))


def _sweep_shape(lengths: tuple[int, ...], timing: dict) -> list[dict]:
    import torch

    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel_nvidia.fla.linear_attention import gdn_chunk_prefill as fla_prefill
    from tokenspeed_kernel_triton import linear_attention as la
    from tokenspeed_kernel_triton.linear_attention import GdnPrefillConfig, GdnTile

    h, hv, dk, dv = 16, 32, 128, 128
    states = [GdnTile(32, 4, 3), GdnTile(32, 4, 2), GdnTile(32, 8, 2), GdnTile(64, 8, 2), GdnTile(64, 4, 2),
              GdnTile(16, 4, 3)]  # fmt: skip
    outs = [GdnTile(128, 8, 2), GdnTile(64, 4, 2), GdnTile(128, 4, 2), GdnTile(64, 8, 2)]
    wys = [GdnTile(128, 8, 2), GdnTile(64, 4, 2), GdnTile(128, 4, 2), GdnTile(64, 8, 1)]
    t = sum(lengths)
    g = torch.Generator(device="cuda").manual_seed(t)
    q = torch.randn(t, h, dk, device="cuda", generator=g).bfloat16()
    k = torch.randn(t, h, dk, device="cuda", generator=g).bfloat16()
    v = torch.randn(t, hv, dv, device="cuda", generator=g).bfloat16()
    gate = -(torch.rand(t, hv, device="cuda", generator=g) * 0.49 + 0.01)
    beta = torch.sigmoid(torch.randn(t, hv, device="cuda", generator=g))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    kw = dict(scale=dk**-0.5, initial_state=None, cu_seqlens=cu, output_final_state=True, use_qk_l2norm=True,
              out=None)  # fmt: skip
    base = la.gdn_prefill_config(len(lengths) * hv, q.device)
    configs = [("table", base)]
    configs += [(f"state={s}", GdnPrefillConfig(base.wy, s, base.out)) for s in states if s != base.state]
    configs += [(f"out={o}", GdnPrefillConfig(base.wy, base.state, o)) for o in outs if o != base.out]
    configs += [(f"wy={w}", GdnPrefillConfig(w, base.state, base.out)) for w in wys if w != base.wy]

    def ours(cfg):
        return la.gdn_chunk_prefill_with_config(q, k, v, gate, beta, **kw, config=cfg)

    fla_us = time_fn(lambda: fla_prefill(q, k, v, gate, beta, **kw), **timing).median_us
    rows = []
    for name, cfg in configs:
        try:
            us = time_fn(functools.partial(ours, cfg), **timing).median_us
        except Exception as exc:
            us, name = None, f"{name} failed: {type(exc).__name__}: {str(exc)[:200]}"
        row = {"seqlens": f"{len(lengths)}x{lengths[0]}", "config": name, "us": us, "fla_us": fla_us,
               "speedup_vs_fla": None if us is None else fla_us / us}  # fmt: skip
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def sweep(out: Path) -> None:
    timing = {"device": "cuda", "warmup_ms": 10.0, "rep_ms": 60.0}
    rows = []
    for lengths in ((16384,), (8 * (2048,)), (32 * (512,)), (4096,)):
        rows += _sweep_shape(lengths, timing)
    (out / "gdn_sweep.json").write_text(json.dumps(rows, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("probe", "sweep"))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    probe(out) if args.what == "probe" else sweep(out)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

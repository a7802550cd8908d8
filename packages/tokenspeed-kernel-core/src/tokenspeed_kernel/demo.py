"""``tokenspeed-kernel demo``: one GPT-OSS decoder layer through the public API.

Runs a prefill of a ragged batch and one decode step, first with full selection,
then with every op forced to the PyTorch reference, and prints per op: the kernel
selection chose, its time (from the ``kernel_scope`` ranges in a torch profiler
trace), and the layer's max error against the reference run.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.models import gpt_oss as model


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="run one GPT-OSS decoder layer through the public API")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--config", choices=("auto", "tiny", "20b"), default="auto", help="tiny on CPU, 20b on GPU")
    p.add_argument("--seqlens", default=None, help="comma-separated prompt lengths (default: 40,7,25 / 2048x4)")
    p.add_argument("--layer", type=int, default=0, help="layer index (even = sliding window, odd = full)")
    p.set_defaults(func=run)


def _inputs(cfg, seqlens, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    total = sum(seqlens)
    x = torch.randn(total, cfg.hidden_size, generator=g).to(torch.bfloat16).to(device)
    positions = torch.cat([torch.arange(n) for n in seqlens]).to(device)
    cu = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    x_new = torch.randn(len(seqlens), cfg.hidden_size, generator=g).to(torch.bfloat16).to(device)
    return x, positions, cu, x_new


def _run_layer(cfg, layer, seqlens, device, cos_sin):
    """Prefill then one decode step; returns (prefill output, decode output)."""
    x, positions, cu, x_new = _inputs(cfg, seqlens, device)
    page = 16
    max_pages = -(-(max(seqlens) + 1) // page)
    cache = model.PagedKVCache(
        cfg, num_layers=layer.index + 1, num_pages=len(seqlens) * max_pages, page_size=page,
        max_batch=len(seqlens), max_pages_per_seq=max_pages, device=device,
    )  # fmt: skip
    slots = torch.cat([cache.reserve(b, n) for b, n in enumerate(seqlens)])
    y = model.layer_prefill(cfg, layer, x, positions, cu, max(seqlens), cos_sin, cache, slots)
    new_slots = torch.cat([cache.reserve(b, 1) for b in range(len(seqlens))])
    seqlens_now = torch.tensor(cache.seqlens, dtype=torch.int32, device=device)
    z = model.layer_decode(
        cfg, layer, x_new, seqlens_now.long() - 1, cos_sin, cache, new_slots, seqlens_now, cache.page_table
    )
    return y, z


def _profile(fn, device):
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        result = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    times: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for ev in prof.key_averages():
        if ev.key.startswith("tokenspeed_kernel::"):
            t = ev.device_time_total if device.type == "cuda" else ev.cpu_time_total
            times[ev.key] += t
            calls[ev.key] += ev.count
    return result, times, calls


def run(args: argparse.Namespace) -> int:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    big = args.config == "20b" or (args.config == "auto" and device.type == "cuda")
    cfg = model.GptOssConfig.gpt_oss_20b() if big else model.GptOssConfig.tiny()
    seqlens = [int(s) for s in args.seqlens.split(",")] if args.seqlens else ([2048] * 4 if big else [40, 7, 25])
    platform = tk.current_platform() if device.type == "cuda" else tk.make_platform("cpu")
    kind = "sliding window" if cfg.layer_type(args.layer) == "sliding_attention" else "full attention"
    print(f"GPT-OSS {'20B' if big else 'tiny'} layer {args.layer} ({kind}) on {platform.describe()}")
    print(f"prefill of {len(seqlens)} sequences ({','.join(map(str, seqlens))} tokens), then one decode step\n")

    layer = model.random_layer(cfg, args.layer, device=device)
    layer.moe_plan = tk.moe_plan(layer.experts, cfg.activation, dtype=torch.bfloat16, device=device)
    layer.experts = tk.moe_process_weights(layer.moe_plan, layer.experts)
    cos_sin = model.yarn_cos_sin_cache(cfg, max(seqlens) + 2, device)

    # Warm-up under the profiler too: kernels compile / load, and the profiler's own start-up cost goes.
    _profile(lambda: _run_layer(cfg, layer, seqlens, device, cos_sin), device)
    t0 = time.perf_counter()
    (y, z), times, calls = _profile(lambda: _run_layer(cfg, layer, seqlens, device, cos_sin), device)
    elapsed = time.perf_counter() - t0

    ref_layer = model.random_layer(cfg, args.layer, device=device)
    with tk.kernel_override("reference"):
        t1 = time.perf_counter()
        (y_ref, z_ref), ref_times, _ = _profile(lambda: _run_layer(cfg, ref_layer, seqlens, device, cos_sin), device)
        ref_elapsed = time.perf_counter() - t1

    by_op: dict[str, list[str]] = defaultdict(list)
    for key in times:
        _, op, kernel = key.split("::")
        by_op[op].append(kernel)
    ref_by_op = {key.split("::")[1]: t for key, t in ref_times.items()}
    print(f"{'op':<26} {'kernel':<36} {'calls':>5} {'time us':>10} {'reference us':>13}")
    for key in sorted(times, key=lambda k: -times[k]):
        _, op, kernel = key.split("::")
        print(f"{op:<26} {kernel:<36} {calls[key]:>5} {times[key]:>10.1f} {ref_by_op.get(op, float('nan')):>13.1f}")
    err_prefill = (y.float() - y_ref.float()).abs().max().item()
    err_decode = (z.float() - z_ref.float()).abs().max().item()
    scale = y_ref.float().abs().max().item()
    print(f"\nlayer wall time (profiled): selected {elapsed * 1e3:.1f} ms, reference {ref_elapsed * 1e3:.1f} ms")
    print(f"max |error| vs reference: prefill {err_prefill:.4g}, decode {err_decode:.4g} (output max {scale:.3g})")
    tolerance = 0.05 * max(scale, 1.0)
    ok = err_prefill <= tolerance and err_decode <= tolerance
    print("OK" if ok else f"MISMATCH (tolerance {tolerance:.3g})")
    return 0 if ok else 1

#!/usr/bin/env python3
"""Where the host time of an eager call goes, on a GPU machine (issue: host cost).

Times, per call (back-to-back calls, one sync at the end), the layers of one
Triton launch (the JIT path, its binder, the compiled kernel's launcher, the C
launch alone), the torch primitives a wrapper uses (empty, current stream), the
public ops at GPT-OSS decode sizes, and an eager vs CUDA-graph decode step of a
2-layer GPT-OSS-20B-shaped model; writes cProfile tables of the eager calls.

    python tools/host_probe.py --out /tmp/probe     # JSON + prof-*.txt in --out
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import io
import json
import os
import pstats
import time

import torch


def _timers():
    """The timing helpers of ``bench --host``, loaded from this checkout's file: the probe also runs
    against older installed packages (``--before``), which do not have them."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "packages", "tokenspeed-kernel-core", "src",
                        "tokenspeed_kernel", "benchmark", "host.py")  # fmt: skip
    spec = importlib.util.spec_from_file_location("_host_timers", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def per_call_us(fn, n: int = 1000) -> float:
    return _timers().per_call_us(fn, n, torch.device("cuda"))


def graph_us(fn, n: int = 400) -> float:
    return _timers().graph_us(fn, n)


def profile(out: str, name: str, fn, n: int = 300) -> None:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    with open(os.path.join(out, f"prof-{name}.txt"), "w") as f:
        f.write(f"{n} calls\n" + s.getvalue())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument(
        "--decode-configs", default="full,triton,hopper.moe_apply",
        help="selection configs (full, triton, op=kernel: one op forced, or a moe_apply kernel); a +plan suffix gives each step an attention plan "
        "(code that has tk.mha_plan: not the old wheels of gpu_session.sh host-before); +prepared decodes through "
        "prepared calls (GptOssModel(prepared_decode=True); not in the old wheels either); both: full+prepared+plan",
    )  # fmt: skip
    p.add_argument("--skip-ops", action="store_true", help="only the decode steps")
    p.add_argument("--rounds", type=int, default=3, help="round-robin rounds of the decode-step configs")
    p.add_argument("--profile", action="store_true", help="cProfile tables of the decode steps")
    p.add_argument(
        "--parts", action="store_true",
        help="device time of the fused decode ops against the pairs they replace (CUDA graphs), and host time only "
        "(the device drained first, not waited for) of the MoE layer's call and its pieces, and of launches while the "
        "GPU is busy",
    )  # fmt: skip
    p.add_argument(
        "--gc", action="store_true",
        help="the decode steps' eager rounds again, alternated with rounds under gc.freeze() (every object made so far "
        "moved out of the collector's generations, as serving engines do after warm-up)",
    )  # fmt: skip
    p.add_argument(
        "--sites", action="store_true",
        help="in-situ host time of every op call of the decode steps (each call timed where the model makes it; "
        "the rest of the step is the model's own Python): a table per config",
    )  # fmt: skip
    p.add_argument(
        "--spin", type=float, default=0.0, metavar="SECONDS",
        help="after warm-up, run each config's eager step back to back for SECONDS (one sync a step) inside spin(), then "
        "exit: for a sampling profiler attached to the process (py-spy record ... -- python tools/host_probe.py ...)",
    )  # fmt: skip
    p.add_argument(
        "--ab-plans", action="store_true",
        help="the decode steps' eager rounds again, alternated in one process with rounds whose launch-plan replays "
        "fall back to the kernels' wrappers (a recording marked open: what a prepared call ran before launch plans)",
    )  # fmt: skip
    p.add_argument(
        "--ab-eager-graphs", action="store_true",
        help="the decode steps' eager rounds again, alternated in one process with rounds under no_eager_graphs() "
        "(the Hopper MoE's calls launch their kernels through its wrapper instead of replaying its eager graphs)",
    )  # fmt: skip
    p.add_argument(
        "--ab-moe-keys", action="store_true",
        help="the decode steps with the MoE weights' memo keys and without (public moe_apply calls served by a "
        "prepared call, or bound and selected each time), alternated in one process",
    )  # fmt: skip
    p.add_argument(
        "--ab", action="store_true",
        help="in one process, alternated: moe_apply at one token with its in-place eager graph and with the copying "
        "one; a torch add + rmsnorm against rmsnorm(residual=) (host time only; then the decode steps)",
    )  # fmt: skip
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import tokenspeed_kernel as tk
    from tokenspeed_kernel_triton import rmsnorm as rn

    res: dict[str, float] = {}

    def rec(name, fn, n=1000):
        res[name] = per_call_us(fn, n)
        print(f"{name:40s} {res[name]:8.2f} us", flush=True)

    d, bf = "cuda", torch.bfloat16
    dev = torch.cuda.current_device()
    x = torch.randn(1, 2880, device=d, dtype=bf)
    w = torch.ones(2880, device=d, dtype=bf)
    a = (x, None, w, torch.empty_like(x), None, 1, 2880, 2880, 0, 2880, 0, 1e-5)
    kw = dict(HAS_RESIDUAL=False, ONE_PASS=True, BLOCK=4096, BLOCK_TAIL=0, ROWS=1, num_warps=8)
    kern = rn._rmsnorm_kernel
    if not args.skip_ops:
        ops_probe(args, res, rec, tk, kern, a, kw, x, w, dev)
    if args.ab:
        ab_probe(res, tk, d, bf)
    if args.parts:
        parts_probe(res, tk, d, bf)
    decode_steps(args, res, rec, tk, d, bf)


class _TimedCall:
    """A call wrapped to add its host time (ns) and count to ``acc[key]``."""

    __slots__ = ("acc", "fn", "key")

    def __init__(self, fn, acc: dict, key) -> None:
        self.fn, self.acc, self.key = fn, acc, key

    def __call__(self, *args, **kwargs):
        t = time.perf_counter_ns()
        r = self.fn(*args, **kwargs)
        e = self.acc[self.key]
        e[0] += time.perf_counter_ns() - t
        e[1] += 1
        return r


class _TimedOps:
    """An ops namespace whose every op call is timed under key (op name, i-th call of the step)."""

    def __init__(self, ops, acc: dict) -> None:
        self._ops, self._acc, self._fns = ops, acc, {}

    def __getattr__(self, name):
        fn = self._fns.get(name)
        if fn is None:
            fn = self._fns[name] = _TimedCall(getattr(self._ops, name), self._acc, name)
        return fn


def sites_table(out: str, res: dict, name: str, step, model, steps: int = 20) -> None:
    """Host time of each op call of a decode step where the model makes it (``--sites``): per op, calls a step
    and us a call; the step's remainder is the model's and the runner's own Python (views, gathers, adds)."""
    import collections

    acc: dict = collections.defaultdict(lambda: [0, 0])
    saved = model.ops
    prepared = []
    if model.prepared_decode:
        for sites_list in model._decode_sites.values():
            for sites in sites_list:
                calls = sites._calls
                prepared.append((calls, list(calls)))
                calls[:] = [(op, _TimedCall(call, acc, op)) for op, call in calls]
    else:
        model.ops = _TimedOps(saved, acc)
    try:
        step()  # (a plain model's first timed step re-enters every op through the proxy)
        acc.clear()
        torch.cuda.synchronize()
        t = time.perf_counter_ns()
        for _ in range(steps):
            step()
        total = (time.perf_counter_ns() - t) / steps / 1e3
        torch.cuda.synchronize()
    finally:
        model.ops = saved
        for calls, orig in prepared:
            calls[:] = orig
    rows = sorted(((op, ns / steps / 1e3, n / steps) for op, (ns, n) in acc.items()), key=lambda r: -r[1])
    in_ops = sum(r[1] for r in rows)
    table = {
        "step host us": total, "op calls host us": in_ops, "rest host us": total - in_ops,
        "ops": {op: {"calls per step": c, "us per step": us, "us per call": us / c} for op, us, c in rows},
    }  # fmt: skip
    res[f"sites {name}"] = table
    lines = [f"{name}: step {total:.0f} us host, op calls {in_ops:.0f} us, rest {total - in_ops:.0f} us"]
    lines += [f"  {op:28s} {c:6.1f} calls {us:8.1f} us/step {us / c:7.2f} us/call" for op, us, c in rows]
    print("\n".join(lines), flush=True)
    with open(os.path.join(out, "sites.txt"), "a") as f:
        f.write("\n".join(lines) + "\n")


def host_only_us(fn, n: int = 100) -> float:
    """Host time per call of ``n`` calls, the device drained before and not waited for inside: a call whose
    device time exceeds its host time (the MoE layer at one token) would otherwise time the device."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def busy_host_us(fn, n: int = 100) -> float:
    """Host time per call of ``n`` calls made while the GPU runs a long kernel queued first (launches into a busy
    device, as an eager decode step's are when the device runs behind)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time: longer than the timed calls
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def parts_probe(res, tk, d, bf) -> None:
    """``--parts``: device time of the fused decode ops and of the pairs they replace; host time of the MoE call and
    its pieces; host time of small launches into an idle and a busy GPU."""
    import statistics

    from tokenspeed_kernel.models import gpt_oss as m

    cfg = m.GptOssConfig.gpt_oss_20b().with_layers(1)
    model = m.GptOssModel(cfg, m.random_weights(cfg, device=torch.device(d), seed=0), max_positions=4096)
    lay = model.layers[0]
    x = torch.randn(1, cfg.hidden_size, device=d, dtype=bf)
    rw, rb = lay.router_weight, lay.router_bias
    resid = torch.randn_like(x)
    qkv = torch.randn(1, 80 * 64, device=d, dtype=bf)
    q, k, v = qkv.view(1, 80, 64).split_with_sizes([64, 8, 8], dim=1)
    cache = model.new_cache(1, 4096)
    cache.reserve(0, 2048)
    kc, vc = cache.k[0], cache.v[0]
    pos = torch.tensor([2000], device=d)
    slots = torch.tensor([2000], device=d)
    cs = model.cos_sin
    pt = cache.page_table[:1]
    cl = torch.tensor([2001], device=d, dtype=torch.int32)  # the new token at position 2000, as pos / slots
    # layer 0 is a sliding-window layer (window_left 127); -1: a full layer's
    attention = {
        f"window {w}": dict(window_left=w, sinks=lay.sinks) for w in (cfg.window_left(lay.index), -1)
    }  # fmt: skip
    device_cases = {}
    for name, akw in attention.items():
        device_cases[f"mha_decode_append_kvcache, {name}"] = functools.partial(
            tk.mha_decode_append_kvcache, q, k, v, kc, vc, pt, cl, cos_sin_cache=cs, style="neox", **akw
        )
        device_cases[f"apply_rotary_and_store + mha_decode_with_kvcache, {name}"] = lambda akw=akw: (
            tk.mha_decode_with_kvcache(
                tk.apply_rotary_and_store(q, k, v, cs, pos, kc, vc, slots, style="neox"), kc, vc, pt, cl, **akw
            )
        )
    device_cases |= {
        "moe_gate": lambda: tk.moe_gate(x, rw, rb, 4),
        "moe_gate with the norm": lambda: tk.moe_gate(
            x, rw, rb, 4, norm_weight=lay.post_norm, norm_eps=1e-5, residual=resid
        ),
        "rmsnorm(residual=) + moe_gate": lambda: tk.moe_gate(
            tk.rmsnorm(x, lay.post_norm, 1e-5, residual=resid)[0], rw, rb, 4
        ),
        "mm router + moe_route": lambda: tk.moe_route(tk.mm(x, rw, rb), 4),
        "apply_rotary_and_store": lambda: tk.apply_rotary_and_store(q, k, v, cs, pos, kc, vc, slots),
        "apply_rotary + kvcache_store": lambda: _rope_store_pair(tk, q, k, v, cs, pos, kc, vc, slots),
    }
    for name, fn in device_cases.items():
        res[f"parts device us {name}"] = graph_us(fn, n=200)
        print(f"parts device {name:34s} {res[f'parts device us {name}']:7.2f} us (CUDA graph)", flush=True)
    tw, ids = tk.moe_gate(x, rw, rb, 4)
    moe = tk.moe_apply.prepare(x, tw, ids, lay.experts, cfg.activation, plan=lay.moe_plan)
    for _ in range(4):
        moe(x, tw, ids, lay.experts, cfg.activation, plan=lay.moe_plan)  # captures the layer's graphs
    torch.cuda.synchronize()
    from tokenspeed_kernel_nvidia.hopper.moe import layer as hl

    graphs = hl._GRAPHS
    # A copying graph to replay alone (in-place ones write a caller's output, which may be gone): None when there is none.
    entry = next((e for e in graphs._graphs.values() if e.output is not None), None)
    host_cases = {
        "moe_apply prepared": lambda: moe(x, tw, ids, lay.experts, cfg.activation, plan=lay.moe_plan),
        "moe_apply public": lambda: tk.moe_apply(x, tw, ids, lay.experts, cfg.activation, plan=lay.moe_plan),
        **({"graph replay": entry.graph.replay, "graph output clone": entry.output.clone} if entry else {}),
        "GraphCache.usable": lambda: graphs.usable(x, tw, ids),
        "is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
        "F.rms_norm": lambda: torch.nn.functional.rms_norm(x, (2880,), lay.input_norm, 1e-5),
        "rmsnorm public": lambda: tk.rmsnorm(x, lay.input_norm, 1e-5),
        "mha_decode_append_kvcache public": next(iter(device_cases.values())),
        "moe_gate with the norm public": device_cases["moe_gate with the norm"],
        "F.linear qkv": lambda: torch.nn.functional.linear(x, lay.qkv_weight, lay.qkv_bias),
        "torch.empty_like": lambda: torch.empty_like(x),
    }
    rounds: dict[str, list[float]] = {k: [] for k in host_cases}
    busy: dict[str, list[float]] = {
        k: [] for k in ("F.rms_norm", "rmsnorm public", "F.linear qkv", "moe_apply prepared")
    }
    for _ in range(5):
        for name, fn in host_cases.items():
            rounds[name].append(host_only_us(fn))
        for name in busy:
            busy[name].append(busy_host_us(host_cases[name]))
    for name, v in rounds.items():
        res[f"parts host us {name}"] = statistics.median(v)
        print(f"parts host {name:34s} {statistics.median(v):7.2f} us (rounds {[round(t, 1) for t in v]})", flush=True)
    for name, v in busy.items():
        res[f"parts host us busy GPU {name}"] = statistics.median(v)
        print(f"parts host, GPU busy, {name:24s} {statistics.median(v):7.2f} us (rounds {[round(t, 1) for t in v]})",
              flush=True)  # fmt: skip


def _rope_store_pair(tk, q, k, v, cs, pos, kc, vc, slots):
    qr, kr = tk.apply_rotary(q, k, cs, pos)
    tk.kvcache_store(kr, v, kc, vc, slots)
    return qr


def ab_probe(res, tk, d, bf, rounds: int = 7) -> None:
    """What the in-place eager graph and the fused residual add save a call, A and B alternated in one process."""
    import statistics

    from tokenspeed_kernel.models import gpt_oss as m
    from tokenspeed_kernel_nvidia.hopper.moe import layer as hl

    cfg = m.GptOssConfig.gpt_oss_20b().with_layers(1)
    model = m.GptOssModel(cfg, m.random_weights(cfg, device=torch.device(d), seed=0), max_positions=64)
    lay = model.layers[0]
    x = torch.randn(1, cfg.hidden_size, device=d, dtype=bf)
    topk_w, topk_ids = tk.moe_route(torch.randn(1, cfg.num_local_experts, device=d), cfg.num_experts_per_tok)
    run = hl._GRAPHS.run

    def copying(key, inputs, fn, *, in_place=False):
        return run(key, inputs, fn)

    def moe():
        return tk.moe_apply(x, topk_w, topk_ids, lay.experts, cfg.activation, plan=lay.moe_plan)

    def moe_copying():
        hl._GRAPHS.run = copying
        try:
            return moe()
        finally:
            del hl._GRAPHS.run  # the class's method again

    s, nw = torch.randn_like(x), lay.input_norm
    cases = {
        "moe_apply 1 token, in-place graph": moe,
        "moe_apply 1 token, copying graph": moe_copying,
        "torch add + rmsnorm": lambda: tk.rmsnorm(x + s, nw, cfg.rms_norm_eps),
        "rmsnorm(residual=)": lambda: tk.rmsnorm(x, nw, cfg.rms_norm_eps, residual=s),
    }
    for fn in cases.values():
        for _ in range(3):
            fn()  # captures (the in-place graph at the second call of these addresses)
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for name, fn in cases.items():
            times[name].append(host_only_us(fn))
    for name, v in times.items():
        res[f"ab {name} host us"] = statistics.median(v)
        res[f"ab {name} host us rounds"] = v
        print(f"ab {name:36s} {statistics.median(v):7.1f} us host (rounds {[round(t, 1) for t in v]})", flush=True)
    res["ab hopper moe eager graphs in place"] = sum(1 for e in hl._GRAPHS._graphs.values() if not e.inputs)


def ops_probe(args, res, rec, tk, kern, a, kw, x, w, dev) -> None:
    import triton
    import triton.language as tl

    from tokenspeed_kernel.launch import cached
    from tokenspeed_kernel_triton import rmsnorm as rn

    d, bf = "cuda", torch.bfloat16
    ck = kern[(1,)](*a, **kw)
    torch.cuda.synchronize()
    rec("rmsnorm kernel, jit fn[grid]()", lambda: kern[(1,)](*a, **kw))
    _, _, _, _, binder = kern.device_caches[dev]
    rec("  binder only", lambda: binder(*a, **kw))
    ck_launch = cached(kern)
    rec("rmsnorm kernel, CachedLaunch", lambda: ck_launch[(1,)](*a, **kw))
    bound = list(binder(*a, **kw)[0].values())
    stream = torch.cuda.current_stream().cuda_stream
    run, fh, pm = ck.run, ck.function, ck.packed_metadata
    rec("  compiled.run (python launcher)", lambda: run(1, 1, 1, stream, fh, pm, None, None, None, *bound))
    launch = run.launch
    coop, pdl = run.launch_cooperative_grid, run.launch_pdl
    rec("  C launch only", lambda: launch(1, 1, 1, stream, fh, coop, pdl, None, None, pm, None, None, None, *bound))
    rec("  raw current stream", lambda: torch._C._cuda_getCurrentRawStream(dev))
    rec("  torch.cuda.current_device", torch.cuda.current_device)
    rec("  x.data_ptr()", x.data_ptr)
    rec("  x.device", lambda: x.device)
    rec("torch.empty 1x2880", lambda: torch.empty((1, 2880), dtype=bf, device=d))
    rec("torch.empty_like", lambda: torch.empty_like(x))

    @triton.jit
    def k1(p):
        tl.store(p, 1.0)

    @triton.jit
    def k6(p0, p1, p2, p3, p4, p5):
        tl.store(p0, 1.0)

    @triton.jit
    def k1i12(p, i0, i1, i2, i3, i4, i5, i6, i7, i8, i9, i10, i11):
        tl.store(p, 1.0)

    f = torch.zeros(16, device=d)
    ints = (3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25)
    for name, kk, ka in (
        ("1 tensor", k1, (f,)),
        ("6 tensors", k6, (f,) * 6),
        ("1 tensor + 12 ints", k1i12, (f, *ints)),
    ):
        c = kk[(1,)](*ka)
        rec(f"{name}: jit", lambda kk=kk, ka=ka: kk[(1,)](*ka))
        b = list(kk.device_caches[dev][4](*ka)[0].values())
        r = c.run
        rec(
            f"{name}: C launch",
            lambda r=r, c=c, b=b: r.launch(1, 1, 1, stream, c.function, False, False, None, None,
                                           c.packed_metadata, None, None, None, *b),
        )  # fmt: skip

    rec("rmsnorm, triton wrapper direct", lambda: rn.rmsnorm(x, w, 1e-5))
    rec("rmsnorm, public", lambda: tk.rmsnorm(x, w, 1e-5))
    rec("rmsnorm, bind only", lambda: tk.rmsnorm.bind(x, w, 1e-5))
    rec("F.rms_norm", lambda: torch.nn.functional.rms_norm(x, (2880,), w, 1e-5))
    profile(args.out, "rmsnorm", lambda: tk.rmsnorm(x, w, 1e-5))

    wq = torch.randn(5120, 2880, device=d, dtype=bf)
    rec("mm public (selected)", lambda: tk.mm(x, wq))
    rec("mm triton forced", lambda: tk.mm(x, wq, solution="triton"))
    rec("torch.mm", lambda: torch.mm(x, wq.t()))
    profile(args.out, "mm-triton", lambda: tk.mm(x, wq, solution="triton"))

    B, ctx, P = 1, 2048, 16
    npages = ctx // P
    kc = torch.randn(npages * B, P, 8, 64, device=d, dtype=bf)
    vc = torch.randn_like(kc)
    pt = torch.arange(npages * B, device=d, dtype=torch.int32).view(B, npages)
    cl = torch.full((B,), ctx, device=d, dtype=torch.int32)
    q = torch.randn(B, 64, 64, device=d, dtype=bf)
    sinks = torch.zeros(64, device=d)
    rec("mha_decode public", lambda: tk.mha_decode_with_kvcache(q, kc, vc, pt, cl, sinks=sinks))
    profile(args.out, "mha_decode", lambda: tk.mha_decode_with_kvcache(q, kc, vc, pt, cl, sinks=sinks))
    with open(os.path.join(args.out, "host_probe.json"), "w") as fo:
        json.dump(res, fo, indent=1)


def alternated(res: dict, steps: dict, rounds: int, variant, tag: str, names: tuple[str, str], text: str) -> None:
    """Each config's eager step timed in rounds, alternated in one process with rounds inside ``variant()``."""
    import statistics

    runs: dict[str, tuple[list[float], list[float]]] = {c: ([], []) for c in steps}
    for _ in range(rounds):
        for conf, (step, _) in steps.items():
            runs[conf][0].append(per_call_us(step, n=10))
            with variant():
                runs[conf][1].append(per_call_us(step, n=10))
    for conf, (plain, other) in runs.items():
        a, b = statistics.median(plain), statistics.median(other)
        res[f"{tag} decode step eager ({conf})"] = {names[0]: plain, names[1]: other}
        print(f"{tag} {conf}: {text.format(a=a, b=b)} (rounds {[round(v) for v in plain]} / {[round(v) for v in other]})",
              flush=True)  # fmt: skip


def spin(step, seconds: float) -> tuple[int, float]:
    """``step()`` back to back for ``seconds`` (a sync after each): the frames a profiler samples under this one."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        torch.cuda.synchronize()
        n += 1
    return n, time.perf_counter() - t0


def decode_steps(args, res, rec, tk, d, bf) -> None:
    """Eager vs graph decode step per config, the configs timed round-robin (the host drifts)."""
    import statistics

    from tokenspeed_kernel.models import gpt_oss as m

    cfg = m.GptOssConfig.gpt_oss_20b().with_layers(args.layers)
    weights = m.random_weights(cfg, device=torch.device(d), seed=0)
    steps = {}
    for conf in args.decode_configs.split(","):
        base, *suffixes = conf.split("+")
        planned = "plan" in suffixes
        prepared = "prepared" in suffixes
        unknown = set(suffixes) - {"plan", "prepared"}
        if unknown:
            raise SystemExit(f"--decode-configs: unknown suffix(es) {sorted(unknown)} in {conf!r} (+plan, +prepared)")
        if base == "full":
            make_ctx = contextlib.nullcontext
        elif base == "triton":
            make_ctx = functools.partial(tk.kernel_override, "triton")
        elif "=" in base:  # op=kernel: one op forced (mm=cublas.mm_bf16: the dense GEMMs as before eager scores)
            op_name, target = base.split("=", 1)
            make_ctx = functools.partial(tk.kernel_override, **{op_name: target})
        else:  # a moe_apply kernel forced (its weights converted by the plan)
            make_ctx = functools.partial(tk.kernel_override, moe_apply=(base, "triton.moe_apply"))
        with make_ctx():
            # (the keyword only when asked: the old wheels of host-before do not have it)
            model = m.GptOssModel(cfg, weights, max_positions=4096, **({"prepared_decode": True} if prepared else {}))
        cache = model.new_cache(1, 4096, page_size=16)
        cache.reserve(0, 4096)
        sampler = m.Sampler(m.SamplingParams(), 1, model.device)
        runner = m.DecodeRunner(model, cache, 1, sampler, cuda_graph=False, attention_plans=planned)
        runner.set_state(
            torch.zeros(1, dtype=torch.int64, device=d), torch.full((1,), 2000, dtype=torch.int64, device=d)
        )

        def step(runner=runner, make_ctx=make_ctx, planned=planned):
            with make_ctx():
                runner._step()
            # The same step again: the cache never runs out.
            if isinstance(getattr(type(runner), "positions", None), property):  # session 24 on: lengths are the state
                runner.cache_seqlens.fill_(2001)
            else:
                runner.positions.fill_(2000)
            if planned:
                runner.host_positions = [2000]

        for _ in range(3):
            step()  # compiles, captures the eager graphs of the MoE, fills every cache
        steps[conf] = (step, model)
    for conf, (_, model) in steps.items():  # which prepared calls replay a launch plan (code that has them)
        status: dict[str, int] = {}
        for sites_list in getattr(model, "_decode_sites", {}).values():
            for sites in sites_list:
                for name, call in sites._calls:
                    why = getattr(call, "plan_status", None)
                    if why is not None:
                        k = f"{name} -> {call.kernel}: {why[:160]}"
                        status[k] = status.get(k, 0) + 1
        if status:
            res[f"launch plans ({conf})"] = status
            for k, n in sorted(status.items()):
                print(f"plans {conf}: {n:3d} x {k}", flush=True)
    if args.spin:
        for conf, (step, _) in steps.items():
            n, secs = spin(step, args.spin)
            res[f"spin ({conf})"] = {"steps": n, "seconds": secs}
            print(f"spin {conf}: {n} steps in {secs:.2f} s, {secs / n * 1e6:.0f} us a step (sampled)", flush=True)
        with open(os.path.join(args.out, "host_probe.json"), "w") as fo:
            json.dump(res, fo, indent=1)
        return  # the profile is the result: no timed rounds under a sampler
    # The host's speed drifts between processes (2-3x across calls): a torch call timed around the rounds, so
    # steps of processes can be compared in its units.
    xr, wr = torch.randn(1, 2880, device=d, dtype=bf), torch.ones(2880, device=d, dtype=bf)
    proxy = [per_call_us(lambda: torch.nn.functional.rms_norm(xr, (2880,), wr, 1e-5))]
    eager: dict[str, list[float]] = {c: [] for c in steps}
    for _ in range(args.rounds):
        for conf, (step, _) in steps.items():
            eager[conf].append(per_call_us(step, n=10))
    if args.gc:
        import gc

        @contextlib.contextmanager
        def frozen():
            gc.freeze()
            try:
                yield
            finally:
                gc.unfreeze()

        alternated(
            res,
            steps,
            args.rounds,
            frozen,
            "gc",
            ("default", "frozen"),
            "eager {a:.0f} us, under gc.freeze() {b:.0f} us",
        )
    if args.ab_plans:
        from tokenspeed_kernel.core import recording

        @contextlib.contextmanager
        def replays_off():
            recording.active += 1  # every replay's guard fails: the wrapper runs, as before launch plans
            try:
                yield
            finally:
                recording.active -= 1

        alternated(res, steps, args.rounds, replays_off, "plans", ("plans", "replays off"),
                   "eager {a:.0f} us with launch plans, {b:.0f} us with replays off")  # fmt: skip
    if args.ab_eager_graphs:
        from tokenspeed_kernel.graphs import no_eager_graphs

        alternated(res, steps, args.rounds, no_eager_graphs, "eager graphs", ("graphs", "direct"),
                   "eager {a:.0f} us with eager graphs, {b:.0f} us with direct launches")  # fmt: skip
    if args.ab_moe_keys:
        layers = [layer for _, model in steps.values() for layer in model.layers]
        saved = [layer.experts.__dict__.get("__memo_key__") for layer in layers]
        if not any(k is not None for k in saved):
            raise SystemExit("--ab-moe-keys: the experts carry no memo key (code before MoE memo keys)")

        @contextlib.contextmanager
        def keys_off():
            def reset():  # (a call pattern turned off after 8 keyless calls looks again)
                tk.moe_apply._public_off.clear()
                tk.moe_apply._public_misses.clear()

            for layer in layers:  # no key: every moe_apply call binds and selects, as before MoE memo keys
                object.__setattr__(layer.experts, "__memo_key__", None)
            reset()
            try:
                yield
            finally:
                for layer, k in zip(layers, saved):
                    object.__setattr__(layer.experts, "__memo_key__", k)
                reset()

        alternated(res, steps, args.rounds, keys_off, "moe keys", ("keys", "keys off"),
                   "eager {a:.0f} us with MoE weights' memo keys, {b:.0f} us without")  # fmt: skip
    proxy.append(per_call_us(lambda: torch.nn.functional.rms_norm(xr, (2880,), wr, 1e-5)))
    res["F.rms_norm 1 x 2880 eager, before / after the rounds"] = proxy
    print(f"host proxy: F.rms_norm {proxy[0]:.1f} / {proxy[1]:.1f} us before / after the rounds", flush=True)
    for conf, (step, model) in steps.items():
        name = f"gpt-oss {args.layers}-layer decode step"
        res[f"{name} eager ({conf})"] = statistics.median(eager[conf])
        res[f"{name} eager rounds ({conf})"] = eager[conf]
        # A captured step reads the lengths on the device: a +plan config has the plain config's graph.
        res[f"{name} graph ({conf})"] = None if "+plan" in conf else graph_us(step, n=20)
        res[f"moe kernel ({conf})"] = model.layers[0].moe_plan.kernel
        g = res[f"{name} graph ({conf})"]
        print(f"{conf}: eager {res[f'{name} eager ({conf})']:.0f} us (rounds {[round(v) for v in eager[conf]]}), "
              f"graph {'-' if g is None else f'{g:.0f} us'}, MoE {res[f'moe kernel ({conf})']}", flush=True)  # fmt: skip
        if args.profile:
            profile(args.out, f"decode-step-{conf}", step, n=10)
        if args.sites:
            sites_table(args.out, res, f"{name} ({conf})", step, model)
    try:  # the MoE's eager graphs: how many, and how many read their inputs in place (code that has them)
        from tokenspeed_kernel_nvidia.hopper.moe.layer import _GRAPHS

        res["hopper moe eager graphs"] = len(_GRAPHS)
        res["hopper moe eager graphs in place"] = sum(1 for e in _GRAPHS._graphs.values() if not e.inputs)
        print(f"hopper moe eager graphs: {len(_GRAPHS)}, in place {res['hopper moe eager graphs in place']}")
        if hasattr(_GRAPHS, "stats"):
            res["hopper moe eager graph calls"] = _GRAPHS.stats()
            print(f"hopper moe eager graph calls: {_GRAPHS.stats()}")
    except ImportError:
        pass
    with open(os.path.join(args.out, "host_probe.json"), "w") as fo:
        json.dump(res, fo, indent=1)


if __name__ == "__main__":
    main()

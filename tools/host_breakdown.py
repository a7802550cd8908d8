#!/usr/bin/env python3
"""Where the host time of each decode-step op goes, on a GPU machine (issue: host cost).

For every case of ``bench --host``'s decode-step table (``HOST_CASES``) the pieces of one
eager call are timed the way ``bench --host`` times a call (back-to-back calls, one sync,
round-robin rounds, median kept):

- ``public``: the public op (keyword arguments, as ``bench --host`` calls it);
- ``bind``: the op's argument checks alone; ``memo``: the memoised checks (ops with ``memo_bind``);
- ``select``: the cached selection alone; ``prepared``: the call prepared once (``op.prepare``);
- ``direct``: the selected kernel's function with the bound arguments (wrapper + launches);
  ``direct_no_graph`` the same without the eager graph replay (``moe_apply``);

then ``cProfile`` tables of ``direct`` and ``public`` (``prof-<op>-<i>-{direct,public}.txt``),
and the costs of a launch's parts: the C launch of a 6-pointer kernel given tensors or
their addresses, ``torch.empty``.

    python tools/host_breakdown.py --out /tmp/breakdown
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from host_probe import profile  # the same cProfile table as the probe's


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--calls", type=int, default=400)
    p.add_argument("--ops", default="", help="comma-separated ops (default: every op of the decode-step table)")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)

    import tokenspeed_kernel as tk  # noqa: F401  (plugins register)
    from tokenspeed_kernel.benchmark.host import HOST_CASES, per_call_us
    from tokenspeed_kernel.numerics.cases import custom_case, get_op_cases
    from tokenspeed_kernel.numerics.inputs import make_generator

    dev = torch.device("cuda")
    ops = [o for o in args.ops.split(",") if o] or [o for o in HOST_CASES if o not in ("argmax", "top_k_top_p_sample")]
    res: dict[str, dict] = {}
    for op in ops:
        oc = get_op_cases(op)
        for i, params in enumerate(HOST_CASES[op]):
            case = custom_case(op, params, device_type="cuda")[0]
            call = oc.make(case, dev, make_generator(dev, case.seed(0)))
            thunks, kernel = _thunks(op, oc.fn, call)
            samples: dict[str, list[float]] = {k: [] for k in thunks}
            for _ in range(5):
                for k, th in thunks.items():
                    samples[k].append(per_call_us(th, args.calls // 5, dev))
            row = {k: statistics.median(v) for k, v in samples.items()}
            row["kernel"] = kernel
            row["case"] = case.describe(defaults=oc.defaults)
            res[f"{op}/{i}"] = row
            print(f"{op}/{i} {kernel}: " + " ".join(f"{k} {v:.1f}" for k, v in row.items() if isinstance(v, float)),
                  flush=True)  # fmt: skip
            for k in ("direct", "public"):
                profile(args.out, f"{op}-{i}-{k}", thunks[k], n=1000)

    res["launch"] = _launch_parts(args.calls)
    print("launch parts:", {k: round(v, 2) for k, v in res["launch"].items()}, flush=True)
    with open(os.path.join(args.out, "host_breakdown.json"), "w") as f:
        json.dump(res, f, indent=1)


def _thunks(op: str, fn, call: dict):
    """The timed pieces of one call (module doc) and the selected kernel's name."""
    from tokenspeed_kernel.core import op as opm
    from tokenspeed_kernel.core.op import NotPreparable
    from tokenspeed_kernel.core.selection import select_for_device
    from tokenspeed_kernel.graphs import no_eager_graphs

    d, sig, traits, sizes, kargs, kkwargs = fn.bind(**call)
    sel = select_for_device(op, sig, traits, sizes, d, None, None)
    thunks = {
        "public": lambda: fn(**call),
        "bind": lambda: fn.bind(**call),
        "select": lambda: select_for_device(op, sig, traits, sizes, d, None, None),
        "direct": lambda: sel.fn(*kargs, **kkwargs),
    }
    if fn.memo_bind:
        thunks["memo"] = lambda: opm._bind_memoised(fn, (), call)
    try:
        prepared = fn.prepare(**call)
        thunks["prepared"] = lambda: prepared(**call)
    except NotPreparable:  # the sampler
        pass
    if op in ("moe_apply", "top_k_top_p_sample"):  # paths that replay an eager graph: also without one

        def direct_no_graph():
            with no_eager_graphs():
                return sel.fn(*kargs, **kkwargs)

        thunks["direct_no_graph"] = direct_no_graph
    return thunks, sel.spec.name


def _launch_parts(calls: int) -> dict[str, float]:
    import triton
    import triton.language as tl

    from tokenspeed_kernel.benchmark.host import per_call_us

    @triton.jit
    def k6(p0, p1, p2, p3, p4, p5, n):
        tl.store(p0 + n, 1.0)

    dev = torch.device("cuda")
    ts = [torch.zeros(16, device="cuda") for _ in range(6)]
    ptrs = [t.data_ptr() for t in ts]
    c = k6[(1,)](*ts, 3)
    b = list(k6.device_caches[torch.cuda.current_device()][4](*ts, 3)[0].values())
    r = c.run
    stream = torch.cuda.current_stream().cuda_stream
    f, pm = c.function, c.packed_metadata

    def launch(vals):
        return lambda: r.launch(1, 1, 1, stream, f, False, False, None, None, pm, None, None, None, *vals)

    out = {
        "C launch, 6 tensors": per_call_us(launch(b), calls, dev),
        "C launch, 6 addresses": per_call_us(launch([*ptrs, 3]), calls, dev),
        "6 data_ptr() calls": per_call_us(lambda: [t.data_ptr() for t in ts], calls, dev),
        "torch.empty 1x2880 bf16": per_call_us(lambda: torch.empty((1, 2880), dtype=torch.bfloat16, device="cuda"), calls, dev),
        "torch.empty_like": per_call_us(lambda: torch.empty_like(ts[0]), calls, dev),
    }  # fmt: skip
    return out


if __name__ == "__main__":
    main()

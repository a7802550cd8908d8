"""Session 20, call 8: moe_route's served call is recorded (call 7) yet costs 19-21 us against 11.5 us for a prepared
call in bench --host. Time public / prepared / direct alternated in one process, and print the served replay's
source and how often it falls back to the wrapper."""

import statistics
import time

import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.benchmark.host import HOST_CASES
from tokenspeed_kernel.core.selection import select_for_device
from tokenspeed_kernel.numerics.cases import Case, get_op_cases
from tokenspeed_kernel.numerics.inputs import make_generator

tk.load_plugins()
dev = torch.device("cuda")


def per_call(f, n=400):
    for _ in range(10):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def probe(op: str) -> None:
    oc = get_op_cases(op)
    params = (HOST_CASES.get(op) or [{}])[0]
    case = Case.make(
        op, params.get("dtype", "bf16"), {**oc.defaults, **{k: v for k, v in params.items() if k in oc.defaults}}
    )
    call = oc.make(case, dev, make_generator(dev, 0))
    fn = getattr(tk, op)
    d, sig, traits, sizes, kargs, kkwargs = fn.bind(**call)
    sel = select_for_device(op, sig, traits, sizes, d, None, None)
    prepared = fn.prepare(**call)
    for _ in range(5):
        fn(**call)
        prepared(**call)
    [served] = [c for c in fn._public_calls.values()]
    fell = []
    for c in (served, prepared):
        plan = c.launch_plan
        if plan is not None:
            ns = plan.replay_served.__globals__
            orig = ns["_fallback"]
            ns["_fallback"] = lambda *a, _o=orig: (fell.append(1), _o(*a))[1]
    rows = {"public": [], "prepared": [], "direct": []}
    for _ in range(5):
        rows["public"].append(per_call(lambda: fn(**call)))
        rows["prepared"].append(per_call(lambda: prepared(**call)))
        rows["direct"].append(per_call(lambda: sel.fn(*kargs, **kkwargs)))
    print(op, {k: round(statistics.median(v), 1) for k, v in rows.items()}, "fallbacks:", len(fell), flush=True)
    print(served.plan_status, prepared.plan_status)
    if served.launch_plan is not None:
        print(served.launch_plan.replay_served.__source__)
        print(prepared.launch_plan.replay.__source__)


for name in ("moe_route", "rmsnorm"):
    probe(name)

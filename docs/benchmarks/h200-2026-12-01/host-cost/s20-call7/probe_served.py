"""Session 20, call 7: why `bench --host` found moe_route's public call (19.0 us) dearer than its prepared call
(11.5 us): which calls the op serves, and each prepared call's launch-plan status, for the host cases of a few ops."""

import json
import os
import time

import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.benchmark.host import HOST_CASES
from tokenspeed_kernel.numerics.cases import Case, get_op_cases
from tokenspeed_kernel.numerics.inputs import make_generator

tk.load_plugins()
dev = torch.device("cuda")
out = {}
for op in ("moe_route", "moe_dispatch", "moe_combine", "quantize_fp8", "rmsnorm"):
    oc = get_op_cases(op)
    params = (HOST_CASES.get(op) or [{}])[0]
    case = Case.make(
        op, params.get("dtype", "bf16"), {**oc.defaults, **{k: v for k, v in params.items() if k in oc.defaults}}
    )
    call = oc.make(case, dev, make_generator(dev, 0))
    fn = getattr(tk, op)
    for _ in range(6):
        fn(**call)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(400):
        fn(**call)
    torch.cuda.synchronize()
    us = (time.perf_counter() - t) / 400 * 1e6
    calls = {
        str(k)[:120]: (getattr(c, "kernel", repr(c)), getattr(c, "plan_status", None))
        for k, c in fn._public_calls.items()
    }
    row = {
        "public_us": us,
        "calls": calls,
        "seen": len(fn._public_seen),
        "off": [str(p) for p in fn._public_off],
        "misses": {str(k): v for k, v in fn._public_misses.items()},
        "args": {k: type(v).__name__ for k, v in call.items()},
    }
    print(op, json.dumps(row, default=str)[:900], flush=True)
    out[op] = row
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "served.json"), "w"), indent=1, default=str)

"""Session 29: the Python of a served public call, on the CPU: meta tensors stand in for device tensors (a memo key
never describes a CPU tensor), public serving switched on by hand (as ``test_public_calls.py``), and the served
call's own path replaced by a function that returns at once, so what is timed is ``Op.__call__`` up to that call;
then ``core.op._memo_key`` alone, which the key path computes first. Best of 5 x 100000 calls, ns a call.

    PYTHONPATH=<the packages' src folders> python public_timing.py
"""

import timeit

import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.core import op as opm
from tokenspeed_kernel.core.op import PreparedCall

opm._public_plans[0] = True
x = torch.empty(1, 2880, dtype=torch.bfloat16, device="meta")
w = torch.empty(2880, dtype=torch.bfloat16, device="meta")
op = tk.rmsnorm
for name, kwargs in (("positional", {}), ("keywords", {"weight": w, "eps": 1e-5})):
    args = (x, w, 1e-5) if not kwargs else (x,)
    for _ in range(5):
        op(*args, **kwargs)
    for call in op._public_calls.values():
        if isinstance(call, PreparedCall):
            call._served = lambda *f: None
    n = 100000
    t = min(timeit.repeat(lambda a=args, k=kwargs: op(*a, **k), number=n, repeat=5)) / n * 1e9
    print(f"rmsnorm 1 x 2880, {name}: {t:.0f} ns")
    flat = (*args, *kwargs.values())
    t = min(timeit.repeat(lambda a=args, k=kwargs, f=flat: opm._memo_key(op, a, k, f), number=n, repeat=5)) / n * 1e9
    print(f"  of which the memo key alone (the key path's first step): {t:.0f} ns")

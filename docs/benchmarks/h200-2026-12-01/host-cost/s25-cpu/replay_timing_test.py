"""The Python cost of a launch plan's replay (``replay_served``) against the kernel's wrapper, on the CPU: the fake GPU
of ``test_launch_plan.py`` (CPU tensors stand in for device tensors; the C launcher is a stand-in that logs), so
what is timed is the replay's own Python (guards, ``data_ptr``, allocations, the stream buffers) and not a launch.

Session 25 (2-core development machine), best of 5 x 20000 calls:

    cp docs/benchmarks/h200-2026-12-01/host-cost/s25-cpu/replay_timing_test.py packages/tokenspeed-kernel-triton/tests/
    TRITON_INTERPRET=1 pytest -q -s packages/tokenspeed-kernel-triton/tests/replay_timing_test.py
    rm packages/tokenspeed-kernel-triton/tests/replay_timing_test.py

Output: ``replay_timing.txt`` beside this file.
"""

import time

import pytest
import test_launch_plan as tlp

from tokenspeed_kernel import launch as L

fake_gpu, streams = tlp.fake_gpu, tlp.streams  # (the fixtures, by name)

OPS = [
    "rmsnorm", "apply_rotary", "apply_rotary_and_store", "moe_route", "moe_gate", "moe_gate+norm", "kvcache_store",
    "swiglu",
]  # fmt: skip


@pytest.mark.parametrize("op", OPS)
def test_time(fake_gpu, streams, monkeypatch, op):
    fn, kargs, kkwargs = tlp.triton_call(op)
    op, _, variant = op.partition("+")
    n_pos, names = len(kargs), tuple(kkwargs)
    vals = tuple((*kargs, *kkwargs.values()))

    def run(*v):
        return fn(*v[:n_pos], **dict(zip(names, v[n_pos:])))

    run(*vals)
    g = fake_gpu
    tlp.fake_package_launchers(g, monkeypatch)
    run(*vals)
    _, plan, why = L.record(run, vals)
    assert plan is not None, why
    n = 20000
    res = {}
    for name, f in (("wrapper", run), ("replay_served", plan.replay_served)):
        for _ in range(200):
            f(*vals)
        best = 1e9
        for _ in range(5):
            g.log.clear()
            t = time.perf_counter()
            for _ in range(n):
                f(*vals)
            best = min(best, (time.perf_counter() - t) / n * 1e6)
        res[name] = round(best, 2)
    src = plan.replay_served.__source__
    print(
        f"\n{op}{'+' + variant if variant else ''}: {res} launches={plan.launches} allocs={plan.allocations} lines={src.count(chr(10))}"
    )
    if op in ("apply_rotary", "moe_gate"):
        print(src)

"""The timing harness (``tokenspeed_kernel.benchmark.timer``).

On a CPU: argument checks, statistics, the wall-clock paths, and the GPU protocols'
structure against a simulated CUDA (events read a fake device clock that the
work, the L2 flush and graph replays advance), so what each method counts and
subtracts is checked without a GPU. With a GPU: the same methods on real kernels.
"""

from __future__ import annotations

import contextlib
import time

import pytest
import torch

from tokenspeed_kernel.benchmark import timer
from tokenspeed_kernel.benchmark.timer import Timing, percentile, time_calls, time_fn

# ---------------------------------------------------------------------------- statistics and checks


def test_percentile_interpolates_linearly():
    assert percentile([], 50) != percentile([], 50)  # nan
    assert percentile([3.0], 10) == 3.0
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 10) == pytest.approx(1.3)


def test_summary_keeps_the_samples_in_order_and_json_unchanged():
    t = timer._summary([5.0, 1.0, 3.0], "wall-clock")
    assert (t.median_us, t.p10_us, t.p90_us, t.repeats) == (3.0, 1.4, 4.6, 3)
    assert t.samples_us == (5.0, 1.0, 3.0)
    assert t.to_json() == {"median_us": 3.0, "p10_us": 1.4, "p90_us": 4.6, "repeats": 3, "method": "wall-clock"}
    # the samples are not part of a Timing's identity
    assert t == Timing(3.0, 1.4, 4.6, 3, "wall-clock")


def test_repeats_fill_the_budgets_within_bounds():
    assert timer._repeats(1e-3, warmup_ms=10, rep_ms=50, min_repeats=5, max_repeats=1000) == (10, 50)
    assert timer._repeats(1e-3, warmup_ms=10, rep_ms=2, min_repeats=5, max_repeats=1000) == (10, 5)
    assert timer._repeats(1e-9, warmup_ms=10, rep_ms=50, min_repeats=5, max_repeats=100) == (100, 100)
    assert timer._repeats(1.0, warmup_ms=0, rep_ms=0, min_repeats=1, max_repeats=10) == (1, 1)


def test_per_call_subtracts_the_baseline_median_and_never_goes_negative():
    assert timer._per_call([80.0, 90.0, 70.0], [30.0, 29.0, 31.0], 10) == [5.0, 6.0, 4.0]
    assert timer._per_call([20.0, 40.0], [30.0], 10) == [0.0, 1.0]
    assert timer._per_call([50.0], [], 10) == [5.0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"warmup_ms": -1}, "warmup_ms"),
        ({"rep_ms": -1}, "rep_ms"),
        ({"min_repeats": 0}, "min_repeats"),
        ({"min_repeats": 10, "max_repeats": 5}, "min_repeats"),
        ({"graph": True, "graph_calls": 0}, "graph_calls"),
        ({"graph_calls": 10}, "graph=True"),
        ({"graph": True}, "CUDA"),
        ({"graph": True, "graph_calls": 10}, "CUDA"),
    ],
)
def test_time_fn_rejects_bad_arguments_before_running(kwargs, match):
    calls = []
    with pytest.raises(ValueError, match=match):
        time_fn(lambda: calls.append(1), device="cpu", **kwargs)
    assert not calls


@pytest.mark.parametrize(("kwargs", "match"), [({"repeats": 0}, "repeats"), ({"repeats": 1, "warmup": -1}, "warmup")])
def test_time_calls_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        time_calls(lambda: None, device="cpu", **kwargs)


# ---------------------------------------------------------------------------- CPU wall clock


def test_time_fn_on_cpu_sizes_the_repeats_from_an_estimate():
    calls = []
    t = time_fn(lambda: (calls.append(1), time.sleep(0.001)), device="cpu", warmup_ms=3, rep_ms=10, min_repeats=4)
    assert t.method == "wall-clock" and 4 <= t.repeats <= 10 and len(t.samples_us) == t.repeats
    assert len(calls) > t.repeats  # one estimate call and the warm-up come first
    assert 1000 <= t.p10_us <= t.median_us <= t.p90_us


def test_time_calls_on_cpu_times_exactly_the_calls_asked_for_in_order():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002 * (len(calls) - 2) if len(calls) > 2 else 0)

    t = time_calls(fn, device="cpu", repeats=3, warmup=2)
    assert len(calls) == 5 and t.repeats == 3 and t.method == "wall-clock"
    first, second, third = t.samples_us
    assert 1500 < first < second < third
    assert t.median_us == second


# ---------------------------------------------------------------------------- GPU protocols, simulated


class FakeCuda:
    """Just enough of ``torch.cuda`` for the timer: one device clock in milliseconds.

    Work advances the clock when it runs eagerly and adds to the graph being
    captured otherwise; a replay advances the clock by what its graph holds.
    ``host_ms`` is host overhead per eager call (the GPU idles while the host
    launches), which a captured graph does not replay.
    """

    def __init__(self, monkeypatch, *, work_ms: float, flush_ms: float, host_ms: float = 0.0) -> None:
        self.now = 0.0
        self.capturing: FakeCuda.Graph | None = None
        self.work_ms, self.flush_ms, self.host_ms = work_ms, flush_ms, host_ms
        self.python_calls = 0
        self.syncs = 0
        fake = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing
                self.t: float | None = None

            def record(self) -> None:
                assert fake.capturing is None, "no events inside a capture"
                self.t = fake.now

            def synchronize(self) -> None:
                fake.syncs += 1

            def elapsed_time(self, end: Event) -> float:
                assert self.t is not None and end.t is not None
                return end.t - self.t

        class Stream:
            def __init__(self, device=None) -> None:
                pass

            def wait_stream(self, other) -> None:
                pass

        @contextlib.contextmanager
        def graph(g):
            fake.capturing = g
            try:
                yield
            finally:
                fake.capturing = None

        class Flush:
            def zero_(self) -> None:
                fake.run(fake.flush_ms)

        def synchronize(device=None) -> None:
            fake.syncs += 1

        for name, value in {
            "Event": Event,
            "Stream": Stream,
            "CUDAGraph": FakeCuda.Graph.factory(self),
            "graph": graph,
            "stream": lambda s: contextlib.nullcontext(),
            "current_stream": lambda device=None: Stream(),
            "device": lambda device: contextlib.nullcontext(),
            "synchronize": synchronize,
            "current_device": lambda: 0,
        }.items():
            monkeypatch.setattr(torch.cuda, name, value)
        monkeypatch.setattr(timer, "_flush_buffer", lambda device: Flush())

    class Graph:
        def __init__(self, fake: FakeCuda) -> None:
            self.fake, self.ms = fake, 0.0

        @staticmethod
        def factory(fake: FakeCuda):
            return lambda: FakeCuda.Graph(fake)

        def replay(self) -> None:
            self.fake.now += self.ms

    def run(self, ms: float) -> None:
        if self.capturing is not None:
            self.capturing.ms += ms
        else:
            self.now += ms

    def work(self) -> None:
        self.python_calls += 1
        if self.capturing is None:
            self.now += self.host_ms
        self.run(self.work_ms)


def test_events_time_each_call_with_the_flush_outside_the_range(monkeypatch):
    gpu = FakeCuda(monkeypatch, work_ms=0.005, flush_ms=0.003)
    t = time_fn(gpu.work, device="cuda:0", warmup_ms=0.1, rep_ms=0.5)
    assert t.method == "cuda-events" and 99 <= t.repeats <= 100
    assert (t.p10_us, t.median_us, t.p90_us) == pytest.approx((5.0, 5.0, 5.0))


def test_events_include_host_overhead_that_leaves_the_gpu_idle(monkeypatch):
    gpu = FakeCuda(monkeypatch, work_ms=0.005, flush_ms=0.003, host_ms=0.020)
    t = time_fn(gpu.work, device="cuda", warmup_ms=0.1, rep_ms=0.5)
    assert t.median_us == pytest.approx(25.0)


def test_single_call_graph_replays_the_capture(monkeypatch):
    gpu = FakeCuda(monkeypatch, work_ms=0.005, flush_ms=0.003, host_ms=0.020)
    t = time_fn(gpu.work, device="cuda:0", graph=True, warmup_ms=0.1, rep_ms=0.5)
    assert t.method == "cuda-graph" and t.median_us == pytest.approx(5.0)
    assert gpu.python_calls == 3  # two warm-up calls and the capture; replays run no Python


def test_graph_batch_subtracts_the_in_graph_flushes(monkeypatch):
    gpu = FakeCuda(monkeypatch, work_ms=0.005, flush_ms=0.003, host_ms=0.020)
    t = time_fn(gpu.work, device="cuda:0", graph=True, graph_calls=10, warmup_ms=1, rep_ms=4, min_repeats=7)
    # a replay: 10 x (flush 3 us + work 5 us) = 80 us; the flush-only graph: 30 us
    assert t.method == "cuda-graph-batch"
    assert (t.p10_us, t.median_us, t.p90_us) == pytest.approx((5.0, 5.0, 5.0))
    assert t.repeats == 36  # 4 ms of (80 + 30) us rounds
    assert gpu.python_calls == 2 + 10  # warm-up, then ten calls captured once


def test_graph_batch_without_flush_divides_the_replay(monkeypatch):
    gpu = FakeCuda(monkeypatch, work_ms=0.005, flush_ms=0.003)
    t = time_fn(gpu.work, device="cuda:0", graph=True, graph_calls=4, flush_l2=False, warmup_ms=0.1, rep_ms=0.5)
    assert t.method == "cuda-graph-batch" and t.median_us == pytest.approx(5.0)


def test_a_failed_capture_raises_after_leaving_the_device_idle(monkeypatch):
    gpu = FakeCuda(monkeypatch, work_ms=0.005, flush_ms=0.003)

    def host_sync():
        gpu.work()
        if gpu.capturing is not None:
            raise RuntimeError("operation not permitted when stream is capturing")

    for graph_calls in (1, 10):
        syncs = gpu.syncs
        with pytest.raises(RuntimeError, match="capturing"):
            time_fn(host_sync, device="cuda:0", graph=True, graph_calls=graph_calls)
        assert gpu.syncs > syncs and gpu.capturing is None


def test_time_calls_on_gpu_syncs_around_every_call(monkeypatch):
    gpu = FakeCuda(monkeypatch, work_ms=2.0, flush_ms=0.003)
    t = time_calls(gpu.work, device="cuda:0", repeats=3, warmup=1)
    assert t.method == "cuda-events" and t.samples_us == pytest.approx((2000.0,) * 3)
    assert gpu.python_calls == 4 and gpu.syncs == 1 + 3


# ---------------------------------------------------------------------------- on a GPU

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _busy(ms: float):
    """A fn whose GPU time is about ``ms`` (a sleep kernel sized from a measurement)."""
    cycles = 1_000_000
    t = time_calls(lambda: torch.cuda._sleep(cycles), device="cuda", repeats=3, warmup=1)
    per_ms = cycles / (t.median_us / 1e3)
    return lambda: torch.cuda._sleep(int(per_ms * ms))


@pytest.mark.gpu
@gpu
def test_gpu_methods_agree_on_a_kernel_of_known_length():
    fn = _busy(0.2)
    events = time_fn(fn, device="cuda", warmup_ms=5, rep_ms=20)
    graph = time_fn(fn, device="cuda", graph=True, warmup_ms=5, rep_ms=20)
    batch = time_fn(fn, device="cuda", graph=True, graph_calls=10, warmup_ms=5, rep_ms=20)
    assert (events.method, graph.method, batch.method) == ("cuda-events", "cuda-graph", "cuda-graph-batch")
    for t in (events, graph, batch):
        assert 150 < t.median_us < 300, t
    calls = time_calls(fn, device="cuda", repeats=4)
    assert calls.repeats == 4 and 150 < calls.median_us < 400


@pytest.mark.gpu
@gpu
def test_gpu_graph_batch_excludes_host_overhead():
    x = torch.ones(1024, device="cuda")

    def slow_host():  # 1 ms of host work before a tiny kernel: the GPU idles under events
        time.sleep(0.001)
        x.mul_(1.0)

    events = time_fn(slow_host, device="cuda", warmup_ms=5, rep_ms=20)
    batch = time_fn(slow_host, device="cuda", graph=True, graph_calls=10, warmup_ms=5, rep_ms=20)
    assert events.median_us > 900 and batch.median_us < 100, (events, batch)


@pytest.mark.gpu
@gpu
def test_gpu_capture_of_a_host_sync_raises_and_the_device_stays_usable():
    x = torch.ones(16, device="cuda")
    with pytest.raises(RuntimeError):  # torch.AcceleratorError is one
        time_fn(lambda: x.sum().item(), device="cuda", graph=True, graph_calls=10)
    assert float(x.sum()) == 16.0
    t = time_fn(lambda: x.mul_(1.0), device="cuda", graph=True, warmup_ms=1, rep_ms=2)
    assert t.median_us > 0

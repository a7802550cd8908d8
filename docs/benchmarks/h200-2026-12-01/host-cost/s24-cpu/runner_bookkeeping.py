"""CPU host time of a GPT-OSS ``DecodeRunner`` step's own bookkeeping, the model and the sampler stubbed (session 24).

Run from the checkout with the packages on the path; the label is printed beside the figure:

    python docs/benchmarks/h200-2026-12-01/host-cost/s24-cpu/runner_bookkeeping.py after

Each step is the runner's ``_step`` plus the reset ``tools/host_probe.py`` does (the same position again), so the
figure is the probe's step minus the model and the sampler. CPU tensors: what this measures is the host path of
the ATen calls (dispatch, allocation); a GPU host adds a launch per call.
"""

import statistics
import sys
import time

import torch

from tokenspeed_kernel.models import gpt_oss as m

torch.set_num_threads(1)
cfg = m.GptOssConfig.tiny()
cache = m.PagedKVCache(cfg, num_layers=1, num_pages=256, page_size=16, max_batch=1, max_pages_per_seq=256)
cache.reserve(0, 4096)
logits, sampled = torch.zeros(1, 8), torch.tensor([3])


class Model:
    device = torch.device("cpu")

    def decode(self, *args, **kwargs):
        return logits


runner = m.DecodeRunner(Model(), cache, 1, lambda _: sampled, cuda_graph=False)
runner.set_state(torch.tensor([1]), torch.tensor([2000]))


def step():
    runner._step()
    if isinstance(getattr(type(runner), "positions", None), property):  # session 24 on: the lengths are the state
        runner.cache_seqlens.fill_(2001)
    else:
        runner.positions.fill_(2000)


rounds = []
for _ in range(7):
    t = time.perf_counter()
    for _ in range(4000):
        step()
    rounds.append((time.perf_counter() - t) / 4000 * 1e6)
label = sys.argv[1] if len(sys.argv) > 1 else "this code"
print(
    f"{label}: {statistics.median(rounds):.2f} us a step (median of 7 rounds of 4000) {[round(x, 2) for x in rounds]}"
)

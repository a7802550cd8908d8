"""Triton argmax and top-k/top-p sampling through the public API.

The sampler must draw exactly the reference's token for the same uniform (up to
fp ties, which the inputs here avoid by spacing the logits); it is also checked
against a float64 transcription of the definition in ``ops/sampling.py`` written
here without sorting.
"""

from __future__ import annotations

import pytest
import torch
from _checks import assert_triton

import tokenspeed_kernel as tk
from tokenspeed_kernel.core.formats import DTYPE_NAMES
from tokenspeed_kernel.reference import sampling as ref

# -- argmax ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [100, 700], ids=["one-chunk", "split"])
def test_argmax(device, dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(5, vocab, generator=g)
    x[1, 10] = x[1, vocab - 5] = 50.0  # tie across chunks: the first wins
    x[2, vocab // 2] = float("nan")  # NaN counts as the largest, like torch.argmax
    x[2, 3] = 1e4
    x[3] = float("-inf")  # all -inf: index 0
    x[4] = torch.randint(0, 3, (vocab,), generator=g).float()  # many exact ties at the max
    x = x.to(dtype).to(device)
    assert_triton("argmax", (DTYPE_NAMES[dtype],), {}, x.device)
    got = tk.argmax(x)
    assert got.dtype == torch.int64
    expected = [
        int(torch.argmax(x[0].float().cpu())),
        10,
        vocab // 2,
        0,
        int((x[4].cpu() == x[4].cpu().max()).nonzero()[0]),
    ]
    assert got.cpu().tolist() == expected
    assert torch.equal(got.cpu(), ref.argmax(x).cpu())


def test_argmax_counters_are_left_zero_and_shared_by_calls_of_one_stream(device, monkeypatch):
    """The last chunk of each row zeroes the row's counter: calls of one stream share the counters and the scratch
    (on CPU the held buffers are forced here; a GPU holds one set per stream anyway), whatever chunk count and batch
    the call before used."""
    from tokenspeed_kernel import launch

    if device == "cpu":
        monkeypatch.setattr(launch, "_BUFFERS", {})
        monkeypatch.setattr(launch, "_current_stream", lambda dev: 1)
        monkeypatch.setattr(launch, "_capturing", lambda: False)
    g = torch.Generator().manual_seed(3)
    # (chunks a row: 36, 79, 36, 1 in the interpreter; 3, 5, 3, 1 on a GPU)
    for batch, vocab in ((5, 9000), (3, 20000), (7, 9000), (2, 100)):
        x = torch.randn(batch, vocab, generator=g).to(device)
        x[0, vocab - 1] = 100.0  # the last chunk's
        assert torch.equal(tk.argmax(x).cpu(), x.cpu().argmax(dim=-1))
    held = [t for (_, kind), t in launch._BUFFERS.items() if kind == "counters" and t.device == x.device]
    assert held and all(int(t.abs().max()) == 0 for t in held)


# -- top-k / top-p -------------------------------------------------------------------


def _sample64(logits, top_k, top_p, temperature, uniform) -> list[int]:
    """The definition, step by step, in float64, without a sort."""
    out = []
    for row in range(logits.shape[0]):
        p = torch.softmax(logits[row].to(torch.float64) / float(temperature[row]), dim=-1)
        k = int(top_k[row])
        keep = p >= torch.topk(p, k).values[-1] if k > 0 else torch.ones_like(p, dtype=torch.bool)
        if float(top_p[row]) < 1.0:
            need = float(top_p[row]) * p[keep].sum()
            values = p[keep].unique()
            mass_at = (p[None, :] * (keep & (p[None, :] >= values[:, None]))).sum(-1)
            keep &= p >= values[mass_at >= need].max()
        cdf = torch.cumsum(torch.where(keep, p, 0.0), dim=0)
        out.append(int((cdf > float(uniform[row]) * cdf[-1]).nonzero()[0]))
    return out


def _spaced_logits(batch: int, vocab: int, seed: int) -> torch.Tensor:
    # Distinct logits 0.02 apart in random order: no two probabilities are within
    # fp rounding of each other, so thresholds and CDF cuts are unambiguous.
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(vocab, generator=g).float() * 0.02 for _ in range(batch)])


def test_top_k_top_p_matches_reference_and_definition(device):
    # V = 700 spans two interpreter blocks (512); rows cover top-k only, top-p only,
    # both, neither, top_k = 1 and top_k = V, under several temperatures.
    logits = _spaced_logits(6, 700, seed=1).to(device)
    top_k = torch.tensor([0, 1, 5, 50, 0, 700], dtype=torch.int32, device=device)
    top_p = torch.tensor([1.0, 1.0, 0.5, 0.9, 0.3, 0.999], device=device)
    temperature = torch.tensor([1.0, 0.5, 1.0, 2.0, 0.7, 3.0], device=device)
    assert_triton("top_k_top_p_sample", ("fp32",), {}, logits.device)
    g = torch.Generator().manual_seed(2)
    for _ in range(2):
        u = torch.rand(6, generator=g).to(device)
        got = tk.top_k_top_p_sample(logits, top_k, top_p, temperature=temperature, uniform=u)
        assert got.dtype == torch.int64
        assert got.cpu().tolist() == ref.top_k_top_p_sample(logits, top_k, top_p, temperature, u).cpu().tolist()
        assert got.cpu().tolist() == _sample64(logits.cpu(), top_k.cpu(), top_p.cpu(), temperature.cpu(), u.cpu())
    # top_k = 1 is greedy whatever the uniform
    assert int(got[1]) == int(logits[1].argmax())


def test_top_k_keeps_ties_and_the_uniform_walks_index_order(device):
    # Row: logits 5 at indices 3, 40, 90 (tied for first), 4 at 7; the rest low. top_k = 2
    # keeps all three tied tokens (the 2nd largest value is 5), so u sweeps them in
    # index order: u < 1/3 -> 3, < 2/3 -> 40, else 90.
    x = torch.full((3, 200), -2.0)
    x[:, [3, 40, 90]] = 5.0
    x[:, 7] = 4.0
    x = x.to(torch.bfloat16).to(device)
    u = torch.tensor([0.1, 0.5, 0.9], device=device)
    top_k = torch.full((3,), 2, dtype=torch.int32, device=device)
    top_p = torch.ones(3, device=device)
    temperature = torch.ones(3, device=device)
    got = tk.top_k_top_p_sample(x, top_k, top_p, temperature=temperature, uniform=u)
    assert got.cpu().tolist() == [3, 40, 90]
    assert got.cpu().tolist() == ref.top_k_top_p_sample(x, top_k, top_p, temperature, u).cpu().tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_random_rows_every_path(device, dtype):
    # Random logits (no near ties at this size) through every path of the kernel: top-k
    # sets that fit the candidate list and ones that overflow it (the interpreter's list
    # holds 16), top-p alone, neither; the radix select runs 4/3/2 key levels by dtype.
    g = torch.Generator().manual_seed(21)
    logits = (torch.randn(6, 900, generator=g) * 3).to(dtype).to(device)
    top_k = torch.tensor([3, 12, 40, 0, 0, 899], dtype=torch.int32, device=device)
    top_p = torch.tensor([0.7, 1.0, 0.8, 0.6, 1.0, 0.95], device=device)
    temperature = torch.tensor([0.7, 1.3, 1.0, 0.9, 2.0, 0.6], device=device)
    u = torch.rand(6, generator=g).to(device)
    assert_triton("top_k_top_p_sample", (DTYPE_NAMES[dtype],), {}, logits.device)
    got = tk.top_k_top_p_sample(logits, top_k, top_p, temperature=temperature, uniform=u)
    assert got.cpu().tolist() == ref.top_k_top_p_sample(logits, top_k, top_p, temperature, u).cpu().tolist()
    assert got.cpu().tolist() == _sample64(logits.cpu(), top_k.cpu(), top_p.cpu(), temperature.cpu(), u.cpu())


def test_kept_set_swept_by_the_uniform(device):
    # One logit row, 8 uniforms spread over [0, 1): the tokens drawn are exactly the kept
    # set (each kept token here holds > 1/8 of the kept mass), in index order, for a
    # top-k set that fits the candidate list (k = 6) and for top-p alone (k = 0).
    row = _spaced_logits(1, 300, seed=13)[0] * 20  # logits 0 .. 120, 0.4 apart
    logits = row.repeat(16, 1).to(device)
    top_k = torch.tensor([6] * 8 + [0] * 8, dtype=torch.int32, device=device)
    top_p = torch.full((16,), 0.75, device=device)
    temperature = torch.full((16,), 1.0, device=device)
    u = ((torch.arange(8) + 0.5) / 8).repeat(2).to(device)
    got = tk.top_k_top_p_sample(logits, top_k, top_p, temperature=temperature, uniform=u).cpu()
    assert got.tolist() == ref.top_k_top_p_sample(logits, top_k, top_p, temperature, u).cpu().tolist()
    p = torch.softmax(row.double(), dim=0)
    for k, drawn in ((6, got[:8]), (0, got[8:])):
        keep = p >= torch.topk(p, k).values[-1] if k else torch.ones_like(p, dtype=torch.bool)
        values = p[keep].unique()
        mass_at = (p[None, :] * (keep & (p[None, :] >= values[:, None]))).sum(-1)
        kept = (keep & (p >= values[mass_at >= 0.75 * p[keep].sum()].max())).nonzero().flatten()
        assert drawn.unique().tolist() == kept.tolist()
        assert drawn.tolist() == sorted(drawn.tolist()), "the uniform walks the kept tokens in index order"


def test_top_p_threshold_inside_a_large_tie(device):
    # 10 tokens at logit 3, 40 tied at 2, the rest at -5: top-p 0.5 puts the threshold on
    # the tied value, so all 40 tied tokens are kept together (the definition keeps ties).
    # More than the candidate list holds tie at the threshold: the exact per-row search.
    x = torch.full((4, 600), -5.0)
    g = torch.Generator().manual_seed(8)
    for row in range(4):
        perm = torch.randperm(600, generator=g)
        x[row, perm[:10]] = 3.0
        x[row, perm[10:50]] = 2.0
    x = x.to(device)
    top_k = torch.tensor([0, 0, 45, 45], dtype=torch.int32, device=device)  # 45th largest is a tied 2
    top_p = torch.tensor([0.5, 0.5, 0.5, 1.0], device=device)
    temperature = torch.ones(4, device=device)
    u = torch.tensor([0.05, 0.9, 0.6, 0.99], device=device)
    got = tk.top_k_top_p_sample(x, top_k, top_p, temperature=temperature, uniform=u)
    want = ref.top_k_top_p_sample(x, top_k, top_p, temperature, u)
    assert got.cpu().tolist() == want.cpu().tolist()
    assert got.cpu().tolist() == _sample64(x.cpu(), top_k.cpu(), top_p.cpu(), temperature.cpu(), u.cpu())
    assert all(float(x[r, int(got[r])]) >= 2.0 for r in range(4))


def test_top_p_threshold_in_the_far_tail(device):
    # One token at logit 0 and 899 at about -23 (weights ~2**-33, below the first top-p
    # pass's 32-binade window): top_p = 1 - 2**-24 needs part of the tail, so the search
    # continues under the window. Row 0's tail logits are distinct (narrowing passes),
    # row 1's are tied (more entries than the candidate list: the exact search). Checked
    # against the float64 definition only: the reference's fp32 softmax rounds the top
    # token's probability by about as much as the whole tail weighs.
    x = torch.full((2, 900), -23.0)
    x[0] -= torch.arange(900) * 1e-3
    x[:, 417] = 0.0
    x = x.to(device)
    top_k = torch.zeros(2, dtype=torch.int32, device=device)
    top_p = torch.full((2,), 1 - 2.0**-24, device=device)
    temperature = torch.ones(2, device=device)
    for u in (0.3, 2.0**-32):
        uu = torch.full((2,), u, device=device)
        got = tk.top_k_top_p_sample(x, top_k, top_p, temperature=temperature, uniform=uu)
        assert got.cpu().tolist() == _sample64(x.cpu(), top_k.cpu(), top_p.cpu(), temperature.cpu(), uu.cpu())
    # kept tail tokens before index 417 come first in index order: a tiny u draws one
    assert int(got[0]) < 417 and int(got[1]) < 417


def test_uniform_extremes_pick_the_first_and_last_kept_token(device):
    logits = _spaced_logits(2, 300, seed=5).to(device)
    top_k = torch.tensor([20, 20], dtype=torch.int32, device=device)
    top_p = torch.ones(2, device=device)
    temperature = torch.full((2,), 0.3, device=device)
    u = torch.tensor([0.0, 1.0 - 2**-24], device=device)
    got = tk.top_k_top_p_sample(logits, top_k, top_p, temperature=temperature, uniform=u)
    kept = torch.topk(logits[0].cpu(), 20).indices
    assert int(got[0]) == int(kept.min())
    assert int(got[1]) == int(torch.topk(logits[1].cpu(), 20).indices.max())


def test_sampler_eager_graph_only_up_to_its_logit_bytes(monkeypatch, device):
    """The eager graph path is taken only for logits of at most GRAPH_MAX_LOGIT_BYTES (each graph keeps a copy
    of its logits); larger calls and graphs=False launch directly. The graph cache is a recorder here."""
    from tokenspeed_kernel_triton import sampling as ts

    class Recorder:
        def __init__(self):
            self.keys = []

        def usable(self, *tensors):
            return True

        def run(self, key, inputs, fn):
            self.keys.append(key)
            return fn(*inputs)

    rec = Recorder()
    monkeypatch.setattr(ts, "_GRAPHS", rec)
    monkeypatch.setattr(ts, "GRAPH_MAX_LOGIT_BYTES", 2 * 64 * 4)  # two rows of 64 fp32 logits

    def call(b, **kw):
        logits = _spaced_logits(b, 64, b).to(device)
        k = torch.full((b,), 5, dtype=torch.int32, device=device)
        p = torch.full((b,), 0.9, device=device)
        t = torch.ones(b, device=device)
        u = torch.rand(b, generator=torch.Generator().manual_seed(b)).to(device)
        got = ts.top_k_top_p_sample(logits, k, p, t, u, **kw)
        assert got.tolist() == ref.top_k_top_p_sample(logits, k, p, t, u).tolist()

    call(2)
    assert len(rec.keys) == 1
    call(3)
    call(2, graphs=False)
    assert len(rec.keys) == 1


# -- GPU, GPT-OSS vocabulary -------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("batch", [1, 64])
def test_argmax_gpt_oss_vocab_gpu(batch):
    torch.manual_seed(0)
    x = torch.randn(batch, 201088, device="cuda", dtype=torch.bfloat16)
    x[0, 200000] = 100.0
    got = tk.argmax(x)
    assert torch.equal(got, ref.argmax(x))
    assert int(got[0]) == 200000


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["top_k_and_p", "top_p_only", "temperature_only", "large_k"])
def test_sample_gpt_oss_vocab_gpu(dtype, mode):
    torch.manual_seed(0)
    batch = 64
    logits = (torch.randn(batch, 201088, device="cuda") * 3).to(dtype)
    top_k = {
        "top_k_and_p": torch.randint(0, 100, (batch,), device="cuda", dtype=torch.int32),
        "top_p_only": torch.zeros(batch, device="cuda", dtype=torch.int32),
        "temperature_only": torch.zeros(batch, device="cuda", dtype=torch.int32),
        "large_k": torch.randint(1000, 5000, (batch,), device="cuda", dtype=torch.int32),  # past the list
    }[mode]
    top_p = torch.rand(batch, device="cuda") * 0.5 + 0.5
    if mode == "temperature_only":
        top_p = torch.ones(batch, device="cuda")
    temperature = torch.rand(batch, device="cuda") + 0.5
    u = torch.rand(batch, device="cuda")
    got = tk.top_k_top_p_sample(logits, top_k, top_p, temperature=temperature, uniform=u)
    want = ref.top_k_top_p_sample(logits, top_k, top_p, temperature, u)
    # the GPU's exp differs from torch's in the last bit: allow a rare near-tie flip
    assert int((got != want).sum()) <= 1
    # deterministic: the same draw again
    assert torch.equal(tk.top_k_top_p_sample(logits, top_k, top_p, temperature=temperature, uniform=u), got)


@pytest.mark.gpu
@gpu
def test_sample_cuda_graph_gpu():
    torch.manual_seed(1)
    batch = 16
    logits = torch.randn(batch, 201088, device="cuda", dtype=torch.bfloat16) * 3
    top_k = torch.tensor([0, 50] * 8, device="cuda", dtype=torch.int32)
    top_p = torch.full((batch,), 0.9, device="cuda")
    temperature = torch.full((batch,), 0.8, device="cuda")
    u = torch.rand(batch, device="cuda")
    eager = tk.top_k_top_p_sample(logits, top_k, top_p, temperature=temperature, uniform=u)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tk.top_k_top_p_sample(logits, top_k, top_p, temperature=temperature, uniform=u)
    graph.replay()
    assert torch.equal(out, eager)
    u.copy_(torch.rand(batch, device="cuda"))
    graph.replay()
    assert torch.equal(out, tk.top_k_top_p_sample(logits, top_k, top_p, temperature=temperature, uniform=u))


@pytest.mark.gpu
@gpu
def test_sample_eager_graph_replays_match_direct_launches_gpu():
    """Eager calls replay a captured graph from a shape's second call: new logits and uniforms are copied in,
    per-row tensors are read where they are (new values at the same address are seen), and a new address or
    shape is a new key. Every result equals the direct launches (graphs=False) bit for bit."""
    from tokenspeed_kernel_triton import sampling as ts

    torch.manual_seed(3)
    batch, vocab = 4, 201088
    top_k = torch.tensor([0, 20, 1, 500], device="cuda", dtype=torch.int32)
    top_p = torch.full((batch,), 0.9, device="cuda")
    temperature = torch.full((batch,), 0.8, device="cuda")
    before = ts._GRAPHS.captures
    for step in range(5):
        logits = (torch.randn(batch, vocab, device="cuda") * 3).to(torch.bfloat16)
        u = torch.rand(batch, device="cuda")
        if step == 3:
            top_k.copy_(torch.tensor([5, 0, 2, 50], device="cuda", dtype=torch.int32))  # same address, new values
        got = ts.top_k_top_p_sample(logits, top_k, top_p, temperature, u)
        want = ts.top_k_top_p_sample(logits, top_k, top_p, temperature, u, graphs=False)
        assert torch.equal(got, want), step
    assert ts._GRAPHS.captures == before + 1
    other_p = torch.full((batch,), 0.5, device="cuda")  # another address: another key
    for _ in range(3):
        logits = (torch.randn(batch, vocab, device="cuda") * 3).to(torch.bfloat16)
        u = torch.rand(batch, device="cuda")
        got = ts.top_k_top_p_sample(logits, top_k, other_p, temperature, u)
        assert torch.equal(got, ts.top_k_top_p_sample(logits, top_k, other_p, temperature, u, graphs=False))
    assert ts._GRAPHS.captures == before + 2
    # the public op with scalar parameters: its per-row tensors are built once, so the graph is reused
    for _ in range(3):
        logits = (torch.randn(batch, vocab, device="cuda") * 3).to(torch.bfloat16)
        u = torch.rand(batch, device="cuda")
        got = tk.top_k_top_p_sample(logits, 40, 0.95, temperature=0.7, uniform=u, override="triton.top_k_top_p_sample")
        k = torch.full((batch,), 40, device="cuda", dtype=torch.int32)
        p = torch.full((batch,), 0.95, device="cuda")
        t = torch.full((batch,), 0.7, device="cuda")
        assert torch.equal(got, ts.top_k_top_p_sample(logits, k, p, t, u, graphs=False))
    assert ts._GRAPHS.captures == before + 3

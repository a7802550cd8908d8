"""Reference argmax and top-k/top-p sampling against brute-force enumeration of the definition."""

from __future__ import annotations

import math

import pytest
import torch

import tokenspeed_kernel as tk

REF = "reference"


# ---------------------------------------------------------------------------
# argmax


def _first_max_loop(row: list[float]) -> int:
    best = 0
    for i, v in enumerate(row):
        if v > row[best]:
            best = i
    return best


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_argmax_first_index_on_ties(dtype):
    g = torch.Generator().manual_seed(0)
    # Few distinct values: most rows hold their maximum several times.
    logits = torch.randint(-3, 4, (64, 33), generator=g).to(dtype)
    got = tk.argmax(logits, override=REF)
    assert got.dtype == torch.int64
    assert got.tolist() == [_first_max_loop(r) for r in logits.float().tolist()]
    logits[5] = 2.0
    logits[5, 17] = 2.5
    logits[5, 30] = 2.5
    assert int(tk.argmax(logits, override=REF)[5]) == 17


def test_argmax_rounding_ties_in_bf16():
    # Distinct in fp32, equal once rounded to bf16: the first of them wins.
    logits = torch.tensor([[1.0, 3.0001, 3.0, 2.0]]).to(torch.bfloat16)
    assert logits[0, 1] == logits[0, 2]
    assert tk.argmax(logits, override=REF).tolist() == [1]


# ---------------------------------------------------------------------------
# top_k_top_p_sample: brute force in float64, straight from the definition


def _kept_set(logits: list[float], top_k: int, top_p: float, temperature: float) -> list[int]:
    """Tokens kept by the definition, enumerated by brute force over every candidate threshold."""
    z = [x / temperature for x in logits]
    mx = max(z)
    e = [math.exp(x - mx) for x in z]
    s = sum(e)
    p = [x / s for x in e]
    kept = list(range(len(p)))
    if top_k > 0:
        kth = sorted(p, reverse=True)[top_k - 1]
        kept = [i for i in kept if p[i] >= kth]
    if top_p < 1.0:
        mass = sum(p[i] for i in kept)
        best = None
        for t in {p[i] for i in kept}:
            if sum(p[i] for i in kept if p[i] >= t) >= top_p * mass and (best is None or t > best):
                best = t
        kept = [i for i in kept if p[i] >= best]
    return kept


def _probs(logits: list[float], temperature: float) -> list[float]:
    z = [x / temperature for x in logits]
    mx = max(z)
    e = [math.exp(x - mx) for x in z]
    return [x / sum(e) for x in e]


def _margin_ok(logits: list[float], top_k: int, top_p: float, temperature: float) -> float:
    """Smallest relative gap between top_p * mass and a candidate threshold's mass (the problem's conditioning)."""
    p = _probs(logits, temperature)
    kept = list(range(len(p)))
    if top_k > 0:
        kth = sorted(p, reverse=True)[top_k - 1]
        kept = [i for i in kept if p[i] >= kth]
    mass = sum(p[i] for i in kept)
    gaps = [abs(sum(p[i] for i in kept if p[i] >= t) - top_p * mass) for t in {p[i] for i in kept}]
    return min(gaps) / mass


def _sample_brute(p: list[float], kept: list[int], u: float) -> int:
    mass = sum(p[i] for i in kept)
    running = 0.0
    for i in range(len(p)):
        if i in kept:
            running += p[i]
            if running > u * mass:
                return i
    raise AssertionError("u must be < 1")


CASES = [
    # logits, top_k, top_p, temperature
    ([0.3, 2.0, -1.0, 1.1, 0.7, 2.4, -0.2, 1.6], 0, 1.0, 1.0),
    ([0.3, 2.0, -1.0, 1.1, 0.7, 2.4, -0.2, 1.6], 3, 1.0, 1.0),
    ([0.3, 2.0, -1.0, 1.1, 0.7, 2.4, -0.2, 1.6], 0, 0.62, 1.0),
    ([0.3, 2.0, -1.0, 1.1, 0.7, 2.4, -0.2, 1.6], 5, 0.8, 0.7),
    ([0.3, 2.0, -1.0, 1.1, 0.7, 2.4, -0.2, 1.6], 1, 1.0, 1.0),
    ([0.3, 2.0, -1.0, 1.1, 0.7, 2.4, -0.2, 1.6], 0, 0.05, 2.0),
    # Ties at the k-th value: top_k=2 keeps all three 1.5's.
    ([1.5, 0.2, 1.5, -0.4, 1.5, 0.9], 2, 1.0, 1.0),
    # Ties at the top-p threshold: the tie group enters as a whole.
    ([1.0, 0.0, 1.0, 1.0, -2.0, 0.5, 1.0], 0, 0.5, 1.0),
    ([1.0, 0.0, 1.0, 1.0, -2.0, 0.5, 1.0], 6, 0.93, 1.3),
]


@pytest.mark.parametrize("logits,top_k,top_p,temperature", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sample_matches_brute_force_for_many_uniforms(logits, top_k, top_p, temperature, dtype):
    row = torch.tensor(logits).to(dtype)
    exact_logits = row.double().tolist()  # what the kernel sees after rounding to dtype
    if top_p < 1.0:
        assert _margin_ok(exact_logits, top_k, top_p, temperature) > 1e-4, "case too close to a top-p boundary"
    kept = _kept_set(exact_logits, top_k, top_p, temperature)
    p = _probs(exact_logits, temperature)
    mass = sum(p[i] for i in kept)
    # A grid of uniforms, dropping those within 1e-5 of a boundary of the inverse CDF.
    boundaries, running = [], 0.0
    for i in kept:
        running += p[i]
        boundaries.append(running / mass)
    us = [j / 997 for j in range(997)]
    us = [u for u in us if all(abs(u - b) > 1e-5 for b in boundaries)]
    expected = [_sample_brute(p, kept, u) for u in us]
    assert set(expected) == set(kept), "the grid must reach every kept token"
    n = len(us)
    got = tk.top_k_top_p_sample(
        row.expand(n, -1).contiguous(),
        top_k,
        top_p,
        temperature=temperature,
        uniform=torch.tensor(us, dtype=torch.float32),
        override=REF,
    )
    assert got.dtype == torch.int64
    assert got.tolist() == expected


def test_sample_per_row_parameters():
    g = torch.Generator().manual_seed(1)
    b, v = 24, 10
    logits = torch.randn(b, v, generator=g) * 2
    top_k = torch.randint(0, v + 1, (b,), generator=g, dtype=torch.int32)
    top_p = torch.rand(b, generator=g) * 0.9 + 0.1
    temperature = torch.rand(b, generator=g) + 0.3
    uniform = torch.rand(b, generator=g)
    got = tk.top_k_top_p_sample(logits, top_k, top_p, temperature=temperature, uniform=uniform, override=REF)
    for r in range(b):
        row = logits[r].double().tolist()
        args = (int(top_k[r]), float(top_p[r]), float(temperature[r]))
        assert _margin_ok(row, *args) > 1e-5
        kept = _kept_set(row, *args)
        assert int(got[r]) == _sample_brute(_probs(row, args[2]), kept, float(uniform[r])), f"row {r}"


def test_top_k_one_is_greedy():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(50, 100, generator=g)
    got = tk.top_k_top_p_sample(logits, 1, generator=torch.Generator().manual_seed(3), override=REF)
    assert torch.equal(got, logits.argmax(dim=-1))


def test_empirical_frequencies_match_renormalized_kept_distribution():
    logits = [0.3, 2.0, -1.0, 1.1, 0.7, 2.4, -0.2, 1.6]
    top_k, top_p, temperature = 6, 0.85, 0.9
    n = 40000
    got = tk.top_k_top_p_sample(
        torch.tensor(logits).expand(n, -1).contiguous(),
        top_k,
        top_p,
        temperature=temperature,
        generator=torch.Generator().manual_seed(4),
        override=REF,
    )
    counts = torch.bincount(got, minlength=len(logits)).tolist()
    kept = _kept_set(logits, top_k, top_p, temperature)
    assert 1 < len(kept) < top_k, "the case should exercise both filters"
    p = _probs(logits, temperature)
    mass = sum(p[i] for i in kept)
    for i, c in enumerate(counts):
        if i not in kept:
            assert c == 0, f"token {i} is filtered out but was drawn {c} times"
            continue
        q = p[i] / mass
        sigma = math.sqrt(q * (1 - q) / n)
        assert abs(c / n - q) < 5 * sigma, f"token {i}: frequency {c / n:.4f}, expected {q:.4f}"


def test_generator_makes_draws_reproducible():
    logits = torch.randn(16, 32, generator=torch.Generator().manual_seed(5))
    a = tk.top_k_top_p_sample(logits, 0, 0.9, generator=torch.Generator().manual_seed(6), override=REF)
    b = tk.top_k_top_p_sample(logits, 0, 0.9, generator=torch.Generator().manual_seed(6), override=REF)
    assert torch.equal(a, b)


def test_sampling_validation_names_the_argument():
    logits = torch.randn(2, 5)
    with pytest.raises(ValueError, match="^logits: expected a 2-D"):
        tk.top_k_top_p_sample(torch.randn(5))
    with pytest.raises(TypeError, match="^logits: expected dtype"):
        tk.argmax(logits.double())
    with pytest.raises(ValueError, match="^top_k:"):
        tk.top_k_top_p_sample(logits, top_k=6)
    with pytest.raises(TypeError, match="^top_k: expected dtype"):
        tk.top_k_top_p_sample(logits, top_k=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="^top_p:"):
        tk.top_k_top_p_sample(logits, top_p=0.0)
    with pytest.raises(ValueError, match="^top_p: expected shape"):
        tk.top_k_top_p_sample(logits, top_p=torch.ones(3))
    with pytest.raises(ValueError, match="^temperature:"):
        tk.top_k_top_p_sample(logits, temperature=0.0)
    with pytest.raises(ValueError, match="^generator:"):
        tk.top_k_top_p_sample(logits, generator=torch.Generator(), uniform=torch.zeros(2))
    with pytest.raises(TypeError, match="^uniform: expected dtype"):
        tk.top_k_top_p_sample(logits, uniform=torch.zeros(2, dtype=torch.float64))


@pytest.mark.parametrize(
    "row,message",
    [
        ([float("nan")] * 5, r"^logits: row 1 holds NaN or \+inf \(its probabilities would all be NaN\)"),
        ([0.0, float("nan"), 1.0, 2.0, 3.0], r"^logits: row 1 holds NaN or \+inf"),
        ([0.0, float("inf"), 1.0, 2.0, 3.0], r"^logits: row 1 holds NaN or \+inf"),
        ([float("-inf")] * 5, r"^logits: row 1 is -inf everywhere \(no token can be sampled\)"),
    ],
)
def test_sampler_rejects_rows_with_no_probabilities(row, message):
    """Before: an all-NaN row returned a token id."""
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0], row])
    with pytest.raises(ValueError, match=message):
        tk.top_k_top_p_sample(logits, 2, 0.9)


def test_sampler_accepts_masked_tokens():
    """-inf on part of a row is a mask: those tokens are never drawn."""
    logits = torch.tensor([[float("-inf"), 1.0, float("-inf"), 0.5, float("-inf")]] * 64)
    got = tk.top_k_top_p_sample(logits, 0, 1.0, generator=torch.Generator().manual_seed(1))
    assert set(got.tolist()) == {1, 3}


def test_sampler_per_row_tensors_on_the_host_are_range_checked():
    logits = torch.randn(2, 5)
    with pytest.raises(ValueError, match=r"^top_k: expected values in \[0, 5\], got 6 in row 1"):
        tk.top_k_top_p_sample(logits, top_k=torch.tensor([1, 6], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^top_p: expected values in \[1e-09, 1.0\], got 0.0 in row 0"):
        tk.top_k_top_p_sample(logits, top_p=torch.tensor([0.0, 0.5]))
    with pytest.raises(ValueError, match=r"^temperature: expected values in \[1e-09, inf\], got nan in row 1"):
        tk.top_k_top_p_sample(logits, temperature=torch.tensor([1.0, float("nan")]))
    with pytest.raises(ValueError, match=r"^uniform: expected values in \[0, 1\)"):
        tk.top_k_top_p_sample(logits, uniform=torch.tensor([0.5, 1.0]))
    with pytest.raises(ValueError, match=r"^top_k: expected an int in \[0, 5\]"):
        tk.top_k_top_p_sample(logits, top_k=2.5)


def test_scalar_parameters_bind_to_tensors_built_once(monkeypatch):
    """Scalar top_k / top_p / temperature become [B] tensors once per (value, batch, dtype, device, stream): a second
    call with the same scalars allocates and fills nothing, and the kernel still gets the right values."""
    from tokenspeed_kernel.ops import sampling

    monkeypatch.setattr(sampling, "_ROW_CONSTANTS", {})
    logits = torch.randn(3, 10)
    u = torch.rand(3)
    first = tk.top_k_top_p_sample.bind(logits, 5, 0.9, temperature=0.7, uniform=u)[4]
    again = tk.top_k_top_p_sample.bind(logits, 5, 0.9, temperature=0.7, uniform=u)[4]
    assert all(a is b for a, b in zip(first[1:4], again[1:4]))
    assert first[1].tolist() == [5] * 3 and first[1].dtype == torch.int32
    assert torch.equal(first[2], torch.full((3,), 0.9)) and torch.equal(first[3], torch.full((3,), 0.7))
    other = tk.top_k_top_p_sample.bind(logits, 6, 0.9, temperature=0.7, uniform=u)[4]
    assert other[1].tolist() == [6] * 3 and other[2] is first[2]
    wider = tk.top_k_top_p_sample.bind(torch.randn(4, 10), 5, 0.9, temperature=0.7, uniform=torch.rand(4))[4]
    assert wider[1].shape == (4,) and wider[1] is not first[1]
    # bind looks the stream up once and keys every parameter by it: another stream, other tensors
    monkeypatch.setattr(sampling, "_stream_of", lambda device: 5)
    on5 = tk.top_k_top_p_sample.bind(logits, 5, 0.9, temperature=0.7, uniform=u)[4]
    assert all(a is not b for a, b in zip(on5[1:4], first[1:4]))
    assert all(
        a is b for a, b in zip(on5[1:4], tk.top_k_top_p_sample.bind(logits, 5, 0.9, temperature=0.7, uniform=u)[4][1:4])
    )
    # the int 1 and the float 1.0 are different entries (an int32 and a float32 tensor)
    assert sampling._row_constant(1, 3, torch.int32, logits.device, None) is not sampling._row_constant(
        1.0, 3, torch.float32, logits.device, None
    )


def test_row_constants_are_not_kept_past_the_cap_or_inside_a_capture(monkeypatch):
    from tokenspeed_kernel.ops import sampling

    monkeypatch.setattr(sampling, "_ROW_CONSTANTS", {})
    monkeypatch.setattr(sampling, "_MAX_ROW_CONSTANTS", 2)
    cpu = torch.device("cpu")
    a = sampling._row_constant(0.5, 2, torch.float32, cpu, None)
    b = sampling._row_constant(0.6, 2, torch.float32, cpu, None)
    c = sampling._row_constant(0.7, 2, torch.float32, cpu, None)  # past the cap: built, not kept
    assert sampling._row_constant(0.5, 2, torch.float32, cpu, None) is a
    assert sampling._row_constant(0.6, 2, torch.float32, cpu, None) is b
    assert sampling._row_constant(0.7, 2, torch.float32, cpu, None) is not c and len(sampling._ROW_CONSTANTS) == 2
    # inside a CUDA graph capture the fill runs only at replay: such a tensor is never kept
    monkeypatch.setattr(sampling, "_ROW_CONSTANTS", {})
    monkeypatch.setattr(sampling, "_MAX_ROW_CONSTANTS", 512)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    real_full = torch.full
    monkeypatch.setattr(torch, "full", lambda size, value, dtype, device: real_full(size, value, dtype=dtype))
    cuda = torch.device("cuda", 0)
    assert sampling._row_constant(0.5, 2, torch.float32, cuda, 7) is not sampling._row_constant(
        0.5, 2, torch.float32, cuda, 7
    )
    assert not sampling._ROW_CONSTANTS
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    on7 = sampling._row_constant(0.5, 2, torch.float32, cuda, 7)
    assert sampling._row_constant(0.5, 2, torch.float32, cuda, 7) is on7
    # another stream: its own tensor (its fill runs on that stream), then a hit there
    on8 = sampling._row_constant(0.5, 2, torch.float32, cuda, 8)
    assert on8 is not on7 and sampling._row_constant(0.5, 2, torch.float32, cuda, 8) is on8
    assert len(sampling._ROW_CONSTANTS) == 2


def test_row_constants_built_under_a_fake_mode_are_not_kept(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tokenspeed_kernel.ops import sampling

    monkeypatch.setattr(sampling, "_ROW_CONSTANTS", {})
    with FakeTensorMode():
        fake = tk.top_k_top_p_sample.bind(torch.empty(3, 10), 5, 0.9, uniform=torch.empty(3))[4]
    assert type(fake[1]) is not torch.Tensor and not sampling._ROW_CONSTANTS
    real = tk.top_k_top_p_sample.bind(torch.randn(3, 10), 5, 0.9, uniform=torch.rand(3))[4]
    assert type(real[1]) is torch.Tensor and real[1].tolist() == [5] * 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_row_constants_are_per_stream_gpu(monkeypatch):
    """On a GPU the constants are per stream: the tensor a call on one stream filled is never read by a call on
    another stream before that fill ran; each stream gets its own, and reuses it."""
    from tokenspeed_kernel.ops import sampling

    monkeypatch.setattr(sampling, "_ROW_CONSTANTS", {})
    dev = torch.device("cuda", torch.cuda.current_device())

    def const():
        return sampling._row_constant(0.9, 4, torch.float32, dev, sampling._stream_of(dev))

    main = const()
    assert const() is main
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        other = const()
        assert other is not main and const() is other
    torch.cuda.synchronize()
    assert torch.equal(main, torch.full((4,), 0.9, device=dev)) and torch.equal(other, main)

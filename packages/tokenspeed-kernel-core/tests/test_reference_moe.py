"""Reference MoE against a per-token, per-expert float64 loop written from GPT_OSS.md."""

from __future__ import annotations

import math

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel import MoEActivation, MoEWeights

REF = "reference"
GPT_OSS = MoEActivation()  # swiglu, alpha 1.702, limit 7, up_offset 1
SILU = MoEActivation.silu()


# ------------------------------------------------------------------ independent weight decoding (from the spec)


def e2m1_value(code: int) -> float:
    sign = -1.0 if code & 8 else 1.0
    exp, man = (code >> 1) & 3, code & 1
    return sign * (0.5 * man if exp == 0 else 2.0 ** (exp - 1) * (1.0 + 0.5 * man))


E2M1 = torch.tensor([e2m1_value(c) for c in range(16)], dtype=torch.float64)


def mxfp4_matrix(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``uint8 [N, K/2]`` + ``uint8 [N, K/32]`` -> float64 ``[N, K]``: element 2j is byte j's low nibble."""
    n, half = blocks.shape
    b = blocks.long()
    w = torch.empty(n, 2 * half, dtype=torch.float64)
    w[:, 0::2] = E2M1[b % 16]
    w[:, 1::2] = E2M1[b // 16]
    factor = torch.tensor([[2.0 ** (int(s) - 127) for s in row] for row in scales.tolist()], dtype=torch.float64)
    return w * factor.repeat_interleave(32, dim=1)


def expert_matrices(w: MoEWeights, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``e``'s ``W13 [2I, H]`` and ``W2 [H, I]`` in float64."""
    if w.format == "mxfp4":
        return mxfp4_matrix(w.w13[e], w.w13_scale[e]), mxfp4_matrix(w.w2[e], w.w2_scale[e])
    if w.format == "fp8_e4m3:per_channel":
        return (
            w.w13[e].double() * w.w13_scale[e].double()[:, None],
            w.w2[e].double() * w.w2_scale[e].double()[:, None],
        )
    if w.format == "fp8_e4m3:per_tensor":
        return w.w13[e].double() * float(w.w13_scale[e]), w.w2[e].double() * float(w.w2_scale[e])
    return w.w13[e].double(), w.w2[e].double()


def loop_moe(x, topk_weights, topk_ids, w: MoEWeights, act: MoEActivation, stats: dict | None = None) -> torch.Tensor:
    """One token, one slot at a time, float64. ``stats["magnitude"]``: the sum of the absolute terms of the
    down projection and the weighted sum, the scale that rounding errors are relative to."""
    t_count, k = topk_ids.shape
    out = torch.zeros(t_count, w.hidden, dtype=torch.float64)
    magnitude = torch.zeros(t_count, w.hidden, dtype=torch.float64)
    for t in range(t_count):
        for s in range(k):
            e = int(topk_ids[t, s])
            w13, w2 = expert_matrices(w, e)
            h = w13 @ x[t].double()
            if w.w13_bias is not None:
                h = h + w.w13_bias[e].double()
            i = h.shape[0] // 2
            gate, up = (h[0::2], h[1::2]) if w.gate_up_interleaved else (h[:i], h[i:])
            if stats is not None and act.limit is not None:
                stats["gate_clamped"] = stats.get("gate_clamped", 0) + int((gate > act.limit).sum())
                stats["up_clamped"] = stats.get("up_clamped", 0) + int((up.abs() > act.limit).sum())
            if act.kind == "silu":
                y = gate / (1 + torch.exp(-gate)) * up
            else:
                if act.limit is not None:
                    gate = torch.minimum(gate, torch.tensor(act.limit, dtype=torch.float64))
                    up = torch.clamp(up, -act.limit, act.limit)
                y = (up + act.up_offset) * gate / (1 + torch.exp(-act.alpha * gate))
            o = w2 @ y
            mag = w2.abs() @ y.abs()
            if w.w2_bias is not None:
                o = o + w.w2_bias[e].double()
                mag = mag + w.w2_bias[e].double().abs()
            out[t] += float(topk_weights[t, s]) * o
            magnitude[t] += abs(float(topk_weights[t, s])) * mag
    if stats is not None:
        stats["magnitude"] = magnitude
    return out


# ------------------------------------------------------------------ weight builders


def make_weights(fmt: str, e: int, h: int, i: int, *, bias: bool, interleaved: bool, seed: int = 0) -> MoEWeights:
    g = torch.Generator().manual_seed(seed)
    # Magnitudes chosen so that |gate| and |up| often exceed GPT-OSS's limit of 7 (the clamp must be exercised).
    w13 = torch.randn(e, 2 * i, h, generator=g) * 0.6
    w2 = torch.randn(e, h, i, generator=g) * 0.2
    b13 = (torch.randn(e, 2 * i, generator=g) * 2).to(torch.bfloat16) if bias else None
    b2 = torch.randn(e, h, generator=g).to(torch.bfloat16) if bias else None
    common = dict(w13_bias=b13, w2_bias=b2, gate_up_interleaved=interleaved)
    if fmt in ("bf16", "fp16", "fp32"):
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[fmt]
        return MoEWeights(w13=w13.to(dt), w2=w2.to(dt), format=fmt, **common)
    if fmt == "fp8_e4m3:per_channel":
        s13 = w13.abs().amax(-1) / 448
        s2 = w2.abs().amax(-1) / 448
        return MoEWeights(
            w13=(w13 / s13[..., None]).to(torch.float8_e4m3fn),
            w2=(w2 / s2[..., None]).to(torch.float8_e4m3fn),
            w13_scale=s13,
            w2_scale=s2,
            format=fmt,
            **common,
        )
    if fmt == "fp8_e4m3:per_tensor":
        s13 = w13.abs().flatten(1).amax(-1) / 448
        s2 = w2.abs().flatten(1).amax(-1) / 448
        return MoEWeights(
            w13=(w13 / s13[:, None, None]).to(torch.float8_e4m3fn),
            w2=(w2 / s2[:, None, None]).to(torch.float8_e4m3fn),
            w13_scale=s13,
            w2_scale=s2,
            format=fmt,
            **common,
        )
    assert fmt == "mxfp4"
    # Random codes, scales 2**-4 .. 2**-2 (w13) and 2**-6 .. 2**-4 (w2).
    return MoEWeights(
        w13=torch.randint(0, 256, (e, 2 * i, h // 2), dtype=torch.uint8, generator=g),
        w2=torch.randint(0, 256, (e, h, i // 2), dtype=torch.uint8, generator=g),
        w13_scale=torch.randint(123, 126, (e, 2 * i, h // 32), dtype=torch.uint8, generator=g),
        w2_scale=torch.randint(121, 124, (e, h, i // 32), dtype=torch.uint8, generator=g),
        format=fmt,
        **common,
    )


def make_routing(t: int, e: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 100)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    weights = torch.softmax(torch.randn(t, k, generator=g), dim=-1)
    return weights, ids


def assert_close_to(
    actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, magnitude=None, *, staged: bool = False
) -> None:
    """Error bound: fp32 computation (relative to ``magnitude``, the sum of absolute terms from :func:`loop_moe`,
    default ``|expected|``) plus rounding to ``dtype``: once at the end (fused), or of every expert output and
    again of the sum (staged)."""
    u = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    assert actual.dtype == dtype and actual.shape == expected.shape
    if not expected.numel():
        return
    magnitude = expected.abs() if magnitude is None else magnitude
    rounding = 2 * u * magnitude if staged else u * expected.abs()
    bound = rounding + 1e-5 * magnitude + 1e-7 * magnitude.max().item()
    err = (actual.double() - expected).abs()
    worst = (err - bound).max().item()
    assert worst <= 0, f"max error {err.max().item():.3g} over bound (max magnitude {magnitude.max().item():.3g})"


# ------------------------------------------------------------------ numerics

H, I, E = 64, 32, 6


@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3:per_channel", "mxfp4"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("act", [GPT_OSS, SILU], ids=["swiglu", "silu"])
@pytest.mark.parametrize("interleaved", [True, False])
def test_moe_apply_matches_loop(fmt, bias, act, interleaved):
    w = make_weights(fmt, E, H, I, bias=bias, interleaved=interleaved)
    x = torch.randn(7, H, generator=torch.Generator().manual_seed(1))
    topk_weights, topk_ids = make_routing(7, E, 3)
    stats: dict = {}
    expected = loop_moe(x, topk_weights, topk_ids, w, act, stats)
    if act.limit is not None:
        assert stats["gate_clamped"] > 0 and stats["up_clamped"] > 0  # the clamp changes the answer here
    got = tk.moe_apply(x, topk_weights, topk_ids, w, act, solution=REF)
    assert_close_to(got, expected, torch.float32, stats["magnitude"])
    # The staged path computes the same thing (fp32 activations: no intermediate rounding either).
    d = tk.moe_dispatch(x, topk_ids, E, solution=REF)
    y = tk.moe_experts(d.hidden, d.expert_offsets, w, act, solution=REF)
    staged = tk.moe_combine(y, d.permutation, topk_weights, solution=REF)
    torch.testing.assert_close(staged, got, rtol=1e-6, atol=1e-6 * got.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp32", "fp8_e4m3:per_tensor", "mxfp4"])
def test_moe_apply_low_precision_activations(dtype, fmt):
    w = make_weights(fmt, E, H, I, bias=True, interleaved=True, seed=3)
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(4)).to(dtype)
    topk_weights, topk_ids = make_routing(5, E, 4, seed=3)
    stats: dict = {}
    expected = loop_moe(x, topk_weights, topk_ids, w, GPT_OSS, stats)
    got = tk.moe_apply(x, topk_weights, topk_ids, w, GPT_OSS, solution=REF)
    assert_close_to(got, expected, dtype, stats["magnitude"])
    # Staged rounds expert outputs to x's dtype before the weighted sum: one more rounding step.
    d = tk.moe_dispatch(x, topk_ids, E, solution=REF)
    y = tk.moe_experts(d.hidden, d.expert_offsets, w, GPT_OSS, solution=REF)
    assert y.dtype == dtype
    staged = tk.moe_combine(y, d.permutation, topk_weights, solution=REF)
    assert_close_to(staged, expected, dtype, stats["magnitude"], staged=True)


@pytest.mark.parametrize(
    "case",
    ["one_expert_takes_all_k1", "one_expert_in_every_token", "most_experts_idle", "single_token", "no_tokens"],
)
def test_routing_edge_cases(case):
    g = torch.Generator().manual_seed(5)
    w = make_weights("mxfp4", E, H, I, bias=True, interleaved=True, seed=5)
    t, k = {"single_token": (1, 4), "one_expert_takes_all_k1": (6, 1), "no_tokens": (0, 2)}.get(case, (6, 2))
    if case == "one_expert_takes_all_k1":
        ids = torch.full((t, 1), 3, dtype=torch.int32)
    elif case == "one_expert_in_every_token":
        other = torch.tensor([0, 1, 2, 4, 5, 0], dtype=torch.int32)
        ids = torch.stack([torch.full((t,), 3, dtype=torch.int32), other], 1)
        ids[::2] = ids[::2].flip(1)  # expert 3 sits in slot 0 for some tokens, slot 1 for others
    elif case == "most_experts_idle":
        ids = torch.tensor([[1, 5], [5, 1], [1, 5], [5, 1], [1, 5], [1, 5]], dtype=torch.int32)
    else:
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(max(t, 1))]).to(torch.int32)[:t]
    weights = torch.rand(t, k, generator=g)
    x = torch.randn(t, H, generator=g)
    stats: dict = {}
    expected = loop_moe(x, weights, ids, w, GPT_OSS, stats)
    got = tk.moe_apply(x, weights, ids, w, GPT_OSS, solution=REF)
    assert got.shape == (t, H)
    assert_close_to(got, expected, torch.float32, stats["magnitude"])
    d = tk.moe_dispatch(x, ids, E, solution=REF)
    counts = torch.bincount(ids.flatten().long(), minlength=E)
    assert d.expert_offsets.tolist() == [0, *torch.cumsum(counts, 0).tolist()]
    y = tk.moe_experts(d.hidden, d.expert_offsets, w, GPT_OSS, solution=REF)
    staged = tk.moe_combine(y, d.permutation, weights, solution=REF)
    torch.testing.assert_close(staged, got, rtol=1e-6, atol=1e-5)


def test_dispatch_matches_loop():
    g = torch.Generator().manual_seed(6)
    t, k, e = 9, 3, 5
    ids = torch.randint(0, e, (t, k), generator=g, dtype=torch.int32)  # repeats within a token allowed
    x = torch.randn(t, 8, generator=g).to(torch.bfloat16)
    d = tk.moe_dispatch(x, ids, e, solution=REF)
    perm, offsets = [], [0]
    for expert in range(e):
        perm += [f for f in range(t * k) if int(ids.view(-1)[f]) == expert]
        offsets.append(len(perm))
    assert d.permutation.dtype == torch.int32 and d.expert_offsets.dtype == torch.int32
    assert d.permutation.tolist() == perm
    assert d.expert_offsets.tolist() == offsets
    assert torch.equal(d.hidden, x[torch.tensor(perm) // k])


def test_experts_and_combine_match_loops():
    g = torch.Generator().manual_seed(7)
    w = make_weights("fp8_e4m3:per_channel", 3, H, I, bias=True, interleaved=False, seed=7)
    offsets = torch.tensor([0, 2, 2, 5], dtype=torch.int32)  # expert 1 gets no rows
    hidden = torch.randn(5, H, generator=g)
    y = tk.moe_experts(hidden, offsets, w, GPT_OSS, solution=REF)
    owner = [0, 0, 2, 2, 2]
    expected = torch.cat(
        [loop_moe(hidden[r : r + 1], torch.ones(1, 1), torch.tensor([[owner[r]]]), w, GPT_OSS) for r in range(5)]
    )
    assert_close_to(y, expected, torch.float32)

    t, k = 3, 2
    expert_out = torch.randn(t * k, 4, generator=g)
    perm = torch.randperm(t * k, generator=g).to(torch.int32)
    topk_weights = torch.rand(t, k, generator=g)
    want = torch.zeros(t, 4, dtype=torch.float64)
    for r in range(t * k):
        f = int(perm[r])
        want[f // k] += float(topk_weights[f // k, f % k]) * expert_out[r].double()
    got = tk.moe_combine(expert_out, perm, topk_weights, solution=REF)
    assert_close_to(got, want, torch.float32)


def test_out_is_written_and_returned():
    w = make_weights("bf16", E, H, I, bias=False, interleaved=True)
    x = torch.randn(4, H, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    topk_weights, topk_ids = make_routing(4, E, 2)
    want = tk.moe_apply(x, topk_weights, topk_ids, w, GPT_OSS, solution=REF)
    out = torch.full_like(x, float("nan"))
    got = tk.moe_apply(x, topk_weights, topk_ids, w, GPT_OSS, out=out, solution=REF)
    assert got is out and torch.equal(out, want)

    d = tk.moe_dispatch(x, topk_ids, E, solution=REF)
    y_want = tk.moe_experts(d.hidden, d.expert_offsets, w, GPT_OSS, solution=REF)
    y_out = torch.full_like(d.hidden, float("nan"))
    assert tk.moe_experts(d.hidden, d.expert_offsets, w, GPT_OSS, out=y_out, solution=REF) is y_out
    assert torch.equal(y_out, y_want)
    c_out = torch.full_like(x, float("nan"))
    assert tk.moe_combine(y_want, d.permutation, topk_weights, out=c_out, solution=REF) is c_out
    assert torch.equal(c_out, tk.moe_combine(y_want, d.permutation, topk_weights, solution=REF))


# ------------------------------------------------------------------ routing


def loop_route(logits: torch.Tensor, k: int, renormalize: bool) -> tuple[list, list]:
    weights, ids = [], []
    for row in logits.double().tolist():
        order = sorted(range(len(row)), key=lambda j: (-row[j], j))[:k]
        if renormalize:
            z = [math.exp(row[j] - row[order[0]]) for j in order]
        else:
            m = max(row)
            total = sum(math.exp(v - m) for v in row)
            z = [math.exp(row[j] - m) / total for j in order]
        s = sum(z) if renormalize else 1.0
        weights.append([v / s for v in z])
        ids.append(order)
    return weights, ids


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_route_matches_loop(renormalize, dtype):
    logits = torch.randn(6, 16, generator=torch.Generator().manual_seed(9)).to(dtype) * 3
    w, ids = tk.moe_route(logits, 4, renormalize=renormalize, solution=REF)
    want_w, want_ids = loop_route(logits, 4, renormalize)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32
    assert ids.tolist() == want_ids
    torch.testing.assert_close(w, torch.tensor(want_w, dtype=torch.float32), rtol=1e-6, atol=1e-7)
    assert bool((w[:, :-1] >= w[:, 1:]).all())
    if renormalize:
        torch.testing.assert_close(w.sum(-1), torch.ones(6))


def test_route_ties_go_to_the_lower_index():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    w, ids = tk.moe_route(logits, 2, solution=REF)
    assert ids.tolist() == [[1, 2], [0, 1]]
    assert w.tolist() == [[0.5, 0.5], [0.5, 0.5]]
    w, ids = tk.moe_route(logits, 4, renormalize=False, solution=REF)
    assert ids.tolist() == [[1, 2, 4, 0], [0, 1, 2, 3]]
    torch.testing.assert_close(w[1], torch.full((4,), 0.2))


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gate_is_the_router_linear_then_the_loop_route(renormalize, dtype):
    """moe_gate: the logits ``x @ W.T + b`` (float64 here, rounded once to x's dtype as mm returns them), routed by
    the loop above."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(6, 40, generator=g).to(dtype)
    w = (torch.randn(16, 40, generator=g) * 0.4).to(dtype)
    b = torch.randn(16, generator=g).to(dtype)
    wts, ids = tk.moe_gate(x, w, b, 4, renormalize=renormalize, solution=REF)
    logits = (x.double() @ w.double().T + b.double()).to(dtype)
    want_w, want_ids = loop_route(logits, 4, renormalize)
    assert ids.tolist() == want_ids
    torch.testing.assert_close(wts, torch.tensor(want_w, dtype=torch.float32), rtol=1e-6, atol=1e-7)
    _, nb_ids = tk.moe_gate(x, w, None, 4, renormalize=renormalize, solution=REF)
    assert nb_ids.tolist() == loop_route((x.double() @ w.double().T).to(dtype), 4, renormalize)[1]


def test_gate_validation_names_the_argument():
    x, w, b = torch.randn(3, 8), torch.randn(4, 8), torch.randn(4)
    with pytest.raises(ValueError, match="^weight: expected shape"):
        tk.moe_gate(x, torch.randn(4, 9), b, 2)
    with pytest.raises(TypeError, match="^weight: expected dtype"):
        tk.moe_gate(x, w.double(), b, 2)
    with pytest.raises(ValueError, match="^bias: expected shape"):
        tk.moe_gate(x, w, torch.randn(5), 2)
    with pytest.raises(ValueError, match="^top_k: expected an int in"):
        tk.moe_gate(x, w, b, 5)
    with pytest.raises(ValueError, match="^top_k:"):
        tk.moe_gate(x, w, b, True)


# ------------------------------------------------------------------ validation through the public API


def test_public_moe_validation_names_the_argument():
    w = make_weights("bf16", E, H, I, bias=False, interleaved=True)
    x = torch.randn(3, H)
    tw, ids = make_routing(3, E, 2)
    with pytest.raises(TypeError, match="^topk_ids:"):
        tk.moe_apply(x, tw, ids.long(), w, GPT_OSS)
    with pytest.raises(ValueError, match="^x: expected hidden size"):
        tk.moe_apply(torch.randn(3, H + 1), tw, ids, w, GPT_OSS)
    with pytest.raises(ValueError, match="^topk_weights:"):
        tk.moe_apply(x, tw[:, :1], ids, w, GPT_OSS)
    with pytest.raises(ValueError, match="^topk_ids: expected 3 rows"):
        tk.moe_apply(x, tw[:2], ids[:2], w, GPT_OSS)
    with pytest.raises(TypeError, match="^out:"):
        tk.moe_apply(x, tw, ids, w, GPT_OSS, out=torch.empty(3, H, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="^activation:"):
        tk.moe_apply(x, tw, ids, w, "swiglu")
    with pytest.raises(TypeError, match="^weights:"):
        tk.moe_apply(x, tw, ids, (w.w13, w.w2), GPT_OSS)
    with pytest.raises(ValueError, match="^top_k:"):
        tk.moe_route(torch.randn(3, E), E + 1)
    with pytest.raises(ValueError, match="^num_experts:"):
        tk.moe_dispatch(x, ids, 0)
    with pytest.raises(ValueError, match="^expert_offsets:"):
        tk.moe_experts(x, torch.zeros(E, dtype=torch.int32), w, GPT_OSS)
    with pytest.raises(ValueError, match="^permutation:"):
        tk.moe_combine(torch.randn(6, H), torch.zeros(5, dtype=torch.int32), tw)
    with pytest.raises(ValueError, match="^limit:"):
        MoEActivation(limit=0.0)
    with pytest.raises(ValueError, match="silu"):
        MoEActivation(kind="silu", limit=7.0)


def test_out_of_range_expert_ids_on_the_host_are_caught_without_debug_mode(monkeypatch):
    """Before: an id past E gave an internal RuntimeError (or bincount's) unless TOKENSPEED_KERNEL_DEBUG=1."""
    monkeypatch.delenv("TOKENSPEED_KERNEL_DEBUG", raising=False)
    tk.reload_settings()
    w = make_weights("bf16", E, H, I, bias=False, interleaved=True)
    tw, ids = make_routing(3, E, 2)
    high, low = ids.clone(), ids.clone()
    high[1, 0] = E
    low[2, 1] = -1
    with pytest.raises(ValueError, match=r"^topk_ids: expert ids must lie in \[0, 6\), got \[\d, 6\]"):
        tk.moe_apply(torch.randn(3, H), tw, high, w, GPT_OSS)
    with pytest.raises(ValueError, match=r"^topk_ids: expert ids must lie in \[0, 6\), got \[-1, \d\]"):
        tk.moe_dispatch(torch.randn(3, H), low, E)


def test_staged_index_tensors_on_the_host_are_checked():
    w = make_weights("bf16", E, H, I, bias=False, interleaved=True)
    hidden = torch.randn(6, H)
    offsets = torch.tensor([0, 2, 2, 4, 5, 6, 6], dtype=torch.int32)
    assert tk.moe_experts(hidden, offsets, w, GPT_OSS).shape == (6, H)
    for bad in ([0, 2, 2, 4, 5, 6, 7], [0, 3, 2, 4, 5, 6, 6], [1, 2, 2, 4, 5, 6, 6]):
        with pytest.raises(ValueError, match=r"^expert_offsets: expected to start at 0, be non-decreasing and end "
                           r"at the 6 rows of hidden"):  # fmt: skip
            tk.moe_experts(hidden, torch.tensor(bad, dtype=torch.int32), w, GPT_OSS)
    tw = torch.full((3, 2), 0.5)
    with pytest.raises(ValueError, match=r"^permutation: entries must lie in \[0, 6\)"):
        tk.moe_combine(hidden, torch.tensor([0, 1, 2, 3, 4, 6], dtype=torch.int32), tw)


def test_canonical_weights_are_validated_once_per_object():
    """Before: a w2 of the wrong shape surfaced as an internal matmul error inside the reference."""
    good = make_weights("fp32", E, H, I, bias=False, interleaved=True)
    x = torch.randn(3, H)
    tw, ids = make_routing(3, E, 2)
    bad = MoEWeights(good.w13, torch.randn(E, H, I + 1), "fp32")
    with pytest.raises(ValueError, match=rf"^weights.w2: expected shape \[{E}, {H}, {I}\], got \[{E}, {H}, {I + 1}\]"):
        tk.moe_apply(x, tw, ids, bad, GPT_OSS)
    with pytest.raises(ValueError, match="^weights.w2: expected shape"):
        tk.moe_experts(torch.randn(6, H), torch.tensor([0, 6, 6, 6, 6, 6, 6], dtype=torch.int32), bad, GPT_OSS)
    wrong_dtype = MoEWeights(good.w13, good.w2.to(torch.bfloat16), "fp32")
    with pytest.raises(TypeError, match="^weights.w2: expected dtype fp32"):
        tk.moe_apply(x, tw, ids, wrong_dtype, GPT_OSS)
    # Validated on the first call, then remembered on the object (no per-call cost).
    fresh = MoEWeights(good.w13, good.w2, "fp32")
    assert not fresh.__dict__.get("_validated")
    calls = []
    original = MoEWeights.validate
    try:
        MoEWeights.validate = lambda self: (calls.append(1), original(self))[1]
        for _ in range(3):
            tk.moe_apply(x, tw, ids, fresh, GPT_OSS)
    finally:
        MoEWeights.validate = original
    assert calls == [1] and fresh.__dict__["_validated"]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"alpha": float("nan")}, "^alpha: expected a finite float, got nan"),
        ({"up_offset": float("inf")}, "^up_offset: expected a finite float, got inf"),
        ({"limit": float("inf")}, "^limit: expected None or a finite float > 0, got inf"),
        ({"limit": -1.0}, "^limit: expected None or a finite float > 0, got -1.0"),
    ],
)
def test_activation_constants_must_be_finite(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MoEActivation(**kwargs)


def test_weights_validate_names_the_argument():
    e, h, i = 2, 64, 32
    good = make_weights("mxfp4", e, h, i, bias=True, interleaved=True)
    good.validate()
    cases = [
        (dict(format="int4"), ValueError, "^format:"),
        (dict(w13_scale=good.w13_scale[..., :1]), ValueError, "^w13_scale: expected shape"),
        (dict(w2=good.w2.to(torch.int8)), TypeError, "^w2:"),
        (dict(w2_bias=good.w2_bias[:, :-1]), ValueError, "^w2_bias:"),
        (dict(w13=good.w13[:, :-1]), ValueError, "^w13: expected an even number of rows"),
    ]
    from dataclasses import replace

    for change, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            replace(good, **change).validate()
    fp8 = make_weights("fp8_e4m3:per_channel", e, h, i, bias=False, interleaved=True)
    fp8.validate()
    with pytest.raises(TypeError, match="^w13_scale:"):
        replace(fp8, w13_scale=fp8.w13_scale.half()).validate()
    with pytest.raises(ValueError, match="^w2_scale:"):
        replace(fp8, format="fp8_e4m3:per_tensor", w13_scale=fp8.w13_scale[:, 0]).validate()
    dense = make_weights("bf16", e, h, i, bias=False, interleaved=True)
    with pytest.raises(ValueError, match="^w13_scale: dense"):
        replace(dense, w13_scale=torch.ones(e, 2 * i)).validate()


def test_from_gpt_oss_shapes_and_decoding():
    g = torch.Generator().manual_seed(10)
    e, h, i = 3, 64, 96
    gu_blocks = torch.randint(0, 256, (e, 2 * i, h // 32, 16), dtype=torch.uint8, generator=g)
    gu_scales = torch.randint(120, 130, (e, 2 * i, h // 32), dtype=torch.uint8, generator=g)
    dn_blocks = torch.randint(0, 256, (e, h, i // 32, 16), dtype=torch.uint8, generator=g)
    dn_scales = torch.randint(120, 130, (e, h, i // 32), dtype=torch.uint8, generator=g)
    gu_bias, dn_bias = torch.randn(e, 2 * i).bfloat16(), torch.randn(e, h).bfloat16()
    w = MoEWeights.from_gpt_oss(gu_blocks, gu_scales, gu_bias, dn_blocks, dn_scales, dn_bias)
    assert w.format == "mxfp4" and w.gate_up_interleaved and w.layout == "canonical"
    assert (w.num_experts, w.hidden, w.intermediate) == (e, h, i)
    assert w.w13.shape == (e, 2 * i, h // 2) and w.w2.shape == (e, h, i // 2)
    # Row n of expert 1: the checkpoint's 32-value groups laid end to end along K.
    dense = mxfp4_matrix(w.w13[1], w.w13_scale[1])
    for grp in range(h // 32):
        want = mxfp4_matrix(gu_blocks[1, :, grp], gu_scales[1, :, grp : grp + 1])
        assert torch.equal(dense[:, 32 * grp : 32 * grp + 32], want)
    with pytest.raises(ValueError, match="^gate_up_proj_blocks: expected a last dim of 16"):
        MoEWeights.from_gpt_oss(gu_blocks[..., :8], gu_scales, None, dn_blocks, dn_scales, None)
    with pytest.raises(TypeError, match="^down_proj_blocks:"):
        MoEWeights.from_gpt_oss(gu_blocks, gu_scales, None, dn_blocks.float(), dn_scales, None)
    with pytest.raises(ValueError, match="^w2_scale:"):
        MoEWeights.from_gpt_oss(gu_blocks, gu_scales, None, dn_blocks, dn_scales[:, :, :1], None)


def test_plan_and_process_weights_on_cpu():
    w = make_weights("mxfp4", E, H, I, bias=True, interleaved=True)
    plan = tk.moe_plan(w, GPT_OSS, dtype=torch.float32, device="cpu", solution=REF)
    assert plan.kernel == "reference.moe_apply" and plan.layout == "canonical"
    assert plan.format == "mxfp4" and plan.activation == GPT_OSS
    assert tk.moe_process_weights(plan, w) is w
    x = torch.randn(4, H, generator=torch.Generator().manual_seed(11))
    tw, ids = make_routing(4, E, 2)
    planned = tk.moe_apply(x, tw, ids, w, GPT_OSS, plan=plan)
    assert torch.equal(planned, tk.moe_apply(x, tw, ids, w, GPT_OSS, solution=REF))
    assert_close_to(planned, loop_moe(x, tw, ids, w, GPT_OSS), torch.float32)
    with pytest.raises(ValueError, match="^activation:"):
        tk.moe_apply(x, tw, ids, w, SILU, plan=plan)
    with pytest.raises(TypeError, match="^plan: expected a MoEPlan"):
        tk.moe_apply(x, tw, ids, w, GPT_OSS, plan="reference.moe_apply")
    with pytest.raises(TypeError, match="^dtype:"):
        tk.moe_plan(w, GPT_OSS, dtype=torch.float64, solution=REF)


# ------------------------------------------------------------------ parity with transformers' GPT-OSS MLP


def test_matches_transformers_gpt_oss_mlp():
    pytest.importorskip("transformers")
    from transformers import GptOssConfig
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP

    e, h, i, k, t = 8, 64, 64, 4, 9
    g = torch.Generator().manual_seed(12)
    gu_blocks = torch.randint(0, 256, (e, 2 * i, h // 32, 16), dtype=torch.uint8, generator=g)
    gu_scales = torch.randint(123, 126, (e, 2 * i, h // 32), dtype=torch.uint8, generator=g)
    dn_blocks = torch.randint(0, 256, (e, h, i // 32, 16), dtype=torch.uint8, generator=g)
    dn_scales = torch.randint(120, 123, (e, h, i // 32), dtype=torch.uint8, generator=g)
    gu_bias, dn_bias = torch.randn(e, 2 * i, generator=g), torch.randn(e, h, generator=g)
    router_w, router_b = torch.randn(e, h, generator=g), torch.randn(e, generator=g)
    x = torch.randn(t, h, generator=g)

    cfg = GptOssConfig(hidden_size=h, intermediate_size=i, num_local_experts=e, num_experts_per_tok=k, swiglu_limit=7.0)
    mlp = GptOssMLP(cfg).float()
    with torch.no_grad():
        # transformers keeps [E, K, N] (input-major) weights, dequantized by its own MXFP4 decoder.
        mlp.experts.gate_up_proj.copy_(convert_moe_packed_tensors(gu_blocks, gu_scales, dtype=torch.float32))
        mlp.experts.down_proj.copy_(convert_moe_packed_tensors(dn_blocks, dn_scales, dtype=torch.float32))
        mlp.experts.gate_up_proj_bias.copy_(gu_bias)
        mlp.experts.down_proj_bias.copy_(dn_bias)
        mlp.router.weight.copy_(router_w)
        mlp.router.bias.copy_(router_b)
        want, _ = mlp(x.unsqueeze(0))

    weights = MoEWeights.from_gpt_oss(gu_blocks, gu_scales, gu_bias, dn_blocks, dn_scales, dn_bias)
    topk_weights, topk_ids = tk.moe_route(x @ router_w.T + router_b, k, solution=REF)
    got = tk.moe_apply(x, topk_weights, topk_ids, weights, GPT_OSS, solution=REF)
    assert_close_to(got, want[0].double(), torch.float32)

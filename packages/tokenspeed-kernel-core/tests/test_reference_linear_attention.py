"""The gated delta rule's references: the recurrence against the chunked formulation and
against formulas written here (orthonormal keys turn the delta rule into decayed linear
attention; one token by hand), the decode step against the recurrence, and the ops'
argument checks."""

from __future__ import annotations

import math

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.reference.linear_attention import gdn_chunked, gdn_recurrent, l2norm

REF = "reference"


def _inputs(t, h, hv, dk, dv, *, seed=0, unit_keys=True):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, h, dk, generator=g)
    k = torch.randn(t, h, dk, generator=g)
    if unit_keys:
        k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(t, hv, dv, generator=g)
    gate = -torch.rand(t, hv, generator=g) * 0.5
    beta = torch.rand(t, hv, generator=g)
    return q, k, v, gate, beta


@pytest.mark.parametrize("chunk", [1, 16, 64])
@pytest.mark.parametrize("l2", [False, True])
def test_chunked_equals_recurrence(chunk, l2):
    q, k, v, g, b = _inputs(150, 2, 4, 16, 8)
    cu = torch.tensor([0, 50, 50, 51, 150], dtype=torch.int32)
    s0 = torch.randn(4, 4, 16, 8, generator=torch.Generator().manual_seed(1))
    o1, f1 = gdn_recurrent(q, k, v, g, b, scale=0.3, initial_state=s0, cu_seqlens=cu, use_qk_l2norm=l2)
    o2, f2 = gdn_chunked(q, k, v, g, b, scale=0.3, initial_state=s0, cu_seqlens=cu, use_qk_l2norm=l2,
                         chunk_size=chunk)  # fmt: skip
    torch.testing.assert_close(o2, o1, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(f2, f1, rtol=1e-4, atol=1e-4)
    # The empty sequence's final state is its initial state.
    torch.testing.assert_close(f1[1], s0[1])


def test_orthonormal_keys_give_decayed_linear_attention():
    """With orthonormal keys, S^T k_t = 0 before k_t is written, so u_t = beta_t v_t and
    o_t = sum_{j<=t} exp(G_t - G_j) beta_j (q_t . k_j) v_j (G: cumulative log decay)."""
    t, dk, dv = 8, 8, 5
    basis = torch.linalg.qr(torch.randn(dk, dk, generator=torch.Generator().manual_seed(3)))[0]
    k = basis[:t].reshape(t, 1, dk)
    q, _, v, g, b = _inputs(t, 1, 1, dk, dv, seed=4)
    o, final = gdn_recurrent(q, k, v, g, b, scale=0.7)
    cg = torch.cumsum(g[:, 0], 0)
    want = torch.zeros(t, dv)
    for i in range(t):
        for j in range(i + 1):
            want[i] += math.exp(cg[i] - cg[j]) * b[j, 0] * 0.7 * (q[i, 0] @ k[j, 0]) * v[j, 0]
    torch.testing.assert_close(o[:, 0], want, rtol=1e-5, atol=1e-5)
    s_want = sum(math.exp(cg[-1] - cg[j]) * b[j, 0] * torch.outer(k[j, 0], v[j, 0]) for j in range(t))
    torch.testing.assert_close(final[0, 0], s_want, rtol=1e-5, atol=1e-5)


def test_one_token_by_hand():
    q = torch.tensor([[[1.0, 2.0]]])
    k = torch.tensor([[[3.0, 4.0]]])  # |k| = 5
    v = torch.tensor([[[1.0, -1.0, 2.0]]])
    g, b = torch.tensor([[math.log(0.5)]]), torch.tensor([[0.25]])
    s0 = torch.ones(1, 1, 2, 3)
    o, final = tk.gdn_chunk_prefill(q, k, v, g, b, scale=1.0, initial_state=s0, output_final_state=True,
                                    use_qk_l2norm=True, solution=REF)  # fmt: skip
    qn, kn = torch.tensor([1.0, 2.0]) / math.sqrt(5 + 1e-6), torch.tensor([0.6, 0.8]) * 5 / math.sqrt(25 + 1e-6)
    s = 0.5 * torch.ones(2, 3)
    u = 0.25 * (v[0, 0] - s.T @ kn)
    s = s + torch.outer(kn, u)
    torch.testing.assert_close(final[0, 0], s)
    torch.testing.assert_close(o[0, 0], s.T @ qn)


@pytest.mark.parametrize("indexed", [False, True])
def test_decode_is_one_recurrence_step(indexed):
    b, h, hv, dk, dv = 4, 2, 4, 8, 6
    q, k, v, g, beta = _inputs(b, h, hv, dk, dv, seed=5)
    state = torch.randn(7, hv, dk, dv, generator=torch.Generator().manual_seed(6))
    before = state.clone()
    idx = torch.tensor([5, -1, 0, 3], dtype=torch.int32) if indexed else None
    o = tk.gdn_decode(q, k, v, g, beta, state, state_indices=idx, use_qk_l2norm=True, solution=REF)
    slots = idx.tolist() if indexed else list(range(b))
    for i, slot in enumerate(slots):
        if slot < 0:
            assert not o[i].any()
            continue
        want_o, want_s = gdn_recurrent(q[i : i + 1], k[i : i + 1], v[i : i + 1], g[i : i + 1], beta[i : i + 1],
                                       scale=dk**-0.5, initial_state=before[slot : slot + 1], use_qk_l2norm=True)  # fmt: skip
        torch.testing.assert_close(o[i], want_o[0])
        torch.testing.assert_close(state[slot], want_s[0])
    untouched = [s for s in range(7) if s not in slots]
    assert torch.equal(state[untouched], before[untouched])


def test_l2norm_matches_the_definition():
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(l2norm(x), x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6))


def test_bf16_prefill_returns_q_dtype_and_grouped_heads():
    q, k, v, g, b = _inputs(20, 1, 3, 8, 4, seed=7)
    o = tk.gdn_chunk_prefill(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, b, solution=REF)
    assert o.dtype == torch.bfloat16 and o.shape == (20, 3, 4)
    # Every value head reads q/k head 0: heads differ only through v, g, beta.
    want, _ = gdn_recurrent(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, b, scale=8**-0.5)
    torch.testing.assert_close(o.float(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(k=torch.randn(5, 2, 16)), "k: expected shape"),
        (dict(v=torch.randn(5, 3, 4)), "multiple of the 2 q/k heads"),
        (dict(g=torch.randn(5, 2)), "g: expected shape"),
        (dict(beta=torch.randn(5, 4, dtype=torch.float64)), "beta: expected dtype"),
        (dict(cu_seqlens=torch.tensor([0, 2, 4], dtype=torch.int32)), "cu_seqlens: the last entry"),
        (dict(initial_state=torch.zeros(2, 4, 8, 4)), "initial_state: expected shape"),
        (dict(scale=0.0), "scale"),
        (dict(out=torch.empty(5, 4, 4, dtype=torch.bfloat16)), "out: expected dtype"),
    ],
)
def test_prefill_argument_errors(change, match):
    args = dict(q=torch.randn(5, 2, 8), k=torch.randn(5, 2, 8), v=torch.randn(5, 4, 4), g=torch.randn(5, 4),
                beta=torch.rand(5, 4))  # fmt: skip
    args.update(change)
    q, k, v, g, beta = (args.pop(n) for n in ("q", "k", "v", "g", "beta"))
    with pytest.raises((TypeError, ValueError), match=match):
        tk.gdn_chunk_prefill(q, k, v, g, beta, **args)


@pytest.mark.parametrize(
    "change,match",
    [
        (dict(state=torch.zeros(3, 2, 8, 4)), "state: expected shape"),
        (dict(state=torch.zeros(1, 4, 8, 4)), "at least 2 states"),
        (dict(state_indices=torch.tensor([0, 9], dtype=torch.int32)), "state_indices: entries must be < 5"),
        (dict(state_indices=torch.tensor([0, 1])), "state_indices: expected dtype"),
    ],
)
def test_decode_argument_errors(change, match):
    args = dict(state=torch.zeros(5, 4, 8, 4))
    args.update(change)
    with pytest.raises((TypeError, ValueError), match=match):
        tk.gdn_decode(torch.randn(2, 2, 8), torch.randn(2, 2, 8), torch.randn(2, 4, 4), torch.randn(2, 4),
                      torch.rand(2, 4), args.pop("state"), **args)  # fmt: skip

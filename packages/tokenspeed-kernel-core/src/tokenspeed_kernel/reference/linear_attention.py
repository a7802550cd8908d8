"""Reference gated delta rule: the token-by-token recurrence (the ground truth) and a
chunked (WY / UT) formulation of the same computation, both in float32.

Chunked form, per value head and chunk of C tokens starting from state ``S0``, with
``G`` the within-chunk cumulative log decay and ``Gam = exp(G)``:

- ``A[i, j] = beta_i * Gam_i / Gam_j * (k_i . k_j)`` for ``j < i`` (0 elsewhere), ``T = (I + A)^-1``;
- ``U = T (beta * V) - T (beta * Gam * K) S0`` (the delta rule's corrected values);
- ``O = scale * (Gam * Q) S0 + scale * (M o Q K^T) U`` with ``M[i, j] = Gam_i / Gam_j`` for ``j <= i``;
- ``S_C = Gam_C * S0 + K^T ((Gam_C / Gam) * U)``.
"""

from __future__ import annotations

import itertools

import torch

__all__ = ["l2norm", "gdn_recurrent", "gdn_chunked", "gdn_chunk_prefill", "gdn_decode"]

_EPS = 1e-6


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + 1e-6)`` over the last dim, in float32."""
    x = x.to(torch.float32)
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + _EPS)


def _prepare(q, k, v, g, beta, use_qk_l2norm):
    hv = v.shape[1]
    group = hv // q.shape[1]
    qf, kf = (l2norm(q), l2norm(k)) if use_qk_l2norm else (q.float(), k.float())
    # Value head j reads q/k head j // group.
    qf = qf.repeat_interleave(group, dim=1)
    kf = kf.repeat_interleave(group, dim=1)
    return qf, kf, v.float(), g.float(), beta.float()


def _bounds(cu_seqlens: torch.Tensor | None, tokens: int) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(0, tokens)]
    c = cu_seqlens.tolist()
    return list(itertools.pairwise(c))


def _step(s, qi, ki, vi, gi, bi, scale):
    """One token on the states ``s [HV, K, V]``: ``(new states, o [HV, V])``."""
    s = s * torch.exp(gi)[:, None, None]
    u = bi[:, None] * (vi - torch.einsum("hkv,hk->hv", s, ki))
    s = s + ki[:, :, None] * u[:, None, :]
    return s, torch.einsum("hkv,hk->hv", s, qi * scale)


def _per_sequence(q, k, v, g, beta, initial_state, cu_seqlens, use_qk_l2norm, run):
    """``run(s, lo, hi, inputs, o)`` over each sequence from its initial state (zeros without one),
    writing ``o`` and returning the final state: ``(o float32 [T, HV, V], final float32 [B, HV, K, V])``."""
    inputs = _prepare(q, k, v, g, beta, use_qk_l2norm)
    qf, vf = inputs[0], inputs[2]
    t, hv, dv = vf.shape
    bounds = _bounds(cu_seqlens, t)
    o = torch.zeros((t, hv, dv), dtype=torch.float32, device=v.device)
    final = torch.zeros((len(bounds), hv, qf.shape[-1], dv), dtype=torch.float32, device=v.device)
    for b, (lo, hi) in enumerate(bounds):
        s = initial_state[b].float().clone() if initial_state is not None else final[b].clone()  # [HV, K, V]
        final[b] = run(s, lo, hi, inputs, o)
    return o, final


def gdn_recurrent(q, k, v, g, beta, *, scale, initial_state=None, cu_seqlens=None, use_qk_l2norm=False):
    """Token by token: ``(o float32 [T, HV, V], final float32 [B, HV, K, V])``."""

    def run(s, lo, hi, inputs, o):
        qf, kf, vf, gf, bf = inputs
        for i in range(lo, hi):
            s, o[i] = _step(s, qf[i], kf[i], vf[i], gf[i], bf[i], scale)
        return s

    return _per_sequence(q, k, v, g, beta, initial_state, cu_seqlens, use_qk_l2norm, run)


def gdn_chunked(q, k, v, g, beta, *, scale, initial_state=None, cu_seqlens=None, use_qk_l2norm=False,
                chunk_size=64):  # fmt: skip
    """The chunked (WY / UT) formulation of :func:`gdn_recurrent` (same results up to rounding)."""

    def run(s, lo, hi, inputs, o):
        qf, kf, vf, gf, bf = inputs
        hv, dev = vf.shape[1], vf.device
        for c0 in range(lo, hi, chunk_size):
            c1 = min(c0 + chunk_size, hi)
            qc, kc, vc = (x[c0:c1].transpose(0, 1) for x in (qf, kf, vf))  # [HV, C, *]
            gc, bc = gf[c0:c1].T, bf[c0:c1].T  # [HV, C]
            cg = torch.cumsum(gc, dim=-1)
            ratio = torch.exp(cg[:, :, None] - cg[:, None, :])  # Gam_i / Gam_j
            n = c1 - c0
            lower = torch.tril(torch.ones(n, n, dtype=torch.bool, device=dev), diagonal=-1)
            a = torch.where(lower, bc[:, :, None] * ratio * (kc @ kc.transpose(1, 2)), 0.0)
            eye = torch.eye(n, device=dev).expand(hv, n, n)
            tinv = torch.linalg.solve_triangular(eye + a, eye, upper=False)
            gam = torch.exp(cg)
            w = tinv @ (bc[:, :, None] * gam[:, :, None] * kc)
            u = tinv @ (bc[:, :, None] * vc) - w @ s
            causal = torch.tril(torch.ones(n, n, dtype=torch.bool, device=dev))
            attn = torch.where(causal, ratio * (qc @ kc.transpose(1, 2)), 0.0)
            oc = scale * (gam[:, :, None] * qc) @ s + scale * attn @ u
            o[c0:c1] = oc.transpose(0, 1)
            last = gam[:, -1]
            s = last[:, None, None] * s + kc.transpose(1, 2) @ (torch.exp(cg[:, -1:] - cg)[:, :, None] * u)
        return s

    return _per_sequence(q, k, v, g, beta, initial_state, cu_seqlens, use_qk_l2norm, run)


def gdn_chunk_prefill(q, k, v, g, beta, *, scale, initial_state=None, cu_seqlens=None, output_final_state=False,
                      use_qk_l2norm=False, out=None):  # fmt: skip
    """The registered reference of ``tokenspeed_kernel.gdn_chunk_prefill``: the recurrence."""
    o, final = gdn_recurrent(q, k, v, g, beta, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens,
                             use_qk_l2norm=use_qk_l2norm)  # fmt: skip
    if out is not None:
        out.copy_(o)
        o = out
    else:
        o = o.to(q.dtype)
    return (o, final) if output_final_state else o


def gdn_decode(q, k, v, g, beta, state, *, scale, state_indices=None, use_qk_l2norm=False, out=None):
    """The registered reference of ``tokenspeed_kernel.gdn_decode``: one recurrence step per
    sequence on ``state[state_indices[b]]`` (in place); padding rows (index < 0) give zeros."""
    qf, kf, vf, gf, bf = _prepare(q, k, v, g, beta, use_qk_l2norm)
    b = q.shape[0]
    idx = list(range(b)) if state_indices is None else state_indices.tolist()
    o = torch.zeros(vf.shape, dtype=torch.float32, device=v.device)
    for i, slot in enumerate(idx):
        if slot < 0:
            continue
        state[slot], o[i] = _step(state[slot], qf[i], kf[i], vf[i], gf[i], bf[i], scale)
    if out is not None:
        return out.copy_(o)
    return o.to(q.dtype)

"""Portable Triton sampling: greedy argmax and the index-order top-k / top-p sampler.

``argmax`` runs in two stages so that one row of a large vocabulary (GPT-OSS:
201088) spreads over many programs: stage one reduces fixed chunks to
(value, first index) pairs, stage two reduces a row's chunks. NaN counts as the
largest value (the first NaN wins), as in ``torch.argmax``.

``top_k_top_p_sample`` follows ``tokenspeed_kernel.ops.sampling``'s definition
without sorting. One program owns a row. It works on the unnormalised weights
``e_i = exp(x_i - max x)``, ``x = logits / temperature`` (the softmax's
normalisation cancels out of every comparison), whose fp32 bit patterns order
like the values since they are >= 0:

1. the top-k threshold is the largest bit pattern ``b`` with
   ``count(e_i >= b) >= k``; the top-p threshold the largest ``b`` with
   ``sum(e_i >= b, kept by top-k) >= top_p * mass``. Both are found by a
   multi-way search over bit patterns: each pass over the row tests ``PROBES``
   candidates at once and shrinks the range ``PROBES + 1`` times (about 8 passes
   for 30 bits at 16 probes), so the search is exact, not approximate;
2. an inverse-CDF scan in index order picks the first token whose running kept
   mass exceeds ``u * kept_mass``.

Masses accumulate in fp64 (as the reference's do), so the sampled token matches
the reference's for the same uniform except where fp rounding ties two choices.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._configs import row_config, sample_config

__all__ = ["argmax", "top_k_top_p_sample", "TRITON_KERNELS"]


@triton.jit
def _argmax_chunk_kernel(x_ptr, val_ptr, idx_ptr, V, stride_x, n_chunks, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    """Stage one: the max (NaN if the chunk has one) and its first index over ``BLOCK * STEPS`` logits."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    start = chunk * (BLOCK * STEPS)
    best = tl.full((), float("-inf"), tl.float32)
    best_idx = start
    nan_idx = tl.full((), 2147483647, tl.int32)
    for step in tl.static_range(STEPS):
        cols = start + step * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        is_nan = x != x
        nan_idx = tl.minimum(nan_idx, tl.min(tl.where(is_nan, cols, 2147483647), axis=0))
        x = tl.where(is_nan, float("-inf"), x)
        m = tl.max(x, axis=0)
        # First index of the block max; a later block must be strictly larger to win.
        i = tl.min(tl.where(x == m, cols, 2147483647), axis=0)
        take = m > best
        best_idx = tl.where(take, i, best_idx)
        best = tl.where(take, m, best)
    has_nan = nan_idx < 2147483647
    tl.store(val_ptr + row * n_chunks + chunk, tl.where(has_nan, float("nan"), best))
    tl.store(idx_ptr + row * n_chunks + chunk, tl.where(has_nan, nan_idx, best_idx).to(idx_ptr.dtype.element_ty))


@triton.jit
def _argmax_reduce_kernel(val_ptr, idx_ptr, out_ptr, n_chunks, BLOCK_C: tl.constexpr):
    """Stage two: the first chunk holding a NaN, else the first chunk reaching the max."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    ok = c < n_chunks
    v = tl.load(val_ptr + row * n_chunks + c, mask=ok, other=float("-inf"))
    i = tl.load(idx_ptr + row * n_chunks + c, mask=ok, other=2147483647)
    is_nan = v != v
    nan_i = tl.min(tl.where(is_nan & ok, i, 2147483647), axis=0)
    v = tl.where(is_nan, float("-inf"), v)
    m = tl.max(v, axis=0)
    # Chunks are in index order, so the smallest index among the tied maxima is the first.
    best = tl.min(tl.where((v == m) & ok, i, 2147483647), axis=0)
    tl.store(out_ptr + row, tl.where(nan_i < 2147483647, nan_i, best).to(tl.int64))


@triton.jit
def _sample_kernel(
    logits_ptr,
    top_k_ptr,
    top_p_ptr,
    temperature_ptr,
    uniform_ptr,
    out_ptr,
    V,
    stride_row,
    BLOCK: tl.constexpr,
    PROBES: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = logits_ptr + row * stride_row
    k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    temperature = tl.load(temperature_ptr + row)
    u = tl.load(uniform_ptr + row)

    # Pass 0: the row max (division by temperature > 0 is monotone, so max x = max(logits) / t).
    l_max = tl.full((), float("-inf"), tl.float32)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        blk = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        l_max = tl.maximum(l_max, tl.max(blk, axis=0))
    x_max = tl.div_rn(l_max, temperature)
    # Each pass below recomputes, per block, e = exp(logits / t - x_max) (the same
    # division as the reference's, IEEE) and its bits; e = 0 past V. The four lines
    # are inlined rather than a helper: the interpreter pays ~10 ms per helper call.

    # Every e lies in [0, 1]: bit patterns of [0, 1.0] are the search space.
    probe = tl.arange(0, PROBES) + 1
    top = tl.full((), 0x3F800001, tl.int32)  # one past 1.0's bits: nothing reaches it
    threshold = tl.full((), 0, tl.int32)  # keeps every token

    if (k > 0) & (k < V):
        # Top-k: largest b with count(bits >= b) >= k. lo always satisfies it, hi never.
        lo = threshold
        hi = top
        while hi - lo > 1:
            step = tl.maximum((hi - lo) // (PROBES + 1), 1)
            cand = lo + step * probe
            count = tl.zeros((PROBES,), dtype=tl.int32)
            for start in range(0, V, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                logits = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
                e = tl.exp(tl.div_rn(logits, temperature) - x_max)
                bits = e.to(tl.int32, bitcast=True)
                count += tl.sum((bits[None, :] >= cand[:, None]).to(tl.int32), axis=1)
            ok = count >= k
            lo = tl.maximum(lo, tl.max(tl.where(ok, cand, lo), axis=0))
            hi = tl.minimum(hi, tl.min(tl.where(ok, hi, cand), axis=0))
        threshold = lo

    if top_p < 1.0:
        # Top-p: largest b >= the top-k threshold with kept mass(bits >= b) >= top_p * mass.
        mass = tl.zeros((), dtype=tl.float64)
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            logits = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            e = tl.exp(tl.div_rn(logits, temperature) - x_max)
            bits = e.to(tl.int32, bitcast=True)
            mass += tl.sum(tl.where(bits >= threshold, e, 0.0).to(tl.float64), axis=0)
        need = top_p.to(tl.float64) * mass
        lo = threshold
        hi = top
        while hi - lo > 1:
            step = tl.maximum((hi - lo) // (PROBES + 1), 1)
            cand = lo + step * probe
            kept = tl.zeros((PROBES,), dtype=tl.float64)
            for start in range(0, V, BLOCK):
                cols = start + tl.arange(0, BLOCK)
                logits = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
                e = tl.exp(tl.div_rn(logits, temperature) - x_max)
                bits = e.to(tl.int32, bitcast=True)
                hit = bits[None, :] >= cand[:, None]
                kept += tl.sum(tl.where(hit, e[None, :], 0.0).to(tl.float64), axis=1)
            ok = kept >= need
            lo = tl.maximum(lo, tl.max(tl.where(ok, cand, lo), axis=0))
            hi = tl.minimum(hi, tl.min(tl.where(ok, hi, cand), axis=0))
        threshold = lo

    # Inverse CDF in index order over the kept tokens.
    mass = tl.zeros((), dtype=tl.float64)
    for start in range(0, V, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        logits = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        e = tl.exp(tl.div_rn(logits, temperature) - x_max)
        bits = e.to(tl.int32, bitcast=True)
        mass += tl.sum(tl.where(bits >= threshold, e, 0.0).to(tl.float64), axis=0)
    target = u.to(tl.float64) * mass
    running = tl.zeros((), dtype=tl.float64)
    found = tl.full((), 2147483647, tl.int32)
    last = tl.full((), -1, tl.int32)
    start = 0
    while (start < V) & (found == 2147483647):
        cols = start + tl.arange(0, BLOCK)
        logits = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        e = tl.exp(tl.div_rn(logits, temperature) - x_max)
        bits = e.to(tl.int32, bitcast=True)
        w = tl.where(bits >= threshold, e, 0.0).to(tl.float64)
        cdf = running + tl.cumsum(w, axis=0)
        found = tl.min(tl.where((cdf > target) & (cols < V), cols, 2147483647), axis=0)
        # If rounding leaves the whole row's mass at or below the target, fall back
        # to the last kept token with non-zero weight.
        last = tl.maximum(last, tl.max(tl.where(w > 0, cols, -1), axis=0))
        running = tl.max(cdf, axis=0)
        start += BLOCK
    tl.store(out_ptr + row, tl.where(found < 2147483647, found, last).to(tl.int64))


TRITON_KERNELS = {
    "argmax_chunk": _argmax_chunk_kernel,
    "argmax_reduce": _argmax_reduce_kernel,
    "top_k_top_p_sample": _sample_kernel,
}


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Index of the largest logit per row (first on ties; the first NaN if a row has one).

    Args:
        logits: ``[B, V]`` bf16/fp16/fp32, last dim contiguous.

    Returns:
        ``int64 [B]``.
    """
    b, v = logits.shape
    out = torch.empty((b,), dtype=torch.int64, device=logits.device)
    if b == 0:
        return out
    if v == 0:
        raise ValueError("logits: argmax needs at least one column")
    cfg = row_config("argmax", logits.device)
    block = min(cfg.block, triton.next_power_of_2(v))
    steps = min(cfg.rows, triton.cdiv(v, block))
    n_chunks = triton.cdiv(v, block * steps)
    if n_chunks == 1:
        # One chunk per row: stage one's index is the answer.
        values = torch.empty((b,), dtype=torch.float32, device=logits.device)
        _argmax_chunk_kernel[(b, 1)](
            logits, values, out, v, logits.stride(0), 1, BLOCK=block, STEPS=steps, num_warps=cfg.num_warps
        )
        return out
    values = torch.empty((b, n_chunks), dtype=torch.float32, device=logits.device)
    indices = torch.empty((b, n_chunks), dtype=torch.int32, device=logits.device)
    _argmax_chunk_kernel[(b, n_chunks)](
        logits, values, indices, v, logits.stride(0), n_chunks, BLOCK=block, STEPS=steps, num_warps=cfg.num_warps
    )
    _argmax_reduce_kernel[(b,)](values, indices, out, n_chunks, BLOCK_C=triton.next_power_of_2(n_chunks))
    return out


def top_k_top_p_sample(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    temperature: torch.Tensor,
    uniform: torch.Tensor,
) -> torch.Tensor:
    """One token per row of ``logits [B, V]`` (definition in :mod:`tokenspeed_kernel.ops.sampling`).

    Args:
        logits: ``[B, V]`` bf16/fp16/fp32, last dim contiguous.
        top_k: ``int32 [B]``; 0 (or >= V) keeps every token.
        top_p: ``float32 [B]`` in (0, 1]; 1 keeps what top-k kept.
        temperature: ``float32 [B]``, > 0.
        uniform: ``float32 [B]`` in [0, 1), each row's random number.

    Returns:
        ``int64 [B]``.
    """
    b, v = logits.shape
    out = torch.empty((b,), dtype=torch.int64, device=logits.device)
    if b == 0:
        return out
    if v == 0:
        raise ValueError("logits: sampling needs at least one column")
    cfg = sample_config(logits.device)
    _sample_kernel[(b,)](
        logits, top_k, top_p, temperature, uniform, out, v, logits.stride(0),
        BLOCK=min(cfg.block, triton.next_power_of_2(v)),
        PROBES=cfg.probes,
        num_warps=cfg.num_warps,
    )  # fmt: skip
    return out

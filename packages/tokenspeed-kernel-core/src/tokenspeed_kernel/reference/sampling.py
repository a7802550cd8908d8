"""Reference sampling: greedy argmax and the index-order top-k / top-p sampler.

The sampler follows :mod:`tokenspeed_kernel.ops.sampling`'s definition step by
step; sums of probabilities run in fp64 so that the reference sits as close to
the exact definition as the fp32 probabilities allow.
"""

from __future__ import annotations

import torch


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Index of the largest value per row of ``logits [B, V]``, the first on ties -> ``int64 [B]``.

    A row holding NaN returns its first NaN (NaN counts as the largest value, as in ``torch.argmax``).
    """
    x = logits.to(torch.float32)
    best = x.max(dim=-1, keepdim=True).values
    hit = (x == best) | (x.isnan() & best.isnan())
    index = torch.arange(x.shape[-1], device=x.device).expand_as(x)
    return torch.where(hit, index, x.shape[-1]).min(dim=-1).values


def top_k_top_p_sample(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    temperature: torch.Tensor,
    uniform: torch.Tensor,
) -> torch.Tensor:
    """One token per row of ``logits [B, V]`` -> ``int64 [B]``.

    Args:
        logits: ``[B, V]`` bf16/fp16/fp32.
        top_k: ``int32 [B]`` in [0, V]; 0 keeps every token.
        top_p: ``float32 [B]`` in (0, 1]; 1 keeps every token top-k kept.
        temperature: ``float32 [B]``, > 0.
        uniform: ``float32 [B]`` in [0, 1), the random number of each row.
    """
    v = logits.shape[-1]
    p = torch.softmax(logits.to(torch.float32) / temperature.unsqueeze(-1), dim=-1)
    sorted_p = p.sort(dim=-1, descending=True).values

    # Top-k: keep p >= the k-th largest p (ties with it kept).
    k = top_k.long().unsqueeze(-1)
    kth = sorted_p.gather(-1, (k.clamp(min=1) - 1))
    no_top_k = k == 0
    keep = (p >= kth) | no_top_k
    kept_sorted = torch.where((sorted_p >= kth) | no_top_k, sorted_p, 0.0).double()

    # Top-p: the threshold t is the largest kept value whose tie-inclusive mass
    # sum(p_i >= t) reaches top_p * mass. Walking the kept values in descending
    # order, that is the value at the first position whose running sum reaches it.
    running = kept_sorted.cumsum(dim=-1)
    need = top_p.double().unsqueeze(-1) * running[:, -1:]
    first = (running < need).sum(dim=-1, keepdim=True)
    n_kept = (kept_sorted > 0).sum(dim=-1, keepdim=True).clamp(min=1)
    threshold = sorted_p.gather(-1, torch.minimum(first, n_kept - 1))
    keep &= (p >= threshold) | (top_p >= 1.0).unsqueeze(-1)

    # Inverse CDF in index order.
    cdf = torch.where(keep, p, 0.0).double().cumsum(dim=-1)
    target = uniform.double().unsqueeze(-1) * cdf[:, -1:]
    return (cdf <= target).sum(dim=-1).clamp(max=v - 1)

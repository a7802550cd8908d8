"""Reference attention: packed varlen prefill, paged extend/decode, cache store.

Semantics are those of :mod:`tokenspeed_kernel.ops.attention`. Everything is
computed in fp32 (an fp8 cache is dequantized at scale 1.0) and the output is
cast once to ``q``'s dtype. Sequences are handled one at a time; within a
sequence the queries go in chunks sized so the fp32 score block stays near
:data:`SCORE_BLOCK_ELEMENTS`, and a chunk only reads the keys its mask can
reach, so sliding-window layers cost ``O(L * window)`` rather than ``O(L^2)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["mha_prefill", "mha_extend_with_kvcache", "mha_decode_with_kvcache", "kvcache_store"]

#: Upper bound (elements) on one fp32 score block ``[Hq, chunk_q, keys]`` (256 MiB).
SCORE_BLOCK_ELEMENTS = 1 << 26

# (lo, hi) -> fp32 keys and values of positions [lo, hi), each [hi - lo, Hkv, D].
_FetchKV = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


def _attend_sequence(
    q: torch.Tensor,
    first_pos: int,
    num_keys: int,
    fetch_kv: _FetchKV,
    out: torch.Tensor,
    lse: torch.Tensor | None,
    *,
    causal: bool,
    window_left: int,
    sinks: torch.Tensor | None,
    softmax_scale: float,
    logit_cap: float,
) -> None:
    """Attention of one sequence's queries, written into ``out`` (and ``lse``).

    q: ``[Lq, Hq, D]``; query ``i`` sits at position ``first_pos + i`` (may be
    negative). Keys are positions ``0 .. num_keys - 1``. out: ``[Lq, Hq, D]``;
    lse: ``float32 [Lq, Hq]`` or None.
    """
    lq, hq, d = q.shape
    if lq == 0:
        return
    if window_left < 0:
        chunk, keys = lq, num_keys
    else:
        # A chunk of queries reads at most chunk + window keys; chunks about as long as the
        # window keep that near 2x the keys actually visible.
        chunk = max(window_left + 1, 256)
        keys = min(num_keys, chunk + window_left)
    chunk = max(1, min(lq, chunk, SCORE_BLOCK_ELEMENTS // max(1, hq * keys)))
    sink = None if sinks is None else sinks.float().view(hq, 1, 1)
    for i0 in range(0, lq, chunk):
        i1 = min(lq, i0 + chunk)
        p0, p1 = first_pos + i0, first_pos + i1  # query positions [p0, p1)
        lo = 0 if window_left < 0 else max(0, p0 - window_left)
        hi = max(lo, min(num_keys, p1) if causal else num_keys)
        k, v = fetch_kv(lo, hi)
        hkv = k.shape[1]
        group = hq // hkv
        c, n = i1 - i0, hi - lo
        # Heads-major batched matmul with the query heads of one KV head stacked on the rows
        # (query head h reads KV head h // group), so K/V are never repeated per query head.
        qh = q[i0:i1].float().reshape(c, hkv, group, d).permute(1, 2, 0, 3).reshape(hkv, group * c, d)
        scores = torch.bmm(qh, k.permute(1, 2, 0)).mul_(softmax_scale)  # [Hkv, G*C, N]
        if logit_cap > 0:
            scores = torch.tanh(scores.div_(logit_cap)).mul_(logit_cap)
        scores = scores.view(hq, c, n)
        qpos = torch.arange(p0, p1, device=q.device).view(c, 1)
        kpos = torch.arange(lo, hi, device=q.device).view(1, n)
        visible = torch.ones(c, n, dtype=torch.bool, device=q.device)
        if causal:
            visible &= kpos <= qpos
        if window_left >= 0:
            visible &= kpos >= qpos - window_left
        scores.masked_fill_(~visible, float("-inf"))
        row_max = scores.amax(dim=-1, keepdim=True) if n else scores.new_full((hq, c, 1), float("-inf"))
        if sink is not None:
            row_max = torch.maximum(row_max, sink)
        # A row that sees nothing and has no sink keeps max -inf: shift it by 0 instead (no inf - inf).
        row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
        probs = torch.exp(scores - row_max)
        denom = probs.sum(dim=-1, keepdim=True)
        if sink is not None:
            denom = denom + torch.exp(sink - row_max)
        o = torch.bmm(probs.view(hkv, group * c, n), v.permute(1, 0, 2)).view(hq, c, d)
        o = o / torch.where(denom > 0, denom, torch.ones_like(denom))
        out[i0:i1] = o.permute(1, 0, 2).to(out.dtype)
        if lse is not None:
            lse[i0:i1] = (row_max + torch.log(denom)).view(hq, c).t()


def _paged_fetch(k_cache: torch.Tensor, v_cache: torch.Tensor, pages: torch.Tensor) -> _FetchKV:
    """Reader of one sequence's keys/values from the paged NHD cache (page list ``pages``)."""
    page_size = k_cache.shape[1]

    def fetch(lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(lo, hi, device=k_cache.device)
        page = pages[pos // page_size].long()
        row = pos % page_size
        return k_cache[page, row].float(), v_cache[page, row].float()

    return fetch


def _outputs(
    q: torch.Tensor, out: torch.Tensor | None, return_lse: bool, lse_rows: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if out is None:
        out = torch.zeros_like(q)
    lse = (
        torch.full((lse_rows, q.shape[1]), float("-inf"), dtype=torch.float32, device=q.device) if return_lse else None
    )
    return out, lse


def mha_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool,
    window_left: int,
    sinks: torch.Tensor | None,
    softmax_scale: float,
    logit_cap: float,
    return_lse: bool,
    out: torch.Tensor | None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`tokenspeed_kernel.mha_prefill`.

    Args:
        q: ``[total_q, Hq, D]``; k, v: ``[total_k, Hkv, D]`` (same dtype).
        cu_seqlens_q, cu_seqlens_k: ``int32 [B+1]``.
        max_seqlen_q, max_seqlen_k: unused (lengths are read from the prefix sums).
        causal, window_left, sinks (``float32 [Hq]`` or None), softmax_scale,
        logit_cap, return_lse: as the public op.
        out: ``[total_q, Hq, D]`` of ``q``'s dtype or None.

    Returns:
        ``out`` or ``(out, lse float32 [total_q, Hq])``.
    """
    out, lse = _outputs(q, out, return_lse, q.shape[0])
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]

        def fetch(lo: int, hi: int, k0: int = k0) -> tuple[torch.Tensor, torch.Tensor]:
            return k[k0 + lo : k0 + hi].float(), v[k0 + lo : k0 + hi].float()

        _attend_sequence(
            q[q0:q1], (k1 - k0) - (q1 - q0), k1 - k0, fetch, out[q0:q1], None if lse is None else lse[q0:q1],
            causal=causal, window_left=window_left, sinks=sinks, softmax_scale=softmax_scale, logit_cap=logit_cap,
        )  # fmt: skip
    return (out, lse) if return_lse else out


def mha_extend_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_q: int,
    *,
    causal: bool,
    window_left: int,
    sinks: torch.Tensor | None,
    softmax_scale: float,
    logit_cap: float,
    return_lse: bool,
    out: torch.Tensor | None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`tokenspeed_kernel.mha_extend_with_kvcache`.

    Args:
        q: ``[total_q, Hq, D]`` packed by ``cu_seqlens_q int32 [B+1]``.
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]`` NHD, float or fp8 e4m3.
        page_table: ``int32 [B, max_pages]``; cache_seqlens: ``int32 [B]``.
        max_seqlen_q: unused.
        Other arguments as :func:`mha_prefill`.

    Returns:
        ``out`` or ``(out, lse float32 [total_q, Hq])``.
    """
    out, lse = _outputs(q, out, return_lse, q.shape[0])
    cq, lens = cu_seqlens_q.tolist(), cache_seqlens.tolist()
    for b in range(len(cq) - 1):
        q0, q1 = cq[b], cq[b + 1]
        _attend_sequence(
            q[q0:q1], lens[b] - (q1 - q0), lens[b], _paged_fetch(k_cache, v_cache, page_table[b]),
            out[q0:q1], None if lse is None else lse[q0:q1],
            causal=causal, window_left=window_left, sinks=sinks, softmax_scale=softmax_scale, logit_cap=logit_cap,
        )  # fmt: skip
    return (out, lse) if return_lse else out


def mha_decode_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    window_left: int,
    sinks: torch.Tensor | None,
    softmax_scale: float,
    logit_cap: float,
    return_lse: bool,
    out: torch.Tensor | None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Reference of :func:`tokenspeed_kernel.mha_decode_with_kvcache`.

    Args:
        q: ``[B, Hq, D]``, one query per sequence at position ``cache_seqlens[b] - 1``.
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]`` NHD, float or fp8 e4m3.
        page_table: ``int32 [B, max_pages]``; cache_seqlens: ``int32 [B]``.
        Other arguments as :func:`mha_prefill`.

    Returns:
        ``out`` or ``(out, lse float32 [B, Hq])``.
    """
    out, lse = _outputs(q, out, return_lse, q.shape[0])
    lens = cache_seqlens.tolist()
    for b in range(q.shape[0]):
        _attend_sequence(
            q[b : b + 1], lens[b] - 1, lens[b], _paged_fetch(k_cache, v_cache, page_table[b]),
            out[b : b + 1], None if lse is None else lse[b : b + 1],
            causal=True, window_left=window_left, sinks=sinks, softmax_scale=softmax_scale, logit_cap=logit_cap,
        )  # fmt: skip
    return (out, lse) if return_lse else out


def kvcache_store(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Reference of :func:`tokenspeed_kernel.kvcache_store`: writes in place, no host sync.

    Args:
        k, v: ``[T, Hkv, D]`` float.
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]``, written in place (cast to their dtype).
        slot_mapping: ``int32/int64 [T]``; slot ``s`` is page ``s // page_size``, row
            ``s % page_size``; negative slots write nothing.
    """
    if slot_mapping.numel() == 0 or k_cache.shape[0] * k_cache.shape[1] == 0:
        return
    page_size = k_cache.shape[1]
    slots = slot_mapping.long()
    valid = slots >= 0
    # Padding rows cannot be dropped without a host sync (boolean indexing), so they are
    # redirected to a write that changes nothing: the first valid token's slot with that
    # token's own value, or, when no token is valid, slot 0 with its current contents.
    first = torch.argmax(valid.to(torch.int8))
    any_valid = valid.any()
    slot = torch.where(valid, slots, torch.where(any_valid, slots[first], torch.zeros_like(slots[first])))
    page, row = slot // page_size, slot % page_size
    for src, cache in ((k, k_cache), (v, v_cache)):
        # Select on raw bytes: torch.where has no fp8 kernel, and bytes select exactly.
        new = src.to(cache.dtype).view(torch.uint8)
        filler = torch.where(any_valid, new[first], cache[0, 0].view(torch.uint8))
        cache[page, row] = torch.where(valid.view(-1, 1, 1), new, filler).view(cache.dtype)

"""Attention: prefill, extend (chunked prefill over the paged cache), decode, cache store.

Conventions (ARCHITECTURE §4): token-major packed batches; ``q [total_q, Hq, D]``,
``k, v [total_k, Hkv, D]``; ``cu_seqlens_* int32 [B+1]``; paged KV cache NHD
``[num_pages, page_size, Hkv, D]`` with ``page_table int32 [B, max_pages]`` and
``cache_seqlens int32 [B]`` counting every token in the cache, the new ones
included.

Masking: a query at absolute position ``p`` sees key ``j`` iff ``j <= p`` (when
causal) and ``j >= p - window_left`` (when ``window_left >= 0``). In
``mha_prefill`` query ``i`` of a sequence with ``Lq`` queries and ``Lk`` keys sits
at ``p = Lk - Lq + i`` (bottom-right aligned, as FlashAttention). Scores are
``(q . k) * softmax_scale``, then, if ``logit_cap > 0``, ``logit_cap *
tanh(score / logit_cap)``. ``sinks float32 [Hq]``: one extra logit per query head
that joins the softmax denominator only. The log-sum-exp (``return_lse``) is the
natural log of that denominator (sinks included), ``float32 [total_q, Hq]``
(``[B, Hq]`` for decode). A query that sees no key (and has no sink) outputs
zeros and an lse of ``-inf``.

Checks that read index tensors' values (``cu_seqlens`` start at 0, never decrease
and end at the packed token count; ``max_seqlen_*`` bound the longest sequence;
``cache_seqlens`` fit the page table and hold at least the new tokens; the pages
used and the slots written lie inside the cache) run whenever those tensors are on
the host, and for device tensors under ``TOKENSPEED_KERNEL_DEBUG=1`` (they cost a
device sync).
"""

from __future__ import annotations

import math

import torch

from ..core.contracts import ANY, Range, Size, TraitSpec
from ..core.formats import DTYPE_NAMES
from ..core.op import KernelCall, Op, Reference, kernel_call
from ..core.validation import (
    check_cu_seqlens,
    check_float,
    check_int,
    check_same_device,
    check_tensor,
    readable_values,
)

__all__ = [
    "mha_prefill",
    "mha_extend_with_kvcache",
    "mha_prefill_with_kvcache",
    "mha_decode_with_kvcache",
    "kvcache_store",
]

_Q_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_KV_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn)

_COMMON_TRAITS = {
    "head_dim": TraitSpec(int, allowed=Range(8, 512), doc="D, the head size of q, k and v"),
    "gqa_group": TraitSpec(int, allowed=Range(1, 256), doc="Hq / Hkv"),
    "window": TraitSpec(bool, default=False, doc="sliding window (window_left >= 0)"),
    "sinks": TraitSpec(bool, default=False, doc="per-head sink logits (GPT-OSS)"),
    "logit_cap": TraitSpec(bool, default=False, doc="tanh soft-capping of scores"),
    "return_lse": TraitSpec(bool, default=False, doc="also return the log-sum-exp"),
}
_CAUSAL = {"causal": TraitSpec(bool, default=True, doc="causal mask")}
_PAGED = {"page_size": TraitSpec(int, allowed=Range(1, 4096), doc="tokens per KV-cache page")}


def _check_heads(q: torch.Tensor, hkv: int, kname: str) -> int:
    hq = q.shape[1]
    if hkv <= 0 or hq % hkv:
        raise ValueError(f"{kname}: {hkv} KV heads must divide the {hq} query heads of q")
    return hq // hkv


def _check_common(q, sinks, softmax_scale, logit_cap, window_left) -> float:
    if sinks is not None:
        check_tensor("sinks", sinks, dtypes=(torch.float32,), shape=(q.shape[1],))
        check_same_device("q", q, sinks=sinks)
    check_int("window_left", window_left, minimum=-1, expected="-1 (full attention) or an int >= 0")
    check_float("logit_cap", logit_cap, minimum=0.0, expected="a finite float >= 0 (0 = off)")
    if softmax_scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    return check_float("softmax_scale", softmax_scale, minimum=0.0, strict=True, expected="a finite float > 0 or None")


def _check_max_seqlen(name: str, value: object) -> None:
    check_int(name, value, minimum=0, expected="a host int >= 0 (the longest sequence)")


def _check_out(out, shape, dtype, device) -> None:
    if out is not None:
        check_tensor("out", out, dtypes=(dtype,), shape=tuple(shape), last_dim_contiguous=True)
        if out.device != device:
            raise ValueError(f"out: expected device {device}, got {out.device}")


def _check_paged(
    q, k_cache, v_cache, page_table, cache_seqlens, batch: int, *, decode: bool, q_lens: torch.Tensor | None = None
) -> None:
    """The paged cache's form, and its values when readable: ``cache_seqlens`` within what the page table
    addresses and >= 1 (decode) or >= each sequence's query count (extend, ``q_lens`` when read), the
    pages the sequences use inside the cache."""
    d = q.shape[-1]
    check_tensor("k_cache", k_cache, dtypes=_KV_DTYPES, dim=4, last_dim_contiguous=True)
    check_tensor("v_cache", v_cache, dtypes=(k_cache.dtype,), shape=tuple(k_cache.shape), last_dim_contiguous=True)
    if k_cache.shape[-1] != d:
        raise ValueError(f"k_cache: expected head_dim {d} (like q), got {k_cache.shape[-1]}")
    check_tensor("page_table", page_table, dtypes=(torch.int32,), dim=2, last_dim_contiguous=True)
    if page_table.shape[0] != batch:
        raise ValueError(f"page_table: expected {batch} rows (one per sequence), got {page_table.shape[0]}")
    check_tensor("cache_seqlens", cache_seqlens, dtypes=(torch.int32,), shape=(batch,))
    check_same_device("q", q, k_cache=k_cache, v_cache=v_cache, page_table=page_table, cache_seqlens=cache_seqlens)
    lens = readable_values(cache_seqlens)
    pt = readable_values(page_table)
    if lens is None or pt is None or batch == 0:
        return
    num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
    capacity = page_table.shape[1] * page_size
    lo, hi = (int(x) for x in torch.aminmax(lens))
    if hi > capacity:
        b = int((lens > capacity).nonzero()[0])
        raise ValueError(
            f"cache_seqlens: sequence {b} holds {hi} tokens, past the {capacity} slots its page_table row "
            f"can address ({page_table.shape[1]} columns x page_size {page_size})"
        )
    if decode and lo < 1:
        b = int((lens < 1).nonzero()[0])
        raise ValueError(
            f"cache_seqlens: expected >= 1 per sequence (the new token is in the cache), got {lo} for sequence {b}"
        )
    if lo < 0:
        b = int((lens < 0).nonzero()[0])
        raise ValueError(f"cache_seqlens: expected values >= 0, got {lo} for sequence {b}")
    if q_lens is not None:
        short = lens < q_lens
        if bool(short.any()):
            b = int(short.nonzero()[0])
            raise ValueError(
                f"cache_seqlens: sequence {b} holds {int(lens[b])} tokens, fewer than its {int(q_lens[b])} queries "
                "(cache_seqlens counts the new tokens too)"
            )
    if pt.numel():
        first, last = (int(x) for x in torch.aminmax(pt))
        if first >= 0 and last < num_pages:
            return  # every entry names a page: nothing to mask
    # Entries past a sequence's pages are never read and may hold anything (padding).
    pages_used = (lens + (page_size - 1)) // page_size
    used = torch.arange(page_table.shape[1]).unsqueeze(0) < pages_used.unsqueeze(1)
    bad = used & ((pt < 0) | (pt >= num_pages))
    if bool(bad.any()):
        b, col = (int(x) for x in bad.nonzero()[0])
        raise ValueError(
            f"page_table: row {b} column {col} names page {int(pt[b, col])}, outside the cache's "
            f"[0, {num_pages}) pages (k_cache.shape[0])"
        )


def _traits(q, hkv, window_left, sinks, logit_cap, return_lse, **extra) -> dict[str, object]:
    return {
        "head_dim": q.shape[-1],
        "gqa_group": q.shape[1] // hkv,
        "window": window_left >= 0,
        "sinks": sinks is not None,
        "logit_cap": logit_cap > 0,
        "return_lse": return_lse,
        **extra,
    }


def _bind_mha_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = True,
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    logit_cap: float = 0.0,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
) -> KernelCall:
    """Packed variable-length attention over fresh keys and values.

    Args:
        q: ``[total_q, Hq, D]`` bf16/fp16/fp32, last dim contiguous.
        k, v: ``[total_k, Hkv, D]``, same dtype as ``q``; ``Hkv`` divides ``Hq``.
        cu_seqlens_q, cu_seqlens_k: ``int32 [B+1]`` prefix sums of the lengths:
            ``0``, non-decreasing, the last entry ``total_q`` (``total_k``).
        max_seqlen_q, max_seqlen_k: host ints, at least the longest sequence
            (they size grids without a device sync).
        causal: bottom-right aligned causal mask.
        window_left: int: -1, or keys ``[p - window_left, p]`` only (GPT-OSS: 127).
        sinks: ``float32 [Hq]`` sink logits, or None.
        softmax_scale: a finite float > 0; None means ``1/sqrt(D)``.
        logit_cap: a finite float; ``> 0`` applies ``cap * tanh(s / cap)`` to scores.
        return_lse: also return ``float32 [total_q, Hq]`` log-sum-exp.
        out: optional ``[total_q, Hq, D]`` output of ``q``'s dtype.

    Returns:
        ``out`` or ``(out, lse)``.
    """
    check_tensor("q", q, dtypes=_Q_DTYPES, dim=3, last_dim_contiguous=True)
    check_tensor("k", k, dtypes=(q.dtype,), dim=3, last_dim_contiguous=True)
    check_tensor("v", v, dtypes=(q.dtype,), shape=tuple(k.shape), last_dim_contiguous=True)
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k: expected head_dim {q.shape[-1]} (like q), got {k.shape[-1]}")
    hkv = k.shape[1]
    _check_heads(q, hkv, "k")
    _check_max_seqlen("max_seqlen_q", max_seqlen_q)
    _check_max_seqlen("max_seqlen_k", max_seqlen_k)
    batch, _ = check_cu_seqlens(
        "cu_seqlens_q", cu_seqlens_q, tokens=q.shape[0], max_seqlen=max_seqlen_q, max_name="max_seqlen_q"
    )
    check_cu_seqlens(
        "cu_seqlens_k", cu_seqlens_k, batch=batch, tokens=k.shape[0], tokens_of="k",
        max_seqlen=max_seqlen_k, max_name="max_seqlen_k",
    )  # fmt: skip
    check_same_device("q", q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    scale = _check_common(q, sinks, softmax_scale, logit_cap, window_left)
    _check_out(out, q.shape, q.dtype, q.device)
    sig = (DTYPE_NAMES[q.dtype], DTYPE_NAMES[k.dtype])
    traits = _traits(q, hkv, window_left, sinks, logit_cap, return_lse, causal=bool(causal))
    return kernel_call(
        q.device, sig, traits, (q.shape[0],),
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        causal=bool(causal), window_left=window_left, sinks=sinks, softmax_scale=scale,
        logit_cap=float(logit_cap), return_lse=return_lse, out=out,
    )  # fmt: skip


def _bind_mha_extend_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_q: int,
    *,
    causal: bool = True,
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    logit_cap: float = 0.0,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
) -> KernelCall:
    """Multi-token queries over the paged KV cache (chunked prefill, speculative verify).

    The cache already holds the new tokens: query ``i`` of sequence ``b`` (with
    ``q_len_b`` queries) sits at position ``cache_seqlens[b] - q_len_b + i``.

    Also exported as ``mha_prefill_with_kvcache`` (the name in the upstream README's
    API list): the same op object.

    Args:
        q: ``[total_q, Hq, D]`` packed by ``cu_seqlens_q int32 [B+1]`` (ending at ``total_q``).
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]`` (NHD).
        page_table: ``int32 [B, max_pages]``; cache_seqlens: ``int32 [B]``, each
            ``>= q_len_b`` and ``<= max_pages * page_size``.
        max_seqlen_q: host int, at least the longest query length.
        Other arguments as :func:`mha_prefill`.
    """
    check_tensor("q", q, dtypes=_Q_DTYPES, dim=3, last_dim_contiguous=True)
    _check_max_seqlen("max_seqlen_q", max_seqlen_q)
    batch, q_lens = check_cu_seqlens(
        "cu_seqlens_q", cu_seqlens_q, tokens=q.shape[0], max_seqlen=max_seqlen_q, max_name="max_seqlen_q"
    )
    check_same_device("q", q, cu_seqlens_q=cu_seqlens_q)
    _check_paged(q, k_cache, v_cache, page_table, cache_seqlens, batch, decode=False, q_lens=q_lens)
    hkv = k_cache.shape[2]
    _check_heads(q, hkv, "k_cache")
    scale = _check_common(q, sinks, softmax_scale, logit_cap, window_left)
    _check_out(out, q.shape, q.dtype, q.device)
    sig = (DTYPE_NAMES[q.dtype], DTYPE_NAMES[k_cache.dtype])
    traits = _traits(q, hkv, window_left, sinks, logit_cap, return_lse, causal=bool(causal), page_size=k_cache.shape[1])
    return kernel_call(
        q.device, sig, traits, (q.shape[0],),
        q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q,
        causal=bool(causal), window_left=window_left, sinks=sinks, softmax_scale=scale,
        logit_cap=float(logit_cap), return_lse=return_lse, out=out,
    )  # fmt: skip


def _bind_mha_decode_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    logit_cap: float = 0.0,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
) -> KernelCall:
    """One new token per sequence over the paged KV cache.

    The new token's K/V are already in the cache (see :func:`kvcache_store`), so
    its query sits at position ``cache_seqlens[b] - 1``.

    Args:
        q: ``[B, Hq, D]``.
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]`` (NHD).
        page_table: ``int32 [B, max_pages]``; cache_seqlens: ``int32 [B]``, each
            ``>= 1`` (the new token) and ``<= max_pages * page_size``.
        Other arguments as :func:`mha_prefill`; lse is ``float32 [B, Hq]``.
    """
    check_tensor("q", q, dtypes=_Q_DTYPES, dim=3, last_dim_contiguous=True)
    batch = q.shape[0]
    _check_paged(q, k_cache, v_cache, page_table, cache_seqlens, batch, decode=True)
    hkv = k_cache.shape[2]
    _check_heads(q, hkv, "k_cache")
    scale = _check_common(q, sinks, softmax_scale, logit_cap, window_left)
    _check_out(out, q.shape, q.dtype, q.device)
    sig = (DTYPE_NAMES[q.dtype], DTYPE_NAMES[k_cache.dtype])
    traits = _traits(q, hkv, window_left, sinks, logit_cap, return_lse, page_size=k_cache.shape[1])
    return kernel_call(
        q.device, sig, traits, (batch, page_table.shape[1] * k_cache.shape[1]),
        q, k_cache, v_cache, page_table, cache_seqlens,
        window_left=window_left, sinks=sinks, softmax_scale=scale,
        logit_cap=float(logit_cap), return_lse=return_lse, out=out,
    )  # fmt: skip


def _bind_kvcache_store(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> KernelCall:
    """Write ``k, v [T, Hkv, D]`` into the paged caches, in place.

    ``slot_mapping int32/int64 [T]``: token ``t`` goes to page ``slot // page_size``,
    row ``slot % page_size``; a negative slot (padding) writes nothing. K/V are
    cast to the cache dtype.
    """
    check_tensor("k_cache", k_cache, dtypes=_KV_DTYPES, dim=4, last_dim_contiguous=True)
    check_tensor("v_cache", v_cache, dtypes=(k_cache.dtype,), shape=tuple(k_cache.shape), last_dim_contiguous=True)
    _, _, hkv, d = k_cache.shape
    check_tensor("k", k, dtypes=_Q_DTYPES, shape=(None, hkv, d), last_dim_contiguous=True)
    check_tensor("v", v, dtypes=(k.dtype,), shape=tuple(k.shape), last_dim_contiguous=True)
    check_tensor("slot_mapping", slot_mapping, dtypes=(torch.int32, torch.int64), shape=(k.shape[0],))
    check_same_device("k", k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    slots = readable_values(slot_mapping)
    if slots is not None and slots.numel():
        hi = int(slots.max())
        if hi >= k_cache.shape[0] * k_cache.shape[1]:
            raise ValueError(
                f"slot_mapping: slot {hi} is past the cache's {k_cache.shape[0] * k_cache.shape[1]} slots "
                f"(num_pages {k_cache.shape[0]} x page_size {k_cache.shape[1]}); negative slots are padding"
            )
    sig = (DTYPE_NAMES[k_cache.dtype],)
    return kernel_call(k.device, sig, (), (k.shape[0],), k, v, k_cache, v_cache, slot_mapping)


def _fake_attention(q, *args, return_lse=False, **kwargs):
    out = q.new_empty(q.shape)
    # lse is [total_q, Hq] for prefill/extend and [B, Hq] for decode: q's first two dims either way.
    return (out, q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32)) if return_lse else out


def _fake_kvcache_store(k, v, k_cache, v_cache, slot_mapping):
    return None


_FLOAT = ("fp32", "bf16", "fp16")
_KV = (*_FLOAT, "fp8_e4m3")
_REFERENCE = "tokenspeed_kernel.reference.attention"
_CASES = "tokenspeed_kernel.numerics.cases.attention"
_ANY_ATTENTION = {name: ANY for name in _COMMON_TRAITS}

mha_prefill = Op(
    name="mha_prefill",
    family="attention",
    roles=("q", "kv"),
    traits={**_COMMON_TRAITS, **_CAUSAL},
    sizes=(Size("tokens", "total_q, the packed query tokens"),),
    doc="Packed varlen attention over fresh K/V.",
    bind=_bind_mha_prefill,
    fake=_fake_attention,
    reference=Reference(
        f"{_REFERENCE}:mha_prefill", formats=[{"q": _FLOAT, "kv": _FLOAT}], traits={**_ANY_ATTENTION, "causal": ANY}
    ),
    workload=f"{_CASES}:MHA_PREFILL",
)
mha_extend_with_kvcache = Op(
    name="mha_extend_with_kvcache",
    family="attention",
    roles=("q", "kv"),
    traits={**_COMMON_TRAITS, **_CAUSAL, **_PAGED},
    sizes=(Size("tokens", "total_q, the packed query tokens"),),
    doc="Multi-token queries over the paged KV cache (chunked prefill).",
    bind=_bind_mha_extend_with_kvcache,
    fake=_fake_attention,
    reference=Reference(
        f"{_REFERENCE}:mha_extend_with_kvcache",
        formats=[{"q": _FLOAT, "kv": _KV}],
        traits={**_ANY_ATTENTION, "causal": ANY, "page_size": ANY},
    ),
    workload=f"{_CASES}:MHA_EXTEND_WITH_KVCACHE",
)
#: Alias (the upstream README's name): the same op object, so its name, selection and custom op are
#: ``mha_extend_with_kvcache``'s.
mha_prefill_with_kvcache = mha_extend_with_kvcache
mha_decode_with_kvcache = Op(
    name="mha_decode_with_kvcache",
    memo_bind=True,
    family="attention",
    roles=("q", "kv"),
    traits={**_COMMON_TRAITS, **_PAGED},
    sizes=(
        Size("batch", "B, one query token per sequence"),
        Size("context", "the cache capacity a sequence can see: page_table columns x page_size"),
    ),
    doc="One query token per sequence over the paged KV cache.",
    bind=_bind_mha_decode_with_kvcache,
    fake=_fake_attention,
    reference=Reference(
        f"{_REFERENCE}:mha_decode_with_kvcache",
        formats=[{"q": _FLOAT, "kv": _KV}],
        traits={**_ANY_ATTENTION, "page_size": ANY},
    ),
    workload=f"{_CASES}:MHA_DECODE_WITH_KVCACHE",
)
kvcache_store = Op(
    name="kvcache_store",
    family="attention",
    roles=("kv",),
    traits={},
    sizes=(Size("tokens", "T, the new K/V rows"),),
    doc="Write new K/V rows into the paged cache by slot.",
    bind=_bind_kvcache_store,
    fake=_fake_kvcache_store,
    reference=Reference(f"{_REFERENCE}:kvcache_store", formats=[{"kv": _KV}]),
    workload=f"{_CASES}:KVCACHE_STORE",
    mutates=("k_cache", "v_cache"),
)

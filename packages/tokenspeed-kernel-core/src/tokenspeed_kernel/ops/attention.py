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
"""

from __future__ import annotations

import math

import torch

from ..core.contracts import ANY, Range, Size, TraitSpec
from ..core.formats import DTYPE_NAMES
from ..core.op import KernelCall, Op, Reference, kernel_call
from ..core.validation import check_cu_seqlens, check_same_device, check_tensor, debug_checks_enabled

__all__ = ["mha_prefill", "mha_extend_with_kvcache", "mha_decode_with_kvcache", "kvcache_store"]

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
    if not isinstance(window_left, int) or window_left < -1:
        raise ValueError(f"window_left: expected -1 (full attention) or an int >= 0, got {window_left!r}")
    if not isinstance(logit_cap, (int, float)) or logit_cap < 0:
        raise ValueError(f"logit_cap: expected a float >= 0 (0 = off), got {logit_cap!r}")
    if softmax_scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    if not isinstance(softmax_scale, (int, float)) or softmax_scale <= 0:
        raise ValueError(f"softmax_scale: expected a positive float or None, got {softmax_scale!r}")
    return float(softmax_scale)


def _check_out(out, shape, dtype, device) -> None:
    if out is not None:
        check_tensor("out", out, dtypes=(dtype,), shape=tuple(shape), last_dim_contiguous=True)
        if out.device != device:
            raise ValueError(f"out: expected device {device}, got {out.device}")


def _check_paged(q, k_cache, v_cache, page_table, cache_seqlens, batch: int) -> None:
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
    if debug_checks_enabled():
        num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
        lens = cache_seqlens.cpu()
        if bool((lens < 0).any()) or bool((lens > page_table.shape[1] * page_size).any()):
            raise ValueError(
                f"cache_seqlens: values must lie in [0, {page_table.shape[1] * page_size}] "
                f"(page_table columns x page_size), got {lens.tolist()}"
            )
        pt = page_table.cpu()
        for b in range(batch):
            used = pt[b, : -(-int(lens[b]) // page_size)]
            if used.numel() and (int(used.min()) < 0 or int(used.max()) >= num_pages):
                raise ValueError(f"page_table: row {b} names pages outside [0, {num_pages}): {used.tolist()}")


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
        cu_seqlens_q, cu_seqlens_k: ``int32 [B+1]`` prefix sums of the lengths.
        max_seqlen_q, max_seqlen_k: host ints bounding the lengths (sizes grids
            without a device sync).
        causal: bottom-right aligned causal mask.
        window_left: -1, or keys ``[p - window_left, p]`` only (GPT-OSS: 127).
        sinks: ``float32 [Hq]`` sink logits, or None.
        softmax_scale: None means ``1/sqrt(D)``.
        logit_cap: ``> 0`` applies ``cap * tanh(s / cap)`` to scores.
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
    batch = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q)
    check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, batch=batch)
    check_same_device("q", q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    for name, val in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not isinstance(val, int) or val < 0:
            raise ValueError(f"{name}: expected a host int >= 0, got {val!r}")
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

    Args:
        q: ``[total_q, Hq, D]`` packed by ``cu_seqlens_q int32 [B+1]``.
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]`` (NHD).
        page_table: ``int32 [B, max_pages]``; cache_seqlens: ``int32 [B]``.
        max_seqlen_q: host int bounding the query lengths.
        Other arguments as :func:`mha_prefill`.
    """
    check_tensor("q", q, dtypes=_Q_DTYPES, dim=3, last_dim_contiguous=True)
    batch = check_cu_seqlens("cu_seqlens_q", cu_seqlens_q)
    _check_paged(q, k_cache, v_cache, page_table, cache_seqlens, batch)
    check_same_device("q", q, cu_seqlens_q=cu_seqlens_q)
    hkv = k_cache.shape[2]
    _check_heads(q, hkv, "k_cache")
    if not isinstance(max_seqlen_q, int) or max_seqlen_q < 0:
        raise ValueError(f"max_seqlen_q: expected a host int >= 0, got {max_seqlen_q!r}")
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
        page_table: ``int32 [B, max_pages]``; cache_seqlens: ``int32 [B]`` >= 1.
        Other arguments as :func:`mha_prefill`; lse is ``float32 [B, Hq]``.
    """
    check_tensor("q", q, dtypes=_Q_DTYPES, dim=3, last_dim_contiguous=True)
    batch = q.shape[0]
    _check_paged(q, k_cache, v_cache, page_table, cache_seqlens, batch)
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
    if debug_checks_enabled() and slot_mapping.numel():
        hi = int(slot_mapping.max())
        if hi >= k_cache.shape[0] * k_cache.shape[1]:
            raise ValueError(f"slot_mapping: slot {hi} is past the cache's {k_cache.shape[0] * k_cache.shape[1]} slots")
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
mha_decode_with_kvcache = Op(
    name="mha_decode_with_kvcache",
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

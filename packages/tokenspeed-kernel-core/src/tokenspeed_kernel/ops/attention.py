"""Attention: prefill, extend (chunked prefill over the paged cache), decode, decode that first writes the new
token's K/V (rotated) into the cache, cache store.

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

Plans (:func:`mha_plan`). An engine knows a step's lengths on the host before it
launches anything. ``plan = mha_plan(cache_seqlens=..., cu_seqlens_q=...)`` takes
them once per step; passing ``plan=plan`` to every layer's attention call then

- runs the value checks above on the plan's host copies (no device read);
- hands it to kernels that need host metadata: FlashInfer plans its schedule from
  it instead of copying the lengths to the host (one sync per call without a
  plan), and the Triton decode sizes its split-KV grid by the longest sequence
  (not by the page table's capacity).

The plan must describe the tensors of the call (``TOKENSPEED_KERNEL_DEBUG=1``
compares the two, with a device sync). Calls with one plan run in stream order:
what a kernel keeps with a plan (:meth:`AttentionPlan.keep`) serves one call at a
time, as FlashInfer's plan does. Kernels that read the lengths on the device (FA3, the AMD kernels,
the reference) do not receive the plan.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

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
    "AttentionPlan",
    "mha_plan",
    "mha_prefill",
    "mha_extend_with_kvcache",
    "mha_prefill_with_kvcache",
    "mha_decode_with_kvcache",
    "mha_decode_append_kvcache",
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


@dataclass(frozen=True)
class AttentionPlan:
    """The host metadata of one attention batch (see the module doc; built by :func:`mha_plan`).

    Fields (host ints; an empty tuple where the plan does not describe it):
        cache_seqlens: per sequence, the tokens in the paged cache (decode, extend).
        cu_seqlens_q: ``[B+1]`` prefix sums of the query lengths (extend, prefill).
        cu_seqlens_k: ``[B+1]`` prefix sums of the key lengths (prefill).

    Derived on construction (-1 where the plan lacks the field): ``batch``;
    ``min_cache_seqlen`` / ``max_cache_seqlen``; ``max_seqlen_q`` / ``max_seqlen_k``, the
    longest query / key length; ``first_short``, the first sequence whose cache holds
    fewer tokens than its queries.
    """

    cache_seqlens: tuple[int, ...] = ()
    cu_seqlens_q: tuple[int, ...] = ()
    cu_seqlens_k: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        batch = None
        for name in ("cache_seqlens", "cu_seqlens_q", "cu_seqlens_k"):
            values = getattr(self, name)
            if type(values) is not tuple or not all(type(x) is int for x in values):
                raise TypeError(f"{name}: expected a tuple of ints, got {type(values).__name__}")
            if not values:
                continue
            cu = name != "cache_seqlens"
            if cu and values[0] != 0:
                raise ValueError(f"{name}: must start at 0, got {list(values[:8])}")
            b = len(values) - 1 if cu else len(values)
            if cu and b < 1:
                raise ValueError(f"{name}: expected [batch + 1] >= 2 entries, got {len(values)}")
            if batch is not None and b != batch:
                raise ValueError(f"{name}: describes {b} sequences, the plan's other lengths {batch}")
            batch = b
            lengths = [y - x for x, y in itertools.pairwise(values)] if cu else list(values)
            if lengths and min(lengths) < 0:
                i = next(i for i, n in enumerate(lengths) if n < 0)
                what = "non-decreasing" if cu else "values >= 0"
                raise ValueError(f"{name}: expected {what}, got {lengths[i]} for sequence {i}")
            object.__setattr__(self, f"_{name}_lengths", lengths)
        if batch is None:
            raise ValueError("mha_plan: give at least one of cache_seqlens, cu_seqlens_q, cu_seqlens_k")
        q_lens = getattr(self, "_cu_seqlens_q_lengths", None)
        k_lens = getattr(self, "_cu_seqlens_k_lengths", None)
        lens = self.cache_seqlens
        short = -1
        if lens and q_lens is not None:
            short = next((b for b in range(batch) if lens[b] < q_lens[b]), -1)
        derived = {
            "batch": batch,
            "min_cache_seqlen": min(lens, default=-1),
            "max_cache_seqlen": max(lens, default=-1),
            "max_seqlen_q": max(q_lens, default=-1) if q_lens is not None else -1,
            "max_seqlen_k": max(k_lens, default=-1) if k_lens is not None else -1,
            "first_short": short,
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)
        # What bind's checks read of a plan (the memo keys a plan by it): the derived ints and the totals.
        totals = (
            self.cu_seqlens_q[-1] if self.cu_seqlens_q else -1,
            self.cu_seqlens_k[-1] if self.cu_seqlens_k else -1,
        )
        object.__setattr__(self, "__memo_key__", (*derived.values(), *totals))
        object.__setattr__(self, "_kept", {})
        object.__setattr__(self, "_lock", threading.Lock())

    def host_tensor(self, name: str) -> torch.Tensor:
        """One field as an ``int32`` CPU tensor (made once per plan; do not write to it)."""
        return self.keep(("host", name), lambda: torch.tensor(getattr(self, name), dtype=torch.int32))

    def keep(self, key: Any, make: Callable[[], Any]) -> Any:
        """What a kernel keeps with this plan under ``key`` (``make()`` on first use): derived
        metadata, buffers. Buffers serve one call at a time (the module doc)."""
        kept = self._kept
        value = kept.get(key)
        if value is None:
            with self._lock:
                value = kept.get(key)
                if value is None:
                    value = make()
                    kept[key] = value
        return value


def _host_ints(name: str, value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, torch.Tensor):
        if value.dim() != 1 or value.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name}: expected a 1-D int32/int64 tensor, got {value.dtype} {list(value.shape)}")
        return tuple(value.tolist())  # a device tensor is copied here: one sync, at plan time
    if isinstance(value, Sequence) and not isinstance(value, str):
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            raise TypeError(f"{name}: expected ints, got {[type(x).__name__ for x in value][:4]}")
        return tuple(int(x) for x in value)
    raise TypeError(f"{name}: expected a sequence of ints or a 1-D int tensor, got {type(value).__name__}")


def mha_plan(
    *,
    cache_seqlens: Sequence[int] | torch.Tensor | None = None,
    cu_seqlens_q: Sequence[int] | torch.Tensor | None = None,
    cu_seqlens_k: Sequence[int] | torch.Tensor | None = None,
) -> AttentionPlan:
    """The host metadata of one attention batch, for every layer's call of a step (module doc).

    Give the lengths the calls will see, from the host (a device tensor is copied: one
    sync here, none per call): ``cache_seqlens`` for decode and extend, ``cu_seqlens_q``
    for extend and prefill, ``cu_seqlens_k`` for prefill. Then pass ``plan=`` to
    :func:`mha_decode_with_kvcache`, :func:`mha_extend_with_kvcache` or
    :func:`mha_prefill`.
    """
    return AttentionPlan(
        _host_ints("cache_seqlens", cache_seqlens),
        _host_ints("cu_seqlens_q", cu_seqlens_q),
        _host_ints("cu_seqlens_k", cu_seqlens_k),
    )


def _check_plan(plan: object, batch: int, *, need: tuple[str, ...], tensors: dict[str, torch.Tensor]) -> AttentionPlan:
    """``plan`` describes ``batch`` sequences with the fields ``need``; under debug checks (or
    for host tensors) it equals the call's tensors."""
    if not isinstance(plan, AttentionPlan):
        raise TypeError(
            f"plan: expected an AttentionPlan (tokenspeed_kernel.mha_plan) or None, got {type(plan).__name__}"
        )
    missing = [n for n in need if not getattr(plan, n)]
    if missing:
        raise ValueError(f"plan: this op reads {', '.join(need)} from it; the plan has no {', '.join(missing)}")
    if plan.batch != batch:
        raise ValueError(f"plan: describes {plan.batch} sequences, the call has {batch}")
    for name, t in tensors.items():
        values = readable_values(t)
        if values is not None and tuple(values.tolist()) != getattr(plan, name):
            mine = getattr(plan, name)
            got = values.tolist()
            i = next((i for i, (a, b) in enumerate(zip(mine, got)) if a != b), min(len(mine), len(got)))
            raise ValueError(
                f"plan: its {name} differ from the {name} tensor of the call at entry {i} "
                f"(plan {mine[i] if i < len(mine) else None}, tensor {got[i] if i < len(got) else None})"
            )
    return plan


def _check_plan_paged(plan: AttentionPlan, capacity: int, page_table_cols: int, page_size: int, decode: bool) -> None:
    """The value checks of :func:`_check_paged` on the plan's host lengths (ints: no tensor op)."""
    lens = plan.cache_seqlens
    if plan.max_cache_seqlen > capacity:
        b = next(b for b, n in enumerate(lens) if n > capacity)
        raise ValueError(
            f"cache_seqlens: sequence {b} holds {lens[b]} tokens, past the {capacity} slots its page_table row "
            f"can address ({page_table_cols} columns x page_size {page_size})"
        )
    if decode and plan.min_cache_seqlen < 1:
        b = next(b for b, n in enumerate(lens) if n < 1)
        raise ValueError(
            f"cache_seqlens: expected >= 1 per sequence (the new token is in the cache), got {lens[b]} for sequence {b}"
        )


def _check_plan_cu(name: str, plan: AttentionPlan, tokens: int, of: str, max_seqlen: int, max_name: str) -> None:
    """:func:`check_cu_seqlens`'s value checks on the plan's ``name`` (ints: no tensor op)."""
    last = getattr(plan, name)[-1]
    if last != tokens:
        raise ValueError(f"plan: its {name} end at {last}, the call has {tokens} packed tokens of {of} ({of}.shape[0])")
    longest = plan.max_seqlen_q if name == "cu_seqlens_q" else plan.max_seqlen_k
    if longest > max_seqlen:
        raise ValueError(
            f"{max_name}: expected at least the longest sequence of {name} ({longest} tokens), got {max_seqlen}"
        )


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
    q,
    k_cache,
    v_cache,
    page_table,
    cache_seqlens,
    batch: int,
    *,
    decode: bool,
    q_lens: torch.Tensor | None = None,
    plan: AttentionPlan | None = None,
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
    num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
    capacity = page_table.shape[1] * page_size
    pt = readable_values(page_table)
    if plan is not None:
        _check_plan_paged(plan, capacity, page_table.shape[1], page_size, decode)
        if pt is None:
            return  # the plan's values are checked (_check_plan compared them with readable tensors)
        lens = plan.host_tensor("cache_seqlens")
    else:
        lens = readable_values(cache_seqlens)
    if lens is None or pt is None or batch == 0:
        return
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
    plan: AttentionPlan | None = None,
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
        plan: an :class:`AttentionPlan` with this batch's ``cu_seqlens_q`` and ``cu_seqlens_k``
            (:func:`mha_plan`; the module doc says what it saves), or None.

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
    if plan is not None:
        _check_plan(
            plan, batch, need=("cu_seqlens_q", "cu_seqlens_k"),
            tensors={"cu_seqlens_q": cu_seqlens_q, "cu_seqlens_k": cu_seqlens_k},
        )  # fmt: skip
        _check_plan_cu("cu_seqlens_q", plan, q.shape[0], "q", max_seqlen_q, "max_seqlen_q")
        _check_plan_cu("cu_seqlens_k", plan, k.shape[0], "k", max_seqlen_k, "max_seqlen_k")
    scale = _check_common(q, sinks, softmax_scale, logit_cap, window_left)
    _check_out(out, q.shape, q.dtype, q.device)
    sig = (DTYPE_NAMES[q.dtype], DTYPE_NAMES[k.dtype])
    traits = _traits(q, hkv, window_left, sinks, logit_cap, return_lse, causal=bool(causal))
    return kernel_call(
        q.device, sig, traits, (q.shape[0],),
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        causal=bool(causal), window_left=window_left, sinks=sinks, softmax_scale=scale,
        logit_cap=float(logit_cap), return_lse=return_lse, out=out, **_plan_kwarg(plan),
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
    plan: AttentionPlan | None = None,
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
        plan: an :class:`AttentionPlan` with this batch's ``cache_seqlens`` and ``cu_seqlens_q``
            (:func:`mha_plan`), or None.
        Other arguments as :func:`mha_prefill`.
    """
    check_tensor("q", q, dtypes=_Q_DTYPES, dim=3, last_dim_contiguous=True)
    _check_max_seqlen("max_seqlen_q", max_seqlen_q)
    batch, q_lens = check_cu_seqlens(
        "cu_seqlens_q", cu_seqlens_q, tokens=q.shape[0], max_seqlen=max_seqlen_q, max_name="max_seqlen_q"
    )
    check_same_device("q", q, cu_seqlens_q=cu_seqlens_q)
    if plan is not None:
        _check_plan(
            plan, batch, need=("cache_seqlens", "cu_seqlens_q"),
            tensors={"cache_seqlens": cache_seqlens, "cu_seqlens_q": cu_seqlens_q},
        )  # fmt: skip
        _check_plan_cu("cu_seqlens_q", plan, q.shape[0], "q", max_seqlen_q, "max_seqlen_q")
        short = plan.first_short
        if short >= 0:
            raise ValueError(
                f"cache_seqlens: sequence {short} holds {plan.cache_seqlens[short]} tokens, fewer than its "
                f"{plan.cu_seqlens_q[short + 1] - plan.cu_seqlens_q[short]} queries (cache_seqlens counts the new "
                "tokens too)"
            )
    _check_paged(q, k_cache, v_cache, page_table, cache_seqlens, batch, decode=False, q_lens=q_lens, plan=plan)
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
        logit_cap=float(logit_cap), return_lse=return_lse, out=out, **_plan_kwarg(plan),
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
    plan: AttentionPlan | None = None,
) -> KernelCall:
    """One new token per sequence over the paged KV cache.

    The new token's K/V are already in the cache (see :func:`kvcache_store`), so
    its query sits at position ``cache_seqlens[b] - 1``.

    Args:
        q: ``[B, Hq, D]``.
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]`` (NHD).
        page_table: ``int32 [B, max_pages]``; cache_seqlens: ``int32 [B]``, each
            ``>= 1`` (the new token) and ``<= max_pages * page_size``.
        plan: an :class:`AttentionPlan` with this batch's ``cache_seqlens`` (:func:`mha_plan`), or None.
        Other arguments as :func:`mha_prefill`; lse is ``float32 [B, Hq]``.
    """
    sig, traits, scale = _check_decode(
        q, k_cache, v_cache, page_table, cache_seqlens, window_left, sinks, softmax_scale, logit_cap, return_lse, out,
        plan,
    )  # fmt: skip
    return kernel_call(
        q.device, sig, traits, (q.shape[0], page_table.shape[1] * k_cache.shape[1]),
        q, k_cache, v_cache, page_table, cache_seqlens,
        window_left=window_left, sinks=sinks, softmax_scale=scale,
        logit_cap=float(logit_cap), return_lse=return_lse, out=out, **_plan_kwarg(plan),
    )  # fmt: skip


def _check_decode(
    q, k_cache, v_cache, page_table, cache_seqlens, window_left, sinks, softmax_scale, logit_cap, return_lse, out, plan
) -> tuple[tuple[str, str], dict[str, object], float]:
    """The checks of a decode call over the paged cache: ``(format signature, traits, softmax scale)``."""
    check_tensor("q", q, dtypes=_Q_DTYPES, dim=3, last_dim_contiguous=True)
    batch = q.shape[0]
    if plan is not None:
        _check_plan(plan, batch, need=("cache_seqlens",), tensors={"cache_seqlens": cache_seqlens})
    _check_paged(q, k_cache, v_cache, page_table, cache_seqlens, batch, decode=True, plan=plan)
    hkv = k_cache.shape[2]
    _check_heads(q, hkv, "k_cache")
    scale = _check_common(q, sinks, softmax_scale, logit_cap, window_left)
    _check_out(out, q.shape, q.dtype, q.device)
    sig = (DTYPE_NAMES[q.dtype], DTYPE_NAMES[k_cache.dtype])
    traits = _traits(q, hkv, window_left, sinks, logit_cap, return_lse, page_size=k_cache.shape[1])
    return sig, traits, scale


def _bind_mha_decode_append_kvcache(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    cos_sin_cache: torch.Tensor | None = None,
    style: str = "neox",
    window_left: int = -1,
    sinks: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    logit_cap: float = 0.0,
    out: torch.Tensor | None = None,
    plan: AttentionPlan | None = None,
) -> KernelCall:
    """One new token per sequence: its key and value written into the paged cache, then attention over the cache,
    in one call (q and k rotated first with ``cos_sin_cache``).

    The same results as ``q = apply_rotary_and_store(q, k, v, cos_sin_cache, cache_seqlens - 1, k_cache,
    v_cache, slots, style=style)`` (``slots``: position ``cache_seqlens[b] - 1``'s row of its page, ``page_table[b,
    p // page_size] * page_size + p % page_size``), then ``mha_decode_with_kvcache(q, k_cache, v_cache, page_table,
    cache_seqlens, ...)``: a decode layer's rotary, cache write and attention in one call (the engine computes no
    slots; no rotated q tensor). Without ``cos_sin_cache`` nothing is rotated (``kvcache_store`` then decode).

    Args:
        q: ``[B, Hq, D]``, the new token's query (not rotated).
        k, v: ``[B, Hkv, D]``, q's dtype, last dim contiguous: the new token's key (not rotated) and value.
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]`` (NHD), written in place at each sequence's position
            ``cache_seqlens[b] - 1`` (the rotated k rounded to q's dtype, then cast to the cache's, as
            ``apply_rotary_and_store``).
        page_table, cache_seqlens: as :func:`mha_decode_with_kvcache`; ``cache_seqlens`` counts the new token.
        cos_sin_cache: ``float32 [max_position, R]`` as :func:`apply_rotary` (its row ``cache_seqlens[b] - 1`` is
            sequence b's angle), or None: no rotation.
        style: the rotary pairing (``"neox"`` / ``"gptj"``), with ``cos_sin_cache``.
        Other arguments as :func:`mha_decode_with_kvcache` (no ``return_lse``: use the two calls for the LSE).

    Returns:
        ``out [B, Hq, D]``.
    """
    sig, traits, scale = _check_decode(
        q, k_cache, v_cache, page_table, cache_seqlens, window_left, sinks, softmax_scale, logit_cap, False, out, plan
    )
    batch, hkv, d = q.shape[0], k_cache.shape[2], q.shape[2]
    check_tensor("k", k, dtypes=(q.dtype,), shape=(batch, hkv, d), last_dim_contiguous=True)
    check_tensor("v", v, dtypes=(q.dtype,), shape=(batch, hkv, d), last_dim_contiguous=True)
    check_same_device("q", q, k=k, v=v)
    if cos_sin_cache is None:
        if style != "neox":
            raise ValueError(f"style: {style!r} given without cos_sin_cache (nothing is rotated without it)")
    else:
        check_rotary_table(cos_sin_cache, d, style)
        check_same_device("q", q, cos_sin_cache=cos_sin_cache)
        lens = plan.host_tensor("cache_seqlens") if plan is not None else readable_values(cache_seqlens)
        if lens is not None and lens.numel() and int(lens.max()) > cos_sin_cache.shape[0]:
            raise ValueError(
                f"cos_sin_cache: {cos_sin_cache.shape[0]} rows, but a sequence's new token sits at position "
                f"{int(lens.max()) - 1} (cache_seqlens - 1)"
            )
    del traits["return_lse"]  # (not an output of this op)
    traits.update(rotary=cos_sin_cache is not None, style=style)
    return kernel_call(
        q.device, sig, traits, (batch, page_table.shape[1] * k_cache.shape[1]),
        q, k, v, k_cache, v_cache, page_table, cache_seqlens,
        cos_sin_cache=cos_sin_cache, style=style, window_left=window_left, sinks=sinks, softmax_scale=scale,
        logit_cap=float(logit_cap), out=out, **_plan_kwarg(plan),
    )  # fmt: skip


def check_rotary_table(cos_sin_cache: torch.Tensor, head_dim: int, style: str) -> None:
    """The checks of a rotary table and its pairing (``apply_rotary``'s and the appending decode's)."""
    check_tensor("cos_sin_cache", cos_sin_cache, dtypes=(torch.float32,), dim=2, contiguous=True)
    rot = cos_sin_cache.shape[1]
    if rot % 2 or rot > head_dim or rot == 0:
        raise ValueError(f"cos_sin_cache: rotary dim {rot} must be even, > 0 and <= head_dim {head_dim}")
    if style not in ("neox", "gptj"):
        raise ValueError(f"style: expected 'neox' or 'gptj', got {style!r}")


def _plan_kwarg(plan: AttentionPlan | None) -> dict:
    # A hint (Op(hints=...)): passed only when given, and only to kernels that name it.
    return {} if plan is None else {"plan": plan}


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
    check_kv_store(k, v, k_cache, v_cache, slot_mapping)
    sig = (DTYPE_NAMES[k_cache.dtype],)
    return kernel_call(k.device, sig, (), (k.shape[0],), k, v, k_cache, v_cache, slot_mapping)


def check_kv_store(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """The checks of a write of ``k, v`` into the paged caches by slot (``kvcache_store``, and the fused store of
    ``apply_rotary_and_store``)."""
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
    memo_bind=True,
    hints=("plan",),
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
    memo_bind=True,
    hints=("plan",),
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
    hints=("plan",),
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
mha_decode_append_kvcache = Op(
    name="mha_decode_append_kvcache",
    memo_bind=True,
    hints=("plan",),
    family="attention",
    roles=("q", "kv"),
    traits={
        **{name: spec for name, spec in _COMMON_TRAITS.items() if name != "return_lse"},
        **_PAGED,
        "rotary": TraitSpec(bool, default=False, doc="q and k rotated first (cos_sin_cache)"),
        "style": TraitSpec(str, default="neox", allowed=("neox", "gptj"), doc="the rotary pairing"),
    },
    sizes=mha_decode_with_kvcache.sizes,
    doc="One query token per sequence: its K/V written into the paged cache (q and k rotated first), then attention.",
    bind=_bind_mha_decode_append_kvcache,
    fake=_fake_attention,
    reference=Reference(
        "tokenspeed_kernel.reference.rope:mha_decode_append_kvcache",  # (it rotates first)
        formats=[{"q": _FLOAT, "kv": _KV}],
        traits={
            **{name: ANY for name in _COMMON_TRAITS if name != "return_lse"},
            "page_size": ANY,
            "rotary": ANY,
            "style": ANY,
        },
    ),
    workload=f"{_CASES}:MHA_DECODE_APPEND_KVCACHE",
    mutates=("k_cache", "v_cache"),
    mutating_result=True,
)
kvcache_store = Op(
    name="kvcache_store",
    memo_bind=True,
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

"""FlashInfer (``flashinfer-python`` 0.7.4) attention wrappers for the public attention ops.

Each function takes the kernel arguments of the matching public op.

Plan/run. FlashInfer splits a call into ``plan`` (host-side scheduling from the
sequence lengths; it also JIT-compiles the module on first use) and ``run`` (the
kernels). ``plan`` needs the lengths on the host. A call given an attention plan
(``tokenspeed_kernel.mha_plan``: the engine's host lengths of the step) takes
them from it; a call without one copies ``cu_seqlens_*`` / ``cache_seqlens`` to
the host: one device synchronisation per call. There is one FlashInfer wrapper
per static configuration (dtypes, heads, head dim, page size, mask, scale,
soft-cap, sinks), and it is planned again only when the lengths differ from its
last plan, so the layers of one forward step share a plan. Neither the host copy
nor FlashInfer's ``plan`` can run inside CUDA-graph capture, so none of these
kernels is tagged ``cuda_graph_safe``; with an attention plan, a call whose
lengths were planned by an earlier call of the same configuration runs no host
copy and no ``plan``: only the page gather and FlashInfer's ``run``.

Paged cache. Ours is NHD ``[num_pages, page_size, Hkv, D]`` with ``page_table
int32 [B, max_pages]`` and ``cache_seqlens int32 [B]``; FlashInfer wants CSR
``indptr [B+1]`` (pages per sequence), flat ``indices [nnz_pages]`` and
``last_page_len [B]`` (0 for an empty sequence). ``indptr`` and
``last_page_len`` are computed from the host copy of the lengths; ``indices`` is
gathered from ``page_table`` on the device on every call, into the buffer the
plan points at, so a page table rewritten between calls with equal lengths is
honoured.

Sinks. FlashInfer's fa2/fa3 kernels take sinks only through its attention-sink
JIT variant (``BatchAttentionWithAttentionSinkWrapper``,
``BatchDecodeWithAttentionSinkWrapper``); its sink is an unscaled logit per query
head that joins the softmax denominator only, as ours (``run(q, kv, sinks,
sm_scale)``). On sm90 with head dims 64/128/256 that variant runs on the fa3
backend, whose scheduler never splits the KV range, so the sink is counted once
per row. The variant has no logit soft-cap. There is no ragged sink wrapper:
ragged prefill with sinks runs the paged one over ``k``/``v`` viewed as a cache
of one-token pages (a view, no copy).

Masks. FlashInfer's ``window_left`` is ours (keys ``[p - window_left, p]``) and
its causal mask is bottom-right aligned (``p = kv_len - qo_len + i``) like ours.

LSE. FlashInfer's kernels produce a base-2 log-sum-exp (sinks included). The
prefill wrappers are asked for natural log (``lse_base="ln"``); the decode
wrapper's ``run`` has no such option, so its lse is multiplied by ``ln 2`` here.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ._jit import first_use, import_flashinfer
from ._layout import paged_metadata

_fi = import_flashinfer()

#: FlashInfer's recommended float workspace (split-KV partial results).
_WORKSPACE_BYTES = 128 * 1024 * 1024
#: Wrappers kept alive (each also holds FlashInfer's 8 MiB int workspace and a pinned copy).
_MAX_WRAPPERS = 16
_LN2 = math.log(2.0)
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass
class _Entry:
    wrapper: Any
    lock: threading.Lock
    meta: tuple | None = None
    #: The flat page ids the current plan reads (entry-owned, refreshed every call).
    kv_indices: torch.Tensor | None = None
    #: ``b * max_pages + j`` for every used page, on the device (for the gather).
    flat_index: torch.Tensor | None = None


_lock = threading.Lock()
_wrappers: OrderedDict[tuple, _Entry] = OrderedDict()
_workspaces: dict[torch.device, torch.Tensor] = {}


def _workspace(device: torch.device) -> torch.Tensor:
    # One float workspace per device, shared by every wrapper (as SGLang does): it
    # holds split-KV partial results only while a run executes, and runs issued on one
    # stream execute one after another. Zeroed because FlashInfer's decode wrapper
    # requires it on first use. Concurrent runs on several streams would need one each.
    with _lock:
        ws = _workspaces.get(device)
        if ws is None:
            ws = torch.zeros(_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
            _workspaces[device] = ws
        return ws


def _entry(key: tuple, make: Callable[[], Any]) -> _Entry:
    with _lock:
        entry = _wrappers.get(key)
        if entry is not None:
            _wrappers.move_to_end(key)
            return entry
    wrapper = make()  # outside the lock: the sink wrappers JIT-compile their module here
    with _lock:
        entry = _wrappers.setdefault(key, _Entry(wrapper, threading.Lock()))
        _wrappers.move_to_end(key)
        while len(_wrappers) > _MAX_WRAPPERS:
            _wrappers.popitem(last=False)
        return entry


def _call(
    key: tuple,
    make: Callable[[], Any],
    module: str,
    meta: tuple,
    plan: Callable[[_Entry], None],
    run: Callable[[_Entry], Any],
    page_table: torch.Tensor | None = None,
) -> Any:
    """Plan (only when ``meta`` changed since this wrapper's last plan), then run."""
    # FlashInfer compiles a module in the constructor (sink variants) or in the first plan.
    with first_use(module):
        entry = _entry(key, make)
        with entry.lock:
            if entry.meta != meta:
                plan(entry)
                entry.meta = meta
            elif page_table is not None:
                _gather_pages(entry, page_table)
            return run(entry)


def _to_host(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """One device-to-host copy (one sync) for all the int32 metadata vectors."""
    flat = torch.cat([t.reshape(-1) for t in tensors]).cpu()
    return list(flat.split([t.numel() for t in tensors]))


def _host(plan: Any, fields: tuple[str, ...], tensors: tuple[torch.Tensor, ...]) -> tuple[list[torch.Tensor], tuple]:
    """The host copies of the length vectors and the plan metadata: from the attention plan when
    there is one (no sync), else one device-to-host copy."""
    if plan is not None:
        return [plan.host_tensor(f) for f in fields], tuple(getattr(plan, f) for f in fields)
    host = _to_host(*tensors)
    return host, tuple(tuple(t.tolist()) for t in host)


def _gather_pages(entry: _Entry, page_table: torch.Tensor) -> None:
    table = page_table if page_table.is_contiguous() else page_table.contiguous()
    torch.index_select(table.view(-1), 0, entry.flat_index, out=entry.kv_indices)


def _flags(window_left: int, logit_cap: float, sinks: bool) -> str:
    return "".join(
        s for s, on in ((" sliding-window", window_left >= 0), (" soft-cap", logit_cap > 0), (" sinks", sinks)) if on
    )


def _target(q: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    # FlashInfer writes a dense output; our out= only promises a contiguous last dim.
    if out is not None and out.is_contiguous():
        return out
    return torch.empty_like(q, memory_format=torch.contiguous_format)


def _finish(res: Any, out: torch.Tensor | None, return_lse: bool, lse_scale: float = 1.0):
    o, lse = res if return_lse else (res, None)
    if out is not None and o.data_ptr() != out.data_ptr():
        out.copy_(o)
        o = out
    if not return_lse:
        return o
    if lse_scale != 1.0:
        lse = lse * lse_scale
    return o, lse


def _empty(q: torch.Tensor, out: torch.Tensor | None, return_lse: bool):
    o = out if out is not None else torch.empty_like(q)
    if not return_lse:
        return o
    return o, torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)


def _sink_prefill_wrapper(q: torch.Tensor, kv_dtype: torch.dtype, window_left: int) -> Any:
    d = q.shape[-1]
    return _fi.BatchAttentionWithAttentionSinkWrapper(
        _workspace(q.device), "NHD", q_data_type=q.dtype, kv_data_type=kv_dtype,
        head_dim_qk=d, head_dim_vo=d, window_left=window_left,
    )  # fmt: skip


def mha_prefill(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
    *, causal, window_left, sinks, softmax_scale, logit_cap, return_lse, out, plan=None,
):  # fmt: skip
    """Ragged prefill: ``BatchPrefillWithRaggedKVCacheWrapper``, or with sinks the paged sink wrapper on 1-token pages."""
    total_q, hq, d = q.shape
    hkv = k.shape[1]
    if total_q == 0:
        return _empty(q, out, return_lse)
    (cu_q, cu_k), meta = _host(plan, ("cu_seqlens_q", "cu_seqlens_k"), (cu_seqlens_q, cu_seqlens_k))
    target = _target(q, out)
    module = f"batch prefill{' (attention sink)' if sinks is not None else ''} {_DTYPE_NAMES[q.dtype]} head_dim={d}"
    module += _flags(window_left, logit_cap, sinks is not None)
    if sinks is None:

        def plan(entry: _Entry) -> None:
            # Host indptrs: FlashInfer reads them without another sync and stages them into
            # device buffers it owns, so the plan keeps no device tensor of the caller's.
            entry.wrapper.plan(
                cu_q, cu_k, hq, hkv, d, causal=causal, window_left=window_left, logits_soft_cap=logit_cap,
                sm_scale=softmax_scale, q_data_type=q.dtype, kv_data_type=k.dtype,
            )  # fmt: skip

        res = _call(
            ("ragged", q.device, q.dtype, hq, hkv, d, causal, window_left, softmax_scale, logit_cap),
            lambda: _fi.BatchPrefillWithRaggedKVCacheWrapper(_workspace(q.device), "NHD"),
            module, meta, plan,
            lambda entry: entry.wrapper.run(q, k, v, out=target, return_lse=return_lse, lse_base="ln"),
        )  # fmt: skip
        return _finish(res, out, return_lse)

    def plan_sink(entry: _Entry) -> None:
        # k/v become a paged cache of one-token pages: page i is token i.
        entry.kv_indices = torch.arange(int(cu_k[-1]), dtype=torch.int32, device=q.device)
        has_keys = (cu_k[1:] > cu_k[:-1]).to(torch.int32)  # last_page_len: 1, or 0 for no key
        entry.wrapper.plan(
            cu_q, cu_k, entry.kv_indices, has_keys, hq, hkv, d, 1, causal=causal, window_left=window_left,
            sm_scale=softmax_scale, q_data_type=q.dtype, kv_data_type=k.dtype,
        )  # fmt: skip

    res = _call(
        ("ragged_sink", q.device, q.dtype, hq, hkv, d, causal, window_left, softmax_scale),
        lambda: _sink_prefill_wrapper(q, k.dtype, window_left),
        module, meta, plan_sink,
        lambda entry: entry.wrapper.run(
            q, (k.unsqueeze(1), v.unsqueeze(1)), sinks, softmax_scale,
            out=target, return_lse=return_lse, lse_base="ln",
        ),
    )  # fmt: skip
    return _finish(res, out, return_lse)


def _plan_pages(entry: _Entry, lens: torch.Tensor, page_size: int, page_table: torch.Tensor) -> tuple:
    indptr, last, flat = paged_metadata(lens, page_size, page_table.shape[1])
    entry.flat_index = flat.to(page_table.device)
    entry.kv_indices = torch.empty(flat.numel(), dtype=torch.int32, device=page_table.device)
    _gather_pages(entry, page_table)
    return indptr, last


def mha_extend_with_kvcache(
    q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q,
    *, causal, window_left, sinks, softmax_scale, logit_cap, return_lse, out, plan=None,
):  # fmt: skip
    """Paged prefill: ``BatchPrefillWithPagedKVCacheWrapper`` (``BatchAttentionWithAttentionSinkWrapper`` with sinks)."""
    total_q, hq, d = q.shape
    _, page_size, hkv, _ = k_cache.shape
    if total_q == 0:
        return _empty(q, out, return_lse)
    (cu_q, lens), meta = _host(plan, ("cu_seqlens_q", "cache_seqlens"), (cu_seqlens_q, cache_seqlens))
    meta = (*meta, page_table.shape[1])
    target = _target(q, out)
    static = (q.device, q.dtype, k_cache.dtype, hq, hkv, d, page_size, causal, window_left, softmax_scale)
    flags = _flags(window_left, logit_cap, sinks is not None)
    if sinks is None:
        # FlashInfer 0.7.4 runs batches whose longest query has <= 64 tokens on fa2 and
        # longer ones on fa3: two modules, each announced on its first compile.
        backend = "fa2" if int((cu_q[1:] - cu_q[:-1]).max()) <= 64 else "fa3"
        module = f"batch prefill (paged, {backend}) {_DTYPE_NAMES[q.dtype]} head_dim={d}{flags}"

        def plan(entry: _Entry) -> None:
            indptr, last = _plan_pages(entry, lens, page_size, page_table)
            entry.wrapper.plan(
                cu_q, indptr, entry.kv_indices, last, hq, hkv, d, page_size, causal=causal,
                window_left=window_left, logits_soft_cap=logit_cap, sm_scale=softmax_scale,
                q_data_type=q.dtype, kv_data_type=k_cache.dtype,
            )  # fmt: skip

        res = _call(
            ("paged", *static, logit_cap),
            lambda: _fi.BatchPrefillWithPagedKVCacheWrapper(_workspace(q.device), "NHD"),
            module, meta, plan,
            lambda entry: entry.wrapper.run(
                q, (k_cache, v_cache), out=target, return_lse=return_lse, lse_base="ln"
            ),
            page_table,
        )  # fmt: skip
        return _finish(res, out, return_lse)

    def plan_sink(entry: _Entry) -> None:
        indptr, last = _plan_pages(entry, lens, page_size, page_table)
        entry.wrapper.plan(
            cu_q, indptr, entry.kv_indices, last, hq, hkv, d, page_size, causal=causal,
            window_left=window_left, sm_scale=softmax_scale, q_data_type=q.dtype, kv_data_type=k_cache.dtype,
        )  # fmt: skip

    res = _call(
        ("paged_sink", *static),
        lambda: _sink_prefill_wrapper(q, k_cache.dtype, window_left),
        f"batch prefill (paged, attention sink) {_DTYPE_NAMES[q.dtype]} head_dim={d}{flags}",
        meta, plan_sink,
        lambda entry: entry.wrapper.run(
            q, (k_cache, v_cache), sinks, softmax_scale, out=target, return_lse=return_lse, lse_base="ln"
        ),
        page_table,
    )  # fmt: skip
    return _finish(res, out, return_lse)


def mha_decode_with_kvcache(
    q, k_cache, v_cache, page_table, cache_seqlens,
    *, window_left, sinks, softmax_scale, logit_cap, return_lse, out, plan=None,
):  # fmt: skip
    """Paged decode: ``BatchDecodeWithPagedKVCacheWrapper`` on tensor cores (``BatchDecodeWithAttentionSinkWrapper``)."""
    batch, hq, d = q.shape
    _, page_size, hkv, _ = k_cache.shape
    if batch == 0:
        return _empty(q, out, return_lse)
    (lens,), meta = _host(plan, ("cache_seqlens",), (cache_seqlens,))
    meta = (*meta, page_table.shape[1])
    target = _target(q, out)
    static = (q.device, q.dtype, k_cache.dtype, hq, hkv, d, page_size, window_left, softmax_scale)
    flags = _flags(window_left, logit_cap, sinks is not None)
    kw = {} if sinks is not None else {"logits_soft_cap": logit_cap}

    def plan(entry: _Entry) -> None:
        indptr, last = _plan_pages(entry, lens, page_size, page_table)
        entry.wrapper.plan(
            indptr, entry.kv_indices, last, hq, hkv, d, page_size, window_left=window_left,
            sm_scale=softmax_scale, q_data_type=q.dtype, kv_data_type=k_cache.dtype, **kw,
        )  # fmt: skip

    if sinks is None:
        key = ("decode", *static, logit_cap)
        module = f"batch decode (tensor cores) {_DTYPE_NAMES[q.dtype]} head_dim={d}{flags}"
        # Tensor-core decode runs FlashInfer's prefill kernels with the query heads of one
        # KV head packed as rows: the fast path for GQA (GPT-OSS: 8 query heads per KV head).
        make = lambda: _fi.BatchDecodeWithPagedKVCacheWrapper(_workspace(q.device), "NHD", use_tensor_cores=True)
        run = lambda entry: entry.wrapper.run(q, (k_cache, v_cache), out=target, return_lse=return_lse)
    else:
        key = ("decode_sink", *static)
        module = f"batch decode (attention sink) {_DTYPE_NAMES[q.dtype]} head_dim={d}{flags}"
        make = lambda: _fi.BatchDecodeWithAttentionSinkWrapper(
            _workspace(q.device), "NHD", q_data_type=q.dtype, kv_data_type=k_cache.dtype,
            head_dim_qk=d, head_dim_vo=d, window_left=window_left,
        )  # fmt: skip
        run = lambda entry: entry.wrapper.run(
            q, (k_cache, v_cache), sinks, softmax_scale, out=target, return_lse=return_lse
        )  # fmt: skip
    res = _call(key, make, module, meta, plan, run, page_table)
    return _finish(res, out, return_lse, lse_scale=_LN2)


def _reset_for_tests() -> None:
    with _lock:
        _wrappers.clear()

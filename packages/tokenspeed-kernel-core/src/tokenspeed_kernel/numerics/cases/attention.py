"""Cases for the attention ops: prefill, extend, decode, cache store.

GPU sets use GPT-OSS shapes (64 query heads, 8 KV heads, head_dim 64, sinks,
window 127 = the config's ``sliding_window = 128``) and the awkward cases:
ragged batches, sequences crossing pages, pages handed out in random order,
windows larger than the sequence, queries shorter than keys, empty sequences.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import torch

from ..compare import check_exact
from ..inputs import cu_seqlens, paged_kv_cache, randn, rope_cos_sin_cache, torch_dtype
from . import CapturedCall, Case, Cost, OpCases, Peer, PeerCall, PeerSkip, nbytes
from ._common import close, compare_by, dim, exact, upcast

_GPT_OSS = {"heads_q": 64, "heads_kv": 8, "head_dim": 64, "sinks": True}

_COMMON = {
    "heads_q": 4,
    "heads_kv": 2,
    "head_dim": 64,
    "window_left": -1,
    "sinks": False,
    "logit_cap": 0.0,
    "return_lse": False,
    "softmax_scale": None,
}


def _tuple_without(t: tuple, i: int) -> tuple:
    return t[:i] + t[i + 1 :]


def _heads_move(case: Case) -> list[Case]:
    """Fewer heads: both halved (same group), the group halved, then a single head."""
    hq, hkv = case["heads_q"], case["heads_kv"]
    out = []
    for nq, nkv in ((1, 1), (hq // hkv, 1), (hq // 2, hkv // 2), (hq // 2, hkv)):
        if nq >= 1 and nkv >= 1 and nq % nkv == 0 and (nq, nkv) != (hq, hkv) and nq <= hq and nkv <= hkv:
            c = case.replace(heads_q=nq, heads_kv=nkv)
            if c not in out:
                out.append(c)
    return out


def _smaller_lengths(n: int, lo: int) -> list[int]:
    return [v for v in dict.fromkeys((lo, n // 2, n - 1)) if lo <= v < n]


def _common_kwargs(case: Case, gen: torch.Generator) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "window_left": case["window_left"],
        "softmax_scale": case["softmax_scale"],
        "logit_cap": case["logit_cap"],
        "return_lse": case["return_lse"],
    }
    if case["sinks"]:
        kw["sinks"] = randn((case["heads_q"],), torch.float32, gen)
    return kw


def _attn_outputs(call: dict[str, Any], result: Any) -> dict[str, torch.Tensor]:
    if isinstance(result, tuple):
        return {"out": result[0], "lse": result[1]}
    return {"out": result}


_ATTN_COMPARE = compare_by({"out": close("matmul"), "lse": close("lse")})


def _common_from_capture(c: CapturedCall, q_shape: tuple[int, ...], hkv: int) -> dict[str, Any]:
    return {
        "heads_q": q_shape[1],
        "heads_kv": hkv,
        "head_dim": q_shape[2],
        "window_left": int(c.value("window_left", -1)),
        "sinks": not c.is_none("sinks"),
        "logit_cap": float(c.value("logit_cap", 0.0)),
        "return_lse": bool(c.value("return_lse", False)),
        "softmax_scale": c.value("softmax_scale"),
    }


def _lengths_from(sample: list | None, batch: int, total: int, longest: int) -> tuple[int, ...]:
    """Sequence lengths: from a recorded ``cu_seqlens`` when capture had one, else
    ``batch`` lengths summing to ``total`` with the first at ``longest``."""
    if sample is not None and len(sample) == batch + 1:
        return tuple(int(b - a) for a, b in itertools.pairwise(sample))
    if batch <= 1:
        return (total,)
    longest = min(longest, total)
    rest = total - longest
    base, extra = divmod(rest, batch - 1)
    return (longest, *[base + (1 if i < extra else 0) for i in range(batch - 1)])


# ---------------------------------------------------------------------------
# mha_prefill


def _make_prefill(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    dt = torch_dtype(case.dtype)
    lq = tuple(case["seqlens_q"])
    lk = tuple(case["seqlens_k"]) if case["seqlens_k"] is not None else lq
    if len(lq) != len(lk):
        raise ValueError(f"seqlens_k: expected {len(lq)} lengths (like seqlens_q), got {len(lk)}")
    hq, hkv, d = case["heads_q"], case["heads_kv"], case["head_dim"]
    return {
        "q": randn((sum(lq), hq, d), dt, gen),
        "k": randn((sum(lk), hkv, d), dt, gen),
        "v": randn((sum(lk), hkv, d), dt, gen),
        "cu_seqlens_q": cu_seqlens(lq, device),
        "cu_seqlens_k": cu_seqlens(lk, device),
        "max_seqlen_q": max(lq, default=0),
        "max_seqlen_k": max(lk, default=0),
        "causal": case["causal"],
        **_common_kwargs(case, gen),
    }


def _prefill_batch_move(case: Case) -> list[Case]:
    lq, lk = case["seqlens_q"], case["seqlens_k"]
    if len(lq) <= 1:
        return []
    singles = [case.replace(seqlens_q=(lq[i],), seqlens_k=None if lk is None else (lk[i],)) for i in range(len(lq))]
    drops = [
        case.replace(seqlens_q=_tuple_without(lq, i), seqlens_k=None if lk is None else _tuple_without(lk, i))
        for i in range(len(lq))
    ]
    return singles + drops


def _prefill_seq_move(case: Case) -> list[Case]:
    lq, lk = case["seqlens_q"], case["seqlens_k"]
    out = []
    for i, n in enumerate(lq):
        for v in _smaller_lengths(n, 1):
            out.append(case.replace(seqlens_q=lq[:i] + (v,) + lq[i + 1 :]))
    if lk is not None:
        for i, n in enumerate(lk):
            for v in _smaller_lengths(n, 1):
                out.append(case.replace(seqlens_k=lk[:i] + (v,) + lk[i + 1 :]))
    return out


def _prefill_from_capture(c: CapturedCall) -> Case | None:
    q, k, cuq = c.shape(0), c.shape(1), c.shape(3)
    if q is None or k is None or cuq is None:
        return None
    batch = cuq[0] - 1
    lq = _lengths_from(c.sample(3), batch, q[0], int(c.value(5, q[0])))
    lk = _lengths_from(c.sample(4), batch, k[0], int(c.value(6, k[0])))
    params = {
        "seqlens_q": lq,
        "seqlens_k": None if lk == lq else lk,
        "causal": bool(c.value("causal", True)),
        **_common_from_capture(c, q, k[1]),
    }
    return Case.make("mha_prefill", c.dtype(0), params)


_prefill_bench_shapes = ((1, 1024), (1, 4096), (1, 8192), (4, 2048), (16, 1024), (8, 8192))

# ---------------------------------------------------------------------------
# Cost models: attention counts only the (query, key) pairs the mask lets through
# (causal halves the work, a window of w keeps w + 1 keys); FLOPs are
# 4 * D * Hq * pairs (Q K^T and P V). Prefill bytes: q, k, v read and the output
# written; decode: the K/V rows the visible keys occupy, read once; extend adds q
# and the output.


def _visible(p: int, lk: int, causal: bool, window: int) -> tuple[int, int]:
    hi = min(p, lk - 1) if causal else lk - 1
    lo = max(0, p - window) if window >= 0 else 0
    return lo, hi


def attention_pairs(q_lens, k_lens, *, causal: bool, window: int) -> int:
    """Visible (query, key) pairs; query ``i`` of sequence ``b`` sits at ``k_lens[b] - q_lens[b] + i``."""
    total = 0
    for lq, lk in zip(q_lens, k_lens):
        if lq <= 0 or lk <= 0:
            continue
        start = lk - lq
        for p in range(start, start + lq):
            lo, hi = _visible(p, lk, causal, window)
            if hi >= lo:
                total += hi - lo + 1
    return total


def _key_span(lq: int, lk: int, causal: bool, window: int) -> int:
    """Keys of one sequence any of its queries sees (each is read once)."""
    if lq <= 0 or lk <= 0:
        return 0
    lo, _ = _visible(lk - lq, lk, causal, window)
    _, hi = _visible(lk - 1, lk, causal, window)
    return max(0, hi - lo + 1)


def _prefill_cost(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    lq = case["seqlens_q"]
    lk = case["seqlens_k"] or lq
    pairs = attention_pairs(lq, lk, causal=case["causal"], window=case["window_left"])
    flops = 4.0 * case["head_dim"] * case["heads_q"] * pairs
    return Cost(flops, nbytes(call["q"], call["k"], call["v"]) + nbytes(*outputs.values()))


def _paged_kv_bytes(call: dict[str, Any], keys: int) -> float:
    kc = call["k_cache"]
    return 2.0 * keys * kc.shape[2] * kc.shape[3] * kc.element_size()


def _extend_cost(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    ql, cl = case["q_lens"], case["cache_lens"]
    pairs = attention_pairs(ql, cl, causal=case["causal"], window=case["window_left"])
    keys = sum(_key_span(q, n, case["causal"], case["window_left"]) for q, n in zip(ql, cl))
    flops = 4.0 * case["head_dim"] * case["heads_q"] * pairs
    return Cost(flops, _paged_kv_bytes(call, keys) + nbytes(call["q"]) + nbytes(*outputs.values()))


def _decode_cost(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    cl = case["cache_lens"]
    pairs = attention_pairs((1,) * len(cl), cl, causal=True, window=case["window_left"])
    return Cost(4.0 * case["head_dim"] * case["heads_q"] * pairs, _paged_kv_bytes(call, pairs))


def _store_cost(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    kc = call["k_cache"]
    written = 2.0 * (case["tokens"] - case["pad"]) * kc.shape[2] * kc.shape[3] * kc.element_size()
    return Cost(0.0, nbytes(call["k"], call["v"], call["slot_mapping"]) + written)


# ---------------------------------------------------------------------------
# Peers: torch SDPA (equal-length batches only, no window; it has no sinks, so a
# case with sinks is timed without them and says so). FlashAttention-3 is the
# nvidia package's fa3.* kernels, registered with peer=True.


def _equal_batch(case: Case) -> tuple[int, int]:
    lq = tuple(case["seqlens_q"])
    lk = tuple(case["seqlens_k"]) if case["seqlens_k"] is not None else lq
    if not lq or len(set(lq)) != 1 or lq != lk:
        raise PeerSkip("needs a batch of equal query and key lengths (a padded [B, S] layout)")
    return len(lq), lq[0]


def _sdpa_peer(backend_name: str) -> Peer:
    def available(device: torch.device) -> str | None:
        if device.type != "cuda":
            return "needs a CUDA device"
        from torch.nn.attention import SDPBackend

        return None if hasattr(SDPBackend, backend_name) else f"this torch has no SDPA backend {backend_name}"

    def prepare(case: Case, call: dict[str, Any], device: torch.device) -> PeerCall:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        b, s = _equal_batch(case)
        if case["window_left"] >= 0:
            raise PeerSkip("no sliding window")
        if case["logit_cap"]:
            raise PeerSkip("no logit soft-capping")
        hq, hkv, d = case["heads_q"], case["heads_kv"], case["head_dim"]
        q = call["q"].view(b, s, hq, d).transpose(1, 2)
        k = call["k"].view(b, s, hkv, d).transpose(1, 2)
        v = call["v"].view(b, s, hkv, d).transpose(1, 2)
        scale = call["softmax_scale"]
        backend = getattr(SDPBackend, backend_name)
        note = "no sinks" if case["sinks"] else ""

        def run(kk: torch.Tensor, vv: torch.Tensor, gqa: bool) -> torch.Tensor:
            return sdpa(q, kk, vv, is_causal=case["causal"], scale=scale, enable_gqa=gqa)

        ctx = lambda: sdpa_kernel(backend)
        try:
            with ctx():
                run(k, v, hq != hkv)
            fn = lambda: run(k, v, hq != hkv)
        except Exception:
            if hq == hkv:
                raise
            # This backend has no grouped-query path: give it K/V expanded to Hq heads.
            ke = k.repeat_interleave(hq // hkv, dim=1)
            ve = v.repeat_interleave(hq // hkv, dim=1)
            with ctx():
                run(ke, ve, False)
            fn = lambda: run(ke, ve, False)
            note = ", ".join(x for x in (note, "K/V expanded to Hq heads") if x)
        return PeerCall(fn, note, ctx)

    name = f"torch.sdpa[{backend_name.lower().replace('_attention', '')}]"
    return Peer(name, prepare, available, f"torch scaled_dot_product_attention, {backend_name} backend")


MHA_PREFILL = OpCases(
    op="mha_prefill",
    cost=_prefill_cost,
    metric="tflops",
    peers=[_sdpa_peer("FLASH_ATTENTION"), _sdpa_peer("CUDNN_ATTENTION")],
    defaults={"seqlens_q": (5, 17), "seqlens_k": None, "causal": True, **_COMMON},
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16",)},
    sets={
        "cpu": [
            {"seqlens_q": (5, 17)},
            {"seqlens_q": (5, 17), "window_left": 3},
            {"seqlens_q": (9, 4), "window_left": 100, "label": "window larger than the sequence"},
            {"seqlens_q": (7, 12), "sinks": True, "window_left": 4, "return_lse": True},
            {"seqlens_q": (6,), "causal": False, "return_lse": True},
            {"seqlens_q": (3, 8), "seqlens_k": (10, 8), "label": "fewer queries than keys (bottom-right)"},
            {"seqlens_q": (11,), "logit_cap": 5.0},
            {"seqlens_q": (1, 0, 6), "return_lse": True, "label": "empty sequence"},
            {"seqlens_q": (13,), "heads_q": 8, "heads_kv": 1, "head_dim": 128, "sinks": True},
        ],
        "gpu": [
            {"seqlens_q": (1024,), **_GPT_OSS},
            {"seqlens_q": (1024,), "window_left": 127, **_GPT_OSS},
            {"seqlens_q": (100, 1000, 2500), "return_lse": True, **_GPT_OSS, "label": "ragged"},
            {"seqlens_q": (100, 1000, 2500), "window_left": 127, **_GPT_OSS, "label": "ragged"},
            {"seqlens_q": (64, 100), "window_left": 127, **_GPT_OSS, "label": "window larger than the sequence"},
            {"seqlens_q": (4096,), "window_left": 127, **_GPT_OSS},
            {"seqlens_q": (2048, 2048), **{**_GPT_OSS, "sinks": False}},
            {"seqlens_q": (513,), "seqlens_k": (1537,), **_GPT_OSS, "label": "fewer queries than keys"},
            {"seqlens_q": (777,), "window_left": 127, **_GPT_OSS, "dtype": "fp16"},
        ],
        "bench-cpu": [{"seqlens_q": (64, 64)}, {"seqlens_q": (128,), "window_left": 16, "sinks": True}],
        "bench-gpu": [
            {"seqlens_q": (s,) * b, "window_left": w, **_GPT_OSS, "dtype": "bf16", "label": f"{b}x{s}"}
            for w in (-1, 127)
            for b, s in _prefill_bench_shapes
        ],
    },
    make=_make_prefill,
    reference_call=lambda case, call: upcast(call, ("q", "k", "v")),
    outputs=_attn_outputs,
    compare=_ATTN_COMPARE,
    shrink=[_prefill_batch_move, _prefill_seq_move, _heads_move],
    from_capture=_prefill_from_capture,
    always_show=("seqlens_q", "heads_q", "heads_kv"),
    tuple_params=("seqlens_q", "seqlens_k"),
)


# ---------------------------------------------------------------------------
# paged ops: extend and decode


def _kv_dtype(case: Case) -> torch.dtype:
    return torch.float8_e4m3fn if case["kv_dtype"] == "fp8_e4m3" else torch_dtype(case.dtype)


def _upcast_paged(case: Case, call: dict[str, Any]) -> dict[str, Any]:
    names = ["q"] + (["k_cache", "v_cache"] if case["kv_dtype"] == "same" else [])
    return upcast(call, names)


def _make_extend(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    dt = torch_dtype(case.dtype)
    q_lens, cache_lens = tuple(case["q_lens"]), tuple(case["cache_lens"])
    if len(q_lens) != len(cache_lens) or any(q > n for q, n in zip(q_lens, cache_lens)):
        raise ValueError(f"q_lens {q_lens} must pair with cache_lens {cache_lens}, each q_len <= its cache_len")
    k_cache, v_cache, table, seqlens = paged_kv_cache(
        cache_lens,
        case["page_size"],
        case["heads_kv"],
        case["head_dim"],
        _kv_dtype(case),
        gen,
        num_pages=case["num_pages"],
    )
    return {
        "q": randn((sum(q_lens), case["heads_q"], case["head_dim"]), dt, gen),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "page_table": table,
        "cache_seqlens": seqlens,
        "cu_seqlens_q": cu_seqlens(q_lens, device),
        "max_seqlen_q": max(q_lens, default=0),
        "causal": case["causal"],
        **_common_kwargs(case, gen),
    }


def _extend_batch_move(case: Case) -> list[Case]:
    ql, cl = case["q_lens"], case["cache_lens"]
    if len(ql) <= 1:
        return []
    singles = [case.replace(q_lens=(ql[i],), cache_lens=(cl[i],)) for i in range(len(ql))]
    drops = [case.replace(q_lens=_tuple_without(ql, i), cache_lens=_tuple_without(cl, i)) for i in range(len(ql))]
    return singles + drops


def _extend_seq_move(case: Case) -> list[Case]:
    ql, cl = case["q_lens"], case["cache_lens"]
    out = []
    for i, (q, n) in enumerate(zip(ql, cl)):
        # Shorter cache with the same number of queries, then fewer queries over the same cache.
        for v in _smaller_lengths(n, max(q, 1)):
            out.append(case.replace(cache_lens=cl[:i] + (v,) + cl[i + 1 :]))
        for v in _smaller_lengths(q, 1):
            out.append(case.replace(q_lens=ql[:i] + (v,) + ql[i + 1 :]))
    return out


def _page_move(case: Case) -> list[Case]:
    ps = case["page_size"]
    return [case.replace(page_size=v, num_pages=None) for v in dict.fromkeys((1, ps // 2)) if 1 <= v < ps]


def _paged_common_from_capture(c: CapturedCall, q: tuple[int, ...], kc: tuple[int, ...]) -> dict[str, Any]:
    return {
        "page_size": kc[1],
        "num_pages": kc[0],
        "kv_dtype": "fp8_e4m3" if c.dtype(1) == "fp8_e4m3" else "same",
        **_common_from_capture(c, q, kc[2]),
    }


def _cache_lens_from(c: CapturedCall, batch: int, q_lens: tuple[int, ...], kc: tuple[int, ...]) -> tuple[int, ...]:
    sample = c.sample(4)
    if sample is not None and len(sample) == batch:
        return tuple(int(x) for x in sample)
    # No recorded lengths (e.g. captured inside a CUDA graph): fill the page table's columns.
    pt = c.shape(3)
    cap = (pt[1] - 1) * kc[1] if pt is not None else kc[0] * kc[1] // max(batch, 1)
    return tuple(max(cap, q) for q in q_lens)


def _extend_from_capture(c: CapturedCall) -> Case | None:
    q, kc, cuq = c.shape(0), c.shape(1), c.shape(5)
    if q is None or kc is None or cuq is None:
        return None
    batch = cuq[0] - 1
    q_lens = _lengths_from(c.sample(5), batch, q[0], int(c.value(6, q[0])))
    cache_lens = _cache_lens_from(c, batch, q_lens, kc)
    params = {"q_lens": q_lens, "cache_lens": cache_lens, "causal": bool(c.value("causal", True))}
    params.update(_paged_common_from_capture(c, q, kc))
    if params["num_pages"] < sum(-(-n // kc[1]) for n in cache_lens):
        params["num_pages"] = None
    return Case.make("mha_extend_with_kvcache", c.dtype(0), params)


_PAGED = {"page_size": 16, "kv_dtype": "same", "num_pages": None}

MHA_EXTEND_WITH_KVCACHE = OpCases(
    op="mha_extend_with_kvcache",
    cost=_extend_cost,
    metric="tflops",
    defaults={"q_lens": (3, 9), "cache_lens": (20, 9), "causal": True, **_PAGED, **_COMMON},
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16",)},
    sets={
        "cpu": [
            {"q_lens": (3, 9), "cache_lens": (20, 9)},
            {"q_lens": (3, 9), "cache_lens": (40, 30), "window_left": 4, "sinks": True, "return_lse": True},
            {
                "q_lens": (5,),
                "cache_lens": (40,),
                "page_size": 4,
                "window_left": 100,
                "label": "window larger than the sequence",
            },
            {"q_lens": (2, 4), "cache_lens": (33, 17), "kv_dtype": "fp8_e4m3"},
            {"q_lens": (4,), "cache_lens": (21,), "causal": False, "logit_cap": 5.0},
        ],
        "gpu": [
            {
                "q_lens": (128, 37, 512),
                "cache_lens": (1000, 37, 3000),
                **_GPT_OSS,
                "label": "ragged, page-crossing",
            },
            {"q_lens": (128, 37, 512), "cache_lens": (1000, 37, 3000), "window_left": 127, **_GPT_OSS},
            {
                "q_lens": (16, 16),
                "cache_lens": (50, 100),
                "window_left": 127,
                **_GPT_OSS,
                "label": "window larger than the sequence",
            },
            {"q_lens": (64, 200), "cache_lens": (2000, 900), "kv_dtype": "fp8_e4m3", **_GPT_OSS},
            {"q_lens": (256,), "cache_lens": (4096,), "page_size": 64, "return_lse": True, **_GPT_OSS},
        ],
        "bench-cpu": [{"q_lens": (16, 16), "cache_lens": (64, 64)}],
        "bench-gpu": [
            {
                "q_lens": (q,) * b,
                "cache_lens": (n,) * b,
                "window_left": w,
                **_GPT_OSS,
                "dtype": "bf16",
                "label": f"{b}x{q}/{n}",
            }
            for w in (-1, 127)
            for b, q, n in ((1, 512, 4096), (4, 1024, 8192), (16, 128, 2048))
        ],
    },
    make=_make_extend,
    reference_call=_upcast_paged,
    outputs=_attn_outputs,
    compare=_ATTN_COMPARE,
    shrink=[_extend_batch_move, _extend_seq_move, _heads_move, _page_move],
    from_capture=_extend_from_capture,
    always_show=("q_lens", "cache_lens", "heads_q", "heads_kv", "page_size"),
    tuple_params=("q_lens", "cache_lens"),
)


def _make_decode(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    dt = torch_dtype(case.dtype)
    cache_lens = tuple(case["cache_lens"])
    if any(n < 1 for n in cache_lens):
        raise ValueError(f"cache_lens: decode needs >= 1 token per sequence (the new one), got {cache_lens}")
    k_cache, v_cache, table, seqlens = paged_kv_cache(
        cache_lens,
        case["page_size"],
        case["heads_kv"],
        case["head_dim"],
        _kv_dtype(case),
        gen,
        num_pages=case["num_pages"],
    )
    return {
        "q": randn((len(cache_lens), case["heads_q"], case["head_dim"]), dt, gen),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "page_table": table,
        "cache_seqlens": seqlens,
        **_common_kwargs(case, gen),
    }


def _decode_batch_move(case: Case) -> list[Case]:
    cl = case["cache_lens"]
    if len(cl) <= 1:
        return []
    return [case.replace(cache_lens=(cl[i],)) for i in range(len(cl))] + [
        case.replace(cache_lens=_tuple_without(cl, i)) for i in range(len(cl))
    ]


def _decode_seq_move(case: Case) -> list[Case]:
    cl = case["cache_lens"]
    return [
        case.replace(cache_lens=cl[:i] + (v,) + cl[i + 1 :]) for i, n in enumerate(cl) for v in _smaller_lengths(n, 1)
    ]


def _decode_from_capture(c: CapturedCall) -> Case | None:
    q, kc = c.shape(0), c.shape(1)
    if q is None or kc is None:
        return None
    cache_lens = _cache_lens_from(c, q[0], (1,) * q[0], kc)
    params = {"cache_lens": cache_lens, **_paged_common_from_capture(c, q, kc)}
    if params["num_pages"] < sum(-(-n // kc[1]) for n in cache_lens):
        params["num_pages"] = None
    return Case.make("mha_decode_with_kvcache", c.dtype(0), params)


def _spread(batch: int, hi: int) -> tuple[int, ...]:
    """``batch`` deterministic lengths spread over [1, hi] (a Weyl sequence: no RNG, no repeats pattern)."""
    return tuple(1 + (i * 2654435761) % hi for i in range(batch))


MHA_DECODE_WITH_KVCACHE = OpCases(
    op="mha_decode_with_kvcache",
    cost=_decode_cost,
    defaults={"cache_lens": (1, 37, 70), **_PAGED, **_COMMON},
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16",)},
    sets={
        "cpu": [
            {"cache_lens": (1, 37, 70)},
            {"cache_lens": (1, 37, 70), "window_left": 8, "sinks": True, "return_lse": True},
            {"cache_lens": (5, 30), "window_left": 200, "label": "window larger than the sequence"},
            {"cache_lens": (17, 33), "kv_dtype": "fp8_e4m3"},
            {"cache_lens": (9, 3), "page_size": 1, "heads_q": 8, "heads_kv": 1, "logit_cap": 5.0},
        ],
        "gpu": [
            {"cache_lens": _spread(32, 4096), **_GPT_OSS, "label": "ragged 32"},
            {
                "cache_lens": _spread(32, 4096),
                "window_left": 127,
                "return_lse": True,
                **_GPT_OSS,
                "label": "ragged 32",
            },
            {
                "cache_lens": _spread(8, 100),
                "window_left": 127,
                **_GPT_OSS,
                "label": "window larger than the sequence",
            },
            {"cache_lens": _spread(16, 8192), "kv_dtype": "fp8_e4m3", **_GPT_OSS, "label": "ragged 16"},
            {"cache_lens": (8192,), "page_size": 64, **_GPT_OSS},
        ],
        "bench-cpu": [{"cache_lens": (64,) * 4}],
        "bench-gpu": [
            {"cache_lens": (n,) * b, "window_left": w, **_GPT_OSS, "dtype": "bf16", "label": f"{b}x{n}"}
            for w in (-1, 127)
            for b, n in ((1, 8192), (32, 4096), (64, 8192), (256, 2048))
        ],
    },
    make=_make_decode,
    reference_call=_upcast_paged,
    outputs=_attn_outputs,
    compare=_ATTN_COMPARE,
    shrink=[_decode_batch_move, _decode_seq_move, _heads_move, _page_move],
    from_capture=_decode_from_capture,
    always_show=("cache_lens", "heads_q", "heads_kv", "page_size"),
    tuple_params=("cache_lens",),
)


# ---------------------------------------------------------------------------
# mha_decode_append_kvcache


def _make_decode_append(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    call = _make_decode(case, device, gen)
    call.pop("return_lse")
    dt, b, hkv, d = torch_dtype(case.dtype), len(case["cache_lens"]), case["heads_kv"], case["head_dim"]
    new = {"k": randn((b, hkv, d), dt, gen), "v": randn((b, hkv, d), dt, gen)}
    if case["rotary"]:
        table = rope_cos_sin_cache(max(case["cache_lens"]), case["rotary_dim"] or d, device)
        new.update(cos_sin_cache=table, style=case["style"])
    q = call.pop("q")
    return {"q": q, **new, **call}


def _append_cache_dtype(case: Case) -> str:
    return "fp8_e4m3" if case["kv_dtype"] == "fp8_e4m3" else case.dtype


def _append_cost(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    attention = _decode_cost(case, call, outputs)
    kc = call["k_cache"]
    written = 2.0 * len(case["cache_lens"]) * kc.shape[2] * kc.shape[3] * kc.element_size()
    return Cost(attention.flops, attention.bytes + nbytes(call["q"], call["k"], call["v"]) + written)


MHA_DECODE_APPEND_KVCACHE = OpCases(
    op="mha_decode_append_kvcache",
    cost=_append_cost,
    defaults={
        "cache_lens": (1, 37, 70),
        **_PAGED,
        **{k: v for k, v in _COMMON.items() if k != "return_lse"},
        "return_lse": False,  # (made by the decode maker; never passed)
        "rotary": True,
        "rotary_dim": None,
        "style": "neox",
    },
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16",)},
    sets={
        "cpu": [
            {"cache_lens": (1, 37, 70)},
            {"cache_lens": (1, 37, 70), "window_left": 8, "sinks": True, "style": "gptj", "rotary_dim": 32},
            {"cache_lens": (5, 30), "rotary": False, "label": "no rotation"},
            {"cache_lens": (17, 33), "kv_dtype": "fp8_e4m3"},
            {"cache_lens": (9, 3), "page_size": 1, "heads_q": 8, "heads_kv": 1, "logit_cap": 5.0},
        ],
        "gpu": [
            {"cache_lens": _spread(32, 4096), **_GPT_OSS, "label": "ragged 32"},
            {"cache_lens": _spread(32, 4096), "window_left": 127, **_GPT_OSS, "label": "ragged 32"},
            {"cache_lens": (1,), **_GPT_OSS, "label": "the first token"},
            {"cache_lens": _spread(16, 8192), "kv_dtype": "fp8_e4m3", **_GPT_OSS, "label": "ragged 16"},
            {"cache_lens": (8192,), "page_size": 64, **_GPT_OSS},
        ],
        "bench-cpu": [{"cache_lens": (64,) * 4}],
        "bench-gpu": [
            {"cache_lens": (n,) * b, "window_left": w, **_GPT_OSS, "dtype": "bf16", "label": f"{b}x{n}"}
            for w in (-1, 127)
            for b, n in ((1, 2048), (1, 8192), (32, 4096), (256, 2048))
        ],
    },
    make=_make_decode_append,
    # The reference rotates in fp32 and writes the caches in place (upcast: fp32 copies); the kernel rounds the
    # rotated k to q's dtype first (the contract), within a step of the cache's dtype.
    reference_call=lambda case, call: upcast(
        call, ["q", "k", "v"] + (["k_cache", "v_cache"] if case["kv_dtype"] == "same" else [])
    ),
    outputs=lambda call, result: {"out": result, "k_cache": call["k_cache"], "v_cache": call["v_cache"]},
    compare=compare_by(
        {
            "out": close("matmul"),
            "k_cache": close("elementwise", dtype_of=_append_cache_dtype),
            # v is written as it is: the reference's fp32 copy of the cache holds the same values.
            "v_cache": lambda case, name, got, want: check_exact(name, got, want.to(got.dtype)),
        }
    ),
    shrink=[_decode_batch_move, _decode_seq_move, _heads_move, _page_move],
    always_show=("cache_lens", "heads_q", "heads_kv", "page_size", "rotary"),
    tuple_params=("cache_lens",),
)


# ---------------------------------------------------------------------------
# kvcache_store


def _make_store(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    dt = torch_dtype(case.dtype)
    cache_dt = torch.float8_e4m3fn if case["cache_dtype"] == "fp8_e4m3" else dt
    t, hkv, d, ps, pages = case["tokens"], case["heads_kv"], case["head_dim"], case["page_size"], case["num_pages"]
    if t > pages * ps:
        raise ValueError(f"tokens: {t} tokens do not fit {pages} pages of {ps}")
    slots = torch.randperm(pages * ps, generator=gen, device=device)[:t]
    if case["pad"]:
        pad_at = torch.randperm(t, generator=gen, device=device)[: case["pad"]]
        slots[pad_at] = -1
    src = torch.float32 if cache_dt == torch.float8_e4m3fn else cache_dt
    return {
        "k": randn((t, hkv, d), dt, gen),
        "v": randn((t, hkv, d), dt, gen),
        "k_cache": randn((pages, ps, hkv, d), src, gen).to(cache_dt),
        "v_cache": randn((pages, ps, hkv, d), src, gen).to(cache_dt),
        "slot_mapping": slots.to(torch.int64 if case["slot_dtype"] == "int64" else torch.int32),
    }


def _store_from_capture(c: CapturedCall) -> Case | None:
    k, kc, slots = c.shape(0), c.shape(2), c.shape(4)
    if k is None or kc is None or slots is None:
        return None
    sample = c.sample(4)
    pad = sum(1 for s in sample if s < 0) if sample is not None else 0
    return Case.make(
        "kvcache_store",
        c.dtype(0),
        {
            "tokens": k[0],
            "heads_kv": k[1],
            "head_dim": k[2],
            "page_size": kc[1],
            "num_pages": kc[0],
            "pad": pad,
            "cache_dtype": "fp8_e4m3" if c.dtype(2) == "fp8_e4m3" else "same",
            "slot_dtype": c.dtype(4) or "int64",
        },
    )


KVCACHE_STORE = OpCases(
    op="kvcache_store",
    cost=_store_cost,
    defaults={
        "tokens": 10,
        "heads_kv": 2,
        "head_dim": 64,
        "page_size": 16,
        "num_pages": 4,
        "pad": 2,
        "cache_dtype": "same",
        "slot_dtype": "int64",
    },
    dtypes={"cpu": ("bf16", "fp32"), "cuda": ("bf16",)},
    sets={
        "cpu": [
            {"tokens": 10},
            {"tokens": 30, "pad": 0, "slot_dtype": "int32", "page_size": 8},
            {"tokens": 7, "cache_dtype": "fp8_e4m3"},
        ],
        "gpu": [
            {"tokens": 256, "heads_kv": 8, "page_size": 16, "num_pages": 512, "pad": 7},
            {"tokens": 4096, "heads_kv": 8, "page_size": 16, "num_pages": 1024, "pad": 0, "slot_dtype": "int32"},
            {"tokens": 64, "heads_kv": 8, "page_size": 16, "num_pages": 64, "cache_dtype": "fp8_e4m3"},
        ],
        "bench-cpu": [{"tokens": 64, "num_pages": 8, "pad": 0}],
        "bench-gpu": [
            {"tokens": t, "heads_kv": 8, "page_size": 16, "num_pages": 2048, "pad": 0, "dtype": "bf16"}
            for t in (64, 4096)
        ],
    },
    make=_make_store,
    outputs=lambda call, result: {"k_cache": call["k_cache"], "v_cache": call["v_cache"]},
    compare=compare_by({"k_cache": exact(), "v_cache": exact()}),
    shrink=[
        dim("tokens", keep=lambda c, v: v > c["pad"]),
        dim("pad", lo=0),
        dim("heads_kv"),
        dim("num_pages", keep=lambda c, v: v * c["page_size"] >= c["tokens"]),
    ],
    from_capture=_store_from_capture,
    always_show=("tokens", "heads_kv", "page_size", "num_pages"),
)

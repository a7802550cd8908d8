"""Reference attention against an independent float64 formulation.

The oracle below is written per sequence and per query head: explicit scores,
an explicit visibility rule, the sink appended as one extra softmax column and
dropped afterwards. Paged caches are built from contiguous K/V with shuffled
pages and NaN in every slot that is not part of a sequence, so reading a wrong
slot shows up in the output.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

import tokenspeed_kernel
from tokenspeed_kernel.reference import attention as ref

HQ, HKV, D = 8, 2, 16
FP8 = torch.float8_e4m3fn

TOL = {
    torch.float32: {"atol": 2e-5, "rtol": 2e-5},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1.6e-2, "rtol": 1.6e-2},
}


# ---------------------------------------------------------------------------
# Independent oracle


def oracle_sequence(q, k, v, positions, *, causal, window_left, sinks, scale, cap):
    """float64 attention of one sequence; returns (out [Lq, Hq, D], lse [Lq, Hq]).

    q ``[Lq, Hq, D]``, k/v ``[Lk, Hkv, D]`` (any float dtype, upcast here);
    ``positions``: the absolute position of each query; keys sit at 0..Lk-1.
    """
    q, k, v = q.double(), k.double(), v.double()
    lq, hq, d = q.shape
    lk, hkv = k.shape[0], k.shape[1]
    out = torch.zeros(lq, hq, d, dtype=torch.float64)
    lse = torch.zeros(lq, hq, dtype=torch.float64)
    key_pos = torch.arange(lk, dtype=torch.float64)
    for h in range(hq):
        kh, vh = k[:, h // (hq // hkv)], v[:, h // (hq // hkv)]
        for i, p in enumerate(positions):
            s = (kh @ q[i, h]) * scale
            if cap > 0:
                s = cap * torch.tanh(s / cap)
            allowed = torch.ones(lk, dtype=torch.bool)
            if causal:
                allowed &= key_pos <= p
            if window_left >= 0:
                allowed &= (p - key_pos) <= window_left
            s = torch.where(allowed, s, torch.tensor(-math.inf, dtype=torch.float64))
            if sinks is not None:
                s = torch.cat([s, sinks[h].double().view(1)])
            total = torch.logsumexp(s, 0) if s.numel() else torch.tensor(-math.inf, dtype=torch.float64)
            lse[i, h] = total
            if torch.isfinite(total):
                w = torch.exp(s - total)[:lk]  # drop the sink column
                out[i, h] = w @ vh
    return out, lse


def oracle(qs, ks, vs, positions, **kw):
    outs, lses = zip(*(oracle_sequence(q, k, v, p, **kw) for q, k, v, p in zip(qs, ks, vs, positions)))
    return torch.cat(outs), torch.cat(lses)


# ---------------------------------------------------------------------------
# Input builders


def seed_of(*parts) -> int:
    """A seed that is stable across processes (str hashing is salted per process)."""
    return zlib.crc32(repr(parts).encode())


def cu(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def rand(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def paged_cache(ks, vs, page_size, dtype, gen):
    """Scatter per-sequence K/V into shuffled pages; returns (k_cache, v_cache, page_table)."""
    used = [-(-k.shape[0] // page_size) for k in ks]
    num_pages = sum(used) + 3
    perm = torch.randperm(num_pages, generator=gen)
    hkv, d = ks[0].shape[1], ks[0].shape[2]
    k_cache = torch.full((num_pages, page_size, hkv, d), math.nan).to(dtype)
    v_cache = torch.full((num_pages, page_size, hkv, d), math.nan).to(dtype)
    # Columns past a sequence's pages hold an out-of-range page id: reading them would raise.
    page_table = torch.full((len(ks), max(used) + 2), num_pages + 5, dtype=torch.int32)
    nxt = 0
    for b, (k, v) in enumerate(zip(ks, vs)):
        for j in range(used[b]):
            page = int(perm[nxt])
            nxt += 1
            page_table[b, j] = page
            rows = slice(j * page_size, min((j + 1) * page_size, k.shape[0]))
            n = rows.stop - rows.start
            k_cache[page, :n] = k[rows].to(dtype)
            v_cache[page, :n] = v[rows].to(dtype)
    return k_cache, v_cache, page_table


VARIANTS = {
    "causal": dict(causal=True, window_left=-1, sinks=False, cap=0.0),
    "noncausal": dict(causal=False, window_left=-1, sinks=False, cap=0.0),
    "window3_sinks": dict(causal=True, window_left=3, sinks=True, cap=0.0),
    "noncausal_window2_cap": dict(causal=False, window_left=2, sinks=False, cap=1.5),
    "window_longer_than_seq": dict(causal=True, window_left=100, sinks=True, cap=0.0),
    "cap_sinks": dict(causal=True, window_left=-1, sinks=True, cap=2.0),
}


def variant_kwargs(name, gen):
    v = VARIANTS[name]
    sinks = rand(gen, HQ) * 2 if v["sinks"] else None
    return dict(causal=v["causal"], window_left=v["window_left"], sinks=sinks, logit_cap=v["cap"])


def call_kwargs(kw, scale):
    return dict(
        causal=kw["causal"], window_left=kw["window_left"], sinks=kw["sinks"], softmax_scale=scale,
        logit_cap=kw["logit_cap"],
    )  # fmt: skip


def oracle_kwargs(kw, scale):
    return dict(causal=kw["causal"], window_left=kw["window_left"], sinks=kw["sinks"], scale=scale, cap=kw["logit_cap"])


# ---------------------------------------------------------------------------
# Prefill


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_matches_oracle(variant, dtype):
    gen = torch.Generator().manual_seed(seed_of(variant, dtype))
    q_lens = [1, 6, 9, 3]
    k_lens = [1, 6, 12, 3]  # third sequence: more keys than queries (bottom-right aligned)
    qs = [rand(gen, n, HQ, D, dtype=dtype) for n in q_lens]
    ks = [rand(gen, n, HKV, D, dtype=dtype) for n in k_lens]
    vs = [rand(gen, n, HKV, D, dtype=dtype) for n in k_lens]
    kw = variant_kwargs(variant, gen)
    scale = 0.37
    out, lse = ref.mha_prefill(
        torch.cat(qs), torch.cat(ks), torch.cat(vs), cu(q_lens), cu(k_lens), max(q_lens), max(k_lens),
        **call_kwargs(kw, scale), return_lse=True, out=None,
    )  # fmt: skip
    positions = [list(range(lk - lq, lk)) for lq, lk in zip(q_lens, k_lens)]
    want_out, want_lse = oracle(qs, ks, vs, positions, **oracle_kwargs(kw, scale))
    assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (sum(q_lens), HQ)
    torch.testing.assert_close(out.double(), want_out, **TOL[dtype])
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)


def test_prefill_window_matters_and_long_window_is_full_attention():
    gen = torch.Generator().manual_seed(1)
    n = 10
    q, k, v = rand(gen, n, HQ, D), rand(gen, n, HKV, D), rand(gen, n, HKV, D)
    args = (q, k, v, cu([n]), cu([n]), n, n)
    common = dict(causal=True, sinks=None, softmax_scale=0.25, logit_cap=0.0, return_lse=False, out=None)
    full = ref.mha_prefill(*args, window_left=-1, **common)
    torch.testing.assert_close(ref.mha_prefill(*args, window_left=n + 50, **common), full, atol=0, rtol=0)
    torch.testing.assert_close(ref.mha_prefill(*args, window_left=n - 1, **common), full, atol=0, rtol=0)
    short = ref.mha_prefill(*args, window_left=2, **common)
    # The first 3 queries see at most 3 keys either way; later ones lose keys to the window.
    torch.testing.assert_close(short[:3], full[:3], atol=0, rtol=0)
    assert (short[3:] - full[3:]).abs().amax() > 0.05


def test_prefill_query_that_sees_nothing():
    gen = torch.Generator().manual_seed(2)
    q, k, v = rand(gen, 4, HQ, D), rand(gen, 2, HKV, D), rand(gen, 2, HKV, D)
    args = (q, k, v, cu([4]), cu([2]), 4, 2)
    common = dict(causal=True, window_left=-1, softmax_scale=0.25, logit_cap=0.0, return_lse=True, out=None)
    out, lse = ref.mha_prefill(*args, sinks=None, **common)
    # Bottom-right alignment: queries 0 and 1 sit at positions -2 and -1.
    assert torch.equal(out[:2], torch.zeros(2, HQ, D))
    assert torch.equal(lse[:2], torch.full((2, HQ), -math.inf))
    want_out, want_lse = oracle(
        [q], [k], [v], [[-2, -1, 0, 1]], causal=True, window_left=-1, sinks=None, scale=0.25, cap=0.0
    )
    torch.testing.assert_close(out.double(), want_out, **TOL[torch.float32])
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)
    sinks = rand(gen, HQ)
    out, lse = ref.mha_prefill(*args, sinks=sinks, **common)
    assert torch.equal(out[:2], torch.zeros(2, HQ, D))
    torch.testing.assert_close(lse[:2], sinks.expand(2, HQ), atol=0, rtol=0)


def test_prefill_chunked_queries_match_single_block(monkeypatch):
    """Forcing tiny query chunks (and so per-chunk key ranges) must not change the result."""
    gen = torch.Generator().manual_seed(3)
    lens = [13, 7]
    q, k, v = rand(gen, 20, HQ, D), rand(gen, 20, HKV, D), rand(gen, 20, HKV, D)
    sinks = rand(gen, HQ)
    for window_left in (-1, 3):
        for causal in (True, False):
            kw = dict(causal=causal, window_left=window_left, sinks=sinks, softmax_scale=0.3, logit_cap=0.0)
            whole = ref.mha_prefill(q, k, v, cu(lens), cu(lens), 13, 13, **kw, return_lse=True, out=None)
            with monkeypatch.context() as m:
                m.setattr(ref, "SCORE_BLOCK_ELEMENTS", HQ * 2 * 4)  # 2-query chunks at most
                chunked = ref.mha_prefill(q, k, v, cu(lens), cu(lens), 13, 13, **kw, return_lse=True, out=None)
            torch.testing.assert_close(chunked[0], whole[0], atol=1e-6, rtol=1e-6)
            torch.testing.assert_close(chunked[1], whole[1], atol=1e-6, rtol=1e-6)


def test_prefill_out_is_written_and_returned():
    gen = torch.Generator().manual_seed(4)
    q, k, v = rand(gen, 5, HQ, D, dtype=torch.float16), rand(gen, 5, HKV, D, dtype=torch.float16), None
    v = rand(gen, 5, HKV, D, dtype=torch.float16)
    kw = dict(causal=True, window_left=-1, sinks=None, softmax_scale=0.25, logit_cap=0.0)
    want = ref.mha_prefill(q, k, v, cu([2, 3]), cu([2, 3]), 3, 3, **kw, return_lse=False, out=None)
    out = torch.full_like(q, math.nan)
    got = ref.mha_prefill(q, k, v, cu([2, 3]), cu([2, 3]), 3, 3, **kw, return_lse=False, out=out)
    assert got is out
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    out2 = torch.full_like(q, math.nan)
    got2, lse = ref.mha_prefill(q, k, v, cu([2, 3]), cu([2, 3]), 3, 3, **kw, return_lse=True, out=out2)
    assert got2 is out2 and lse.shape == (5, HQ)
    torch.testing.assert_close(out2, want, atol=0, rtol=0)


def test_prefill_strided_q_k_v_from_fused_qkv():
    """q, k, v as head views of one fused projection output (only the last dim is contiguous)."""
    gen = torch.Generator().manual_seed(12)
    lens = [5, 3]
    qkv = rand(gen, 8, (HQ + 2 * HKV) * D)
    q = qkv[:, : HQ * D].view(8, HQ, D)
    k = qkv[:, HQ * D : (HQ + HKV) * D].view(8, HKV, D)
    v = qkv[:, (HQ + HKV) * D :].view(8, HKV, D)
    assert not q.is_contiguous() and not k.is_contiguous()
    out = tokenspeed_kernel.mha_prefill(q, k, v, cu(lens), cu(lens), 5, 5, window_left=1)
    positions = [list(range(n)) for n in lens]
    want, _ = oracle(
        q.split(lens), k.split(lens), v.split(lens), positions, causal=True, window_left=1, sinks=None,
        scale=D**-0.5, cap=0.0,
    )  # fmt: skip
    torch.testing.assert_close(out.double(), want, **TOL[torch.float32])


def test_gpt_oss_sliding_window_with_sinks():
    """GPT-OSS sliding layer: sliding_window=128 means keys p-127..p (window_left=127), plus sinks."""
    gen = torch.Generator().manual_seed(5)
    n, hq, hkv, d = 300, 4, 1, 8  # > 256: the reference splits the queries into two chunks
    q = rand(gen, n, hq, d, dtype=torch.bfloat16)
    k = rand(gen, n, hkv, d, dtype=torch.bfloat16)
    v = rand(gen, n, hkv, d, dtype=torch.bfloat16)
    sinks = rand(gen, hq)
    scale = d**-0.5
    out, lse = tokenspeed_kernel.mha_prefill(
        q, k, v, cu([n]), cu([n]), n, n, window_left=127, sinks=sinks, return_lse=True
    )

    # Written from the model description: a softmax over [scores of keys with p - 128 < j <= p, sink].
    qd, kd, vd = q.double(), k.double(), v.double()
    want = torch.zeros(n, hq, d, dtype=torch.float64)
    want_lse = torch.zeros(n, hq, dtype=torch.float64)
    j = torch.arange(n)
    for h in range(hq):
        scores = (qd[:, h] @ kd[:, h // (hq // hkv)].T) * scale  # [n, n]
        p = j.view(n, 1)
        scores = scores.masked_fill(~((p - 128 < j) & (j <= p)), -math.inf)
        logits = torch.cat([scores, sinks[h].double().expand(n, 1)], dim=1)
        probs = torch.softmax(logits, dim=1)[:, :n]
        want_lse[:, h] = torch.logsumexp(logits, dim=1)
        want[:, h] = probs @ vd[:, h // (hq // hkv)]
    torch.testing.assert_close(out.double(), want, **TOL[torch.bfloat16])
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)
    # The window must bite: full attention differs at late positions.
    full = tokenspeed_kernel.mha_prefill(q, k, v, cu([n]), cu([n]), n, n, sinks=sinks)
    assert (full[200:].float() - out[200:].float()).abs().amax() > 0.05


# ---------------------------------------------------------------------------
# Paged extend / decode

CACHE_CASES = [
    (torch.float32, torch.float32),
    (torch.bfloat16, torch.bfloat16),
    (torch.bfloat16, FP8),
    (torch.float16, FP8),
]


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("variant", ["causal", "noncausal", "window3_sinks", "noncausal_window2_cap", "cap_sinks"])
@pytest.mark.parametrize("q_dtype,cache_dtype", CACHE_CASES, ids=["fp32", "bf16", "bf16-fp8kv", "fp16-fp8kv"])
def test_extend_matches_oracle(page_size, variant, q_dtype, cache_dtype):
    gen = torch.Generator().manual_seed(seed_of(page_size, variant, q_dtype, cache_dtype))
    cache_lens = [1, 7, 16, 17, 33]
    q_lens = [1, 3, 16, 1, 5]
    ks = [rand(gen, n, HKV, D) for n in cache_lens]
    vs = [rand(gen, n, HKV, D) for n in cache_lens]
    qs = [rand(gen, n, HQ, D, dtype=q_dtype) for n in q_lens]
    k_cache, v_cache, page_table = paged_cache(ks, vs, page_size, cache_dtype, gen)
    kw = variant_kwargs(variant, gen)
    scale = 0.29
    out, lse = ref.mha_extend_with_kvcache(
        torch.cat(qs), k_cache, v_cache, page_table, torch.tensor(cache_lens, dtype=torch.int32), cu(q_lens),
        max(q_lens), **call_kwargs(kw, scale), return_lse=True, out=None,
    )  # fmt: skip
    positions = [list(range(lc - lq, lc)) for lq, lc in zip(q_lens, cache_lens)]
    # The oracle sees exactly what the cache holds: K/V rounded to the cache dtype.
    ks_c = [k.to(cache_dtype).double() for k in ks]
    vs_c = [v.to(cache_dtype).double() for v in vs]
    want_out, want_lse = oracle(qs, ks_c, vs_c, positions, **oracle_kwargs(kw, scale))
    assert out.dtype == q_dtype
    torch.testing.assert_close(out.double(), want_out, **TOL[q_dtype])
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("variant", ["causal", "window3_sinks", "cap_sinks", "window_longer_than_seq"])
@pytest.mark.parametrize("q_dtype,cache_dtype", CACHE_CASES, ids=["fp32", "bf16", "bf16-fp8kv", "fp16-fp8kv"])
def test_decode_matches_oracle(page_size, variant, q_dtype, cache_dtype):
    gen = torch.Generator().manual_seed(seed_of("decode", page_size, variant, q_dtype, cache_dtype))
    cache_lens = [1, 5, 16, 17, 40]
    ks = [rand(gen, n, HKV, D) for n in cache_lens]
    vs = [rand(gen, n, HKV, D) for n in cache_lens]
    q = rand(gen, len(cache_lens), HQ, D, dtype=q_dtype)
    k_cache, v_cache, page_table = paged_cache(ks, vs, page_size, cache_dtype, gen)
    kw = variant_kwargs(variant, gen)
    call = call_kwargs(kw, 0.31)
    del call["causal"]
    out, lse = ref.mha_decode_with_kvcache(
        q, k_cache, v_cache, page_table, torch.tensor(cache_lens, dtype=torch.int32), **call, return_lse=True, out=None
    )
    ks_c = [k.to(cache_dtype).double() for k in ks]
    vs_c = [v.to(cache_dtype).double() for v in vs]
    want_out, want_lse = oracle(
        [q[b : b + 1] for b in range(len(cache_lens))], ks_c, vs_c, [[n - 1] for n in cache_lens],
        **oracle_kwargs(kw, 0.31),
    )  # fmt: skip
    assert out.shape == (len(cache_lens), HQ, D) and lse.shape == (len(cache_lens), HQ)
    torch.testing.assert_close(out.double(), want_out, **TOL[q_dtype])
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_extend_and_decode_agree_with_dense_prefill(page_size):
    """Same sequences through the paged ops and through dense prefill give the same numbers."""
    gen = torch.Generator().manual_seed(6 + page_size)
    cache_lens, q_lens = [3, 21, 9], [2, 4, 9]
    ks = [rand(gen, n, HKV, D) for n in cache_lens]
    vs = [rand(gen, n, HKV, D) for n in cache_lens]
    qs = [rand(gen, n, HQ, D) for n in q_lens]
    k_cache, v_cache, page_table = paged_cache(ks, vs, page_size, torch.float32, gen)
    lens = torch.tensor(cache_lens, dtype=torch.int32)
    sinks = rand(gen, HQ)
    kw = dict(window_left=4, sinks=sinks, softmax_scale=0.2, logit_cap=3.0, return_lse=True, out=None)
    dense = ref.mha_prefill(
        torch.cat(qs), torch.cat(ks), torch.cat(vs), cu(q_lens), cu(cache_lens), 9, 21, causal=True, **kw
    )
    paged = ref.mha_extend_with_kvcache(
        torch.cat(qs), k_cache, v_cache, page_table, lens, cu(q_lens), 9, causal=True, **kw
    )
    torch.testing.assert_close(paged[0], dense[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(paged[1], dense[1], atol=1e-6, rtol=1e-6)
    last = torch.stack([q[-1] for q in qs])
    decoded = ref.mha_decode_with_kvcache(last, k_cache, v_cache, page_table, lens, **kw)
    ends = cu(q_lens)[1:].long() - 1
    torch.testing.assert_close(decoded[0], dense[0][ends], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(decoded[1], dense[1][ends], atol=1e-6, rtol=1e-6)


def test_decode_out_is_written_and_returned():
    gen = torch.Generator().manual_seed(7)
    ks, vs = [rand(gen, 6, HKV, D)], [rand(gen, 6, HKV, D)]
    k_cache, v_cache, page_table = paged_cache(ks, vs, 4, torch.bfloat16, gen)
    q = rand(gen, 1, HQ, D, dtype=torch.bfloat16)
    lens = torch.tensor([6], dtype=torch.int32)
    kw = dict(window_left=-1, sinks=None, softmax_scale=0.25, logit_cap=0.0, return_lse=False)
    want = ref.mha_decode_with_kvcache(q, k_cache, v_cache, page_table, lens, **kw, out=None)
    out = torch.full_like(q, math.nan)
    assert ref.mha_decode_with_kvcache(q, k_cache, v_cache, page_table, lens, **kw, out=out) is out
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    out = torch.full_like(q, math.nan)
    got = ref.mha_extend_with_kvcache(q, k_cache, v_cache, page_table, lens, cu([1]), 1, causal=True, **kw, out=out)
    assert got is out
    torch.testing.assert_close(out, want, atol=0, rtol=0)


# ---------------------------------------------------------------------------
# kvcache_store


@pytest.mark.parametrize("src_dtype,cache_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, FP8)])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_kvcache_store_matches_loop(src_dtype, cache_dtype, slot_dtype):
    gen = torch.Generator().manual_seed(8)
    num_pages, page_size, t = 5, 4, 9
    k_cache = rand(gen, num_pages, page_size, HKV, D).to(cache_dtype)
    v_cache = rand(gen, num_pages, page_size, HKV, D).to(cache_dtype)
    k, v = rand(gen, t, HKV, D, dtype=src_dtype), rand(gen, t, HKV, D, dtype=src_dtype)
    slots = torch.randperm(num_pages * page_size, generator=gen)[:t]
    slots[[0, 4, 8]] = -1  # padding, including the first token
    slots = slots.to(slot_dtype)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            want_k[s // page_size, s % page_size] = k[i].to(cache_dtype)
            want_v[s // page_size, s % page_size] = v[i].to(cache_dtype)
    assert ref.kvcache_store(k, v, k_cache, v_cache, slots) is None
    assert torch.equal(k_cache.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(v_cache.view(torch.uint8), want_v.view(torch.uint8))


def test_kvcache_store_all_padding_changes_nothing():
    gen = torch.Generator().manual_seed(9)
    k_cache, v_cache = rand(gen, 3, 2, HKV, D), rand(gen, 3, 2, HKV, D)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    k, v = rand(gen, 4, HKV, D), rand(gen, 4, HKV, D)
    tokenspeed_kernel.kvcache_store(k, v, k_cache, v_cache, torch.full((4,), -1, dtype=torch.int64))
    assert torch.equal(k_cache, before_k) and torch.equal(v_cache, before_v)


def test_store_then_decode_round_trip():
    """Write a sequence token by token (with padding rows) via the public op, then decode."""
    gen = torch.Generator().manual_seed(10)
    page_size, n = 4, 11
    k, v, q = rand(gen, n, HKV, D), rand(gen, n, HKV, D), rand(gen, 1, HQ, D)
    k_cache = torch.full((6, page_size, HKV, D), math.nan)
    v_cache = torch.full((6, page_size, HKV, D), math.nan)
    page_table = torch.tensor([[4, 1, 5, 0]], dtype=torch.int32)
    pos = torch.arange(n)
    slots = page_table[0, pos // page_size].long() * page_size + pos % page_size
    kp, vp = torch.cat([k, k[:1] * 7]), torch.cat([v, v[:1] * 7])  # one padding row, garbage values
    tokenspeed_kernel.kvcache_store(kp, vp, k_cache, v_cache, torch.cat([slots, torch.tensor([-1])]))
    lens = torch.tensor([n], dtype=torch.int32)
    out = tokenspeed_kernel.mha_decode_with_kvcache(q, k_cache, v_cache, page_table, lens)
    want, _ = oracle([q], [k], [v], [[n - 1]], causal=True, window_left=-1, sinks=None, scale=D**-0.5, cap=0.0)
    torch.testing.assert_close(out.double(), want, **TOL[torch.float32])


# ---------------------------------------------------------------------------
# Public API path


def _selected(op, signature, traits):
    cands = tokenspeed_kernel.explain_selection(op, signature, traits)
    return [c.name for c in cands if c.selected]


def test_public_ops_select_reference_on_cpu_and_match_oracle():
    gen = torch.Generator().manual_seed(11)
    base = dict(head_dim=D, gqa_group=HQ // HKV, window=True, sinks=True, logit_cap=False, return_lse=True)
    assert _selected("mha_prefill", ("fp32", "fp32"), {**base, "causal": True}) == ["reference.mha_prefill"]
    assert _selected("mha_extend_with_kvcache", ("bf16", "fp8_e4m3"), {**base, "causal": True, "page_size": 4}) == [
        "reference.mha_extend_with_kvcache"
    ]
    assert _selected("mha_decode_with_kvcache", ("bf16", "bf16"), {**base, "page_size": 16}) == [
        "reference.mha_decode_with_kvcache"
    ]

    lens = [4, 1, 6]
    q, k, v = rand(gen, 11, HQ, D), rand(gen, 11, HKV, D), rand(gen, 11, HKV, D)
    sinks = rand(gen, HQ)
    out, lse = tokenspeed_kernel.mha_prefill(
        q, k, v, cu(lens), cu(lens), 6, 6, window_left=2, sinks=sinks, return_lse=True
    )
    qs, ks, vs = q.split(lens), k.split(lens), v.split(lens)
    positions = [list(range(n)) for n in lens]
    want_out, want_lse = oracle(qs, ks, vs, positions, causal=True, window_left=2, sinks=sinks, scale=D**-0.5, cap=0.0)
    torch.testing.assert_close(out.double(), want_out, **TOL[torch.float32])
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-4, rtol=1e-5)

    k_cache, v_cache, page_table = paged_cache(list(ks), list(vs), 4, FP8, gen)
    qb = q.to(torch.bfloat16)
    lens_t = torch.tensor(lens, dtype=torch.int32)
    got = tokenspeed_kernel.mha_extend_with_kvcache(
        qb, k_cache, v_cache, page_table, lens_t, cu(lens), 6, window_left=2, sinks=sinks
    )
    ks8 = [x.to(FP8).double() for x in ks]
    vs8 = [x.to(FP8).double() for x in vs]
    want8, _ = oracle(
        qb.split(lens), ks8, vs8, positions, causal=True, window_left=2, sinks=sinks, scale=D**-0.5, cap=0.0
    )
    torch.testing.assert_close(got.double(), want8, **TOL[torch.bfloat16])
    ends = cu(lens)[1:].long() - 1
    dec = tokenspeed_kernel.mha_decode_with_kvcache(
        qb[ends], k_cache, v_cache, page_table, lens_t, window_left=2, sinks=sinks
    )
    torch.testing.assert_close(dec.double(), want8[ends], **TOL[torch.bfloat16])


def _prefill_inputs(hq=HQ, hkv=HKV, dtype=torch.float32, k_dtype=None):
    q = torch.zeros(5, hq, D, dtype=dtype)
    k = torch.zeros(5, hkv, D, dtype=k_dtype or dtype)
    return q, k, k.clone(), cu([2, 3]), cu([2, 3]), 3, 3


def _paged_inputs(batch_rows=2):
    q = torch.zeros(2, HQ, D)
    k_cache = torch.zeros(4, 4, HKV, D)
    page_table = torch.zeros(batch_rows, 2, dtype=torch.int32)
    return q, k_cache, k_cache.clone(), page_table, torch.tensor([3, 5], dtype=torch.int32)


def test_public_validation_errors_name_the_argument():
    with pytest.raises(TypeError, match=r"^k: expected dtype"):
        tokenspeed_kernel.mha_prefill(*_prefill_inputs(k_dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"^q: expected dtype"):
        tokenspeed_kernel.mha_prefill(*_prefill_inputs(dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^k: 3 KV heads must divide the 8 query heads"):
        tokenspeed_kernel.mha_prefill(*_prefill_inputs(hkv=3))
    q, k, v, cq, ck, mq, mk = _prefill_inputs()
    with pytest.raises(TypeError, match=r"^cu_seqlens_q: expected dtype"):
        tokenspeed_kernel.mha_prefill(q, k, v, cq.long(), ck, mq, mk)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: expected batch 2"):
        tokenspeed_kernel.mha_prefill(q, k, v, cq, cu([5]), mq, mk)
    with pytest.raises(TypeError, match=r"^sinks: expected dtype"):
        tokenspeed_kernel.mha_prefill(q, k, v, cq, ck, mq, mk, sinks=torch.zeros(HQ, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"^window_left"):
        tokenspeed_kernel.mha_prefill(q, k, v, cq, ck, mq, mk, window_left=-2)
    with pytest.raises(TypeError, match=r"^out: expected dtype"):
        tokenspeed_kernel.mha_prefill(q, k, v, cq, ck, mq, mk, out=torch.zeros(5, HQ, D, dtype=torch.float16))

    q, kc, vc, pt, lens = _paged_inputs(batch_rows=3)
    with pytest.raises(ValueError, match=r"^page_table: expected 2 rows"):
        tokenspeed_kernel.mha_decode_with_kvcache(q, kc, vc, pt, lens)
    with pytest.raises(ValueError, match=r"^page_table: expected 2 rows"):
        tokenspeed_kernel.mha_extend_with_kvcache(q, kc, vc, pt, lens, cu([1, 1]), 1)
    q, kc, vc, pt, lens = _paged_inputs()
    with pytest.raises(TypeError, match=r"^v_cache: expected dtype"):
        tokenspeed_kernel.mha_decode_with_kvcache(q, kc, vc.to(torch.bfloat16), pt, lens)
    with pytest.raises(ValueError, match=r"^k_cache: 3 KV heads must divide"):
        kc3 = torch.zeros(4, 4, 3, D)
        tokenspeed_kernel.mha_decode_with_kvcache(q, kc3, kc3.clone(), pt, lens)
    with pytest.raises(TypeError, match=r"^slot_mapping: expected dtype"):
        tokenspeed_kernel.kvcache_store(
            torch.zeros(2, HKV, D), torch.zeros(2, HKV, D), kc, vc, torch.zeros(2, dtype=torch.float32)
        )


# ---------------------------------------------------------------------------
# Checks that read values: always on host tensors, under TOKENSPEED_KERNEL_DEBUG=1 on device tensors


def _bad_value_calls():
    """(label, call, exception, message start): every call is wrong in one value only."""
    q, k, v, cq, ck, mq, mk = _prefill_inputs()  # 5 tokens as sequences of 2 and 3
    P = tokenspeed_kernel.mha_prefill
    E = tokenspeed_kernel.mha_extend_with_kvcache
    Dc = tokenspeed_kernel.mha_decode_with_kvcache
    S = tokenspeed_kernel.kvcache_store
    qd, kc, vc, pt, lens = _paged_inputs()  # 4 pages of 4; page_table 2 columns: 8 tokens per sequence
    qe = torch.zeros(5, HQ, D)
    ce = cu([2, 3])
    kv = torch.zeros(3, HKV, D)
    i32 = lambda *x: torch.tensor(x, dtype=torch.int32)
    return [
        ("cu_seqlens past the tokens", lambda: P(q, k, v, cu([2, 5]), ck, 5, 3), ValueError,
         r"cu_seqlens_q: the last entry \(7\) must equal the 5 packed tokens of q"),
        ("cu_seqlens short of the tokens", lambda: P(q, k, v, cq, cu([2, 2]), mq, mk), ValueError,
         r"cu_seqlens_k: the last entry \(4\) must equal the 5 packed tokens of k"),
        ("cu_seqlens decreasing", lambda: P(q, k, v, i32(0, 4, 2, 5), i32(0, 4, 2, 5), 4, 4), ValueError,
         r"cu_seqlens_q: must start at 0 and be non-decreasing, got \[0, 4, 2, 5\]"),
        ("cu_seqlens not from 0", lambda: P(q, k, v, i32(1, 3, 5), ck, mq, mk), ValueError,
         r"cu_seqlens_q: must start at 0"),
        ("max_seqlen_q too small", lambda: P(q, k, v, cq, ck, 2, mk), ValueError,
         r"max_seqlen_q: expected at least the longest sequence of cu_seqlens_q \(3 tokens\), got 2"),
        ("max_seqlen_k too small", lambda: P(q, k, v, cq, ck, mq, 1), ValueError, r"max_seqlen_k: .*got 1"),
        ("extend cu_seqlens past q", lambda: E(qe, kc, vc, pt, lens, cu([2, 4]), 4), ValueError,
         r"cu_seqlens_q: the last entry \(6\) must equal the 5 packed tokens of q"),
        ("extend max_seqlen_q too small", lambda: E(qe, kc, vc, pt, lens, ce, 2), ValueError, r"max_seqlen_q: "),
        ("extend cache shorter than its queries", lambda: E(qe, kc, vc, pt, i32(3, 2), ce, 3), ValueError,
         r"cache_seqlens: sequence 1 holds 2 tokens, fewer than its 3 queries"),
        ("extend cache past the page table", lambda: E(qe, kc, vc, pt, i32(3, 9), ce, 3), ValueError,
         r"cache_seqlens: sequence 1 holds 9 tokens, past the 8 slots"),
        ("decode cache_seqlens 0", lambda: Dc(qd, kc, vc, pt, i32(0, 5)), ValueError,
         r"cache_seqlens: expected >= 1 per sequence .* got 0 for sequence 0"),
        ("decode cache_seqlens negative", lambda: Dc(qd, kc, vc, pt, i32(3, -1)), ValueError,
         r"cache_seqlens: expected >= 1"),
        ("decode cache past the page table", lambda: Dc(qd, kc, vc, pt, i32(3, 9)), ValueError,
         r"cache_seqlens: sequence 1 holds 9 tokens, past the 8 slots its page_table row can address"),
        ("page id past the cache", lambda: Dc(qd, kc, vc, i32(0, 1, 2, 4).view(2, 2), i32(3, 5)), ValueError,
         r"page_table: row 1 column 1 names page 4, outside the cache's \[0, 4\) pages"),
        ("negative page id", lambda: Dc(qd, kc, vc, i32(-1, 0, 2, 3).view(2, 2), i32(3, 5)), ValueError,
         r"page_table: row 0 column 0 names page -1"),
        ("slot past the cache", lambda: S(kv, kv, kc, vc, i32(0, 16, -1)), ValueError,
         r"slot_mapping: slot 16 is past the cache's 16 slots"),
    ]  # fmt: skip


BAD_VALUES = _bad_value_calls()


@pytest.mark.parametrize("label", [c[0] for c in BAD_VALUES])
def test_host_index_tensors_are_checked_without_debug_mode(label, monkeypatch):
    """Reading a CPU tensor costs no device sync: these checks always run for host tensors."""
    monkeypatch.delenv("TOKENSPEED_KERNEL_DEBUG", raising=False)
    tokenspeed_kernel.reload_settings()
    _, call, exc, message = next(c for c in BAD_VALUES if c[0] == label)
    with pytest.raises(exc, match="^" + message):
        call()


def test_unused_page_table_entries_and_padding_slots_are_not_checked():
    """Only the pages a sequence uses must be valid; negative slots are padding."""
    qd, kc, vc, _, _ = _paged_inputs()
    pt = torch.tensor([[1, 99], [2, -7]], dtype=torch.int32)  # column 1 unused: 3 and 4 tokens fit one page
    lens = torch.tensor([3, 4], dtype=torch.int32)
    out = tokenspeed_kernel.mha_decode_with_kvcache(qd, kc, vc, pt, lens)
    assert out.shape == qd.shape
    kv = torch.ones(3, HKV, D)
    kc0 = torch.zeros_like(kc)
    tokenspeed_kernel.kvcache_store(kv, kv, kc0, kc0.clone(), torch.tensor([5, -1, -2], dtype=torch.int32))
    assert kc0[1, 1].eq(1).all() and kc0.sum() == HKV * D  # slot 5 only


@pytest.mark.parametrize(
    "kwargs,exc,message",
    [
        ({"window_left": True}, TypeError, r"window_left: expected -1 \(full attention\) or an int >= 0, got True"),
        ({"window_left": 2.0}, TypeError, r"window_left: expected .* got 2.0 \(float\)"),
        ({"window_left": -2}, ValueError, r"window_left: expected .* got -2"),
        ({"softmax_scale": math.nan}, ValueError, r"softmax_scale: expected a finite float > 0 or None, got nan"),
        ({"softmax_scale": math.inf}, ValueError, r"softmax_scale: expected a finite float > 0 or None, got inf"),
        ({"softmax_scale": 0.0}, ValueError, r"softmax_scale: .* got 0.0"),
        ({"softmax_scale": "0.1"}, TypeError, r"softmax_scale: .* got '0.1' \(str\)"),
        ({"logit_cap": math.inf}, ValueError, r"logit_cap: expected a finite float >= 0 \(0 = off\), got inf"),
        ({"logit_cap": math.nan}, ValueError, r"logit_cap: .* got nan"),
        ({"logit_cap": True}, TypeError, r"logit_cap: .* got True \(bool\)"),
        ({"solution": 123}, TypeError, r"solution: expected a kernel or solution name, or a non-empty list"),
        ({"override": ["triton", 7]}, TypeError, r"override: expected a kernel or solution name"),
    ],
)
def test_scalar_arguments_are_checked(kwargs, exc, message):
    """Before: window_left=True raised an internal RuntimeError, nan/inf scales returned NaN, solution=123
    raised "'int' object is not iterable"."""
    q, k, v, cq, ck, mq, mk = _prefill_inputs()
    with pytest.raises(exc, match="^" + message):
        tokenspeed_kernel.mha_prefill(q, k, v, cq, ck, mq, mk, **kwargs)


def test_max_seqlen_must_be_a_host_int():
    q, k, v, cq, ck, mq, mk = _prefill_inputs()
    with pytest.raises(TypeError, match=r"^max_seqlen_q: expected a host int >= 0 .* got True \(bool\)"):
        tokenspeed_kernel.mha_prefill(q, k, v, cq, ck, True, mk)
    with pytest.raises(TypeError, match=r"^max_seqlen_k: .*\(Tensor\)"):
        tokenspeed_kernel.mha_prefill(q, k, v, cq, ck, mq, torch.tensor(3))


def test_values_of_fake_and_meta_tensors_are_never_read():
    """Under torch.compile the arguments are FakeTensors (a subclass): no value check, no error."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v, _, _, mq, mk = _prefill_inputs()
    wrong = cu([2, 9])  # on the host this fails: last entry 11 != 5 tokens
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fq, fk, fv, bad = (mode.from_tensor(t) for t in (q, k, v, wrong))
        sig, _, sizes = tokenspeed_kernel.mha_prefill.call_key(fq, fk, fv, bad, bad, mq, mk)
    assert sig == ("fp32", "fp32") and sizes == {"tokens": 5}
    with pytest.raises(ValueError, match="^cu_seqlens_q: the last entry"):
        tokenspeed_kernel.mha_prefill.call_key(q, k, v, wrong, wrong, mq, mk)
    meta = wrong.to("meta")
    sig, _, _ = tokenspeed_kernel.mha_prefill.call_key(q.to("meta"), k.to("meta"), v.to("meta"), meta, meta, mq, mk)
    assert sig == ("fp32", "fp32")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_index_tensors_are_checked_in_debug_mode_only(monkeypatch):
    """A device tensor's values cost a sync: checked only under TOKENSPEED_KERNEL_DEBUG=1."""
    q, k, v, _, ck, _, mk = (t.cuda() if isinstance(t, torch.Tensor) else t for t in _prefill_inputs())
    bad = cu([2, 5]).cuda()  # last entry 7 != 5 tokens
    call = lambda: tokenspeed_kernel.mha_prefill.call_key(q, k, v, bad, ck, 5, mk)
    monkeypatch.delenv("TOKENSPEED_KERNEL_DEBUG", raising=False)
    tokenspeed_kernel.reload_settings()
    call()  # not read: no error, no sync
    monkeypatch.setenv("TOKENSPEED_KERNEL_DEBUG", "1")
    tokenspeed_kernel.reload_settings()
    try:
        with pytest.raises(ValueError, match=r"^cu_seqlens_q: the last entry \(7\) must equal the 5 packed tokens"):
            call()
        qd, kc, vc, pt, _ = (t.cuda() for t in _paged_inputs())
        with pytest.raises(ValueError, match=r"^cache_seqlens: expected >= 1"):
            tokenspeed_kernel.mha_decode_with_kvcache.call_key(qd, kc, vc, pt, torch.tensor([0, 3]).int().cuda())
    finally:
        monkeypatch.delenv("TOKENSPEED_KERNEL_DEBUG")
        tokenspeed_kernel.reload_settings()

"""Triton attention kernels against the PyTorch reference.

On CPU the kernels run under ``TRITON_INTERPRET=1`` (conftest) on tiny shapes whose
interpreter tiles (``configs.*["interpret"]``: 32-row tiles, 16-key steps) still
cross block, page, window and causal boundaries. Tests marked ``gpu`` run GPT-OSS
shapes on a CUDA/ROCm device.

Tolerances: fp32 inputs are compared tightly (a wrong mask moves outputs by ~1e-1).
bf16/fp16 outputs are compared at a few output ulps: besides rounding the output,
the kernel rounds the softmax probabilities to the K/V dtype before the second
product (as FlashAttention does), and Triton's interpreter rounds fp32 -> bf16 by
truncation. The LSE is fp32 in every case and compared tightly.
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

import tokenspeed_kernel
from tokenspeed_kernel.reference import attention as ref
from tokenspeed_kernel_triton import rope
from tokenspeed_kernel_triton.attention import decode, extend, prefill, store

_TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
_LSE_TOL = 1e-4


def _assert_close(out: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(out.float(), expected.float(), atol=_TOL[dtype], rtol=_TOL[dtype])


def _assert_lse(lse: torch.Tensor, expected: torch.Tensor) -> None:
    assert lse.dtype == torch.float32
    # -inf (a query that sees nothing and has no sink) must match exactly.
    assert torch.equal(torch.isneginf(lse), torch.isneginf(expected))
    finite = torch.isfinite(expected)
    torch.testing.assert_close(lse[finite], expected[finite], atol=_LSE_TOL, rtol=_LSE_TOL)


def _cu(lengths: list[int], device: str) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)


def _paged_cache(
    lengths: list[int], page_size: int, hkv: int, head_dim: int, dtype: torch.dtype, device: str, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random caches whose pages are shuffled across sequences; the page table has one
    spare column, and the last page of a sequence is only partly filled unless the length
    divides the page size."""
    max_pages = max(-(-n // page_size) for n in lengths) + 1
    num_pages = len(lengths) * max_pages + 2
    shape = (num_pages, page_size, hkv, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    v_cache = torch.randn(shape, generator=gen).to(device=device, dtype=dtype)
    perm = torch.randperm(num_pages, generator=gen)[: len(lengths) * max_pages]
    page_table = perm.view(len(lengths), max_pages).to(device=device, dtype=torch.int32).contiguous()
    return k_cache, v_cache, page_table


def _args(**kw) -> dict:
    base = {"causal": True, "window_left": -1, "sinks": None, "logit_cap": 0.0, "return_lse": True, "out": None}
    return {**base, **kw}


# --------------------------------------------------------------------------- prefill

PREFILL_CASES = {
    # GPT-OSS-like: 8 query heads per KV head, head_dim 64, window + sinks, a length-1 sequence.
    "gptoss_window_sinks_bf16": dict(
        q_lens=[1, 19, 40], k_lens=[1, 19, 40], hq=8, hkv=1, d=64, dtype=torch.bfloat16, window_left=6, sinks=True
    ),
    # Fewer queries than keys (bottom-right alignment), soft-capped scores, GQA 2:1.
    "bottom_right_logit_cap_fp32": dict(
        q_lens=[5, 17, 1], k_lens=[12, 31, 30], hq=4, hkv=2, d=32, dtype=torch.float32, logit_cap=5.0
    ),
    # Non-causal with a window (left bound only), fp16.
    "noncausal_window_fp16": dict(
        q_lens=[20, 3], k_lens=[20, 35], hq=2, hkv=2, d=16, dtype=torch.float16, causal=False, window_left=3
    ),
    # More queries than keys: the first rows see no key (zeros, lse -inf) unless a sink exists.
    "empty_rows_fp32": dict(q_lens=[6, 3], k_lens=[4, 0], hq=2, hkv=1, d=16, dtype=torch.float32),
    "empty_rows_sinks_fp32": dict(q_lens=[6, 3], k_lens=[4, 0], hq=2, hkv=1, d=16, dtype=torch.float32, sinks=True),
    # Window longer than every sequence: same as full causal attention.
    "window_longer_than_seq_fp32": dict(
        q_lens=[33, 2], k_lens=[33, 2], hq=8, hkv=1, d=64, dtype=torch.float32, window_left=100, sinks=True
    ),
    # head_dim 128.
    "head_dim_128_fp32": dict(q_lens=[18], k_lens=[18], hq=2, hkv=1, d=128, dtype=torch.float32),
    # A group larger than a tile's 32 interpreter rows: split over two programs, the second
    # half-filled (non-power-of-two group).
    "group_48_fp32": dict(q_lens=[3], k_lens=[5], hq=48, hkv=1, d=16, dtype=torch.float32, sinks=True),
}


@pytest.mark.parametrize("case", sorted(PREFILL_CASES))
def test_prefill_matches_reference(case: str, device: str) -> None:
    c = dict(PREFILL_CASES[case])
    gen = torch.Generator().manual_seed(zlib.crc32(case.encode()))
    q_lens, k_lens, hq, hkv, d, dtype = (c.pop(n) for n in ("q_lens", "k_lens", "hq", "hkv", "d", "dtype"))
    sinks = torch.randn(hq, generator=gen).to(device) if c.pop("sinks", False) else None
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(device=device, dtype=dtype)
    k = torch.randn(sum(k_lens), hkv, d, generator=gen).to(device=device, dtype=dtype)
    v = torch.randn(sum(k_lens), hkv, d, generator=gen).to(device=device, dtype=dtype)
    cu_q, cu_k = _cu(q_lens, device), _cu(k_lens, device)
    kw = _args(sinks=sinks, softmax_scale=d**-0.5, **c)
    out, lse = prefill.mha_prefill(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), **kw)
    exp_out, exp_lse = ref.mha_prefill(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), **kw)
    _assert_close(out, exp_out, dtype)
    _assert_lse(lse, exp_lse)
    if case.startswith("empty_rows") and sinks is None:
        assert torch.equal(out[:2], torch.zeros_like(out[:2]))  # rows 0, 1 of sequence 0 see no key


def test_prefill_window_skips_blocks_outside(device: str) -> None:
    """Keys no query can see are never loaded: NaN there must not reach the output."""
    gen = torch.Generator().manual_seed(1)
    hq, hkv, d, lk, lq, window = 8, 1, 64, 70, 5, 9
    q = torch.randn(lq, hq, d, generator=gen).to(device=device, dtype=torch.bfloat16)
    k = torch.randn(lk, hkv, d, generator=gen).to(device=device, dtype=torch.bfloat16)
    v = torch.randn(lk, hkv, d, generator=gen).to(device=device, dtype=torch.bfloat16)
    first_visible = lk - lq - window  # the earliest query (position lk - lq) sees keys from here on
    k[:first_visible] = float("nan")
    v[:first_visible] = float("nan")
    cu_q, cu_k = _cu([lq], device), _cu([lk], device)
    kw = _args(window_left=window, sinks=torch.randn(hq, generator=gen).to(device), softmax_scale=d**-0.5)
    out, lse = prefill.mha_prefill(q, k, v, cu_q, cu_k, lq, lk, **kw)
    exp_out, exp_lse = ref.mha_prefill(q, k, v, cu_q, cu_k, lq, lk, **kw)
    _assert_close(out, exp_out, torch.bfloat16)
    _assert_lse(lse, exp_lse)


def test_prefill_writes_into_out_and_skips_lse(device: str) -> None:
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(9, 4, 16, generator=gen).to(device)
    k = torch.randn(9, 2, 16, generator=gen).to(device)
    v = torch.randn(9, 2, 16, generator=gen).to(device)
    cu = _cu([9], device)
    # A strided out (a view into a wider buffer) must be honoured.
    buf = torch.full((9, 4, 32), 7.0, device=device)
    out = buf[:, :, :16]
    got = prefill.mha_prefill(q, k, v, cu, cu, 9, 9, softmax_scale=0.3, out=out)
    assert got.data_ptr() == out.data_ptr()
    expected = ref.mha_prefill(q, k, v, cu, cu, 9, 9, **_args(softmax_scale=0.3, return_lse=False))
    _assert_close(out, expected, torch.float32)
    assert torch.equal(buf[:, :, 16:], torch.full_like(buf[:, :, 16:], 7.0))


# --------------------------------------------------------------------------- extend

EXTEND_CASES = {
    # Page 16, GPT-OSS group, sequences crossing pages with a partly filled last page, one
    # sequence whose queries are its whole cache, window + sinks.
    "page16_gptoss_bf16": dict(
        cache_lens=[37, 5, 16], q_lens=[3, 5, 1], page=16, hq=8, hkv=1, d=64, dtype=torch.bfloat16,
        window_left=19, sinks=True,
    ),
    # Page 1 (every key its own page), GQA 2:1, logit cap.
    "page1_fp32": dict(
        cache_lens=[9, 20], q_lens=[9, 2], page=1, hq=4, hkv=2, d=32, dtype=torch.float32, logit_cap=8.0
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(EXTEND_CASES))
def test_extend_matches_reference(case: str, device: str) -> None:
    c = dict(EXTEND_CASES[case])
    gen = torch.Generator().manual_seed(zlib.crc32(case.encode()))
    cache_lens, q_lens, page, hq, hkv, d, dtype = (
        c.pop(n) for n in ("cache_lens", "q_lens", "page", "hq", "hkv", "d", "dtype")
    )
    sinks = torch.randn(hq, generator=gen).to(device) if c.pop("sinks", False) else None
    k_cache, v_cache, page_table = _paged_cache(cache_lens, page, hkv, d, dtype, device, gen)
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(device=device, dtype=dtype)
    seqlens = torch.tensor(cache_lens, dtype=torch.int32, device=device)
    cu_q = _cu(q_lens, device)
    kw = _args(sinks=sinks, softmax_scale=d**-0.5, **c)
    args = (q, k_cache, v_cache, page_table, seqlens, cu_q, max(q_lens))
    out, lse = extend.mha_extend_with_kvcache(*args, **kw)
    exp_out, exp_lse = ref.mha_extend_with_kvcache(*args, **kw)
    _assert_close(out, exp_out, dtype)
    _assert_lse(lse, exp_lse)


def test_extend_equals_prefill_on_the_same_keys(device: str) -> None:
    """Two formulations of one computation: paged extend vs contiguous prefill (fp32)."""
    gen = torch.Generator().manual_seed(3)
    cache_lens, q_lens, page, hq, hkv, d = [21, 34], [4, 34], 8, 4, 1, 16
    k_cache, v_cache, page_table = _paged_cache(cache_lens, page, hkv, d, torch.float32, device, gen)
    pos = [torch.arange(n, device=device) for n in cache_lens]
    gather = [(page_table[b, p // page].long(), p % page) for b, p in enumerate(pos)]
    k = torch.cat([k_cache[pg, row] for pg, row in gather])
    v = torch.cat([v_cache[pg, row] for pg, row in gather])
    q = torch.randn(sum(q_lens), hq, d, generator=gen).to(device)
    kw = _args(window_left=6, softmax_scale=0.25)
    seqlens = torch.tensor(cache_lens, dtype=torch.int32, device=device)
    out_e, lse_e = extend.mha_extend_with_kvcache(
        q, k_cache, v_cache, page_table, seqlens, _cu(q_lens, device), 34, **kw
    )
    out_p, lse_p = prefill.mha_prefill(q, k, v, _cu(q_lens, device), _cu(cache_lens, device), 34, 34, **kw)
    torch.testing.assert_close(out_e, out_p, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse_e, lse_p, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- decode

DECODE_CASES = {
    # Page 16, GPT-OSS group, lengths 1 / page-crossing / exact page multiple, window + sinks.
    "page16_gptoss_bf16": dict(
        lens=[37, 1, 16, 50], page=16, hq=8, hkv=1, d=64, dtype=torch.bfloat16, window_left=20, sinks=True
    ),
    # Page 1, GQA 2:1, logit cap, full attention.
    "page1_fp32": dict(lens=[9, 33], page=1, hq=4, hkv=2, d=32, dtype=torch.float32, logit_cap=6.0),
    # A large page (64) holding whole sequences, window longer than the sequence.
    "page64_fp16": dict(lens=[40, 3], page=64, hq=2, hkv=1, d=16, dtype=torch.float16, window_left=500, sinks=True),
}


@pytest.mark.parametrize("num_splits", [None, 1, 3])
@pytest.mark.parametrize("case", sorted(DECODE_CASES))
def test_decode_matches_reference(case: str, num_splits: int | None, device: str) -> None:
    c = dict(DECODE_CASES[case])
    if num_splits == 3 and case == "page64_fp16":
        pytest.skip("covered by the other cases; keeps the interpreter run short")
    gen = torch.Generator().manual_seed(zlib.crc32(case.encode()))
    lens, page, hq, hkv, d, dtype = (c.pop(n) for n in ("lens", "page", "hq", "hkv", "d", "dtype"))
    sinks = torch.randn(hq, generator=gen).to(device) if c.pop("sinks", False) else None
    k_cache, v_cache, page_table = _paged_cache(lens, page, hkv, d, dtype, device, gen)
    q = torch.randn(len(lens), hq, d, generator=gen).to(device=device, dtype=dtype)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    kw = _args(sinks=sinks, softmax_scale=d**-0.5, **c)
    del kw["causal"]
    args = (q, k_cache, v_cache, page_table, seqlens)
    out, lse = decode.mha_decode_with_kvcache(*args, **kw, num_splits=num_splits)
    exp_out, exp_lse = ref.mha_decode_with_kvcache(*args, **kw)
    _assert_close(out, exp_out, dtype)
    _assert_lse(lse, exp_lse)


def test_decode_counters_are_left_zero_and_shared_by_calls_of_one_stream(device: str, monkeypatch) -> None:
    """The last split of each (sequence, head program) zeroes its counter: calls of one stream share the counters
    (on CPU the held buffer is forced here; a GPU holds one per stream anyway), and each call merges correctly
    whatever split count the one before used."""
    from tokenspeed_kernel import launch

    if device == "cpu":
        monkeypatch.setattr(launch, "_BUFFERS", {})
        monkeypatch.setattr(launch, "_current_stream", lambda dev: 1)
        monkeypatch.setattr(launch, "_capturing", lambda: False)
    c = dict(DECODE_CASES["page16_gptoss_bf16"])
    gen = torch.Generator().manual_seed(5)
    lens, page, hq, hkv, d, dtype = (c.pop(n) for n in ("lens", "page", "hq", "hkv", "d", "dtype"))
    sinks = torch.randn(hq, generator=gen).to(device) if c.pop("sinks", False) else None
    k_cache, v_cache, page_table = _paged_cache(lens, page, hkv, d, dtype, device, gen)
    q = torch.randn(len(lens), hq, d, generator=gen).to(device=device, dtype=dtype)
    args = (q, k_cache, v_cache, page_table, torch.tensor(lens, dtype=torch.int32, device=device))
    kw = _args(sinks=sinks, softmax_scale=d**-0.5, **c)
    del kw["causal"]
    exp_out, exp_lse = ref.mha_decode_with_kvcache(*args, **kw)
    for splits in (3, 2, 3):
        out, lse = decode.mha_decode_with_kvcache(*args, **kw, num_splits=splits)
        _assert_close(out, exp_out, dtype)
        _assert_lse(lse, exp_lse)
    held = [t for (_, kind), t in launch._BUFFERS.items() if kind == "counters" and t.device == q.device]
    assert held and all(int(t.abs().max()) == 0 for t in held)


def test_decode_window_skips_pages_outside(device: str) -> None:
    """Pages wholly before the window are never read, nor their page-table entries used:
    they point at a NaN page here, and keys before the window inside a page are NaN too."""
    gen = torch.Generator().manual_seed(4)
    lens, page, hq, hkv, d, window = [45, 30], 4, 8, 1, 64, 10
    k_cache, v_cache, page_table = _paged_cache(lens, page, hkv, d, torch.bfloat16, device, gen)
    poison = sorted(set(range(k_cache.shape[0])) - set(page_table.flatten().tolist()))[0]  # a page nobody uses
    k_cache[poison] = float("nan")
    v_cache[poison] = float("nan")
    for b, n in enumerate(lens):
        first = n - 1 - window
        page_table[b, : first // page] = poison
        p0, r0 = int(page_table[b, first // page]), first % page
        k_cache[p0, :r0] = float("nan")
        v_cache[p0, :r0] = float("nan")
    q = torch.randn(len(lens), hq, d, generator=gen).to(device=device, dtype=torch.bfloat16)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    kw = _args(window_left=window, sinks=torch.randn(hq, generator=gen).to(device), softmax_scale=d**-0.5)
    del kw["causal"]
    args = (q, k_cache, v_cache, page_table, seqlens)
    out, lse = decode.mha_decode_with_kvcache(*args, **kw, num_splits=2)
    # The reference gathers whole pages, so it gets a clean copy of the visible keys.
    clean_k, clean_v = k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0)
    exp_out, exp_lse = ref.mha_decode_with_kvcache(q, clean_k, clean_v, page_table, seqlens, **kw)
    _assert_close(out, exp_out, torch.bfloat16)
    _assert_lse(lse, exp_lse)


def test_decode_num_splits_depends_on_shapes_only() -> None:
    cfg = {"ctas_per_sm": 4, "min_tokens_per_split": 256, "max_splits": 64, "num_sms": 132}
    cpu = torch.device("cpu")
    # batch x KV-head programs against 4 x 132 wanted programs, bounded by the context.
    assert decode.choose_num_splits(1, 8, 8192, cpu, cfg) == 32  # 66 wanted, 8192 / 256 = 32
    assert decode.choose_num_splits(32, 8, 4096, cpu, cfg) == 3
    assert decode.choose_num_splits(64, 8, 8192, cpu, cfg) == 2
    assert decode.choose_num_splits(256, 8, 2048, cpu, cfg) == 1
    assert decode.choose_num_splits(1, 8, 128, cpu, cfg) == 1  # a window of 128 keys


def test_decode_with_a_plan(device: str) -> None:
    """A plan sizes the split grid by the longest sequence (not the page table's 64 pages): the same bits as
    the call without a plan at that split count, and the reference's values. The plan keeps no partials."""
    gen = torch.Generator().manual_seed(11)
    lens, page, hq, hkv, d = [37, 9], 4, 8, 1, 16
    k_cache, v_cache, _ = _paged_cache([256, 256], page, hkv, d, torch.float32, device, gen)
    page_table = torch.randperm(k_cache.shape[0], generator=gen)[:128].view(2, 64).to(device, torch.int32)
    q = torch.randn(len(lens), hq, d, generator=gen).to(device)
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    kw = _args(sinks=torch.randn(hq, generator=gen).to(device), softmax_scale=d**-0.5)
    del kw["causal"]
    cfg = {
        **decode.decode_config(q.device, d),
        "num_sms": 132,
        "ctas_per_sm": 4,
        "min_tokens_per_split": 16,
        "max_splits": 64,
    }
    plan = tokenspeed_kernel.mha_plan(cache_seqlens=lens)
    args = (q, k_cache, v_cache, page_table, seqlens)
    # Without the plan the split count follows the 256-slot capacity, with it the longest sequence (37 -> 64).
    assert decode._decode_plan(q, k_cache, page_table, -1, None, None, 0.0, True, cfg, None)[0][2] == 16
    assert decode._decode_plan(q, k_cache, page_table, -1, None, None, 0.0, True, cfg, None, 64)[0][2] == 4
    decode._PLANS.clear()
    # (this config's split rules on every device: a GPU's own would not split sequences this short)
    out, lse = decode.mha_decode_with_kvcache(*args, **kw, plan=plan, config=cfg)
    again, _ = decode.mha_decode_with_kvcache(*args, **kw, plan=plan, config=cfg)
    splits = decode.choose_num_splits(2, 1, 64, q.device, cfg)
    plain, plain_lse = decode.mha_decode_with_kvcache(*args, **kw, num_splits=splits, config=cfg)
    assert torch.equal(out, plain) and torch.equal(lse, plain_lse) and torch.equal(out, again)
    exp_out, exp_lse = ref.mha_decode_with_kvcache(*args, **kw)
    _assert_close(out, exp_out, torch.float32)
    _assert_lse(lse, exp_lse)
    # The partials are the stream's scratch, not the plan's (a launch plan can replay a call that uses them).
    kept = [k for k in plan._kept if k[0] == "triton.decode"]
    assert splits > 1 and not kept
    # Through the public op, plan included: the kernel's bits with the device's own config, the reference's values.
    with tokenspeed_kernel.kernel_override("triton"):
        pub, pub_lse = tokenspeed_kernel.mha_decode_with_kvcache(*args, **kw, plan=plan)
    own, own_lse = decode.mha_decode_with_kvcache(*args, **kw, plan=plan)
    assert torch.equal(pub, own) and torch.equal(pub_lse, own_lse)
    _assert_close(pub, exp_out, torch.float32)
    _assert_lse(pub_lse, exp_lse)


# --------------------------------------------------------------------------- store


def _append_inputs(device, dtype, lens, page, hq, hkv, d, rot, seed):
    """A paged cache holding ``lens - 1`` tokens a sequence (pages shuffled), the new token's q, k, v and a
    rotary table of ``rot`` dims (none for 0)."""
    g = torch.Generator().manual_seed(seed)
    cols = max(-(-n // page) for n in lens)
    pages = len(lens) * cols + 2
    kc = torch.randn(pages, page, hkv, d, generator=g).to(dtype).to(device)
    vc = torch.randn(pages, page, hkv, d, generator=g).to(dtype).to(device)
    pt = torch.randperm(pages, generator=g)[: len(lens) * cols].view(len(lens), cols).to(torch.int32).to(device)
    q = torch.randn(len(lens), hq, d, generator=g).to(dtype).to(device)
    k = torch.randn(len(lens), hkv, d, generator=g).to(dtype).to(device)
    v = torch.randn(len(lens), hkv, d, generator=g).to(dtype).to(device)
    cs = torch.randn(max(lens), rot, generator=g).to(device) if rot else None
    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    return q, k, v, kc, vc, pt, seqlens, cs


def _two_calls(q, k, v, kc, vc, pt, seqlens, cs, style, **kw):
    """What the appending decode replaces: apply_rotary_and_store (or the store alone), then the decode."""
    pos = seqlens.long() - 1
    page = kc.shape[1]
    slots = pt.long().gather(1, (pos // page)[:, None])[:, 0] * page + pos % page
    if cs is not None:
        q = rope.apply_rotary_and_store(q, k, v, cs, pos, kc, vc, slots, style=style)
    else:
        store.kvcache_store(k, v, kc, vc, slots)
    return decode.mha_decode_with_kvcache(q, kc, vc, pt, seqlens, **kw)


@pytest.mark.parametrize(
    "style, rot, window_left, sinks, num_splits",
    [("neox", 32, -1, True, 1), ("neox", 32, 3, True, 3), ("gptj", 16, -1, False, 2), (None, 0, -1, False, 4),
     ("neox", 24, 6, True, 2)],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_decode_append_equals_rotary_store_then_decode(style, rot, window_left, sinks, num_splits, dtype, device):
    """The appending decode against the two calls it replaces, bit for bit: the output and both caches (the new
    rows written where the page table puts position L - 1; every other row untouched). Lengths cross pages and
    splits (page 4, ragged); with a window the new key is still the query's own."""
    lens, hq, hkv, d = [5, 9, 16, 1], 8, 2, 32
    a = _append_inputs(device, dtype, lens, 4, hq, hkv, d, rot, seed=3)
    b = tuple(t.clone() if t is not None else None for t in a)
    sk = torch.randn(hq, generator=torch.Generator().manual_seed(4)).to(device) if sinks else None
    kw = dict(window_left=window_left, sinks=sk, num_splits=num_splits)
    got = decode.mha_decode_append_kvcache(*a[:7], cos_sin_cache=a[7], style=style or "neox", **kw)
    want = _two_calls(*b, style, **kw)
    assert torch.equal(got, want)
    assert torch.equal(a[3], b[3]) and torch.equal(a[4], b[4])  # k_cache, v_cache
    assert not torch.equal(a[3], _append_inputs(device, dtype, lens, 4, hq, hkv, d, rot, seed=3)[3])  # written


def test_decode_append_public_op_and_its_checks(device: str) -> None:
    """The public op selects the Triton kernel under the interpreter and equals the reference; bad arguments are
    refused by name."""
    q, k, v, kc, vc, pt, seqlens, cs = _append_inputs(device, torch.float32, [3, 7], 4, 4, 2, 16, 16, seed=5)
    args = (q, k, v, kc, vc, pt, seqlens)
    if device == "cpu":
        sel = tokenspeed_kernel.mha_decode_append_kvcache.selected_kernel(*args, cos_sin_cache=cs)
        assert sel.spec.name == "triton.mha_decode_append_kvcache"
    kc2, vc2 = kc.clone(), vc.clone()
    got = tokenspeed_kernel.mha_decode_append_kvcache(*args, cos_sin_cache=cs)
    want = tokenspeed_kernel.mha_decode_append_kvcache(
        q, k, v, kc2, vc2, pt, seqlens, cos_sin_cache=cs, solution="reference"
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kc, kc2, atol=1e-6, rtol=1e-6)
    assert torch.equal(vc, vc2)
    op = tokenspeed_kernel.mha_decode_append_kvcache
    with pytest.raises(ValueError, match="^k: "):
        op(q, k[:, :1], v, kc, vc, pt, seqlens)
    with pytest.raises(TypeError, match="^v: "):
        op(q, k, v.half(), kc, vc, pt, seqlens)
    with pytest.raises(ValueError, match="style: 'gptj' given without cos_sin_cache"):
        op(*args, style="gptj")
    with pytest.raises(ValueError, match="style: expected"):
        op(*args, cos_sin_cache=cs, style="llama")
    with pytest.raises(ValueError, match="cos_sin_cache: 6 rows, but a sequence's new token sits at position 6"):
        op(*args, cos_sin_cache=cs[:6])
    with pytest.raises(ValueError, match="cos_sin_cache: rotary dim 18 must be"):
        op(*args, cos_sin_cache=torch.zeros(8, 18, device=device))


@pytest.mark.parametrize("src_dtype", [torch.bfloat16, torch.float32])
def test_kvcache_store(src_dtype: torch.dtype, device: str) -> None:
    gen = torch.Generator().manual_seed(5)
    pages, page, hkv, d = 5, 4, 3, 16
    k_cache = torch.randn(pages, page, hkv, d, generator=gen).to(device=device, dtype=torch.bfloat16)
    v_cache = torch.randn(pages, page, hkv, d, generator=gen).to(device=device, dtype=torch.bfloat16)
    k = torch.randn(6, hkv, d, generator=gen).to(device=device, dtype=src_dtype)
    v = torch.randn(6, hkv, d, generator=gen).to(device=device, dtype=src_dtype)
    slot_dtype = torch.int64 if src_dtype == torch.bfloat16 else torch.int32
    slots = torch.tensor([0, 7, -1, 19, 5, -3], dtype=slot_dtype, device=device)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            expected_k[s // page, s % page] = k[t].to(torch.bfloat16)
            expected_v[s // page, s % page] = v[t].to(torch.bfloat16)
    store.kvcache_store(k, v, k_cache, v_cache, slots)
    if src_dtype == torch.bfloat16:
        assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    else:
        # fp32 -> bf16: the GPU rounds to nearest, the interpreter truncates; 1 ulp apart at most.
        for got, exp in ((k_cache, expected_k), (v_cache, expected_v)):
            torch.testing.assert_close(got.float(), exp.float(), atol=0.0, rtol=2.0**-7)
        untouched = torch.ones(pages * page, dtype=torch.bool)
        untouched[[0, 7, 19, 5]] = False
        untouched = untouched.view(pages, page).to(device)
        assert torch.equal(k_cache[untouched], expected_k[untouched])


# --------------------------------------------------------------------------- public API


def _selected(op: str, signature: tuple[str, ...], traits: dict) -> str:
    chosen = [c for c in tokenspeed_kernel.explain_selection(op, signature, traits) if c.selected]
    assert len(chosen) == 1
    return chosen[0].name


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks CPU selection under the interpreter")
def test_selection_picks_triton_on_interpreter() -> None:
    attn = {"head_dim": 64, "gqa_group": 8, "window": True, "sinks": True, "logit_cap": False, "return_lse": True}
    sig = ("bf16", "bf16")
    assert _selected("mha_prefill", sig, {**attn, "causal": True}) == "triton.mha_prefill"
    assert _selected("mha_extend_with_kvcache", sig, {**attn, "page_size": 16}) == "triton.mha_extend_with_kvcache"
    assert _selected("mha_decode_with_kvcache", sig, {**attn, "page_size": 1}) == "triton.mha_decode_with_kvcache"
    assert _selected("kvcache_store", ("bf16",), {}) == "triton.kvcache_store"
    # Declared limits: head_dim 96 (not a power of two), page 512 and an fp8 cache fall back.
    assert _selected("mha_prefill", sig, {**attn, "head_dim": 96}) == "reference.mha_prefill"
    assert _selected("mha_decode_with_kvcache", sig, {**attn, "page_size": 512}) == "reference.mha_decode_with_kvcache"
    assert _selected("kvcache_store", ("fp8_e4m3",), {}) == "reference.kvcache_store"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks CPU selection under the interpreter")
def test_public_api_runs_triton(device: str) -> None:
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(12, 8, 64, generator=gen).to(torch.bfloat16)
    k = torch.randn(12, 1, 64, generator=gen).to(torch.bfloat16)
    v = torch.randn(12, 1, 64, generator=gen).to(torch.bfloat16)
    sinks = torch.randn(8, generator=gen)
    cu = _cu([5, 7], "cpu")
    out, lse = tokenspeed_kernel.mha_prefill(q, k, v, cu, cu, 7, 7, window_left=3, sinks=sinks, return_lse=True)
    direct_out, direct_lse = prefill.mha_prefill(
        q, k, v, cu, cu, 7, 7, window_left=3, sinks=sinks, softmax_scale=0.125, return_lse=True
    )
    assert torch.equal(out, direct_out) and torch.equal(lse, direct_lse)
    exp_out, exp_lse = ref.mha_prefill(q, k, v, cu, cu, 7, 7, **_args(window_left=3, sinks=sinks, softmax_scale=0.125))
    _assert_close(out, exp_out, torch.bfloat16)
    _assert_lse(lse, exp_lse)

    k_cache, v_cache, page_table = _paged_cache([9, 3], 16, 1, 64, torch.bfloat16, "cpu", gen)
    qd = torch.randn(2, 8, 64, generator=gen).to(torch.bfloat16)
    seqlens = torch.tensor([9, 3], dtype=torch.int32)
    got = tokenspeed_kernel.mha_decode_with_kvcache(qd, k_cache, v_cache, page_table, seqlens, sinks=sinks)
    expected = ref.mha_decode_with_kvcache(
        qd, k_cache, v_cache, page_table, seqlens, window_left=-1, sinks=sinks, softmax_scale=0.125, logit_cap=0.0,
        return_lse=False, out=None,
    )  # fmt: skip
    _assert_close(got, expected, torch.bfloat16)


# --------------------------------------------------------------------------- GPU (GPT-OSS shapes)

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
_HQ, _HKV, _D = 64, 8, 64


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("window_left", [-1, 127])
@pytest.mark.parametrize("lengths", [[1024], [2048, 1, 777, 4096]])
def test_gpu_prefill_gptoss(lengths: list[int], window_left: int) -> None:
    gen = torch.Generator().manual_seed(7)
    total = sum(lengths)
    q = torch.randn(total, _HQ, _D, generator=gen).cuda().bfloat16()
    k = torch.randn(total, _HKV, _D, generator=gen).cuda().bfloat16()
    v = torch.randn(total, _HKV, _D, generator=gen).cuda().bfloat16()
    sinks = torch.randn(_HQ, generator=gen).cuda()
    cu = _cu(lengths, "cuda")
    kw = _args(window_left=window_left, sinks=sinks, softmax_scale=_D**-0.5)
    out, lse = prefill.mha_prefill(q, k, v, cu, cu, max(lengths), max(lengths), **kw)
    exp_out, exp_lse = ref.mha_prefill(q, k, v, cu, cu, max(lengths), max(lengths), **kw)
    torch.testing.assert_close(out.float(), exp_out.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse, exp_lse, atol=1e-3, rtol=1e-3)


@pytest.mark.gpu
@gpu
def test_gpu_extend_gptoss() -> None:
    gen = torch.Generator().manual_seed(8)
    cache_lens, q_lens = [3000, 700, 129], [1000, 700, 1]
    k_cache, v_cache, page_table = _paged_cache(cache_lens, 16, _HKV, _D, torch.bfloat16, "cuda", gen)
    q = torch.randn(sum(q_lens), _HQ, _D, generator=gen).cuda().bfloat16()
    seqlens = torch.tensor(cache_lens, dtype=torch.int32, device="cuda")
    for window_left in (-1, 127):
        kw = _args(window_left=window_left, sinks=torch.randn(_HQ, generator=gen).cuda(), softmax_scale=_D**-0.5)
        args = (q, k_cache, v_cache, page_table, seqlens, _cu(q_lens, "cuda"), max(q_lens))
        out, lse = extend.mha_extend_with_kvcache(*args, **kw)
        exp_out, exp_lse = ref.mha_extend_with_kvcache(*args, **kw)
        torch.testing.assert_close(out.float(), exp_out.float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse, exp_lse, atol=1e-3, rtol=1e-3)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("page", [1, 16, 256])
@pytest.mark.parametrize("window_left", [-1, 127])
def test_gpu_decode_gptoss(page: int, window_left: int) -> None:
    gen = torch.Generator().manual_seed(9)
    lens = [1, 4096, 8191, 17, 2048, 300, 5000, 64]
    k_cache, v_cache, page_table = _paged_cache(lens, page, _HKV, _D, torch.bfloat16, "cuda", gen)
    q = torch.randn(len(lens), _HQ, _D, generator=gen).cuda().bfloat16()
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    kw = _args(window_left=window_left, sinks=torch.randn(_HQ, generator=gen).cuda(), softmax_scale=_D**-0.5)
    del kw["causal"]
    args = (q, k_cache, v_cache, page_table, seqlens)
    exp_out, exp_lse = ref.mha_decode_with_kvcache(*args, **kw)
    for num_splits in (None, 1, 7):
        out, lse = decode.mha_decode_with_kvcache(*args, **kw, num_splits=num_splits)
        torch.testing.assert_close(out.float(), exp_out.float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse, exp_lse, atol=1e-3, rtol=1e-3)


def _gpu_decode_inputs(seed: int, capacity: int):
    """Four sequences of 100-4000 tokens in paged caches of ``capacity`` tokens each, on the GPU."""
    gen = torch.Generator().manual_seed(seed)
    lens = [100, 2000, 513, 4000]
    k_cache, v_cache, page_table = _paged_cache([capacity] * 4, 16, _HKV, _D, torch.bfloat16, "cuda", gen)
    q = torch.randn(len(lens), _HQ, _D, generator=gen).cuda().bfloat16()
    sinks = torch.randn(_HQ, generator=gen).cuda()
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    kw = {"window_left": -1, "sinks": sinks, "softmax_scale": _D**-0.5, "logit_cap": 0.0, "return_lse": False}
    return lens, k_cache, v_cache, page_table, q, seqlens, kw


@pytest.mark.gpu
@gpu
def test_gpu_decode_cuda_graph_replay() -> None:
    """Captured once, replayed with longer sequences: no host sync, shapes-only split count."""
    _lens, k_cache, v_cache, page_table, q, seqlens, kw = _gpu_decode_inputs(10, 4096)
    out = torch.empty_like(q)
    decode.mha_decode_with_kvcache(q, k_cache, v_cache, page_table, seqlens, out=out, **kw)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode.mha_decode_with_kvcache(q, k_cache, v_cache, page_table, seqlens, out=out, **kw)
    seqlens.copy_(torch.tensor([4096, 1, 3000, 4095], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    expected = ref.mha_decode_with_kvcache(q, k_cache, v_cache, page_table, seqlens, out=None, **kw)
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@gpu
def test_gpu_decode_plan_cuda_graph_replay() -> None:
    """With a plan: captured and replayed like the call without one (the partials kept with the
    plan are the graph's), equal to the eager call's bits, and no allocation in the eager call."""
    lens, k_cache, v_cache, page_table, q, seqlens, kw = _gpu_decode_inputs(12, 65536)
    plan = tokenspeed_kernel.mha_plan(cache_seqlens=lens)
    out = torch.empty_like(q)
    eager = decode.mha_decode_with_kvcache(q, k_cache, v_cache, page_table, seqlens, plan=plan, **kw).clone()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    decode.mha_decode_with_kvcache(q, k_cache, v_cache, page_table, seqlens, out=out, plan=plan, **kw)
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before  # out= given: nothing allocated
    graph = torch.cuda.CUDAGraph()
    out.zero_()
    with torch.cuda.graph(graph):
        decode.mha_decode_with_kvcache(q, k_cache, v_cache, page_table, seqlens, out=out, plan=plan, **kw)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    expected = ref.mha_decode_with_kvcache(q, k_cache, v_cache, page_table, seqlens, out=None, **kw)
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("window_left", [-1, 127])
def test_gpu_decode_append_gptoss(window_left: int) -> None:
    """GPT-OSS shapes (64 query heads, 8 KV heads, head_dim 64, YaRN-like table, page 16): the appending decode
    against the two calls it replaces, bit for bit (output and caches), with several split counts; then in a CUDA
    graph replayed at the next position (the new row follows cache_seqlens)."""
    lens = [1, 4096, 17, 2048, 300, 5000, 64, 8191]
    a = _append_inputs("cuda", torch.bfloat16, lens, 16, _HQ, _HKV, _D, _D, seed=11)
    sinks = torch.randn(_HQ, generator=torch.Generator().manual_seed(12)).cuda()
    for num_splits in (None, 1, 7):
        x = tuple(t.clone() for t in a)
        y = tuple(t.clone() for t in a)
        kw = dict(window_left=window_left, sinks=sinks, num_splits=num_splits)
        got = decode.mha_decode_append_kvcache(*x[:7], cos_sin_cache=x[7], **kw)
        want = _two_calls(*y, "neox", **kw)
        assert torch.equal(got, want), num_splits
        assert torch.equal(x[3], y[3]) and torch.equal(x[4], y[4]), num_splits
    q, k, v, kc, vc, pt, seqlens, cs = (t.clone() for t in a)
    kc2, vc2 = kc.clone(), vc.clone()
    out = torch.empty_like(q)
    kw = dict(window_left=window_left, sinks=sinks)
    decode.mha_decode_append_kvcache(q, k, v, kc, vc, pt, seqlens, cos_sin_cache=cs, out=out, **kw)  # compiles
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode.mha_decode_append_kvcache(q, k, v, kc, vc, pt, seqlens, cos_sin_cache=cs, out=out, **kw)
    seqlens.sub_(1).clamp_(min=1)  # one position back: the graph writes and reads there
    graph.replay()
    torch.cuda.synchronize()
    want = _two_calls(q, k, v, kc2, vc2, pt, seqlens, cs, "neox", **kw)
    assert torch.equal(out, want)


@pytest.mark.gpu
@gpu
def test_gpu_kvcache_store() -> None:
    gen = torch.Generator().manual_seed(11)
    k_cache = torch.zeros(64, 16, _HKV, _D, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    k = torch.randn(300, _HKV, _D, generator=gen).cuda().bfloat16()
    v = torch.randn(300, _HKV, _D, generator=gen).cuda().bfloat16()
    slots = torch.randperm(64 * 16, generator=gen)[:300].cuda()
    slots[::7] = -1
    store.kvcache_store(k, v, k_cache, v_cache, slots)
    exp_k, exp_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    ref.kvcache_store(k, v, exp_k, exp_v, slots)
    assert torch.equal(k_cache, exp_k) and torch.equal(v_cache, exp_v)


def test_softmax_scale_default_is_inverse_sqrt_head_dim(device: str) -> None:
    gen = torch.Generator().manual_seed(12)
    q = torch.randn(4, 2, 16, generator=gen).to(device)
    k = torch.randn(4, 1, 16, generator=gen).to(device)
    v = torch.randn(4, 1, 16, generator=gen).to(device)
    cu = _cu([4], device)
    got = prefill.mha_prefill(q, k, v, cu, cu, 4, 4, softmax_scale=None)
    expected = ref.mha_prefill(q, k, v, cu, cu, 4, 4, **_args(softmax_scale=1 / math.sqrt(16), return_lse=False))
    _assert_close(got, expected, torch.float32)

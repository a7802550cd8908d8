"""Attention plans (``tk.mha_plan``): validation, the checks they let bind run on host values,
the memo, the hint that reaches only the kernels naming it, and the custom-op schema.

Meta tensors stand in for device tensors: bind never reads their values, so any value
check that fires on them comes from the plan.
"""

from __future__ import annotations

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.core import op as op_module
from tokenspeed_kernel.core.registry import Priority, register_kernel, unregister_kernel


def _decode(batch=2, page_size=4, max_pages=3, device="meta"):
    g = torch.Generator().manual_seed(batch)
    q = torch.randn(batch, 8, 16, generator=g).to(device, torch.bfloat16)
    kc = torch.randn(16, page_size, 1, 16, generator=g).to(device, torch.bfloat16)
    pt = torch.zeros(batch, max_pages, dtype=torch.int32, device=device)
    cs = torch.ones(batch, dtype=torch.int32, device=device)
    return q, kc, kc, pt, cs


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({}, ValueError, "at least one of cache_seqlens"),
        ({"cu_seqlens_q": [1, 3]}, ValueError, "cu_seqlens_q: must start at 0"),
        ({"cu_seqlens_q": [0, 3, 2]}, ValueError, "cu_seqlens_q: expected non-decreasing, got -1 for sequence 1"),
        ({"cu_seqlens_k": [0]}, ValueError, r"cu_seqlens_k: expected \[batch \+ 1\] >= 2"),
        ({"cache_seqlens": [3, -1]}, ValueError, "cache_seqlens: expected values >= 0, got -1 for sequence 1"),
        ({"cache_seqlens": [3, 4], "cu_seqlens_q": [0, 1]}, ValueError, "describes 1 sequences"),
        ({"cache_seqlens": [3.0]}, TypeError, "cache_seqlens: expected ints"),
        ({"cache_seqlens": "12"}, TypeError, "cache_seqlens: expected a sequence of ints"),
        ({"cache_seqlens": torch.ones(2, 2, dtype=torch.int32)}, ValueError, "cache_seqlens: expected a 1-D"),
    ],
)
def test_mha_plan_names_the_bad_argument(kwargs, error, match):
    with pytest.raises(error, match=match):
        tk.mha_plan(**kwargs)


def test_mha_plan_summary():
    plan = tk.mha_plan(cache_seqlens=torch.tensor([5, 9, 1]), cu_seqlens_q=(0, 2, 3, 4))
    assert (plan.batch, plan.max_cache_seqlen, plan.max_seqlen_q, plan.max_seqlen_k) == (3, 9, 2, -1)
    assert plan.cache_seqlens == (5, 9, 1) and plan.host_tensor("cache_seqlens").tolist() == [5, 9, 1]
    assert plan == tk.mha_plan(cache_seqlens=[5, 9, 1], cu_seqlens_q=[0, 2, 3, 4])
    assert plan.keep("x", lambda: [1]) is plan.keep("x", lambda: [2])


def test_bind_checks_the_plan_values_without_reading_tensors():
    call = tk.mha_decode_with_kvcache.call_key
    args = _decode()  # capacity 3 pages x 4 = 12 slots
    call(*args, plan=tk.mha_plan(cache_seqlens=[12, 1]))
    with pytest.raises(ValueError, match="cache_seqlens: sequence 1 holds 13 tokens, past the 12 slots"):
        call(*args, plan=tk.mha_plan(cache_seqlens=[12, 13]))
    with pytest.raises(ValueError, match=r"cache_seqlens: expected >= 1 per sequence .* got 0 for sequence 0"):
        call(*args, plan=tk.mha_plan(cache_seqlens=[0, 2]))
    with pytest.raises(ValueError, match="plan: describes 3 sequences, the call has 2"):
        call(*args, plan=tk.mha_plan(cache_seqlens=[1, 2, 3]))
    with pytest.raises(ValueError, match="plan: this op reads cache_seqlens .* the plan has no cache_seqlens"):
        call(*args, plan=tk.mha_plan(cu_seqlens_q=[0, 1, 2]))
    with pytest.raises(TypeError, match="plan: expected an AttentionPlan"):
        call(*args, plan=[1, 2])


def test_extend_and_prefill_check_the_plan():
    q, kc, vc, pt, cs = _decode(max_pages=4)
    q = torch.empty(5, 8, 16, dtype=torch.bfloat16, device="meta")
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    ext = tk.mha_extend_with_kvcache.call_key
    ext(q, kc, vc, pt, cs, cu, 3, plan=tk.mha_plan(cache_seqlens=[6, 3], cu_seqlens_q=[0, 2, 5]))
    with pytest.raises(ValueError, match="cache_seqlens: sequence 1 holds 2 tokens, fewer than its 3 queries"):
        ext(q, kc, vc, pt, cs, cu, 3, plan=tk.mha_plan(cache_seqlens=[6, 2], cu_seqlens_q=[0, 2, 5]))
    with pytest.raises(ValueError, match="max_seqlen_q: expected at least the longest sequence of cu_seqlens_q"):
        ext(q, kc, vc, pt, cs, cu, 2, plan=tk.mha_plan(cache_seqlens=[6, 3], cu_seqlens_q=[0, 2, 5]))
    with pytest.raises(ValueError, match=r"plan: its cu_seqlens_q end at 4, the call has 5 packed tokens of q"):
        ext(q, kc, vc, pt, cs, cu, 3, plan=tk.mha_plan(cache_seqlens=[6, 3], cu_seqlens_q=[0, 2, 4]))
    k = torch.empty(9, 1, 16, dtype=torch.bfloat16, device="meta")
    pre = tk.mha_prefill.call_key
    pre(q, k, k, cu, cu, 3, 6, plan=tk.mha_plan(cu_seqlens_q=[0, 2, 5], cu_seqlens_k=[0, 6, 9]))
    with pytest.raises(ValueError, match="max_seqlen_k: expected at least the longest sequence of cu_seqlens_k"):
        pre(q, k, k, cu, cu, 3, 5, plan=tk.mha_plan(cu_seqlens_q=[0, 2, 5], cu_seqlens_k=[0, 6, 9]))


def test_a_host_tensor_must_equal_the_plan():
    q, kc, vc, pt, cs = _decode(device="cpu")
    with pytest.raises(ValueError, match=r"plan: its cache_seqlens differ .* at entry 0 \(plan 2, tensor 1\)"):
        tk.mha_decode_with_kvcache.call_key(q, kc, vc, pt, cs, plan=tk.mha_plan(cache_seqlens=[2, 1]))


def test_the_memo_keys_a_plan_by_what_the_checks_read():
    op = tk.mha_decode_with_kvcache
    args = _decode()
    first = op_module._bind_memoised(op, args, {"plan": tk.mha_plan(cache_seqlens=[3, 4])})
    other = tk.mha_plan(cache_seqlens=[4, 3])  # same summary: served, and the kernel gets this plan
    hit = op_module._bind_memoised(op, args, {"plan": other})
    assert hit[5]["plan"] is other and hit[:4] == first[:4]
    with pytest.raises(ValueError, match="past the 12 slots"):  # another summary: bind runs again
        op_module._bind_memoised(op, args, {"plan": tk.mha_plan(cache_seqlens=[3, 40])})


def test_the_plan_reaches_only_a_kernel_that_names_it():
    seen = []

    def with_plan(q, k_cache, v_cache, page_table, cache_seqlens, *, plan=None, **kw):
        seen.append(("with", plan))
        return torch.zeros_like(q)

    def without(q, k_cache, v_cache, page_table, cache_seqlens, *, window_left, sinks, softmax_scale, logit_cap,
                return_lse, out):  # fmt: skip
        seen.append(("without", None))
        return torch.zeros_like(q)

    traits = {n: tk.ANY for n in ("head_dim", "gqa_group", "window", "sinks", "logit_cap", "return_lse", "page_size")}
    for name, fn in (("plantest.with", with_plan), ("plantest.without", without)):
        register_kernel("mha_decode_with_kvcache", name=name, solution="plantest", traits=traits,
                        formats=[{"q": "bf16", "kv": "bf16"}], priority=Priority.SPECIALIZED, impl=fn)  # fmt: skip
    try:
        args = _decode(device="cpu")
        plan = tk.mha_plan(cache_seqlens=[1, 1])
        tk.mha_decode_with_kvcache(*args, plan=plan, override="plantest.with")
        tk.mha_decode_with_kvcache(*args, plan=plan, override="plantest.without")
        tk.mha_decode_with_kvcache(*args, override="plantest.with")
        assert seen == [("with", plan), ("without", None), ("with", None)]
    finally:
        for name in ("plantest.with", "plantest.without"):
            unregister_kernel(name)


def test_the_plan_crosses_the_custom_op_schema():
    from tokenspeed_kernel.compile import ops, schema_of

    schema = schema_of("mha_decode_with_kvcache")
    assert "bool plan_present" in schema and "int[] plan_cache_seqlens_ints" in schema, schema
    args = _decode(device="cpu")
    plan = tk.mha_plan(cache_seqlens=[1, 1])
    got = ops.mha_decode_with_kvcache(*args, plan=plan)
    want = tk.mha_decode_with_kvcache(*args, plan=plan)
    assert want.abs().sum() > 0
    torch.testing.assert_close(got, want)

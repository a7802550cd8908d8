"""FlashInfer attention wrappers with an attention plan (CPU, FlashInfer faked).

A fake ``flashinfer`` module records what the wrappers are asked to do; the wrapper
module is imported against it. Checked: a call given ``plan=`` takes the lengths from
the plan (no device-to-host copy, ``_to_host`` is made to fail), FlashInfer's ``plan``
runs once per new batch and not again for later layers, the metadata handed to
``plan`` equal the ones a call without a plan derives from the tensors, and the page
table is gathered on every call.
"""

from __future__ import annotations

import importlib
import sys
import types

import pytest
import torch

import tokenspeed_kernel as tk


class _Wrapper:
    def __init__(self, *args, **kwargs):
        self.plans: list[tuple] = []
        self.runs = 0

    def plan(self, *args, **kwargs):
        self.plans.append(tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args))

    def run(self, q, *args, out=None, return_lse=False, **kwargs):
        self.runs += 1
        o = torch.zeros_like(q) if out is None else out.zero_()
        return (o, torch.zeros(q.shape[0], q.shape[1])) if return_lse else o


@pytest.fixture
def fi(monkeypatch):
    fake = types.ModuleType("flashinfer")
    for name in (
        "BatchPrefillWithRaggedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper",
        "BatchDecodeWithPagedKVCacheWrapper", "BatchAttentionWithAttentionSinkWrapper",
        "BatchDecodeWithAttentionSinkWrapper",
    ):  # fmt: skip
        setattr(fake, name, type(name, (_Wrapper,), {}))
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    sys.modules.pop("tokenspeed_kernel_nvidia.flashinfer.attention", None)
    mod = importlib.import_module("tokenspeed_kernel_nvidia.flashinfer.attention")
    yield mod
    mod._reset_for_tests()
    sys.modules.pop("tokenspeed_kernel_nvidia.flashinfer.attention", None)


def _no_host_copy(*tensors):
    raise AssertionError("a call with a plan copied lengths to the host")


def _decode_args(lens, page_size=4, hq=8, hkv=1, d=16, max_pages=4):
    batch = len(lens)
    q = torch.randn(batch, hq, d, dtype=torch.bfloat16)
    kc = torch.randn(batch * max_pages, page_size, hkv, d, dtype=torch.bfloat16)
    pt = torch.arange(batch * max_pages, dtype=torch.int32).view(batch, max_pages)
    return q, kc, kc.clone(), pt, torch.tensor(lens, dtype=torch.int32)


def _kw():
    return dict(window_left=-1, sinks=None, softmax_scale=0.25, logit_cap=0.0, return_lse=False, out=None)


def test_decode_plan_replaces_the_host_copy(fi, monkeypatch):
    lens = [5, 9, 13]
    q, kc, vc, pt, cs = _decode_args(lens)
    fi.mha_decode_with_kvcache(q, kc, vc, pt, cs, **_kw())  # without a plan: the tensors' copy
    (entry,) = fi._wrappers.values()
    expected = entry.wrapper.plans[-1]
    fi._reset_for_tests()
    monkeypatch.setattr(fi, "_to_host", _no_host_copy)
    plan = tk.mha_plan(cache_seqlens=lens)
    for _ in range(3):  # three layers of one step
        fi.mha_decode_with_kvcache(q, kc, vc, pt, cs, plan=plan, **_kw())
    (entry,) = fi._wrappers.values()
    assert len(entry.wrapper.plans) == 1 and entry.wrapper.runs == 3
    got = entry.wrapper.plans[0]
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    # The next step's lengths plan again; a rewritten page table is gathered on every call.
    fi.mha_decode_with_kvcache(q, kc, vc, pt, cs + 1, plan=tk.mha_plan(cache_seqlens=[n + 1 for n in lens]), **_kw())
    assert len(entry.wrapper.plans) == 2
    pt2 = pt.flip(0).contiguous()
    fi.mha_decode_with_kvcache(q, kc, vc, pt2, cs + 1, plan=tk.mha_plan(cache_seqlens=[n + 1 for n in lens]), **_kw())
    assert len(entry.wrapper.plans) == 2
    pages = [(n + 1 + 3) // 4 for n in lens]
    want = torch.cat([pt2[b, : pages[b]] for b in range(3)])
    assert torch.equal(entry.kv_indices, want)


def test_extend_and_prefill_plans(fi, monkeypatch):
    monkeypatch.setattr(fi, "_to_host", _no_host_copy)
    q_lens, lens = [2, 3], [6, 3]
    cu_q = [0, 2, 5]
    q, kc, vc, pt, cs = _decode_args(lens)
    q = torch.randn(5, 8, 16, dtype=torch.bfloat16)
    kw = dict(_kw(), causal=True)
    plan = tk.mha_plan(cache_seqlens=lens, cu_seqlens_q=cu_q)
    cu = torch.tensor(cu_q, dtype=torch.int32)
    fi.mha_extend_with_kvcache(q, kc, vc, pt, cs, cu, max(q_lens), plan=plan, **kw)
    fi.mha_extend_with_kvcache(q, kc, vc, pt, cs, cu, max(q_lens), plan=plan, **kw)
    (entry,) = fi._wrappers.values()
    assert len(entry.wrapper.plans) == 1 and entry.wrapper.runs == 2
    assert entry.wrapper.plans[0][0].tolist() == cu_q
    fi._reset_for_tests()
    k = torch.randn(9, 1, 16, dtype=torch.bfloat16)
    pplan = tk.mha_plan(cu_seqlens_q=cu_q, cu_seqlens_k=[0, 6, 9])
    fi.mha_prefill(q, k, k.clone(), cu, torch.tensor([0, 6, 9], dtype=torch.int32), 3, 6, plan=pplan, **kw)
    (entry,) = fi._wrappers.values()
    assert [t.tolist() for t in entry.wrapper.plans[0][:2]] == [cu_q, [0, 6, 9]]


def test_hinted_kwargs_follow_the_kernel_signature(fi, monkeypatch):
    """The plan reaches a kernel whose signature names it; the reference (no such parameter) gets none."""
    seen = {}

    def kernel(q, k_cache, v_cache, page_table, cache_seqlens, *, plan=None, **kw):
        seen["plan"] = plan
        return torch.zeros_like(q)

    from tokenspeed_kernel.core.op import hinted_kwargs

    plan = tk.mha_plan(cache_seqlens=[5])
    assert hinted_kwargs(("plan",), kernel, {"plan": plan, "out": None}) == {"plan": plan, "out": None}
    ref = importlib.import_module("tokenspeed_kernel.reference.attention").mha_decode_with_kvcache
    assert hinted_kwargs(("plan",), ref, {"plan": plan, "out": None}) == {"out": None}
    assert hinted_kwargs(("plan",), fi.mha_decode_with_kvcache, {"plan": plan})["plan"] is plan

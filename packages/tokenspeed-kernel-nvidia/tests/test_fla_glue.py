"""The flash-linear-attention wrapper's argument translation, on CPU with a stand-in ``fla``
(the real library runs on the H200: docs/benchmarks/)."""

from __future__ import annotations

import importlib
import sys
import types

import pytest
import torch


@pytest.fixture
def wrapper(monkeypatch):
    calls = []

    def chunk_gated_delta_rule(q, k, v, g, beta, **kw):
        calls.append((q, k, v, g, beta, kw))
        state = torch.zeros(1 if kw["cu_seqlens"] is None else kw["cu_seqlens"].numel() - 1, v.shape[2], q.shape[3],
                            v.shape[3])  # fmt: skip
        return v.clone(), (state if kw["output_final_state"] else None)

    pkg = types.ModuleType("fla")
    ops = types.ModuleType("fla.ops")
    gdr = types.ModuleType("fla.ops.gated_delta_rule")
    gdr.chunk_gated_delta_rule = chunk_gated_delta_rule
    for name, mod in (("fla", pkg), ("fla.ops", ops), ("fla.ops.gated_delta_rule", gdr)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "tokenspeed_kernel_nvidia.fla.linear_attention", raising=False)
    module = importlib.import_module("tokenspeed_kernel_nvidia.fla.linear_attention")
    yield module, calls
    sys.modules.pop("tokenspeed_kernel_nvidia.fla.linear_attention", None)


def test_packed_call_becomes_batch_one_with_int64_offsets(wrapper):
    module, calls = wrapper
    q = torch.randn(7, 2, 16, dtype=torch.bfloat16)
    v = torch.randn(7, 4, 8, dtype=torch.bfloat16)
    g, beta = -torch.rand(7, 4), torch.rand(7, 4)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    o, final = module.gdn_chunk_prefill(q, q, v, g, beta, scale=0.25, initial_state=None, cu_seqlens=cu,
                                        output_final_state=True, use_qk_l2norm=True, out=None)  # fmt: skip
    fq, fk, fv, fg, fb, kw = calls[0]
    assert fk.shape == fq.shape
    assert fq.shape == (1, 7, 2, 16) and fv.shape == (1, 7, 4, 8)
    assert fg.dtype == torch.float32 and fb.dtype == torch.bfloat16  # fla takes beta in q's dtype
    assert kw["cu_seqlens"].dtype == torch.int64 and kw["cu_seqlens"].tolist() == [0, 3, 7]
    assert kw["scale"] == 0.25 and kw["use_qk_l2norm_in_kernel"] is True and kw["output_final_state"] is True
    assert o.shape == (7, 4, 8) and torch.equal(o, v) and final.shape == (2, 4, 16, 8)


def test_out_and_no_final_state(wrapper):
    module, _ = wrapper
    q = torch.randn(3, 1, 16)
    v = torch.randn(3, 1, 16)
    out = torch.empty_like(v)
    got = module.gdn_chunk_prefill(q, q, v, torch.zeros(3, 1), torch.ones(3, 1), scale=1.0, initial_state=None,
                                   cu_seqlens=None, output_final_state=False, use_qk_l2norm=False, out=out)  # fmt: skip
    assert got is out and torch.equal(out, v)

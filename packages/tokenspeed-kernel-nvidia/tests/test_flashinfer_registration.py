"""FlashInfer wrappers: registration only when installed, exact capabilities, layouts, JIT cache setting (CPU).

FlashInfer's presence is faked by patching ``importlib.util.find_spec``; nothing
here imports FlashInfer (the wrapper modules that do are never resolved).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import math
import sys
import types

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.core.registry import registry
from tokenspeed_kernel.ops.moe import MoEActivation, MoEWeights
from tokenspeed_kernel_nvidia.flashinfer import _jit, _register
from tokenspeed_kernel_nvidia.flashinfer._layout import moe_padded, paged_metadata

ATTN_OPS = ("mha_prefill", "mha_extend_with_kvcache", "mha_decode_with_kvcache")
EXPECTED = {f"flashinfer.{op}{tail}" for op in ATTN_OPS for tail in ("", "_sink")} | {
    "flashinfer.rmsnorm",
    "flashinfer.moe_apply",
}
BF16 = ("bf16", "bf16")
GPT_OSS = {"head_dim": 64, "gqa_group": 8, "window": True, "sinks": True}
# flashinfer.moe_apply has a weight preprocessor, so it takes weights converted to its layout only.
GPT_OSS_MOE = {"activation": "swiglu", "clamp": True, "bias": True, "gate_up_interleaved": True,
               "layout": "flashinfer.moe_apply"}  # fmt: skip


def _traits(op: str, **kw) -> dict:
    t = {**GPT_OSS, **kw}
    if op != "mha_prefill":
        t.setdefault("page_size", 16)
    return t


def _register_with_flashinfer(monkeypatch, present: bool) -> list:
    """Run ``register()`` with FlashInfer faked present/absent; returns the specs it replaced."""
    tk.plugin_reports()  # discover plugins first: the nvidia plugin may register these itself
    saved = [s for s in registry.all() if s.solution == "flashinfer"]
    for s in saved:
        registry.unregister(s.name)
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "flashinfer":
            return importlib.machinery.ModuleSpec("flashinfer", None) if present else None
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    _register.register()
    return saved


def _restore(saved: list) -> None:
    for s in [s for s in registry.all() if s.solution == "flashinfer"]:
        registry.unregister(s.name)
    for s in saved:
        registry.register(s, replace=True)


@pytest.fixture
def with_flashinfer(monkeypatch):
    saved = _register_with_flashinfer(monkeypatch, True)
    yield
    _restore(saved)


def _candidates(op, sig, traits, arch="sm90"):
    return {c.name: c for c in tk.explain_selection(op, sig, traits, platform=tk.make_platform(arch))}


def _ranks_above_portable(cands, name, op):
    """``name`` is eligible and ranks above the Triton (if installed) and reference kernels."""
    assert cands[name].eligible, cands[name].reason
    others = [cands[o] for o in (f"triton.{op}", f"reference.{op}") if o in cands and cands[o].eligible]
    assert others and all(cands[name].rank < o.rank for o in others)


def test_nothing_registers_without_flashinfer(monkeypatch):
    saved = _register_with_flashinfer(monkeypatch, False)
    try:
        assert [s.name for s in registry.all() if s.solution == "flashinfer"] == []
    finally:
        _restore(saved)


def test_registers_exactly_these_kernels_lazily(with_flashinfer):
    specs = {s.name: s for s in registry.all() if s.solution == "flashinfer"}
    assert set(specs) == EXPECTED
    for s in specs.values():
        assert s.hardware_validated is False, s.name
        assert (s.capability.min_arch, s.capability.max_arch) == ("sm90", "sm90")
        assert isinstance(s.impl, str) and s.impl.startswith("tokenspeed_kernel_nvidia.flashinfer.")
    for op in ATTN_OPS:
        for name in (f"flashinfer.{op}", f"flashinfer.{op}_sink"):
            assert "cuda_graph_safe" not in specs[name].tags  # plans on the host every call
            assert specs[name].impl == f"tokenspeed_kernel_nvidia.flashinfer.attention:{op}"
    moe = specs["flashinfer.moe_apply"]
    assert moe.weight_preprocessor == "tokenspeed_kernel_nvidia.flashinfer.moe:preprocess_weights"
    assert "cuda_graph_safe" not in moe.tags
    # Registration imported neither FlashInfer nor a wrapper module.
    assert "flashinfer" not in sys.modules
    for mod in ("attention", "norm", "moe"):
        assert f"tokenspeed_kernel_nvidia.flashinfer.{mod}" not in sys.modules


def test_no_sampling_argmax_or_staged_moe_kernel(with_flashinfer):
    for op in ("argmax", "top_k_top_p_sample", "moe_experts", "moe_route", "kvcache_store"):
        assert not [s.name for s in registry.for_op(op) if s.solution == "flashinfer"], op


@pytest.mark.parametrize("op", ATTN_OPS)
def test_gpt_oss_attention_routes_to_the_sink_kernel(with_flashinfer, op):
    cands = _candidates(op, BF16, _traits(op))
    sink, plain = cands[f"flashinfer.{op}_sink"], cands[f"flashinfer.{op}"]
    assert plain.reason == "trait sinks=True (supports False)"
    # Above the portable kernels; FA3 (same band, no host sync) stays first when installed.
    _ranks_above_portable(cands, f"flashinfer.{op}_sink", op)
    fa3 = cands.get(f"fa3.{op}")
    if fa3 is not None and fa3.eligible:
        assert fa3.rank < sink.rank
    else:
        assert sink.selected


@pytest.mark.parametrize("op", ATTN_OPS)
def test_soft_cap_and_sinks_split_between_the_two_kernels(with_flashinfer, op):
    cands = _candidates(op, BF16, _traits(op, sinks=False, logit_cap=True))
    assert cands[f"flashinfer.{op}"].eligible
    assert cands[f"flashinfer.{op}_sink"].reason == "trait sinks=False (supports True); logit_cap=True (supports False)"
    # Both at once: FlashInfer's sink variant has no soft-cap, and nothing else takes it.
    cands = _candidates(op, BF16, _traits(op, logit_cap=True))
    assert cands[f"flashinfer.{op}"].reason == "trait sinks=True (supports False)"
    assert cands[f"flashinfer.{op}_sink"].reason == "trait logit_cap=True (supports False)"


@pytest.mark.parametrize("op", ATTN_OPS)
def test_attention_rejections_name_the_exact_reason(with_flashinfer, op):
    name = f"flashinfer.{op}_sink"
    for arch, reason in (
        ("sm100", "needs arch <= sm90, platform is sm100"),
        ("sm80", "needs arch >= sm90, platform is sm80"),
        ("gfx950", "needs vendor nvidia, platform is amd"),
    ):
        assert _candidates(op, BF16, _traits(op), arch)[name].reason == reason
    assert _candidates(op, BF16, _traits(op, head_dim=96))[name].reason == "trait head_dim=96 (supports 64|128|256)"
    assert _candidates(op, ("fp32", "fp32"), _traits(op))[name].reason == (
        "formats q=fp32, kv=fp32 not supported (supports {q: bf16, kv: bf16} or {q: fp16, kv: fp16})"
    )
    assert _candidates(op, ("bf16", "fp8_e4m3"), _traits(op))[name].reason.startswith("formats q=bf16, kv=fp8_e4m3")
    if op != "mha_prefill":
        for page_size in (24, 512):
            reason = _candidates(op, BF16, _traits(op, page_size=page_size))[name].reason
            assert reason == f"trait page_size={page_size} (supports 1..256, powers of two)"
    assert _candidates(op, ("fp16", "fp16"), _traits(op, head_dim=128, gqa_group=1, window=False))[name].eligible


def test_rmsnorm_plain_only(with_flashinfer):
    _ranks_above_portable(_candidates("rmsnorm", ("bf16",), {"fused_residual": False}), "flashinfer.rmsnorm", "rmsnorm")
    fused = _candidates("rmsnorm", ("bf16",), {"fused_residual": True})["flashinfer.rmsnorm"]
    assert fused.reason == "trait fused_residual=True (supports False)"
    fp32 = _candidates("rmsnorm", ("fp32",), {})["flashinfer.rmsnorm"]
    assert fp32.reason == "formats x=fp32 not supported (supports {x: bf16|fp16})"


def test_moe_apply_takes_gpt_oss_mxfp4_and_nothing_else(with_flashinfer):
    planned = _candidates("moe_apply", ("bf16", "mxfp4"), GPT_OSS_MOE)
    assert planned["flashinfer.moe_apply"].eligible and planned["flashinfer.moe_apply"].rank == 1
    canonical = _candidates("moe_apply", ("bf16", "mxfp4"), {**GPT_OSS_MOE, "layout": "canonical"})
    assert canonical["flashinfer.moe_apply"].reason == "trait layout='canonical' (supports 'flashinfer.moe_apply')"
    assert _candidates("moe_apply", ("bf16", "mxfp4"), {**GPT_OSS_MOE, "activation": "silu", "clamp": False})[
        "flashinfer.moe_apply"
    ].eligible
    for sig in (("fp16", "mxfp4"), ("bf16", "bf16"), ("bf16", "fp8_e4m3:per_channel")):
        reason = _candidates("moe_apply", sig, GPT_OSS_MOE)["flashinfer.moe_apply"].reason
        assert reason == f"formats x={sig[0]}, w={sig[1]} not supported (supports {{x: bf16, w: mxfp4}})"
    assert _candidates("moe_apply", ("bf16", "mxfp4"), GPT_OSS_MOE, "sm100")["flashinfer.moe_apply"].reason == (
        "needs arch <= sm90, platform is sm100"
    )


# --- host-side conversions (no FlashInfer) -------------------------------------------------


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_paged_metadata_matches_the_page_table(page_size):
    g = torch.Generator().manual_seed(page_size)
    lens = torch.tensor([0, 1, page_size, page_size + 1, 3 * page_size, 777], dtype=torch.int32)
    max_pages = -(-777 // page_size) + 2
    table = torch.randint(0, 10_000, (lens.numel(), max_pages), generator=g, dtype=torch.int32)
    indptr, last, flat = paged_metadata(lens, page_size, max_pages)
    want_pages = [math.ceil(n / page_size) for n in lens.tolist()]
    assert torch.diff(indptr).tolist() == want_pages
    # FlashInfer's lengths: on the device 0 for no page, else (pages - 1) * page_size +
    # last_page_len; on the host (its planner) max(pages - 1, 0) * page_size + last_page_len.
    device_lens = [0 if p == 0 else (p - 1) * page_size + int(lp) for p, lp in zip(want_pages, last)]
    host_lens = [max(p - 1, 0) * page_size + int(lp) for p, lp in zip(want_pages, last)]
    assert device_lens == host_lens == lens.tolist()
    assert all(1 <= int(lp) <= page_size for p, lp in zip(want_pages, last) if p)
    want_ids = torch.cat([table[b, :p] for b, p in enumerate(want_pages)])
    assert torch.equal(table.view(-1)[flat], want_ids)
    assert (indptr.dtype, last.dtype) == (torch.int32, torch.int32)


_E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def _decode(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """MXFP4 bytes ``[..., K/2]`` + E8M0 ``[..., K/32]`` -> float64 ``[..., K]`` (spec decoder)."""
    nib = torch.stack([codes & 0xF, codes >> 4], dim=-1).flatten(-2).long()
    val = _E2M1[nib & 7] * torch.where(nib >= 8, -1.0, 1.0)
    scale = torch.exp2(scales.double() - 127).repeat_interleave(32, dim=-1)
    return val * scale


def _mxfp4_weights(e, h, i, *, bias, interleaved, w13_bias=True, w2_bias=True, seed=0) -> MoEWeights:
    g = torch.Generator().manual_seed(seed)
    u8 = lambda *s, lo=0, hi=256: torch.randint(lo, hi, s, generator=g, dtype=torch.int32).to(torch.uint8)
    b = lambda *s: torch.randn(*s, generator=g).to(torch.bfloat16)
    return MoEWeights(
        w13=u8(e, 2 * i, h // 2), w2=u8(e, h, i // 2), format="mxfp4",
        w13_scale=u8(e, 2 * i, h // 32, lo=120, hi=130), w2_scale=u8(e, h, i // 32, lo=120, hi=130),
        w13_bias=b(e, 2 * i) if bias and w13_bias else None, w2_bias=b(e, h) if bias and w2_bias else None,
        gate_up_interleaved=interleaved,
    )  # fmt: skip


def _expert_canonical(x, w: MoEWeights, e: int, act: MoEActivation) -> torch.Tensor:
    """Our op's definition (ops/moe.py) for one expert, float64."""
    h = x @ _decode(w.w13[e], w.w13_scale[e]).T
    if w.w13_bias is not None:
        h = h + w.w13_bias[e].double()
    gate, up = (h[:, 0::2], h[:, 1::2]) if w.gate_up_interleaved else h.chunk(2, dim=-1)
    gate, up = gate.clamp(max=act.limit), up.clamp(-act.limit, act.limit)
    y = (up + act.up_offset) * gate * torch.sigmoid(act.alpha * gate)
    out = y @ _decode(w.w2[e], w.w2_scale[e]).T
    return out + w.w2_bias[e].double() if w.w2_bias is not None else out


def _expert_flashinfer(x, p, e: int, act: MoEActivation) -> torch.Tensor:
    """The same expert on the padded [up; gate] layout, as FlashInfer's SwigluBias kernel reads it."""
    hp, ip = p.w2.shape[1], p.w2.shape[2] * 2
    xp = torch.nn.functional.pad(x, (0, hp - x.shape[1]))
    h = xp @ _decode(p.w13[e], p.w13_scale[e]).T
    if p.w13_bias is not None:
        h = h + p.w13_bias[e].double()
    up, gate = h[:, :ip], h[:, ip:]  # linear first, the gate inter_size later
    gate = gate.clamp(max=act.limit)
    y = gate * torch.sigmoid(gate * act.alpha) * (up.clamp(-act.limit, act.limit) + act.up_offset)
    out = y @ _decode(p.w2[e], p.w2_scale[e]).T
    if p.w2_bias is not None:
        out = out + p.w2_bias[e].double()
    return out[:, : x.shape[1]]


@pytest.mark.parametrize(
    "interleaved,bias,w2_bias", [(True, True, True), (False, True, True), (True, False, False), (False, True, False)]
)
def test_moe_padding_and_gate_up_order_preserve_the_expert(interleaved, bias, w2_bias):
    e, h, i = 2, 96, 160  # both pad: 96 -> 128, 160 -> 256
    w = _mxfp4_weights(e, h, i, bias=bias, interleaved=interleaved, w2_bias=w2_bias, seed=3)
    p = moe_padded(w)
    assert (p.hidden, p.intermediate) == (h, i)
    assert p.w13.shape == (e, 512, 64) and p.w13_scale.shape == (e, 512, 4)
    assert p.w2.shape == (e, 128, 128) and p.w2_scale.shape == (e, 128, 8)
    if bias:
        assert p.w13_bias.shape == (e, 512) and p.w2_bias.shape == (e, 128)
        assert p.w13_bias.dtype == p.w2_bias.dtype == torch.bfloat16
        if not w2_bias:
            assert not p.w2_bias.any()  # the kernel takes both biases; the missing one is zeros
    else:
        assert p.w13_bias is None and p.w2_bias is None
    x = torch.randn(5, h, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    act = MoEActivation()
    for expert in range(e):
        want = _expert_canonical(x, w, expert, act)
        got = _expert_flashinfer(x, p, expert, act)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-9)


def test_moe_padding_is_a_no_op_on_aligned_shapes():
    w = _mxfp4_weights(1, 128, 128, bias=False, interleaved=False, seed=5)
    p = moe_padded(w)
    assert torch.equal(p.w13, torch.cat([w.w13[:, 128:], w.w13[:, :128]], dim=1))  # [up; gate]
    assert torch.equal(p.w2, w.w2) and torch.equal(p.w2_scale, w.w2_scale)


# --- JIT cache location and first-use messages ---------------------------------------------


def test_cache_env_maps_onto_flashinfers_before_import(monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    monkeypatch.delenv(_jit.FLASHINFER_CACHE_ENV, raising=False)
    monkeypatch.setenv(_jit.CACHE_ENV, str(tmp_path))
    _jit.apply_cache_env()
    assert _jit.FLASHINFER_CACHE_ENV == "FLASHINFER_WORKSPACE_BASE"
    assert __import__("os").environ["FLASHINFER_WORKSPACE_BASE"] == str(tmp_path)
    assert _jit.cache_dir() == str(tmp_path / ".cache" / "flashinfer")


def test_cache_env_overrides_flashinfers_variable_loudly(monkeypatch, tmp_path, caplog):
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    monkeypatch.setenv(_jit.FLASHINFER_CACHE_ENV, "/elsewhere")
    monkeypatch.setenv(_jit.CACHE_ENV, str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="tokenspeed_kernel.flashinfer"):
        _jit.apply_cache_env()
    assert __import__("os").environ["FLASHINFER_WORKSPACE_BASE"] == str(tmp_path)
    assert [r.getMessage() for r in caplog.records] == [
        f"TOKENSPEED_FLASHINFER_CACHE={tmp_path} overrides FLASHINFER_WORKSPACE_BASE=/elsewhere"
    ]


def test_cache_env_after_flashinfer_import_is_reported_not_applied(monkeypatch, tmp_path, caplog):
    env_mod = types.SimpleNamespace(FLASHINFER_BASE_DIR="/home/u", FLASHINFER_JIT_DIR="/home/u/.cache/flashinfer/x")
    monkeypatch.setitem(sys.modules, "flashinfer", types.ModuleType("flashinfer"))
    monkeypatch.setitem(sys.modules, "flashinfer.jit.env", env_mod)
    monkeypatch.delenv(_jit.FLASHINFER_CACHE_ENV, raising=False)
    monkeypatch.setenv(_jit.CACHE_ENV, str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="tokenspeed_kernel.flashinfer"):
        _jit.apply_cache_env()
    assert "FLASHINFER_WORKSPACE_BASE" not in __import__("os").environ
    (msg,) = [r.getMessage() for r in caplog.records]
    assert msg.startswith(f"TOKENSPEED_FLASHINFER_CACHE={tmp_path} is ignored: FlashInfer was imported before")
    assert _jit.cache_dir() == "/home/u/.cache/flashinfer/x"  # FlashInfer's own answer once imported


def test_first_use_announces_each_module_once(monkeypatch, tmp_path, caplog):
    monkeypatch.delitem(sys.modules, "flashinfer.jit.env", raising=False)
    monkeypatch.setenv(_jit.CACHE_ENV, str(tmp_path))
    _jit._reset_for_tests()
    with caplog.at_level(logging.INFO, logger="tokenspeed_kernel.flashinfer"):
        with _jit.first_use("batch decode bf16 head_dim=64"):
            pass
        with _jit.first_use("batch decode bf16 head_dim=64"):
            pass
        with _jit.first_use("rmsnorm bfloat16"):
            pass
    msgs = [(r.levelno, r.getMessage()) for r in caplog.records]
    cache = tmp_path / ".cache" / "flashinfer"
    assert msgs[0] == (
        logging.WARNING,
        "FlashInfer is compiling batch decode bf16 head_dim=64 (skipped if already cached); "
        f"this can take minutes; cache at {cache}",
    )
    assert msgs[1][0] == logging.INFO and msgs[1][1].startswith("FlashInfer batch decode bf16 head_dim=64 ready after")
    assert msgs[2][1].startswith("FlashInfer is compiling rmsnorm bfloat16")
    assert len(msgs) == 4


# --- wrapper glue against a FlashInfer stand-in ----------------------------------------------
#
# A stand-in ``flashinfer`` module whose wrapper classes take the 0.7.4 signatures (a renamed or
# misplaced argument raises TypeError) and compute with the reference from the metadata they were
# planned with, reading the page ids at run time like FlashInfer. It checks the glue (metadata
# conversion, plan reuse, sinks/soft-cap routing, lse base, out=, MoE padding): not FlashInfer.

_LN2 = math.log(2.0)


class _FakeRagged:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None,
                 jit_kwargs=None, variant_owns_mask=False):  # fmt: skip
        assert kv_layout == "NHD" and not use_cuda_graph
        self.plans = 0

    def plan(self, qo_indptr, kv_indptr, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo=None,
             custom_mask=None, packed_custom_mask=None, causal=False, pos_encoding_mode="NONE",
             use_fp16_qk_reduction=False, window_left=-1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
             rope_theta=None, q_data_type="float16", kv_data_type=None, o_data_type=None, non_blocking=True,
             **more):  # fmt: skip
        self.plans += 1
        self.p = dict(qo=qo_indptr.to("cpu"), kv=kv_indptr.to("cpu"), causal=causal, window_left=window_left,
                      cap=logits_soft_cap or 0.0, scale=sm_scale)  # fmt: skip

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None, return_lse=False,
            lse_base="log2", lse_layout="NH", enable_pdl=None, window_left=None, sinks=None, **more):  # fmt: skip
        assert not args and sinks is None
        return _fake_attend(q, k, v, self.p["qo"], self.p["kv"], self.p, None, out, return_lse, lse_base)


def _fake_attend(q, k, v, qo, kv, p, sinks, out, return_lse, lse_base):
    from tokenspeed_kernel.reference.attention import mha_prefill as ref

    o, lse = ref(q, k, v, qo.int(), kv.int(), 0, 0, causal=p["causal"], window_left=p["window_left"], sinks=sinks,
                 softmax_scale=p["scale"], logit_cap=p["cap"], return_lse=True, out=out)  # fmt: skip
    return (o, lse if lse_base == "ln" else lse / _LN2) if return_lse else o


class _FakePaged:
    sink_variant = False

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", jit_args=None, jit_kwargs=None,
                 variant_owns_mask=False, max_total_num_rows=None):  # fmt: skip
        assert kv_layout == "NHD" and not use_cuda_graph
        self.plans = 0

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads, num_kv_heads,
             head_dim_qk, page_size, head_dim_vo=None, custom_mask=None, packed_custom_mask=None, causal=False,
             pos_encoding_mode="NONE", use_fp16_qk_reduction=False, sm_scale=None, window_left=-1,
             logits_soft_cap=None, rope_scale=None, rope_theta=None, q_data_type="float16", kv_data_type=None,
             o_data_type=None, non_blocking=True, **more):  # fmt: skip
        self.plans += 1
        # Like FlashInfer: host copies of the CSR arrays, the page ids kept as the (device) tensor given.
        self.p = dict(qo=qo_indptr.to("cpu"), indptr=paged_kv_indptr.to("cpu"), last=paged_kv_last_page_len.to("cpu"),
                      indices=paged_kv_indices, page_size=page_size, causal=causal, window_left=window_left,
                      cap=logits_soft_cap or 0.0, scale=sm_scale)  # fmt: skip

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, lse_base="log2", lse_layout="NH", enable_pdl=None, window_left=None, sinks=None,
            **more):  # fmt: skip
        p, sink = self.p, None
        if self.sink_variant:
            sink, scale = args
            assert scale == p["scale"] and sinks is None
        else:
            assert not args and sinks is None  # fa2/fa3 would ignore a sinks= keyword
        k, v, kv = _fake_gather(paged_kv_cache, p)
        return _fake_attend(q, k, v, p["qo"], kv, p, sink, out, return_lse, lse_base)


def _fake_gather(paged_kv_cache, p):
    k_cache, v_cache = paged_kv_cache
    ks, vs, lens = [], [], []
    for b in range(p["indptr"].numel() - 1):
        ids = p["indices"][int(p["indptr"][b]) : int(p["indptr"][b + 1])].long()
        n = 0 if ids.numel() == 0 else (ids.numel() - 1) * p["page_size"] + int(p["last"][b])
        ks.append(k_cache[ids].flatten(0, 1)[:n])
        vs.append(v_cache[ids].flatten(0, 1)[:n])
        lens.append(n)
    return torch.cat(ks), torch.cat(vs), torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])


class _FakeSinkPaged(_FakePaged):
    sink_variant = True

    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, qo_indptr_buf=None,
                 paged_kv_indptr_buf=None, paged_kv_indices_buf=None, paged_kv_last_page_len_buf=None,
                 custom_mask_buf=None, mask_indptr_buf=None, backend="auto", pos_encoding_mode="NONE",
                 use_fp16_qk_reduction=False, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
                 head_dim_qk=128, head_dim_vo=128, window_left=-1):  # fmt: skip
        super().__init__(float_workspace_buffer, kv_layout)
        self.swa = window_left >= 0

    def plan(self, *args, **kwargs):
        assert "logits_soft_cap" not in kwargs
        super().plan(*args, **kwargs)
        assert (self.p["window_left"] >= 0) == self.swa  # the JIT variant is built for one mode


class _FakeDecode(_FakePaged):
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None, paged_kv_last_page_len_buffer=None,
                 backend="auto", jit_args=None, jit_kwargs=None):  # fmt: skip
        assert kv_layout == "NHD" and not use_cuda_graph
        self.plans = 0

    _PLAN_KW = frozenset({"pos_encoding_mode", "window_left", "window_right", "logits_soft_cap", "q_data_type", "kv_data_type",
                "o_data_type", "data_type", "sm_scale", "rope_scale", "rope_theta", "non_blocking"})  # fmt: skip

    def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
             *deprecated_positional_args, **kwargs):  # fmt: skip
        assert not deprecated_positional_args and set(kwargs) <= self._PLAN_KW, kwargs
        batch = indptr.numel() - 1
        qo = torch.arange(batch + 1)
        _FakePaged.plan(self, qo, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                        causal=True, **{k: v for k, v in kwargs.items() if k != "window_right"})  # fmt: skip

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse=False, enable_pdl=None, window_left=None, sinks=None, q_len_per_req=None, **more):  # fmt: skip
        # No lse_base here (as FlashInfer's decode run): base-2 lse.
        return _FakePaged.run(self, q, paged_kv_cache, *args, out=out, return_lse=return_lse, lse_base="log2",
                              sinks=sinks)  # fmt: skip


class _FakeSinkDecode(_FakeDecode):
    sink_variant = True

    def __init__(self, float_workspace_buffer, kv_layout="NHD", backend="auto", q_data_type=torch.bfloat16,
                 kv_data_type=torch.bfloat16, head_dim_qk=128, head_dim_vo=128, window_left=-1, **kwargs):  # fmt: skip
        super().__init__(float_workspace_buffer, kv_layout, **kwargs)
        self.swa = window_left >= 0

    def plan(self, *args, **kwargs):
        assert "logits_soft_cap" not in kwargs
        super().plan(*args, **kwargs)
        assert (self.p["window_left"] >= 0) == self.swa


def _fake_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    assert input.dim() == 2 and weight.dtype == input.dtype and out.shape == input.shape
    x = input.float()
    out.copy_((x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(out.dtype))
    return out


def _fake_interleave_scales(scales, group_size=32):
    return scales.clone()  # stand-in for the real folding: identity, so the fake MoE can decode it


def _fake_cutlass_fused_moe(input, token_selected_experts, token_final_scales, fc1_expert_weights,
                            fc2_expert_weights, output_dtype, quant_scales, fc1_expert_biases=None,
                            fc2_expert_biases=None, input_sf=None, swiglu_alpha=None, swiglu_beta=None,
                            swiglu_limit=None, tp_size=1, tp_rank=0, ep_size=1, ep_rank=0, cluster_size=1,
                            cluster_rank=0, output=None, enable_alltoall=False, use_deepseek_fp8_block_scale=False,
                            use_w4_group_scaling=False, activation_type=None, **more):  # fmt: skip
    assert use_w4_group_scaling and output_dtype == torch.bfloat16 and input.dtype == torch.bfloat16
    assert (fc1_expert_biases is None) == (fc2_expert_biases is None)  # both or neither
    assert token_selected_experts.dtype == torch.int32 and token_final_scales.dtype == torch.float32
    hp, ip = fc2_expert_weights.shape[1], fc2_expert_weights.shape[2] * 2
    assert input.shape[1] == hp and output.shape == (input.shape[0], hp)
    s1, s2 = (s.view(torch.uint8) for s in quant_scales)
    pick = lambda t, x: None if t is None else t[x].double()
    alpha, beta, limit = pick(swiglu_alpha, 0), pick(swiglu_beta, 0), pick(swiglu_limit, 0)
    res = torch.zeros(input.shape[0], hp, dtype=torch.float64)
    for t in range(input.shape[0]):
        for x_e, w in zip(token_selected_experts[t].tolist(), token_final_scales[t].tolist()):
            h = input[t].double() @ _decode(fc1_expert_weights[x_e], s1[x_e]).T
            if fc1_expert_biases is not None:
                h = h + fc1_expert_biases[x_e].double()
            up, gate = h[:ip], h[ip:]
            if limit is not None:
                gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
            a = 1.0 if alpha is None else alpha
            y = gate * torch.sigmoid(a * gate) * (up + (0.0 if beta is None else beta))
            o = y.to(torch.bfloat16).double() @ _decode(fc2_expert_weights[x_e], s2[x_e]).T
            if fc2_expert_biases is not None:
                o = o + fc2_expert_biases[x_e].double()
            res[t] += w * o
    output.copy_(res.to(output.dtype))
    return output


def _fake_flashinfer() -> types.ModuleType:
    fi = types.ModuleType("flashinfer")
    fi.BatchPrefillWithRaggedKVCacheWrapper = _FakeRagged
    fi.BatchPrefillWithPagedKVCacheWrapper = _FakePaged
    fi.BatchAttentionWithAttentionSinkWrapper = _FakeSinkPaged
    fi.BatchDecodeWithPagedKVCacheWrapper = _FakeDecode
    fi.BatchDecodeWithAttentionSinkWrapper = _FakeSinkDecode
    fi.rmsnorm = _fake_rmsnorm
    fi.cutlass_fused_moe = _fake_cutlass_fused_moe
    fi.ActivationType = types.SimpleNamespace(Swiglu=3)
    fi.fused_moe = types.SimpleNamespace(
        interleave_moe_weights_for_sm90_mixed_gemm=lambda w, quant_type="fp4": w.clone(),
        interleave_moe_scales_for_sm90_mixed_gemm=_fake_interleave_scales,
    )
    return fi


_WRAPPER_MODULES = tuple(f"tokenspeed_kernel_nvidia.flashinfer.{m}" for m in ("attention", "norm", "moe"))


@pytest.fixture
def fake_flashinfer(monkeypatch, with_flashinfer):
    import tokenspeed_kernel_nvidia.flashinfer as pkg

    monkeypatch.setitem(sys.modules, "flashinfer", _fake_flashinfer())
    monkeypatch.delenv(_jit.CACHE_ENV, raising=False)
    with tk.fake_platform("sm90"):
        yield
    for name in _WRAPPER_MODULES:  # drop the modules bound to the stand-in
        sys.modules.pop(name, None)
        if hasattr(pkg, name.rsplit(".", 1)[1]):
            delattr(pkg, name.rsplit(".", 1)[1])


def _glue_close(got, want, what):
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=1e-5, msg=what)


def _cpu_cache(lens, page_size, hkv=2, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // page_size) for n in lens]
    total = sum(pages) + 3
    perm = torch.randperm(total, generator=g)
    k_cache = torch.randn(total, page_size, hkv, d, generator=g).bfloat16()
    v_cache = torch.randn(total, page_size, hkv, d, generator=g).bfloat16()
    table = torch.zeros(len(lens), max(pages) + 1, dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[at : at + n].int()
        at += n
    return k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("sinks", [False, True])
def test_glue_prefill(fake_flashinfer, sinks):
    g = torch.Generator().manual_seed(1)
    qlens, klens = [3, 1, 9], [3, 5, 9]
    q = torch.randn(sum(qlens), 8, 64, generator=g).bfloat16()
    k, v = (torch.randn(sum(klens), 2, 64, generator=g).bfloat16() for _ in range(2))
    cu = lambda ls: torch.tensor([0, *torch.tensor(ls).cumsum(0).tolist()], dtype=torch.int32)
    args = (q, k, v, cu(qlens), cu(klens), 9, 9)
    kw = dict(window_left=2, sinks=torch.randn(8, generator=g) if sinks else None, return_lse=True)
    if not sinks:
        kw["logit_cap"] = 5.0
    got, lse = tk.mha_prefill(*args, **kw, solution="flashinfer")
    want, want_lse = tk.mha_prefill(*args, **kw, solution="reference")
    _glue_close(got, want, "out")
    _glue_close(lse, want_lse, "lse (natural log)")


@pytest.mark.parametrize("sinks", [False, True])
def test_glue_extend_and_plan_reuse(fake_flashinfer, sinks):
    from tokenspeed_kernel_nvidia.flashinfer import attention

    g = torch.Generator().manual_seed(2)
    k_cache, v_cache, table, lens = _cpu_cache([20, 3, 40], 16)
    qlens = [4, 3, 1]
    q = torch.randn(sum(qlens), 8, 64, generator=g).bfloat16()
    cu_q = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
    kw = dict(window_left=-1 if sinks else 7, sinks=torch.randn(8, generator=g) if sinks else None, return_lse=True)
    call = lambda t, sol, **extra: tk.mha_extend_with_kvcache(q, k_cache, v_cache, t, lens, cu_q, 4, **kw, **extra,
                                                              solution=sol)  # fmt: skip
    out = torch.empty_like(q)
    got, lse = call(table, "flashinfer", out=out)
    assert got is out
    want, want_lse = call(table, "reference")
    _glue_close(got, want, "out")
    _glue_close(lse, want_lse, "lse")
    (entry,) = [e for e in attention._wrappers.values() if e.wrapper.plans]
    # Same lengths, every page moved: the plan is reused and the page ids follow the new table.
    perm = torch.randperm(k_cache.shape[0], generator=g)
    k2, v2 = torch.empty_like(k_cache), torch.empty_like(v_cache)
    k2[perm], v2[perm] = k_cache, v_cache
    moved = perm[table.long()].int()
    assert not torch.equal(moved, table)
    again = tk.mha_extend_with_kvcache(q, k2, v2, moved, lens, cu_q, 4, **kw, solution="flashinfer")
    assert entry.wrapper.plans == 1
    _glue_close(again[0], want, "reused plan")


@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("page_size", [1, 16])
def test_glue_decode(fake_flashinfer, sinks, page_size):
    g = torch.Generator().manual_seed(3)
    k_cache, v_cache, table, lens = _cpu_cache([1, 17, 40], page_size)
    q = torch.randn(3, 8, 64, generator=g).bfloat16()
    kw = dict(window_left=5, sinks=torch.randn(8, generator=g) if sinks else None, return_lse=True)
    got, lse = tk.mha_decode_with_kvcache(q, k_cache, v_cache, table, lens, **kw, solution="flashinfer")
    want, want_lse = tk.mha_decode_with_kvcache(q, k_cache, v_cache, table, lens, **kw, solution="reference")
    _glue_close(got, want, "out")
    _glue_close(lse, want_lse, "lse rescaled from base 2")


def test_glue_rmsnorm(fake_flashinfer):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 64, generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(64, generator=g)).bfloat16()
    out = torch.empty(2, 3, 128, dtype=torch.bfloat16)[..., :64]  # rows not flattenable: via a temporary
    got = tk.rmsnorm(x, w, 1e-5, out=out, solution="flashinfer")
    assert got is out
    _glue_close(got, tk.rmsnorm(x, w, 1e-5, solution="reference"), "rmsnorm")


@pytest.mark.parametrize("act", [MoEActivation(), MoEActivation.silu()])
def test_glue_moe_apply(fake_flashinfer, act):
    w = _mxfp4_weights(4, 96, 160, bias=True, interleaved=True, w2_bias=False, seed=6)
    plan = tk.moe_plan(w, act, dtype=torch.bfloat16, device="cpu", solution="flashinfer")
    processed = tk.moe_process_weights(plan, w)
    assert processed.layout == "flashinfer.moe_apply" and processed.extra == (96, 160)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 96, generator=g).bfloat16()
    topk_w, topk_ids = tk.moe_route(torch.randn(5, 4, generator=g), 2, solution="reference")
    got = tk.moe_apply(x, topk_w, topk_ids, processed, act, plan=plan)
    want = tk.moe_apply(x, topk_w, topk_ids, w, act, solution="reference")
    assert got.shape == (5, 96)
    # The stand-in rounds the activation to bf16 before the second GEMM, as the kernel does.
    rel = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert rel < 1e-2, rel

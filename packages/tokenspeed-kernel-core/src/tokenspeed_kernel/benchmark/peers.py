"""External peers: libraries a kernel is compared with, never selectable.

A peer is timed next to the registered kernels on the same case (its inputs are
converted from the case's call outside the timed region) and shown in reports,
but it is not in the kernel registry, so selection never picks it. Built-in
peers:

- ``mha_prefill``: ``torch.sdpa[flash]`` and ``torch.sdpa[cudnn]`` (equal-length
  batches only, no window; sinks are not supported, so a case with sinks is timed
  without them and says so), and FlashAttention-3 ``flash_attn_varlen_func``
  (package ``tokenspeed-fa3``, import ``flash_attn_interface``) when importable;
- ``mha_decode_with_kvcache`` / ``mha_extend_with_kvcache``: FA3 ``flash_attn_with_kvcache``;
- ``moe_experts`` / ``moe_apply``: ``torch._grouped_mm`` with bf16 weights (quantized
  weights are dequantized first: the bf16 baseline PERFORMANCE.md compares with);
- ``mm``: ``torch.mm`` (dense; MXFP4 weights dequantized to bf16) and
  ``torch._scaled_mm`` (FP8 per tensor, per token x per channel);
- ``rmsnorm``: ``torch.nn.functional.rms_norm`` (residual added unfused).

FA3's sink argument is found by inspecting the function's signature at run time
(``sinks``, ``learnable_sink`` or ``s_aux``); a build without one is timed
without sinks and the report says "no sinks". Third parties add peers with
:func:`register_peer`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..numerics.cases import Case

__all__ = ["Peer", "PeerCall", "PeerSkip", "register_peer", "peers_for", "all_peers"]


class PeerSkip(Exception):
    """The peer cannot run this case (the message says why)."""


@dataclass
class PeerCall:
    """A prepared peer call: ``fn()`` runs it; ``context`` (optional) wraps the whole timing."""

    fn: Callable[[], Any]
    note: str = ""
    context: Callable[[], contextlib.AbstractContextManager] | None = None


@dataclass
class Peer:
    name: str
    op: str
    prepare: Callable[[Case, dict[str, Any], torch.device], PeerCall]
    #: None if the peer can run on this device, else why not.
    available: Callable[[torch.device], str | None] = lambda device: None
    doc: str = ""


_PEERS: dict[str, list[Peer]] = {}


def register_peer(peer: Peer) -> Peer:
    """Add an external comparator for ``peer.op`` (replaces one of the same name)."""
    peers = [p for p in _PEERS.get(peer.op, []) if p.name != peer.name]
    _PEERS[peer.op] = [*peers, peer]
    return peer


def peers_for(op: str) -> list[Peer]:
    return list(_PEERS.get(op, []))


def all_peers() -> dict[str, list[Peer]]:
    return {op: list(p) for op, p in _PEERS.items()}


def _needs_cuda(device: torch.device) -> str | None:
    return None if device.type == "cuda" else "needs a CUDA device"


# ---------------------------------------------------------------------------
# Attention


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

    return Peer(f"torch.sdpa[{backend_name.lower().replace('_attention', '')}]", "mha_prefill", prepare, available,
                f"torch scaled_dot_product_attention, {backend_name} backend")  # fmt: skip


def _fa3_available(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "needs a CUDA device"
    if importlib.util.find_spec("flash_attn_interface") is None:
        return "flash_attn_interface (tokenspeed-fa3) is not installed"
    return None


_SINK_NAMES = ("sinks", "learnable_sink", "s_aux", "sink")


def _fa3_kwargs(fn: Callable[..., Any], case: Case, call: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """Keyword arguments for the common options, by the names this FA3 build's signature has."""
    params = inspect.signature(fn).parameters
    kw: dict[str, Any] = {"softmax_scale": call["softmax_scale"]}
    notes = []
    causal = case.get("causal", True)
    if "causal" in params:
        kw["causal"] = causal
    w = case["window_left"]
    if w >= 0:
        right = 0 if causal else -1
        if "window_size" in params:
            kw["window_size"] = (w, right)
        elif "window_size_left" in params:
            kw.update(window_size_left=w, window_size_right=right)
        else:
            raise PeerSkip("this flash_attn_interface has no window argument")
    if case["logit_cap"]:
        if "softcap" not in params:
            raise PeerSkip("this flash_attn_interface has no softcap argument")
        kw["softcap"] = case["logit_cap"]
    if case["sinks"]:
        name = next((n for n in _SINK_NAMES if n in params), None)
        if name is None:
            notes.append("no sinks (this flash_attn_interface takes none)")
        else:
            # FA3 builds take sinks in the q dtype (bf16): cast once, outside the timed call.
            kw[name] = call["sinks"].to(call["q"].dtype)
    return kw, ", ".join(notes)


def _fa3_prefill(case: Case, call: dict[str, Any], device: torch.device) -> PeerCall:
    import flash_attn_interface as fa

    f = fa.flash_attn_varlen_func
    kw, note = _fa3_kwargs(f, case, call)
    args = (
        call["q"],
        call["k"],
        call["v"],
        call["cu_seqlens_q"],
        call["cu_seqlens_k"],
        call["max_seqlen_q"],
        call["max_seqlen_k"],
    )
    return PeerCall(lambda: f(*args, **kw), note)


def _fa3_paged(decode: bool) -> Callable[[Case, dict[str, Any], torch.device], PeerCall]:
    def prepare(case: Case, call: dict[str, Any], device: torch.device) -> PeerCall:
        import flash_attn_interface as fa

        f = fa.flash_attn_with_kvcache
        params = inspect.signature(f).parameters
        kw, note = _fa3_kwargs(f, case, call)
        table = "page_table" if "page_table" in params else "block_table"
        kw.update({"cache_seqlens": call["cache_seqlens"], table: call["page_table"]})
        if decode:
            q = call["q"].unsqueeze(1)
            kw["causal"] = True
        else:
            lens = tuple(case["q_lens"])
            if "cu_seqlens_q" in params:
                q = call["q"]
                kw.update(cu_seqlens_q=call["cu_seqlens_q"], max_seqlen_q=call["max_seqlen_q"])
            elif len(set(lens)) == 1:
                q = call["q"].view(len(lens), lens[0], *call["q"].shape[1:])
            else:
                raise PeerSkip("this flash_attn_with_kvcache takes no cu_seqlens_q and the query lengths differ")
        return PeerCall(lambda: f(q, call["k_cache"], call["v_cache"], **kw), note)

    return prepare


# ---------------------------------------------------------------------------
# MoE and GEMM


def _dense_weights(weights: Any) -> tuple[torch.Tensor, torch.Tensor, str]:
    """bf16 ``w13 [E, 2I, H]``, ``w2 [E, H, I]`` of (canonical) MoE weights; note if dequantized."""
    from ..reference.moe import dequantize_expert_weights

    if weights.format in ("bf16", "fp16", "fp32"):
        return weights.w13.to(torch.bfloat16), weights.w2.to(torch.bfloat16), ""
    pairs = [dequantize_expert_weights(weights, e) for e in range(weights.num_experts)]
    w13 = torch.stack([p[0] for p in pairs]).to(torch.bfloat16)
    w2 = torch.stack([p[1] for p in pairs]).to(torch.bfloat16)
    return w13, w2, f"bf16 weights ({weights.format} dequantized)"


def _swiglu(h: torch.Tensor, activation: Any, interleaved: bool) -> torch.Tensor:
    gate, up = (h[..., 0::2], h[..., 1::2]) if interleaved else h.chunk(2, dim=-1)
    if activation.kind == "silu":
        return torch.nn.functional.silu(gate) * up
    if activation.limit is not None:
        gate = gate.clamp(max=activation.limit)
        up = up.clamp(min=-activation.limit, max=activation.limit)
    return (up + activation.up_offset) * gate * torch.sigmoid(activation.alpha * gate)


class _GroupedExperts:
    """Both expert GEMMs with ``torch._grouped_mm`` on bf16 weights, the activation in torch ops."""

    def __init__(self, weights: Any, activation: Any) -> None:
        if not hasattr(torch, "_grouped_mm"):
            raise PeerSkip("this torch has no _grouped_mm")
        w13, w2, self.note = _dense_weights(weights)
        # _grouped_mm takes the second operand as [E, K, N] with K-major storage: a transposed view.
        self.w13t = w13.transpose(1, 2)
        self.w2t = w2.transpose(1, 2)
        self.b13 = None if weights.w13_bias is None else weights.w13_bias.to(torch.bfloat16)
        self.b2 = None if weights.w2_bias is None else weights.w2_bias.to(torch.bfloat16)
        self.activation = activation
        self.interleaved = weights.gate_up_interleaved
        self.num_experts = weights.num_experts

    def __call__(self, rows: torch.Tensor, ends: torch.Tensor, row_expert: torch.Tensor | None) -> torch.Tensor:
        h = torch._grouped_mm(rows, self.w13t, offs=ends)
        if self.b13 is not None and row_expert is not None:
            h = h + self.b13[row_expert]
        y = _swiglu(h.float(), self.activation, self.interleaved).to(torch.bfloat16)
        out = torch._grouped_mm(y, self.w2t, offs=ends)
        if self.b2 is not None and row_expert is not None:
            out = out + self.b2[row_expert]
        return out


def _grouped_experts(case: Case, call: dict[str, Any], device: torch.device) -> PeerCall:
    experts = _GroupedExperts(call["weights"], call["activation"])
    rows = call["hidden"].to(torch.bfloat16)
    offs = call["expert_offsets"]
    ends = offs[1:].contiguous()
    counts = (offs[1:] - offs[:-1]).long()
    row_expert = torch.repeat_interleave(torch.arange(experts.num_experts, device=offs.device), counts)
    return PeerCall(lambda: experts(rows, ends, row_expert), experts.note)


def _grouped_apply(case: Case, call: dict[str, Any], device: torch.device) -> PeerCall:
    experts = _GroupedExperts(call["weights"], call["activation"])
    x = call["x"].to(torch.bfloat16)
    ids, w = call["topk_ids"], call["topk_weights"]
    k, e = ids.shape[1], experts.num_experts
    ones = torch.ones(ids.numel(), dtype=torch.int32, device=ids.device)

    def fn() -> torch.Tensor:
        # Routing metadata is part of the timed work, built without a host sync.
        flat = ids.flatten().long()
        order = flat.argsort(stable=True)
        counts = torch.zeros(e, dtype=torch.int32, device=ids.device).scatter_add_(0, flat, ones)
        ends = counts.cumsum(0, dtype=torch.int32)
        token = order // k
        y = experts(x[token], ends, flat[order])
        y = y * w.flatten()[order, None].to(y.dtype)
        return torch.zeros_like(x).index_add_(0, token, y)

    return PeerCall(fn, experts.note)


def _torch_mm(case: Case, call: dict[str, Any], device: torch.device) -> PeerCall:
    fmt = case["b_format"]
    if fmt.startswith("fp8"):
        raise PeerSkip("fp8 operands: see torch._scaled_mm")
    a, b, bias = call["a"], call["b"], call.get("bias")
    note = ""
    if fmt == "mxfp4":
        from ..reference.quantization import mxfp4_to_float

        b = mxfp4_to_float(b, call["b_scale"]).to(a.dtype)
        note = "bf16 weights (mxfp4 dequantized)"
    bt = b.t()
    if bias is not None:
        bias = bias.to(a.dtype)
        return PeerCall(lambda: torch.addmm(bias, a, bt), note)
    return PeerCall(lambda: torch.mm(a, bt), note)


def _scaled_mm(case: Case, call: dict[str, Any], device: torch.device) -> PeerCall:
    fmt = case["b_format"]
    if fmt not in ("fp8_e4m3:per_tensor", "fp8_e4m3:per_token"):
        raise PeerSkip("torch._scaled_mm here: FP8 per tensor or per token x per channel only")
    a, b = call["a"], call["b"]
    a_scale = call["a_scale"].reshape(()) if fmt.endswith("per_tensor") else call["a_scale"]
    b_scale = call["b_scale"].reshape(()) if fmt.endswith("per_tensor") else call["b_scale"].reshape(1, -1)
    bias = call.get("bias")
    out_dtype = call.get("out_dtype") or torch.bfloat16
    bias = None if bias is None else bias.to(out_dtype)
    bt = b.t()
    return PeerCall(lambda: torch._scaled_mm(a, bt, scale_a=a_scale, scale_b=b_scale, bias=bias, out_dtype=out_dtype))


def _torch_rms_norm(case: Case, call: dict[str, Any], device: torch.device) -> PeerCall:
    x, w, eps = call["x"], call["weight"].to(call["x"].dtype), call["eps"]
    res = call.get("residual")
    shape = (x.shape[-1],)
    f = torch.nn.functional.rms_norm
    if res is None:
        return PeerCall(lambda: f(x, shape, w, eps))
    return PeerCall(lambda: f(x + res, shape, w, eps), "residual added unfused")


def _register_builtin() -> None:
    for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
        register_peer(_sdpa_peer(backend))
    register_peer(Peer("fa3", "mha_prefill", _fa3_prefill, _fa3_available, "FlashAttention-3 flash_attn_varlen_func"))
    register_peer(
        Peer("fa3", "mha_decode_with_kvcache", _fa3_paged(True), _fa3_available, "FA3 flash_attn_with_kvcache")
    )
    register_peer(
        Peer("fa3", "mha_extend_with_kvcache", _fa3_paged(False), _fa3_available, "FA3 flash_attn_with_kvcache")
    )
    register_peer(Peer("torch._grouped_mm", "moe_experts", _grouped_experts, doc="bf16 grouped GEMMs"))
    register_peer(Peer("torch._grouped_mm", "moe_apply", _grouped_apply, doc="sort + bf16 grouped GEMMs + index_add"))
    register_peer(Peer("torch.mm", "mm", _torch_mm, doc="cuBLAS (or the CPU BLAS)"))
    register_peer(Peer("torch._scaled_mm", "mm", _scaled_mm, _needs_cuda, "cuBLASLt FP8"))
    register_peer(Peer("torch.rms_norm", "rmsnorm", _torch_rms_norm, doc="torch.nn.functional.rms_norm"))


_register_builtin()

"""Cases for the MoE ops: route, dispatch, experts, combine, fused apply.

Expert weights are built in fp32 and converted with the public ops
(``quantize_fp8`` per row or per expert, ``quantize_mxfp4``), forced onto the
reference so that inputs never depend on a kernel under test; every weight
format sees the same underlying matrices. ``w13`` has std ``3/sqrt(H)``: the
gate/up pre-activations are then N(0, ~9) and GPT-OSS's clamp at 7 is active on
a few percent of them. Routing is uniformly random with distinct experts per
token; small cases have more experts than rows, so some experts get no rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ... import ops
from ...core.formats import DTYPE_NAMES
from ...ops.moe import MoEActivation, MoEPlan, MoEWeights, moe_process_weights
from ..inputs import randn, random_topk_ids, random_topk_weights, torch_dtype
from . import CapturedCall, Case, Cost, OpCases, Peer, PeerCall, PeerSkip, nbytes
from ._common import close, compare_by, dim, exact, named, upcast

_DENSE_FORMATS = {"bf16", "fp16", "fp32"}


def _activation(case: Case) -> MoEActivation:
    if case["activation"] == "silu":
        return MoEActivation.silu()
    return MoEActivation(kind="swiglu", alpha=1.702, limit=case["limit"], up_offset=1.0)


def moe_weights(case: Case, device: torch.device, gen: torch.Generator) -> MoEWeights:
    """Canonical :class:`MoEWeights` for a case's ``weight_format`` (``dense`` = the case dtype)."""
    e, h, i = case["experts"], case["hidden"], case["inter"]
    dt = torch_dtype(case.dtype)
    w13 = randn((e, 2 * i, h), torch.float32, gen, scale=3.0 / math.sqrt(h))
    w2 = randn((e, h, i), torch.float32, gen, scale=1.0 / math.sqrt(i))
    b13 = randn((e, 2 * i), dt, gen, scale=0.5) if case["bias"] else None
    b2 = randn((e, h), dt, gen, scale=0.1) if case["bias"] else None
    fmt = case["weight_format"]
    common = {"w13_bias": b13, "w2_bias": b2, "gate_up_interleaved": case["interleaved"]}
    if fmt == "dense":
        return MoEWeights(w13=w13.to(dt), w2=w2.to(dt), format=case.dtype, **common)
    if fmt == "mxfp4":
        q13, s13 = ops.quantize_mxfp4(w13.to(torch.bfloat16).contiguous(), solution="reference")
        q2, s2 = ops.quantize_mxfp4(w2.to(torch.bfloat16).contiguous(), solution="reference")
        return MoEWeights(w13=q13, w2=q2, format="mxfp4", w13_scale=s13, w2_scale=s2, **common)
    if fmt == "fp8_e4m3:per_channel":
        q13, s13 = ops.quantize_fp8(w13.reshape(-1, h).contiguous(), granularity="per_token", solution="reference")
        q2, s2 = ops.quantize_fp8(w2.reshape(-1, i).contiguous(), granularity="per_token", solution="reference")
        return MoEWeights(
            w13=q13.view(e, 2 * i, h),
            w2=q2.view(e, h, i),
            format=fmt,
            w13_scale=s13.view(e, 2 * i).contiguous(),
            w2_scale=s2.view(e, h).contiguous(),
            **common,
        )
    if fmt == "fp8_e4m3:per_tensor":
        q13, s13 = zip(
            *(ops.quantize_fp8(w13[x].contiguous(), granularity="per_tensor", solution="reference") for x in range(e))
        )
        q2, s2 = zip(
            *(ops.quantize_fp8(w2[x].contiguous(), granularity="per_tensor", solution="reference") for x in range(e))
        )
        return MoEWeights(
            w13=torch.stack(q13),
            w2=torch.stack(q2),
            format=fmt,
            w13_scale=torch.cat(s13),
            w2_scale=torch.cat(s2),
            **common,
        )
    raise ValueError(f"weight_format: expected dense, mxfp4, fp8_e4m3:per_channel or fp8_e4m3:per_tensor, got {fmt!r}")


def _upcast_weights(w: MoEWeights) -> MoEWeights:
    """Dense bf16/fp16 weights in fp32 (the reference then sees exact values); quantized ones as they are."""
    f = lambda t: None if t is None else t.float()
    if w.format in ("bf16", "fp16"):
        return MoEWeights(
            w13=w.w13.float(), w2=w.w2.float(), format="fp32", w13_bias=f(w.w13_bias), w2_bias=f(w.w2_bias),
            gate_up_interleaved=w.gate_up_interleaved,
        )  # fmt: skip
    return MoEWeights(
        w13=w.w13, w2=w.w2, format=w.format, w13_bias=f(w.w13_bias), w2_bias=f(w.w2_bias), w13_scale=w.w13_scale,
        w2_scale=w.w2_scale, gate_up_interleaved=w.gate_up_interleaved,
    )  # fmt: skip


def _upcast_moe(x_name: str):
    def up(case: Case, call: dict[str, Any]) -> dict[str, Any]:
        out = upcast(call, (x_name,))
        out["weights"] = _upcast_weights(call["weights"])
        return out

    return up


def _for_kernel(x_name: str, op: str):
    """Kernels with their own weight layout get weights converted by their preprocessor
    (``moe_plan`` + ``moe_process_weights``); ``moe_apply`` then runs through the plan."""

    def adapt(call: dict[str, Any], spec: Any) -> dict[str, Any] | None:
        if spec.weight_preprocessor is None:
            return None
        w, act = call["weights"], call["activation"]
        if spec.format_reject_reason((DTYPE_NAMES[call[x_name].dtype], w.format), ("x", "w")):
            return None  # not this kernel's formats: the call is left as it is and selection rejects it
        plan = MoEPlan(kernel=spec.name, layout=spec.weight_layout, format=w.format, activation=act)
        extra = {"plan": plan} if op == "moe_apply" else {}
        return {**call, "weights": moe_process_weights(plan, w), "override": spec.name, **extra}

    return adapt


def _weights_from_capture(c: CapturedCall, where: int) -> dict[str, Any] | None:
    w = c.obj(where)
    if w is None or w.get("object") != "MoEWeights":
        return None
    w = w["fields"]
    w13 = tuple(w["w13"]["tensor"])
    fmt = w["format"]
    hidden = tuple(w["w2"]["tensor"])[1]
    return {
        "experts": w13[0],
        "hidden": hidden,
        "inter": w13[1] // 2,
        "weight_format": "dense" if fmt in _DENSE_FORMATS else fmt,
        "bias": w.get("w13_bias") is not None or w.get("w2_bias") is not None,
        "interleaved": bool(w.get("gate_up_interleaved", True)),
    }


def _activation_from_capture(c: CapturedCall, where: int) -> dict[str, Any]:
    a = (c.obj(where) or {}).get("fields", {})
    return {"activation": a.get("kind", "swiglu"), "limit": a.get("limit", 7.0)}


_MOE_DEFAULTS = {
    "tokens": 6,
    "top_k": 2,
    "experts": 8,
    "hidden": 64,
    "inter": 64,
    "weight_format": "dense",
    "bias": True,
    "interleaved": True,
    "activation": "swiglu",
    "limit": 7.0,
}
_OSS20 = {"experts": 32, "top_k": 4, "hidden": 2880, "inter": 2880}
_OSS120 = {"experts": 128, "top_k": 4, "hidden": 2880, "inter": 2880}
_MOE_CPU = [
    {},
    {"weight_format": "mxfp4"},
    {"weight_format": "fp8_e4m3:per_channel", "tokens": 3},
    {"weight_format": "fp8_e4m3:per_tensor", "bias": False},
    {"activation": "silu", "limit": None, "interleaved": False, "bias": False},
    {"tokens": 1, "top_k": 4, "experts": 16, "weight_format": "mxfp4", "label": "decode, most experts idle"},
]
_MOE_GPU = [
    {"tokens": 1, "weight_format": "mxfp4", **_OSS20},
    {"tokens": 64, "weight_format": "mxfp4", **_OSS20},
    {"tokens": 1024, "weight_format": "mxfp4", **_OSS20},
    {"tokens": 64, "weight_format": "dense", **_OSS20},
    {"tokens": 64, "weight_format": "fp8_e4m3:per_channel", **_OSS20},
    {"tokens": 64, "weight_format": "mxfp4", **_OSS120},
]


def _moe_shrink() -> list:
    def step(c: Case) -> int:
        return 32 if c["weight_format"] == "mxfp4" else 1

    def hidden_move(c: Case) -> list[Case]:
        return dim("hidden", lo=step(c), step=step(c))(c)

    def inter_move(c: Case) -> list[Case]:
        return dim("inter", lo=step(c), step=step(c))(c)

    return [
        dim("tokens"),
        dim("experts", keep=lambda c, v: v >= c["top_k"]),
        dim("top_k"),
        hidden_move,
        inter_move,
    ]


# ---------------------------------------------------------------------------


def _make_route(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    logits = randn((case["tokens"], case["experts"]), torch_dtype(case.dtype), gen, scale=2.0)
    return {"router_logits": logits, "top_k": case["top_k"], "renormalize": case["renormalize"]}


def _route_from_capture(c: CapturedCall) -> Case | None:
    s = c.shape(0)
    if s is None:
        return None
    return Case.make(
        "moe_route",
        c.dtype(0),
        {
            "tokens": s[0],
            "experts": s[1],
            "top_k": int(c.value(1, 4)),
            "renormalize": bool(c.value("renormalize", True)),
        },
    )


# ---------------------------------------------------------------------------
# Cost models: weights counted for *active* experts only (those that received a
# row), at their storage size (MXFP4: 4.25 bits a value with its E8M0 scales);
# FLOPs are 2 * rows * (2I * H + I * H).


def _expert_bytes(weights: Any, experts: int) -> float:
    """Storage of ``experts`` experts' weights (scales and biases included)."""
    e = weights.num_experts
    total = nbytes(weights.w13, weights.w2, weights.w13_scale, weights.w2_scale, weights.w13_bias, weights.w2_bias)
    return total * experts / max(e, 1)


def _moe_flops(rows: int, case: Case) -> float:
    h, i = case["hidden"], case["inter"]
    return 2.0 * rows * (2 * i * h + i * h)


def _experts_cost(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    offs = call["expert_offsets"]
    active = int(((offs[1:] - offs[:-1]) > 0).sum())
    rows = call["hidden"].shape[0]
    moved = _expert_bytes(call["weights"], active) + nbytes(call["hidden"]) + nbytes(*outputs.values())
    return Cost(_moe_flops(rows, case), moved)


def _apply_cost(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    active = int(torch.unique(call["topk_ids"]).numel())
    rows = call["topk_ids"].numel()
    moved = _expert_bytes(call["weights"], active) + nbytes(call["x"], call["topk_ids"], call["topk_weights"])
    return Cost(_moe_flops(rows, case), moved + nbytes(*outputs.values()))


# ---------------------------------------------------------------------------
# Peer: torch._grouped_mm with bf16 weights (quantized weights dequantized first:
# the bf16 baseline PERFORMANCE.md compares with).


def _dense_weights(weights: Any) -> tuple[torch.Tensor, torch.Tensor, str]:
    """bf16 ``w13 [E, 2I, H]``, ``w2 [E, H, I]`` of (canonical) MoE weights; note if dequantized."""
    from ...reference.moe import dequantize_expert_weights

    if weights.format in ("bf16", "fp16", "fp32"):
        return weights.w13.to(torch.bfloat16), weights.w2.to(torch.bfloat16), ""
    pairs = [dequantize_expert_weights(weights, e) for e in range(weights.num_experts)]
    w13 = torch.stack([p[0] for p in pairs]).to(torch.bfloat16)
    w2 = torch.stack([p[1] for p in pairs]).to(torch.bfloat16)
    return w13, w2, f"bf16 weights ({weights.format} dequantized)"


def _torch_swiglu(h: torch.Tensor, activation: Any, interleaved: bool) -> torch.Tensor:
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
        y = _torch_swiglu(h.float(), self.activation, self.interleaved).to(torch.bfloat16)
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


MOE_ROUTE = OpCases(
    op="moe_route",
    defaults={"tokens": 8, "experts": 32, "top_k": 4, "renormalize": True},
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp32")},
    sets={
        "cpu": [
            {"tokens": 8},
            {"tokens": 5, "experts": 128, "renormalize": False},
            {"tokens": 3, "experts": 4, "top_k": 4},
        ],
        "gpu": [{"tokens": 1, "experts": 128}, {"tokens": 4096, "experts": 128}, {"tokens": 777, "experts": 32}],
        "bench-cpu": [{"tokens": 256, "experts": 128}],
        "bench-gpu": [{"tokens": t, "experts": 128, "dtype": "bf16"} for t in (1, 64, 4096, 16384)],
    },
    make=_make_route,
    outputs=named("weights", "ids"),
    compare=compare_by({"weights": close("softmax"), "ids": exact()}),
    shrink=[dim("tokens"), dim("experts", keep=lambda c, v: v >= c["top_k"]), dim("top_k")],
    from_capture=_route_from_capture,
    always_show=("tokens", "experts", "top_k"),
)


# ---------------------------------------------------------------------------
# moe_gate: the router's linear layer and the routing. A kernel summing the logits in another order than the
# reference may round one to the neighbouring value of x's dtype, which moves its token's weights by that rounding
# and, where two logits (nearly) tie, may pick the other expert: the weights are compared within a matmul's
# tolerance, and the experts by the exact logits of the ones picked (float64 from the call's inputs), which agree
# for such a swap and differ for a wrong pick.


def _make_gate(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    dt = torch_dtype(case.dtype)
    t, h, e = case["tokens"], case["hidden"], case["experts"]
    return {
        "x": randn((t, h), dt, gen),
        "weight": randn((e, h), dt, gen, scale=h**-0.5 * 2.0),
        "bias": randn((e,), dt, gen) if case["bias"] else None,
        "top_k": case["top_k"],
        "renormalize": case["renormalize"],
        **(_gate_norm(case, (t, h), dt, gen) if case["norm"] else {}),
    }


def _gate_norm(case: Case, shape: tuple[int, int], dt: torch.dtype, gen: torch.Generator) -> dict[str, Any]:
    """The RMSNorm the router reads first (``norm``), of ``x + residual`` (``residual``)."""
    norm = {"norm_weight": randn((shape[1],), dt, gen, scale=0.1, mean=1.0), "norm_eps": 1e-5}
    if case["residual"]:
        norm["residual"] = randn(shape, dt, gen)
    return norm


def _gate_outputs(call: dict[str, Any], result: Any) -> dict[str, torch.Tensor]:
    weights, ids = result[:2]
    x = call["x"]
    outputs = {"weights": weights}
    if call.get("norm_weight") is not None:  # the exact norm of the call's inputs (the stream rounded as specified)
        s = x if call.get("residual") is None else x + call["residual"]
        outputs["h"] = result[2]
        if len(result) > 3:
            outputs["stream"] = result[3]
        s = s.double()
        x = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + call["norm_eps"]) * call["norm_weight"].double()
    logits = x.double() @ call["weight"].double().T
    if call["bias"] is not None:
        logits = logits + call["bias"].double()
    return {**outputs, "picked_logits": logits.gather(1, ids.long())}


def _gate_from_capture(c: CapturedCall) -> Case | None:
    x, w = c.shape(0), c.shape(1)
    if x is None or w is None:
        return None
    return Case.make(
        "moe_gate",
        c.dtype(0),
        {
            "tokens": x[0],
            "hidden": x[1],
            "experts": w[0],
            "top_k": int(c.value(3, 4)),
            "bias": c.shape(2) is not None,
            "renormalize": bool(c.value("renormalize", True)),
            "norm": not c.is_none("norm_weight"),
            "residual": not c.is_none("residual"),
        },
    )


def _gate_cost(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    t, h, e = case["tokens"], case["hidden"], case["experts"]
    moved = sum(nbytes(call[k]) for k in ("x", "weight", "bias", "norm_weight", "residual") if call.get(k) is not None)
    return Cost(2.0 * t * h * e, moved + nbytes(*outputs.values()))


MOE_GATE = OpCases(
    op="moe_gate",
    cost=_gate_cost,
    defaults={
        "tokens": 8,
        "hidden": 256,
        "experts": 32,
        "top_k": 4,
        "bias": True,
        "renormalize": True,
        "norm": False,
        "residual": False,
    },
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp32")},
    sets={
        "cpu": [
            {"tokens": 8},
            {"tokens": 5, "experts": 128, "hidden": 96, "renormalize": False, "bias": False},
            {"tokens": 3, "experts": 4, "top_k": 4, "hidden": 100},
            {"tokens": 19, "hidden": 80},
            {"tokens": 3, "hidden": 100, "norm": True, "residual": True, "label": "norm of x + residual first"},
            {"tokens": 19, "hidden": 80, "norm": True, "label": "norm first"},
        ],
        "gpu": [  # (the norm cases among the first three: the launch tests take three a kernel)
            {"tokens": 1, "hidden": 2880, "norm": True, "residual": True, "label": "norm of x + residual first"},
            {"tokens": 64, "hidden": 2880},
            {"tokens": 4096, "hidden": 2880, "norm": True, "residual": True, "label": "norm of x + residual first"},
            {"tokens": 1, "hidden": 2880},
            {"tokens": 4096, "hidden": 2880},
            {"tokens": 777, "hidden": 7168, "experts": 128, "top_k": 8, "bias": False},
            {"tokens": 33, "hidden": 2880, "norm": True, "label": "norm first"},
        ],
        "bench-cpu": [{"tokens": 64}],
        "bench-gpu": [
            {"tokens": t, "hidden": 2880, "dtype": "bf16", "norm": n, "residual": n}
            for t in (1, 64, 4096)
            for n in (0, 1)
        ],
    },
    make=_make_gate,
    reference_call=lambda case, call: upcast(call, ("x", "weight", "bias", "norm_weight", "residual")),
    outputs=_gate_outputs,
    compare=compare_by(
        {
            "weights": close("matmul"),
            "picked_logits": close("matmul"),
            "h": close("elementwise"),
            "stream": close("elementwise"),
        }
    ),
    shrink=[dim("tokens"), dim("experts", keep=lambda c, v: v >= c["top_k"]), dim("top_k"), dim("hidden", lo=16)],
    from_capture=_gate_from_capture,
    always_show=("tokens", "hidden", "experts", "top_k"),
)


def _make_dispatch(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    t = case["tokens"]
    return {
        "x": randn((t, case["hidden"]), torch_dtype(case.dtype), gen),
        "topk_ids": random_topk_ids(t, case["experts"], case["top_k"], gen),
        "num_experts": case["experts"],
    }


def _dispatch_from_capture(c: CapturedCall) -> Case | None:
    x, ids = c.shape(0), c.shape(1)
    if x is None or ids is None:
        return None
    return Case.make(
        "moe_dispatch", c.dtype(0), {"tokens": x[0], "hidden": x[1], "top_k": ids[1], "experts": int(c.value(2, 1))}
    )


MOE_DISPATCH = OpCases(
    op="moe_dispatch",
    defaults={"tokens": 8, "hidden": 64, "experts": 8, "top_k": 2},
    dtypes={"cpu": ("bf16",), "cuda": ("bf16",)},
    sets={
        "cpu": [{"tokens": 8}, {"tokens": 3, "experts": 16, "top_k": 4}, {"tokens": 1, "experts": 4, "top_k": 1}],
        "gpu": [
            {"tokens": 1, "hidden": 2880, "experts": 128, "top_k": 4},
            {"tokens": 4096, "hidden": 2880, "experts": 128, "top_k": 4},
        ],
        "bench-cpu": [{"tokens": 256, "hidden": 256, "experts": 32, "top_k": 4}],
        "bench-gpu": [{"tokens": t, "hidden": 2880, "experts": 128, "top_k": 4} for t in (1, 64, 4096, 16384)],
    },
    make=_make_dispatch,
    outputs=lambda call, r: {"hidden": r.hidden, "expert_offsets": r.expert_offsets, "permutation": r.permutation},
    compare=compare_by({"hidden": exact(), "expert_offsets": exact(), "permutation": exact()}),
    shrink=[dim("tokens"), dim("experts", keep=lambda c, v: v >= c["top_k"]), dim("top_k"), dim("hidden")],
    from_capture=_dispatch_from_capture,
    always_show=("tokens", "experts", "top_k"),
)


def _make_experts(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    t, k, e = case["tokens"], case["top_k"], case["experts"]
    ids = random_topk_ids(t, e, k, gen)
    counts = torch.bincount(ids.flatten().long(), minlength=e)
    offsets = torch.zeros(e + 1, dtype=torch.int32, device=device)
    offsets[1:] = counts.cumsum(0).to(torch.int32)
    return {
        "hidden": randn((t * k, case["hidden"]), torch_dtype(case.dtype), gen),
        "expert_offsets": offsets,
        "weights": moe_weights(case, device, gen),
        "activation": _activation(case),
    }


def _experts_from_capture(c: CapturedCall) -> Case | None:
    x = c.shape(0)
    w = _weights_from_capture(c, 2)
    if x is None or w is None:
        return None
    return Case.make("moe_experts", c.dtype(0), {"tokens": x[0], "top_k": 1, **w, **_activation_from_capture(c, 3)})


MOE_EXPERTS = OpCases(
    op="moe_experts",
    cost=_experts_cost,
    metric="tflops",
    peers=[Peer("torch._grouped_mm", _grouped_experts, doc="bf16 grouped GEMMs")],
    defaults=dict(_MOE_DEFAULTS),
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16",)},
    sets={
        "cpu": _MOE_CPU,
        "gpu": _MOE_GPU,
        "bench-cpu": [{"tokens": 32, "top_k": 2, "experts": 8, "hidden": 128, "inter": 128}],
        "bench-gpu": [
            {"tokens": t, "weight_format": f, **_OSS120, "dtype": "bf16"}
            for f in ("mxfp4", "dense")
            for t in (1, 64, 4096)
        ],
    },
    make=_make_experts,
    reference_call=_upcast_moe("hidden"),
    outputs=named("out"),
    compare=compare_by({"out": close("matmul")}),
    shrink=_moe_shrink(),
    from_capture=_experts_from_capture,
    for_kernel=_for_kernel("hidden", "moe_experts"),
    always_show=("tokens", "top_k", "experts", "hidden", "inter", "weight_format"),
)


def _make_combine(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    t, k = case["tokens"], case["top_k"]
    return {
        "expert_out": randn((t * k, case["hidden"]), torch_dtype(case.dtype), gen),
        "permutation": torch.randperm(t * k, generator=gen, device=device).to(torch.int32),
        "topk_weights": random_topk_weights(t, k, gen),
    }


def _combine_from_capture(c: CapturedCall) -> Case | None:
    y, w = c.shape(0), c.shape(2)
    if y is None or w is None:
        return None
    return Case.make("moe_combine", c.dtype(0), {"tokens": w[0], "top_k": w[1], "hidden": y[1]})


MOE_COMBINE = OpCases(
    op="moe_combine",
    defaults={"tokens": 8, "top_k": 4, "hidden": 64},
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16",)},
    sets={
        "cpu": [{"tokens": 8}, {"tokens": 1, "top_k": 1, "hidden": 33}],
        "gpu": [{"tokens": 1, "hidden": 2880}, {"tokens": 4096, "hidden": 2880}],
        "bench-cpu": [{"tokens": 256, "hidden": 256}],
        "bench-gpu": [{"tokens": t, "hidden": 2880} for t in (1, 64, 4096, 16384)],
    },
    make=_make_combine,
    reference_call=lambda case, call: upcast(call, ("expert_out",)),
    outputs=named("out"),
    compare=compare_by({"out": close("elementwise")}),
    shrink=[dim("tokens"), dim("top_k"), dim("hidden")],
    from_capture=_combine_from_capture,
    always_show=("tokens", "top_k", "hidden"),
)


def _make_apply(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    t, k, e = case["tokens"], case["top_k"], case["experts"]
    call = {
        "x": randn((t, case["hidden"]), torch_dtype(case.dtype), gen),
        "topk_weights": random_topk_weights(t, k, gen),
        "topk_ids": random_topk_ids(t, e, k, gen),
        "weights": moe_weights(case, device, gen),
        "activation": _activation(case),
    }
    if case["fp8_activations"]:
        call["fp8_activations"] = True
    return call


def _w4a8_expected(case: Case, call: dict[str, Any], spec: Any):
    """Kernels that always round activations to fp8 (``fp8_activations`` declared True only) are
    compared with the float32 W4A8 reference within ``fp8_matmul``; every other kernel with the op
    reference."""
    m = spec.traits.get("fp8_activations")
    if m is None or False in m or not case["fp8_activations"]:
        return None  # an exact kernel, or a case that does not allow fp8 (selection skips the kernel)
    from ...reference.moe import moe_apply_w4a8

    up = _upcast_moe("x")(case, call)
    out = moe_apply_w4a8(up["x"], up["topk_weights"], up["topk_ids"], up["weights"], up["activation"])
    return {"out": out}, compare_by({"out": close("fp8_matmul")})


def _apply_from_capture(c: CapturedCall) -> Case | None:
    x, ids = c.shape(0), c.shape(2)
    w = _weights_from_capture(c, 3)
    if x is None or ids is None or w is None:
        return None
    return Case.make("moe_apply", c.dtype(0), {"tokens": x[0], "top_k": ids[1], **w, **_activation_from_capture(c, 4)})


MOE_APPLY = OpCases(
    op="moe_apply",
    cost=_apply_cost,
    metric="tflops",
    peers=[Peer("torch._grouped_mm", _grouped_apply, doc="sort + bf16 grouped GEMMs + index_add")],
    # fp8_activations: the call allows W4A8 kernels (moe_apply(fp8_activations=True)).
    defaults=dict(_MOE_DEFAULTS, fp8_activations=False),
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16",)},
    sets={
        "cpu": _MOE_CPU,
        # fp8 activations allowed: W4A8 kernels run (against the W4A8 reference), the others as usual.
        "gpu": [*_MOE_GPU, {"tokens": 2048, "weight_format": "mxfp4", **_OSS120, "fp8_activations": True}],
        "bench-cpu": [{"tokens": 32, "top_k": 2, "experts": 8, "hidden": 128, "inter": 128}],
        "bench-gpu": [
            {"tokens": t, "weight_format": f, **_OSS120, "dtype": "bf16"}
            for f in ("mxfp4", "dense")
            for t in (1, 8, 64, 512, 4096, 16384)
        ],
    },
    make=_make_apply,
    reference_call=_upcast_moe("x"),
    outputs=named("out"),
    compare=compare_by({"out": close("matmul")}),
    shrink=_moe_shrink(),
    from_capture=_apply_from_capture,
    for_kernel=_for_kernel("x", "moe_apply"),
    kernel_reference=_w4a8_expected,
    always_show=("tokens", "top_k", "experts", "hidden", "inter", "weight_format"),
)

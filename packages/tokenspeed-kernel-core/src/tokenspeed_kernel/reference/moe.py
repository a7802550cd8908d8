"""Reference MoE: routing, dispatch, grouped experts, combine, and the fused layer.

Expert weights are dequantized one expert at a time (only experts that received
rows) and every product runs in float32; results are cast to the activations'
dtype once, at the end. The fused :func:`moe_apply` keeps the expert outputs in
float32 through the weighted sum, so it equals the staged path up to the staged
path's rounding of the expert outputs to ``x``'s dtype.
"""

from __future__ import annotations

import torch

from ..ops.moe import MoEActivation, MoEDispatchResult, MoEWeights, w4a8_inter_scale
from .gemm import mm
from .norm import rmsnorm
from .quantization import fp8_to_float, mxfp4_to_float

__all__ = [
    "moe_route",
    "moe_gate",
    "moe_dispatch",
    "moe_experts",
    "moe_combine",
    "moe_apply",
    "dequantize_expert_weights",
    "expert_mlp",
]


def moe_route(router_logits: torch.Tensor, top_k: int, *, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k routing.

    Args:
        router_logits: ``[T, E]`` float.
        top_k: experts per token.
        renormalize: softmax over the top-k logits; else the full softmax's probabilities.

    Returns:
        ``(topk_weights float32 [T, top_k] descending, topk_ids int32 [T, top_k])``; ties go
        to the lower expert index.
    """
    logits = router_logits.to(torch.float32)
    # A stable descending sort keeps equal logits in index order: ties go to the lower expert.
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    top_logits, ids = sorted_logits[:, :top_k], order[:, :top_k]
    if renormalize:
        weights = torch.softmax(top_logits, dim=-1)
    else:
        weights = torch.softmax(logits, dim=-1).gather(1, ids)
    return weights, ids.to(torch.int32)


def moe_gate(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    top_k: int,
    *,
    renormalize: bool,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float | None = None,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """Reference of :func:`tokenspeed_kernel.moe_gate`: the references of ``rmsnorm`` (with ``norm_weight``), ``mm``
    (fp32 accumulation, the logits rounded to ``x``'s dtype) and :func:`moe_route`."""
    normed = ()
    if norm_weight is not None:
        normed = rmsnorm(x, norm_weight, norm_eps, residual=residual)
        normed = normed if residual is not None else (normed,)
        x = normed[0]
    logits = mm(x, weight, bias, a_scale=None, b_scale=None, out_dtype=x.dtype, out=None)
    return (*moe_route(logits, top_k, renormalize=renormalize), *normed)


def moe_dispatch(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int) -> MoEDispatchResult:
    """Group the ``T * k`` (token, slot) pairs by expert, token order within an expert.

    Args:
        x: ``[T, H]``.
        topk_ids: ``int32 [T, k]``.
        num_experts: ``E``.

    Returns:
        :class:`MoEDispatchResult` with ``hidden [T*k, H]`` (x's dtype),
        ``expert_offsets int32 [E+1]``, ``permutation int32 [T*k]``.
    """
    k = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).long()
    permutation = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=num_experts)
    offsets = torch.zeros(num_experts + 1, dtype=torch.int32, device=x.device)
    offsets[1:] = torch.cumsum(counts, 0)
    hidden = x[torch.div(permutation, k, rounding_mode="floor")]
    return MoEDispatchResult(hidden=hidden, expert_offsets=offsets, permutation=permutation.to(torch.int32))


def dequantize_expert_weights(weights: MoEWeights, expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert's canonical weights as float32.

    Args:
        weights: canonical :class:`MoEWeights` of any format.
        expert: expert index.

    Returns:
        ``(w13 float32 [2I, H], w2 float32 [H, I])``.
    """
    fmt = weights.format
    if fmt == "mxfp4":
        return (
            mxfp4_to_float(weights.w13[expert], weights.w13_scale[expert]),
            mxfp4_to_float(weights.w2[expert], weights.w2_scale[expert]),
        )
    if fmt.startswith("fp8"):
        per_row = fmt.endswith("per_channel")
        return (
            fp8_to_float(weights.w13[expert], weights.w13_scale[expert], per_row=per_row),
            fp8_to_float(weights.w2[expert], weights.w2_scale[expert], per_row=per_row),
        )
    return weights.w13[expert].to(torch.float32), weights.w2[expert].to(torch.float32)


def quantize_rows_e4m3(rows: torch.Tensor) -> torch.Tensor:
    """W4A8's activations: each row rounded to E4M3 with the scale ``max |row| / 448``, back in float32."""
    rows = rows.to(torch.float32)
    amax = rows.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30)
    q = (rows * (448.0 / amax)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.to(torch.float32) * (amax / 448.0)


def expert_mlp(
    rows: torch.Tensor, weights: MoEWeights, expert: int, activation: MoEActivation, *, fp8: bool = False
) -> torch.Tensor:
    """One expert's MLP on ``rows [n, H]`` in float32 -> ``float32 [n, H]`` (no routing weight).

    ``fp8``: W4A8 semantics (what a kernel allowed fp8 activations computes): ``rows`` rounded per row
    to E4M3 (:func:`quantize_rows_e4m3`) and the SwiGLU output to E4M3 times
    :func:`tokenspeed_kernel.ops.moe.w4a8_inter_scale`."""
    w13, w2 = dequantize_expert_weights(weights, expert)
    rows = quantize_rows_e4m3(rows) if fp8 else rows
    h = rows.to(torch.float32) @ w13.T
    if weights.w13_bias is not None:
        h = h + weights.w13_bias[expert].to(torch.float32)
    if weights.gate_up_interleaved:
        gate, up = h[:, 0::2], h[:, 1::2]
    else:
        gate, up = h.chunk(2, dim=-1)
    if activation.limit is not None:
        gate = gate.clamp(max=activation.limit)
        up = up.clamp(-activation.limit, activation.limit)
    # kind="silu" is this formula with alpha 1, no limit, no offset (MoEActivation enforces those).
    y = (up + activation.up_offset) * gate * torch.sigmoid(activation.alpha * gate)
    if fp8:
        q = w4a8_inter_scale(activation)
        y = (y * q).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32) / q
    out = y @ w2.T
    if weights.w2_bias is not None:
        out = out + weights.w2_bias[expert].to(torch.float32)
    return out


def _experts_fp32(
    hidden: torch.Tensor, expert_offsets: torch.Tensor, weights: MoEWeights, activation: MoEActivation,
    fp8: bool = False,
) -> torch.Tensor:  # fmt: skip
    result = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    bounds = expert_offsets.tolist()
    for e in range(weights.num_experts):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            result[lo:hi] = expert_mlp(hidden[lo:hi], weights, e, activation, fp8=fp8)
    return result


def _combine_fp32(expert_out: torch.Tensor, permutation: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
    t, k = topk_weights.shape
    by_slot = torch.empty((t * k, expert_out.shape[1]), dtype=torch.float32, device=expert_out.device)
    by_slot[permutation.long()] = expert_out.to(torch.float32)
    return (by_slot.view(t, k, expert_out.shape[1]) * topk_weights.to(torch.float32).unsqueeze(-1)).sum(dim=1)


def _finish(result: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None) -> torch.Tensor:
    if out is None:
        return result.to(dtype)
    out.copy_(result)
    return out


def moe_experts(
    hidden: torch.Tensor,
    expert_offsets: torch.Tensor,
    weights: MoEWeights,
    activation: MoEActivation,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each expert's MLP on its rows.

    Args:
        hidden: ``[N, H]`` rows grouped by expert.
        expert_offsets: ``int32 [E+1]``.
        weights: canonical :class:`MoEWeights`.
        activation: :class:`MoEActivation`.
        out: optional ``[N, H]`` of ``hidden``'s dtype.

    Returns:
        ``[N, H]`` in ``hidden``'s dtype (``out`` when given).
    """
    return _finish(_experts_fp32(hidden, expert_offsets, weights, activation), hidden.dtype, out)


def moe_combine(
    expert_out: torch.Tensor,
    permutation: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[t] = sum_s topk_weights[t, s] * expert_out[row of (t, s)]``.

    Args:
        expert_out: ``[T*k, H]`` in dispatch order.
        permutation: ``int32 [T*k]``.
        topk_weights: ``float32 [T, k]``.
        out: optional ``[T, H]`` of ``expert_out``'s dtype.
    """
    return _finish(_combine_fp32(expert_out, permutation, topk_weights), expert_out.dtype, out)


def moe_apply(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: MoEWeights,
    activation: MoEActivation,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The fused layer ``sum_s topk_weights[t, s] * expert_{topk_ids[t, s]}(x[t])``.

    Args:
        x: ``[T, H]``.
        topk_weights: ``float32 [T, k]``.
        topk_ids: ``int32 [T, k]``.
        weights: canonical :class:`MoEWeights`.
        activation: :class:`MoEActivation`.
        out: optional ``[T, H]`` of ``x``'s dtype.
    """
    return _finish(_apply_fp32(x, topk_weights, topk_ids, weights, activation), x.dtype, out)


def _apply_fp32(x, topk_weights, topk_ids, weights, activation, fp8: bool = False) -> torch.Tensor:
    d = moe_dispatch(x, topk_ids, weights.num_experts)
    expert_out = _experts_fp32(d.hidden, d.expert_offsets, weights, activation, fp8=fp8)
    return _combine_fp32(expert_out, d.permutation, topk_weights)


def moe_apply_w4a8(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: MoEWeights,
    activation: MoEActivation,
) -> torch.Tensor:
    """:func:`moe_apply` with W4A8 semantics (``expert_mlp(fp8=True)``), in float32: the reference
    of kernels that quantize activations to E4M3 (``moe_apply(..., fp8_activations=True)``)."""
    return _apply_fp32(x, topk_weights, topk_ids, weights, activation, fp8=True)

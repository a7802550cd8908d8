"""The CDNA MXFP4 MoE as kernels of ``tokenspeed_kernel.moe_apply`` (the amd plugin's
``amd.gfx950.moe_apply`` / ``amd.gfx942.moe_apply``): same host plan and kernels as the
vLLM entry point, with the caller's routing and activations in their own dtype (no FP8)."""

from __future__ import annotations

import torch

from tokenspeed_kernel.ops.moe import MoEActivation, MoEWeights

from .fused import fused_moe
from .weights import MxfpMoeWeights, prepare_weights

__all__ = ["LAYOUT", "preprocess_weights", "moe_apply"]

#: The weight layout both archs' kernels read (one plan serves either).
LAYOUT = "amd.cdna.mxfp4"


def preprocess_weights(weights: MoEWeights) -> MoEWeights:
    """Canonical MXFP4 weights -> the kernels' layout (gate/up interleaved, float32 biases)."""
    if weights.format != "mxfp4":
        raise ValueError(f"weights: the CDNA MoE takes mxfp4 weights, got {weights.format!r}")
    w = prepare_weights(
        weights.w13, weights.w13_scale, weights.w2, weights.w2_scale, weights.w13_bias, weights.w2_bias,
        interleaved=weights.gate_up_interleaved,
    )  # fmt: skip
    return MoEWeights(
        w13=w.w13, w2=w.w2, format="mxfp4", w13_bias=w.w13_bias, w2_bias=w.w2_bias, w13_scale=w.w13_scale,
        w2_scale=w.w2_scale, gate_up_interleaved=True,
    )  # fmt: skip


def moe_apply(
    target: str,
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: MoEWeights,
    activation: MoEActivation,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sum_s w[t,s] * expert_{ids[t,s]}(x[t])`` on ``target``'s kernels."""
    w = MxfpMoeWeights(
        w13=weights.w13, w13_scale=weights.w13_scale, w2=weights.w2, w2_scale=weights.w2_scale,
        w13_bias=weights.w13_bias, w2_bias=weights.w2_bias, interleaved=weights.gate_up_interleaved,
    )  # fmt: skip
    return fused_moe(
        x, w, top_k=topk_ids.shape[1], topk_weights=topk_weights, topk_ids=topk_ids, swiglu_alpha=activation.alpha,
        swiglu_limit=activation.limit, swiglu_beta=activation.up_offset, target=target, out=out,
    )  # fmt: skip

"""The functions vLLM's TokenSpeed MoE backend calls (``--moe-backend tokenspeed``, gfx950).

vLLM (``vllm/model_executor/layers/fused_moe/experts/tokenspeed_mxfp4_moe.py``) imports

- ``tokenspeed_kernel_amd.ops.moe.mxfp4_gfx950_preprocess.preprocess_gluon_mxfp4_gfx950_moe_weights``
  once per layer after loading, then
- ``tokenspeed_kernel_amd.ops.moe.fused_mxfp_gfx950.gluon_mxfp_fused_moe`` per forward,

also found under upstream's newer paths ``tokenspeed_kernel_amd.ops.gfx950.moe.mxfp4.weight_preprocess``
and ``...mxfp4.fused``. All four names are these two functions: a thin adapter over
:func:`tokenspeed_kernel_amd.moe.fused.fused_moe`, the same code our ``moe_apply``
kernels run.

Data contract: MXFP4 expert weights (``uint8 [E, 2I, H/2]`` gate/up interleaved as in
GPT-OSS checkpoints, E8M0 scales), static per-tensor FP8 e4m3 activation scales (W4A8),
softmax top-k routing from the logits inside the call, bf16/fp16 in and out, no expert
parallelism.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from .fused import fused_moe
from .weights import MxfpMoeWeights, prepare_weights

__all__ = ["gluon_mxfp_fused_moe", "preprocess_gluon_mxfp4_gfx950_moe_weights", "MxPrecisionConfig"]

#: Keys of vLLM's ``plan`` dict this function understands.
_PLAN_KEYS = {"internal_activation_dtype"}


@dataclass
class MxPrecisionConfig:
    """What vLLM reads from ``layer.w13_precision_config`` / ``w2_precision_config``:
    ``b_mx_scale`` (the E8M0 weight scales in the kernels' layout) and ``out_dtype``
    (None: the activations' dtype)."""

    b_mx_scale: torch.Tensor
    out_dtype: torch.dtype | None = None


def _static_scale(layer: torch.nn.Module, name: str) -> torch.Tensor:
    value = getattr(layer, name, None)
    if value is None:
        raise ValueError(
            f"layer.{name}: required (the static FP8 activation scale of W4A8); load it before preprocessing"
        )
    if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.numel() < 1:
        raise ValueError(f"layer.{name}: expected a float tensor of per-expert (or one) scales, got {value!r}")
    # One scale for every expert (the kernels quantize the activations once per tensor):
    # the largest, so no expert's inputs saturate.
    return value.detach().to(torch.float32).amax().reshape(1)


def preprocess_gluon_mxfp4_gfx950_moe_weights(plan: dict, layer: torch.nn.Module, *, preshuffle: bool = True) -> None:
    """Convert a loaded layer's MXFP4 experts for :func:`gluon_mxfp_fused_moe`, in place.

    Reads ``layer.w13_weight`` (``uint8 [E, 2I, H/2]``), ``w2_weight`` (``[E, H, I/2]``),
    ``w13_weight_scale`` / ``w2_weight_scale`` (E8M0 ``uint8``), optional
    ``w13_weight_bias`` / ``w2_weight_bias``, and the static FP8 input scales
    ``w13_input_scale`` / ``w2_input_scale`` (``[E]`` or one value); optional
    ``w13_input_layout``: ``"interleaved"`` (default, GPT-OSS) or ``"concatenated"``
    (gate rows, then up rows).

    Sets ``w13_weight_triton_tensor`` / ``w2_weight_triton_tensor`` (the kernels' layout:
    the checkpoint's row-major bytes with gate/up interleaved; the kernels' async copies
    into padded LDS arrange the MFMA operands, so no further shuffle exists),
    ``w13_precision_config`` / ``w2_precision_config`` (:class:`MxPrecisionConfig`),
    ``w13_act_scale`` / ``w2_act_scale`` (``float32 [1]``: the largest per-expert scale)
    and float32 ``w13_weight_bias`` / ``w2_weight_bias`` (zeros when the layer has none),
    and deletes ``w13_weight`` / ``w2_weight``.

    Args:
        plan: vLLM's plan dict; the one key read is ``internal_activation_dtype``
            (``"fp8"`` if present: these kernels are W4A8). Other keys are warned about.
        layer: the ``torch.nn.Module`` holding the weights.
        preshuffle: must be True (what vLLM passes): the layout above is the only one.
    """
    if not isinstance(plan, dict):
        raise TypeError(f"plan: expected a dict, got {type(plan).__name__}")
    unknown = sorted(set(plan) - _PLAN_KEYS)
    if unknown:
        warnings.warn(f"plan: keys {unknown} are not used by the gfx950 MXFP4 MoE preprocessing", stacklevel=2)
    act = plan.get("internal_activation_dtype", "fp8")
    if act != "fp8":
        raise ValueError(f"plan['internal_activation_dtype']: these kernels run FP8 activations (W4A8), got {act!r}")
    if preshuffle is not True:
        raise ValueError(
            "preshuffle: only True is supported (the kernels read one layout: row-major MXFP4 with gate/up interleaved)"
        )
    for name in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"):
        if getattr(layer, name, None) is None:
            raise ValueError(f"layer.{name}: required")
    layout = getattr(layer, "w13_input_layout", "interleaved")
    if layout not in ("interleaved", "concatenated"):
        raise ValueError(f"layer.w13_input_layout: expected 'interleaved' or 'concatenated', got {layout!r}")
    a1 = _static_scale(layer, "w13_input_scale")
    a2 = _static_scale(layer, "w2_input_scale")
    w = prepare_weights(
        layer.w13_weight.data, layer.w13_weight_scale.data, layer.w2_weight.data, layer.w2_weight_scale.data,
        getattr(layer, "w13_weight_bias", None), getattr(layer, "w2_weight_bias", None),
        interleaved=layout == "interleaved",
    )  # fmt: skip
    dev = w.w13.device
    b13 = w.w13_bias if w.w13_bias is not None else torch.zeros(w.w13.shape[:2], dtype=torch.float32, device=dev)
    b2 = w.w2_bias if w.w2_bias is not None else torch.zeros(w.w2.shape[:2], dtype=torch.float32, device=dev)
    layer.w13_weight_triton_tensor = w.w13
    layer.w2_weight_triton_tensor = w.w2
    layer.w13_precision_config = MxPrecisionConfig(b_mx_scale=w.w13_scale)
    layer.w2_precision_config = MxPrecisionConfig(b_mx_scale=w.w2_scale)
    layer.w13_act_scale = a1
    layer.w2_act_scale = a2
    layer.w13_weight_bias = torch.nn.Parameter(b13, requires_grad=False)
    layer.w2_weight_bias = torch.nn.Parameter(b2, requires_grad=False)
    del layer.w13_weight
    del layer.w2_weight
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def gluon_mxfp_fused_moe(
    hidden_states: torch.Tensor,
    router_logits: torch.Tensor,
    w13_weight: torch.Tensor,
    w2_weight: torch.Tensor,
    *,
    w13_mx_scale: torch.Tensor,
    w2_mx_scale: torch.Tensor,
    w13_act_scale: torch.Tensor,
    w2_act_scale: torch.Tensor,
    top_k: int,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    enable_warp_decode: bool = True,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float | None = 7.0,
    swiglu_beta: float = 1.0,
    target: str | None = None,
) -> torch.Tensor:
    """The fused W4A8 MXFP4 MoE layer with routing inside: ``[T, H]`` in ``out_dtype``.

    Args:
        hidden_states: ``[T, H]`` bf16 / fp16.
        router_logits: ``[T, E]``: softmax top-k, renormalised over the ``top_k`` chosen.
        w13_weight, w2_weight: ``layer.w13_weight_triton_tensor`` / ``w2_weight_triton_tensor``
            from :func:`preprocess_gluon_mxfp4_gfx950_moe_weights`.
        w13_mx_scale, w2_mx_scale: their ``precision_config.b_mx_scale``.
        w13_act_scale, w2_act_scale: the static FP8 scales of the two GEMMs' inputs.
        top_k: experts per token.
        w13_bias, w2_bias: float32 ``[E, 2I]`` / ``[E, H]`` or None.
        out_dtype: bf16 / fp16 (default: ``hidden_states``' dtype).
        enable_warp_decode: allow the decode path (two launches, routing fused in) for
            up to ``schedule.DECODE_MAX_TOKENS`` tokens; False: the grouped GEMMs always.
        swiglu_alpha, swiglu_limit, swiglu_beta: ``(clamp(up) + beta) * g * sigmoid(alpha g)``,
            ``g = min(gate, limit)``.
        target: None (the device's arch: gfx950 / gfx942), or ``"portable"`` for the Triton
            twin (any GPU; CPU under ``TRITON_INTERPRET=1``).
    """
    weights = MxfpMoeWeights(
        w13=w13_weight, w13_scale=w13_mx_scale, w2=w2_weight, w2_scale=w2_mx_scale,
        w13_bias=None if w13_bias is None else w13_bias.to(torch.float32),
        w2_bias=None if w2_bias is None else w2_bias.to(torch.float32),
        interleaved=True,
    )  # fmt: skip
    _check_prepared(weights)
    return fused_moe(
        hidden_states, weights, top_k=top_k, router_logits=router_logits, w13_act_scale=w13_act_scale,
        w2_act_scale=w2_act_scale, swiglu_alpha=swiglu_alpha, swiglu_limit=swiglu_limit, swiglu_beta=swiglu_beta,
        out_dtype=out_dtype, decode=enable_warp_decode, target=target,
    )  # fmt: skip


def _check_prepared(w: MxfpMoeWeights) -> None:
    """Shapes and dtypes of weights from the preprocessing (the per-call check is cheap: no copies)."""
    names: dict[str, Any] = {"w13_weight": w.w13, "w2_weight": w.w2, "w13_mx_scale": w.w13_scale,
                             "w2_mx_scale": w.w2_scale}  # fmt: skip
    for name, t in names.items():
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 3 or not t.is_contiguous():
            raise ValueError(
                f"{name}: expected a contiguous uint8 [E, rows, K/2 or K/32] tensor from "
                f"preprocess_gluon_mxfp4_gfx950_moe_weights, got {getattr(t, 'dtype', type(t).__name__)} "
                f"{list(getattr(t, 'shape', []))}"
            )
    e, two_i, h_half = w.w13.shape
    h, i = 2 * h_half, two_i // 2
    expected = {"w2_weight": (e, h, i // 2), "w13_mx_scale": (e, two_i, h // 32), "w2_mx_scale": (e, h, i // 32)}
    for name, shape in expected.items():
        if tuple(names[name].shape) != shape:
            raise ValueError(f"{name}: expected shape {list(shape)} (from w13_weight {list(w.w13.shape)}), "
                             f"got {list(names[name].shape)}")  # fmt: skip
    if w.w13_bias is not None and tuple(w.w13_bias.shape) != (e, two_i):
        raise ValueError(f"w13_bias: expected [E, 2I] = {[e, two_i]}, got {list(w.w13_bias.shape)}")
    if w.w2_bias is not None and tuple(w.w2_bias.shape) != (e, h):
        raise ValueError(f"w2_bias: expected [E, H] = {[e, h]}, got {list(w.w2_bias.shape)}")

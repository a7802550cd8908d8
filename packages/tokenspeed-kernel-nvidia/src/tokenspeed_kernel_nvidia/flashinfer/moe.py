"""FlashInfer SM90 mixed-input MXFP4 MoE: ``cutlass_fused_moe(..., use_w4_group_scaling=True)``.

The Hopper W4A16 path of FlashInfer's CUTLASS fused MoE (TensorRT-LLM's): bf16
activations, MXFP4 expert weights converted to bf16 inside the GEMM main loop
through a lookup table, E8M0 group-32 scales, routing weights applied and the
top-k rows summed in the second GEMM's epilogue.

Layout (:func:`preprocess_weights`, run once through ``moe_process_weights``; the
reorder and padding are ``_layout.moe_padded``):

- gate/up order: the kernel's first GEMM yields ``[linear (up) | gate]``
  (``cutlass_fused_moe_kernels.cuh``: the gate is read ``inter_size`` after the
  linear value), so the canonical rows (gate/up interleaved, or gate first) are
  reordered to ``[up; gate]``, biases alike;
- padding: the mixed-input GEMM folds the scales per 64 rows x 128 columns, so
  hidden ``H`` and intermediate ``I`` are zero-padded to multiples of 128 (GPT-OSS:
  2880 -> 3072, +14% weight memory). Padded weights are code 0 (+0.0) with scale
  1.0 and zero bias: padded intermediate channels compute ``act(0, 0) = 0`` and
  padded hidden channels multiply zero inputs, so the padding adds exact zeros.
  ``x`` is zero-padded per call (a copy) and the output sliced back;
- bytes: ``interleave_moe_weights_for_sm90_mixed_gemm(w, "fp4")`` reorders the
  packed codes (same E2M1 codes, low nibble = even element, as ours) and
  ``interleave_moe_scales_for_sm90_mixed_gemm`` folds the E8M0 scales into
  ``[E, rows/64, K/128, 16, 16]`` blocks (16 bytes contiguous); the kernel takes
  them as ``int32`` views;
- biases: bf16 (the kernel reads biases in the output dtype); when only one of
  ``w13_bias``/``w2_bias`` exists the other is zeros (the kernel takes both or
  neither).

Activation: with ``swiglu_alpha``/``swiglu_beta``/``swiglu_limit`` (per-expert
fp32) the kernel runs ``SwigluBias``: ``min(g, limit) * sigmoid(alpha * min(g,
limit)) * (clamp(u, -limit, limit) + beta)`` in fp32 on the first GEMM's bf16
output plus bias, i.e. our ``MoEActivation(kind="swiglu")`` with ``beta =
up_offset`` and no limit when ``limit is None``; ``kind="silu"`` is its plain
``Swiglu`` (``silu(g) * u``). The activation output is rounded to bf16 before
the second GEMM.

The fused top-k reduction uses atomics, so results are not bitwise reproducible
run to run (FlashInfer falls back to a deterministic finalize when
``torch.are_deterministic_algorithms_enabled()``). FlashInfer compiles its whole
SM90 fused-MoE module with nvcc on first use (weight preprocessing included):
more than nine minutes on the H200 machine.
"""

from __future__ import annotations

import dataclasses
import threading

import torch
import torch.nn.functional as F

from tokenspeed_kernel.ops.moe import MoEActivation, MoEWeights

from ._jit import first_use, import_flashinfer
from ._layout import moe_padded

_fi = import_flashinfer()

_MODULE = "SM90 fused MoE (CUTLASS, MXFP4 weights x bf16 activations)"

_params_lock = threading.Lock()
_params: dict[tuple, tuple[torch.Tensor | None, ...]] = {}


def preprocess_weights(weights: MoEWeights) -> MoEWeights:
    """Canonical MXFP4 :class:`MoEWeights` -> FlashInfer's SM90 mixed-input layout (new tensors).

    Args:
        weights: canonical ``mxfp4`` weights on the GPU (FlashInfer's byte interleave is a
            CUDA kernel): ``w13 uint8 [E, 2I, H/2]``,
            ``w13_scale uint8 [E, 2I, H/32]``, ``w2 uint8 [E, H, I/2]``, ``w2_scale uint8
            [E, H, I/32]``, optional ``w13_bias [E, 2I]`` / ``w2_bias [E, H]``.

    Returns:
        ``MoEWeights`` with ``w13 uint8 [E, 2Ip, Hp/2]``, ``w2 uint8 [E, Hp, Ip/2]`` (byte
        interleaved), ``w13_scale uint8 [E, 2Ip/64, Hp/128, 16, 16]``, ``w2_scale uint8
        [E, Hp/64, Ip/128, 16, 16]``, bf16 biases ``[E, 2Ip]`` / ``[E, Hp]`` (rows ``[up;
        gate]``) and ``extra = (H, I)``; ``Hp``/``Ip`` are ``H``/``I`` rounded up to 128.
    """
    if weights.format != "mxfp4":
        raise ValueError(f"weights: the FlashInfer SM90 MoE takes mxfp4 weights, got {weights.format!r}")
    p = moe_padded(weights)
    fm = _fi.fused_moe
    with first_use(_MODULE):  # the byte interleave is a kernel of the fused-MoE module
        w13 = fm.interleave_moe_weights_for_sm90_mixed_gemm(p.w13, "fp4")
        w2 = fm.interleave_moe_weights_for_sm90_mixed_gemm(p.w2, "fp4")
    return dataclasses.replace(
        weights,
        w13=w13,
        w2=w2,
        w13_scale=fm.interleave_moe_scales_for_sm90_mixed_gemm(p.w13_scale),
        w2_scale=fm.interleave_moe_scales_for_sm90_mixed_gemm(p.w2_scale),
        w13_bias=p.w13_bias,
        w2_bias=p.w2_bias,
        extra=(p.hidden, p.intermediate),
    )


def _activation_params(activation: MoEActivation, e: int, device: torch.device) -> tuple[torch.Tensor | None, ...]:
    """Per-expert fp32 ``(alpha, beta, limit)`` for ``SwigluBias``; all None for plain SiLU-gated."""
    if activation.kind == "silu":
        return None, None, None
    key = (activation, e, device)
    with _params_lock:
        got = _params.get(key)
        if got is None:
            full = lambda v: torch.full((e,), float(v), dtype=torch.float32, device=device)
            limit = None if activation.limit is None else full(activation.limit)
            got = _params[key] = (full(activation.alpha), full(activation.up_offset), limit)
        return got


def moe_apply(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: MoEWeights,
    activation: MoEActivation,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fused MoE layer with weights from :func:`preprocess_weights`.

    Args:
        x: ``bf16 [T, H]``.
        topk_weights: ``float32 [T, k]``; topk_ids: ``int32 [T, k]``.
        weights: processed by :func:`preprocess_weights` (``extra = (H, I)``).
        activation: :class:`MoEActivation` (swiglu with any alpha/limit/up_offset, or silu).
        out: optional ``bf16 [T, H]``.
    """
    t, h = x.shape
    if weights.extra[:1] != (h,):
        raise ValueError(f"weights: processed for hidden size {weights.extra[:1]}, x has {h}")
    hp = weights.w2.shape[1]
    if t == 0:
        return out if out is not None else torch.empty_like(x)
    xp = x if h == hp and x.is_contiguous() else F.pad(x, (0, hp - h)).contiguous()
    direct = out is not None and h == hp and out.is_contiguous()
    buf = out if direct else torch.empty(t, hp, dtype=torch.bfloat16, device=x.device)
    alpha, beta, limit = _activation_params(activation, weights.num_experts, x.device)
    with first_use(_MODULE):
        _fi.cutlass_fused_moe(
            xp, topk_ids, topk_weights.contiguous(), weights.w13, weights.w2, torch.bfloat16,
            [weights.w13_scale.view(torch.int32), weights.w2_scale.view(torch.int32)],
            fc1_expert_biases=weights.w13_bias, fc2_expert_biases=weights.w2_bias,
            swiglu_alpha=alpha, swiglu_beta=beta, swiglu_limit=limit,
            use_w4_group_scaling=True, activation_type=_fi.ActivationType.Swiglu, output=buf,
        )  # fmt: skip
    if direct:
        return out
    y = buf if h == hp else buf[:, :h]
    if out is not None:
        return out.copy_(y)
    return y.contiguous()

"""Host code of the CDNA MXFP4 MoE: one launch plan, run with the kernel set of a target.

``target`` picks the kernels: ``"gfx950"`` (Gluon, scaled MFMA), ``"gfx942"`` (Gluon,
bf16 MFMA on weights decoded in registers) or ``"portable"`` (the Triton twin, any GPU
and the interpreter). Everything else (argument checks, tiles, routing and the block
schedule, scratch buffers, grids, the arguments of every launch) is this module's and
the same for all three.

Activations: with both static FP8 scales (``w13_act_scale``, ``w2_act_scale``) the layer
runs W4A8 as vLLM's TokenSpeed backend expects: ``x / w13_act_scale`` and the SwiGLU
output ``/ w2_act_scale`` rounded to E4M3 (saturating) feed the GEMMs, whose fp32
results are multiplied back by the scales. Without scales (``moe_apply``) the GEMMs take
the activations in their own dtype.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass
from typing import Any

import torch

from .._launch import KernelLaunch, next_pow2
from .schedule import MoeTiles, build_schedule, choose_tiles, max_tiles, route
from .weights import MxfpMoeWeights

__all__ = ["KernelSet", "TARGETS", "kernel_set", "resolve_target", "moe_launches", "fused_moe"]


@dataclass(frozen=True)
class KernelSet:
    """The four kernels of one target and the constexprs only that target's kernels take
    (``decode_constexprs`` for the two decode kernels, ``grouped_constexprs`` for the grouped GEMMs)."""

    name: str
    decode_gate_up: Any
    decode_down: Any
    grouped_gate_up: Any
    grouped_down: Any
    decode_constexprs: tuple[tuple[str, Any], ...] = ()
    grouped_constexprs: tuple[tuple[str, Any], ...] = ()


TARGETS = ("gfx950", "gfx942", "portable")


@functools.cache
def kernel_set(target: str) -> KernelSet:
    """The kernels of ``target`` (imported on first use)."""
    if target == "portable":
        twin = importlib.import_module("tokenspeed_kernel_amd.moe.twin")
        # The interpreter's bf16 dot is wrong in Triton 3.6: the twin's dots then take the same values in fp32.
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        return KernelSet(
            "portable", twin.decode_gate_up, twin.decode_down, twin.grouped_gate_up, twin.grouped_down,
            grouped_constexprs=(("DOT_FP32", interpreted),),
        )  # fmt: skip
    if target in ("gfx950", "gfx942"):
        from ..cdna.arch import ARCHS
        from ..cdna.moe_common import decode_constexprs, grouped_constexprs

        dec = importlib.import_module("tokenspeed_kernel_amd.cdna.moe_decode")
        grp = importlib.import_module("tokenspeed_kernel_amd.cdna.moe_grouped")
        return KernelSet(
            target, dec.decode_gate_up, dec.decode_down, grp.grouped_gate_up, grp.grouped_down,
            decode_constexprs=decode_constexprs(ARCHS[target]),
            grouped_constexprs=grouped_constexprs(ARCHS[target]),
        )  # fmt: skip
    raise ValueError(f"target: expected one of {TARGETS}, got {target!r}")


def resolve_target(device: torch.device, target: str | None) -> str:
    """``target`` if given, else the CDNA arch of ``device`` (or of the active fake platform)."""
    if target is not None:
        if target not in TARGETS:
            raise ValueError(f"target: expected one of {TARGETS} or None, got {target!r}")
        return target
    from tokenspeed_kernel.core.platform import platform_for_device

    plat = platform_for_device(device)
    if plat.vendor == "amd" and plat.arch in ("gfx950", "gfx942"):
        return plat.arch
    raise RuntimeError(
        f"the CDNA MXFP4 MoE runs on gfx950 or gfx942; {device} is {plat.vendor} {plat.arch}. "
        "Pass target='portable' for its Triton twin (any GPU, or the CPU under TRITON_INTERPRET=1)."
    )


def _scale(name: str, value: Any, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or not value.is_floating_point():
            raise ValueError(f"{name}: expected one float (a per-tensor scale), got {value.dtype} {list(value.shape)}")
        if value.device != device:
            raise ValueError(f"{name}: expected device {device} (like hidden_states), got {value.device}")
        return value.reshape(1).to(torch.float32)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return torch.full((1,), float(value), dtype=torch.float32, device=device)
    raise TypeError(f"{name}: expected a float tensor of one element or a float > 0, got {value!r}")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def moe_launches(
    x: torch.Tensor,
    weights: MxfpMoeWeights,
    *,
    top_k: int,
    router_logits: torch.Tensor | None,
    topk: tuple[torch.Tensor, torch.Tensor] | None,
    act_scales: tuple[torch.Tensor, torch.Tensor] | None,
    swiglu: tuple[float, float | None, float],
    out: torch.Tensor,
    kernels: KernelSet,
    tiles: MoeTiles,
) -> tuple[list[KernelLaunch], Any]:
    """The launches of one call and a function that finishes the result after them.

    ``topk = (weights float32 [T, k], ids int32 [T, k])`` or ``router_logits`` (routed here).
    ``out [T, H]`` receives the result. Returns ``(launches, finish)``; ``finish()``
    returns ``out``.
    """
    tokens, hidden = x.shape
    e, inter = weights.num_experts, weights.inter
    dev = x.device
    fp8 = act_scales is not None
    # Without FP8 activations the kernels read no scale: nothing to allocate per call.
    a1, a2 = act_scales if fp8 else (None, None)
    alpha, limit, beta = swiglu
    clamp = limit is not None
    limit_v = float(limit) if clamp else 0.0
    inter_dtype = torch.float8_e4m3fn if fp8 else x.dtype
    w13, s13, w2, s2, b13, b2 = (
        weights.w13,
        weights.w13_scale,
        weights.w2,
        weights.w2_scale,
        weights.w13_bias,
        weights.w2_bias,
    )
    has_bias = b13 is not None or b2 is not None
    if has_bias:
        b13 = b13 if b13 is not None else torch.zeros(w13.shape[:2], dtype=torch.float32, device=dev)
        b2 = b2 if b2 is not None else torch.zeros(w2.shape[:2], dtype=torch.float32, device=dev)
    w13_strides = (w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), b13.stride(0) if has_bias else 0)
    w2_strides = (w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), b2.stride(0) if has_bias else 0)
    common = dict(HAS_BIAS=has_bias, ACT_FP8=fp8, NUM_WARPS=tiles.num_warps, num_warps=tiles.num_warps)
    k = top_k
    inter_buf = torch.empty((tokens * k, inter), dtype=inter_dtype, device=dev)

    if tiles.path == "decode":
        decode = dict(kernels.decode_constexprs)
        if topk is None:
            ids = torch.empty((tokens, k), dtype=torch.int32, device=dev)
            wts = torch.empty((tokens, k), dtype=torch.float32, device=dev)
            logits, stride_lt = router_logits, router_logits.stride(0)
        else:
            wts, ids = topk
            logits, stride_lt = ids, 0
        gate_up = KernelLaunch(
            kernels.decode_gate_up, (tokens * k, _cdiv(inter, tiles.block_n1)),
            (x, logits, w13, s13, b13, a1, a2, ids, wts, inter_buf, x.stride(0), stride_lt, *w13_strides,
             float(alpha), limit_v, float(beta)),
            dict(NUM_EXPERTS=e, EXPERTS_P2=next_pow2(e), TOP_K=k, HIDDEN=hidden, INTER=inter,
                 BLOCK_N=tiles.block_n1, BLOCK_K=tiles.block_k, INTERLEAVED=weights.interleaved, CLAMP=clamp,
                 ROUTE=topk is None, **common, **decode),
        )  # fmt: skip
        down = KernelLaunch(
            kernels.decode_down, (tokens, _cdiv(hidden, tiles.block_n2)),
            (inter_buf, ids, wts, w2, s2, b2, a2, out, *w2_strides, out.stride(0)),
            dict(TOP_K=k, HIDDEN=hidden, INTER=inter, BLOCK_N=tiles.block_n2, BLOCK_K=tiles.block_k, **common,
                 **decode),
        )  # fmt: skip
        return [gate_up, down], lambda: out

    wts, ids = route(router_logits, k) if topk is None else topk
    sched = build_schedule(ids, e, tiles.block_m)
    n_tiles = max_tiles(tokens * k, e, tiles.block_m)
    y = torch.empty((tokens * k, hidden), dtype=torch.float32, device=dev)
    grouped = dict(kernels.grouped_constexprs)
    tile_args = (sched.sorted_rows, sched.expert_offsets, sched.tile_expert, sched.tile_start)
    gate_up = KernelLaunch(
        kernels.grouped_gate_up, (n_tiles, _cdiv(inter, tiles.block_n1)),
        (x, *tile_args, w13, s13, b13, a1, a2, inter_buf, x.stride(0), *w13_strides, float(alpha), limit_v,
         float(beta)),
        dict(TOP_K=k, HIDDEN=hidden, INTER=inter, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n1,
             BLOCK_K=tiles.block_k, INTERLEAVED=weights.interleaved, CLAMP=clamp, **common, **grouped),
    )  # fmt: skip
    down = KernelLaunch(
        kernels.grouped_down, (n_tiles, _cdiv(hidden, tiles.block_n2)),
        (inter_buf, *tile_args, wts.reshape(-1), w2, s2, b2, a2, y, *w2_strides, y.stride(0)),
        dict(HIDDEN=hidden, INTER=inter, BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n2, BLOCK_K=tiles.block_k,
             **common, **grouped),
    )  # fmt: skip

    def finish() -> torch.Tensor:
        # The k slots of a token, summed in slot order (deterministic).
        return out.copy_(y.view(tokens, k, hidden).sum(dim=1))

    return [gate_up, down], finish


def fused_moe(
    x: torch.Tensor,
    weights: MxfpMoeWeights,
    *,
    top_k: int,
    router_logits: torch.Tensor | None = None,
    topk_weights: torch.Tensor | None = None,
    topk_ids: torch.Tensor | None = None,
    w13_act_scale: torch.Tensor | float | None = None,
    w2_act_scale: torch.Tensor | float | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float | None = 7.0,
    swiglu_beta: float = 1.0,
    out_dtype: torch.dtype | None = None,
    decode: bool = True,
    target: str | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The MXFP4 MoE layer ``sum_s w[t,s] * W2_e(swiglu(W13_e x_t + b13_e)) + b2_e``.

    Args:
        x: ``[T, H]`` bf16 / fp16.
        weights: :class:`~.weights.MxfpMoeWeights` (from :func:`~.weights.prepare_weights`).
        top_k: experts per token.
        router_logits: ``[T, E]``: route here (softmax top-k, renormalised); or give
            ``topk_weights`` (float32 ``[T, k]``) and ``topk_ids`` (int32 ``[T, k]``).
        w13_act_scale, w2_act_scale: static per-tensor FP8 scales of the GEMM inputs
            (both: W4A8), or neither (activations in x's dtype).
        swiglu_alpha, swiglu_limit (None: no clamp), swiglu_beta (added to up):
            ``(clamp(up) + beta) * g * sigmoid(alpha * g)`` with ``g = min(gate, limit)``.
        out_dtype: result dtype (bf16 / fp16; default x's).
        decode: allow the decode path for small T (False: always the grouped GEMMs).
        target: ``"gfx950"``, ``"gfx942"``, ``"portable"``, or None (the device's arch).
        out: optional ``[T, H]`` result tensor of ``out_dtype``.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"hidden_states: expected a bf16/fp16 [T, H] tensor, got {getattr(x, 'dtype', type(x))} "
                        f"{list(getattr(x, 'shape', []))}")  # fmt: skip
    if not isinstance(weights, MxfpMoeWeights):
        raise TypeError(f"weights: expected MxfpMoeWeights, got {type(weights).__name__}")
    tokens, hidden = x.shape
    e = weights.num_experts
    if hidden != weights.hidden:
        raise ValueError(f"hidden_states: expected hidden size {weights.hidden} (the weights'), got {hidden}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= e:
        raise ValueError(f"top_k: expected an int in [1, {e}], got {top_k!r}")
    if x.stride(1) != 1:
        raise ValueError("hidden_states: expected unit stride along H")
    if (router_logits is None) == (topk_ids is None):
        raise ValueError("router_logits: give router_logits, or topk_weights and topk_ids, not both or neither")
    if router_logits is not None:
        if router_logits.shape != (tokens, e) or not router_logits.is_floating_point():
            raise ValueError(f"router_logits: expected a float [T, E] = {[tokens, e]}, got "
                             f"{router_logits.dtype} {list(router_logits.shape)}")  # fmt: skip
        if router_logits.stride(1) != 1:
            router_logits = router_logits.contiguous()
        topk = None
    else:
        if topk_weights is None:
            raise ValueError("topk_weights: required with topk_ids")
        if topk_ids.dtype != torch.int32 or topk_ids.shape != (tokens, top_k):
            raise ValueError(f"topk_ids: expected int32 [T, top_k] = {[tokens, top_k]}, got "
                             f"{topk_ids.dtype} {list(topk_ids.shape)}")  # fmt: skip
        if topk_weights.dtype != torch.float32 or topk_weights.shape != (tokens, top_k):
            raise ValueError(f"topk_weights: expected float32 [T, top_k], got {topk_weights.dtype} "
                             f"{list(topk_weights.shape)}")  # fmt: skip
        topk = (topk_weights.contiguous(), topk_ids.contiguous())
    if (w13_act_scale is None) != (w2_act_scale is None):
        raise ValueError("w13_act_scale, w2_act_scale: give both static FP8 scales (W4A8) or neither")
    act_scales = None
    if w13_act_scale is not None:
        act_scales = (_scale("w13_act_scale", w13_act_scale, x.device), _scale("w2_act_scale", w2_act_scale, x.device))
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"out_dtype: expected torch.bfloat16 or torch.float16, got {out_dtype}")
    if out is None:
        out = torch.empty((tokens, hidden), dtype=out_dtype, device=x.device)
    elif out.shape != (tokens, hidden) or out.dtype != out_dtype:
        raise ValueError(f"out: expected {out_dtype} [T, H] = {[tokens, hidden]}, got {out.dtype} {list(out.shape)}")
    kernels = kernel_set(resolve_target(x.device, target))
    if tokens == 0:
        return out
    tiles = choose_tiles(tokens, e, top_k, decode=decode)
    launches, finish = moe_launches(
        x, weights, top_k=top_k, router_logits=router_logits, topk=topk, act_scales=act_scales,
        swiglu=(swiglu_alpha, swiglu_limit, swiglu_beta), out=out, kernels=kernels, tiles=tiles,
    )  # fmt: skip
    for launch in launches:
        launch()
    return finish()

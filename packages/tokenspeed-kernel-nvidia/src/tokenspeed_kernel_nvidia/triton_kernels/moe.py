"""``moe_apply`` through OpenAI's ``triton_kernels`` on Hopper: MXFP4 weights x bf16 activations.

The layer (what vLLM runs for GPT-OSS on H100/H200, with our routing inputs):

1. from ``topk_ids`` (the call's routing): the (token, slot) rows sorted by expert
   (a stable sort, so rows of one expert stay in token order), the rows per expert,
   and the library's ragged metadata over them; all on the device, no host sync;
2. first matmul: gathers each row's token from ``x``, adds the w13 bias and runs the
   library's fused SwiGLU (``swiglu_fn``: gate/up are interleaved pairs, gate
   clamped to ``<= limit``, up to ``[-limit, limit]``, ``gate * sigmoid(alpha *
   gate) * (up + 1)`` in fp32), so only ``up_offset = 1`` (GPT-OSS) is offered;
3. second matmul: adds the w2 bias, multiplies by the routing weight and scatters
   each row to ``token * k + slot``;
4. the top-k rows of each token are summed in torch (the library's ``reduce`` does
   not compile on upstream Triton 3.6).

Host cost: an eager call of at most ``GRAPH_MAX_TOKENS`` tokens replays a CUDA graph
of steps 1-4, captured once per call shape and weights at the shape's second call
(``tokenspeed_kernel.graphs``); the library's Python costs 1.3-2.4 ms per call at one
token on the H200 machine.

Weights (:func:`preprocess_weights`, once, through ``moe_process_weights``): the
codes and E8M0 scales are transposed so the reduction axis is dim -2 (the
library's ``[E, K, N]``) and converted to its Hopper layouts
(``HopperMXValueLayout(mx_axis=-2, mma_version=3)``,
``HopperMXScaleLayout(mx_axis=-2, num_warps=8)``, as vLLM does); gate/up rows are
interleaved if they were not; biases become fp32. The converted tensors are the
``MoEWeights`` fields; ``extra`` holds the logical shapes the library's tensor
wrappers need, rebuilt (and cached) per weights object.
"""

from __future__ import annotations

import dataclasses
import threading

import torch

from tokenspeed_kernel.graphs import GraphCache, in_place_key, tensor_key
from tokenspeed_kernel.ops.moe import MoEActivation, MoEWeights, interleave_gate_up

from ._compat import import_triton_kernels

__all__ = ["preprocess_weights", "moe_apply", "SCALE_NUM_WARPS"]

#: Warps the Hopper scale swizzle is laid out for (vLLM's choice; the matmul reads it that way).
SCALE_NUM_WARPS = 8
MX_BLOCK = 32

_tk = import_triton_kernels()
_layout = _tk.tensor_details.layout
_FP4 = _tk.tensor.FP4


def _value_layout():
    return _layout.HopperMXValueLayout(mx_axis=-2, mma_version=3)


def _scale_layout():
    return _layout.HopperMXScaleLayout(mx_axis=-2, num_warps=SCALE_NUM_WARPS)


def _to_hopper(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Canonical ``codes [E, N, K/2]`` / ``scales [E, N, K/32]`` -> the library's Hopper storages."""
    w = _tk.tensor.convert_layout(_tk.tensor.wrap_torch_tensor(codes.transpose(-2, -1), dtype=_FP4), _value_layout())
    s = _tk.tensor.convert_layout(_tk.tensor.wrap_torch_tensor(scales.transpose(-2, -1)), _scale_layout())
    return w.storage.data, s.storage.data


def preprocess_weights(weights: MoEWeights) -> MoEWeights:
    """Canonical MXFP4 weights -> this kernel's layout (new tensors; the input is not modified)."""
    if weights.format != "mxfp4":
        raise ValueError(f"weights: triton_kernels.moe_apply takes mxfp4 weights, got {weights.format!r}")
    e, two_i, _ = weights.w13.shape
    inter, hidden = two_i // 2, weights.hidden
    w13, s13, b13 = weights.w13, weights.w13_scale, weights.w13_bias
    if not weights.gate_up_interleaved:
        w13, s13 = interleave_gate_up(w13, inter), interleave_gate_up(s13, inter)
        b13 = None if b13 is None else interleave_gate_up(b13, inter)
    w13_data, s13_data = _to_hopper(w13.contiguous(), s13.contiguous())
    w2_data, s2_data = _to_hopper(weights.w2.contiguous(), weights.w2_scale.contiguous())
    return MoEWeights(
        w13=w13_data,
        w2=w2_data,
        format="mxfp4",
        # fp32 biases, as vLLM passes them: the epilogue adds them to the fp32 accumulator.
        w13_bias=None if b13 is None else b13.float().contiguous(),
        w2_bias=None if weights.w2_bias is None else weights.w2_bias.float().contiguous(),
        w13_scale=s13_data,
        w2_scale=s2_data,
        gate_up_interleaved=True,
        extra=(e, hidden, inter),
    )


@dataclasses.dataclass(frozen=True)
class _Layer:
    w13: object
    w2: object
    pc13: object
    pc2: object


_layers: dict[tuple, _Layer] = {}
_layers_lock = threading.Lock()


def _layer(weights: MoEWeights) -> _Layer:
    """The library's tensor wrappers and precision configs for converted weights (cached per storage)."""
    key = (weights.w13.data_ptr(), weights.w2.data_ptr(), weights.w13_scale.data_ptr(), weights.w2_scale.data_ptr(),
           weights.extra)  # fmt: skip
    hit = _layers.get(key)
    if hit is not None:
        return hit
    e, hidden, inter = weights.extra
    storage, tensor = _tk.tensor.Storage, _tk.tensor.Tensor
    mm = _tk.matmul

    def value(data: torch.Tensor, k: int, n: int):
        return tensor(storage(data, _value_layout()), dtype=_FP4, shape=[e, k, n])

    def scale(data: torch.Tensor, k: int, n: int):
        return tensor(storage(data, _scale_layout()), dtype=_tk.tensor.UINT8, shape=[e, k // MX_BLOCK, n])

    def precision(s):
        return mm.PrecisionConfig(flex_ctx=mm.FlexCtx(rhs_data=_tk.numerics.InFlexData()), b_mx_scale=s,
                                  b_microblock_size=MX_BLOCK)  # fmt: skip

    layer = _Layer(
        w13=value(weights.w13, hidden, 2 * inter),
        w2=value(weights.w2, inter, hidden),
        pc13=precision(scale(weights.w13_scale, hidden, 2 * inter)),
        pc2=precision(scale(weights.w2_scale, inter, hidden)),
    )
    with _layers_lock:
        if len(_layers) > 256:  # layers of a few models; converted weights that went away leave stale keys
            _layers.clear()
        _layers[key] = layer
    return layer


def _activation(activation: MoEActivation):
    mm = _tk.matmul
    specs = mm.FnSpecs("swiglu", _tk.swiglu.swiglu_fn, ("alpha", "limit"), reduction_n=2)
    return mm.FusedActivation(specs, (float(activation.alpha), activation.limit))


def moe_apply(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: MoEWeights,
    activation: MoEActivation,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sum_s w[t,s] * expert_{ids[t,s]}(x[t])`` with the library's two ragged matmuls.

    Eager calls of up to ``GRAPH_MAX_TOKENS`` tokens replay a CUDA graph of the layer
    captured once per shape, or per recurring input addresses, read without copies
    (:mod:`tokenspeed_kernel.graphs`, ``in_place``): the library's host code
    costs 1.3-2.4 ms a call at one token on the H200 machine (host-cost report), the
    whole layer with the route 89.5 us in a CUDA graph (hopper-moe report).
    """
    if topk_ids.shape[0] <= GRAPH_MAX_TOKENS and _GRAPHS.usable(x, topk_weights, topk_ids):
        key = (
            tensor_key(x), tensor_key(topk_weights), tensor_key(topk_ids), weights.extra, activation,
            in_place_key(weights.w13, weights.w13_scale, weights.w2, weights.w2_scale, weights.w13_bias,
                         weights.w2_bias),
        )  # fmt: skip
        result = _GRAPHS.run(
            key, (x, topk_weights, topk_ids), lambda a, w, i: _apply(a, w, i, weights, activation), in_place=True
        )
    else:
        result = _apply(x, topk_weights, topk_ids, weights, activation)
    if out is not None:
        return out.copy_(result)
    return result


#: eager calls of at most this many tokens replay a captured graph (memory per graph: a few MB at 64 tokens).
GRAPH_MAX_TOKENS = 64
_GRAPHS = GraphCache("triton_kernels.moe_apply", max_graphs=128)


def _apply(x, topk_weights, topk_ids, weights: MoEWeights, activation: MoEActivation) -> torch.Tensor:
    tokens, k = topk_ids.shape
    e = weights.num_experts
    layer = _layer(weights)
    flat = topk_ids.reshape(-1)
    # Rows in expert order; stable, so an expert's rows keep token order (as the library's topk gives them).
    order = torch.argsort(flat, stable=True).to(torch.int32)
    counts = torch.zeros(e, dtype=torch.int32, device=x.device).scatter_add_(0, flat.long(), torch.ones_like(flat))
    ragged = _tk.tensor.make_ragged_tensor_metadata(counts, tokens * k)
    gammas = topk_weights.reshape(-1)[order.long()]
    h = _tk.matmul.matmul(x, layer.w13, weights.w13_bias, a_ragged_metadata=ragged, gather_indx=order // k,
                          precision_config=layer.pc13, fused_activation=_activation(activation))  # fmt: skip
    y = _tk.matmul.matmul(h, layer.w2, weights.w2_bias, a_ragged_metadata=ragged, scatter_indx=order,
                          precision_config=layer.pc2, gammas=gammas)  # fmt: skip
    return y.view(tokens, k, y.shape[-1]).sum(dim=1, dtype=torch.float32).to(x.dtype)

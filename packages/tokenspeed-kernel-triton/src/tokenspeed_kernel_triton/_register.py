"""Entry point of the ``triton`` plugin: every kernel of this package, one table walked by one loop.

Nothing here imports Triton or a kernel module: each implementation is a lazy
``"module:function"`` string, resolved on the first call that selects it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tokenspeed_kernel import ANY, Range, register_kernel

from ._common import TRITON_CAPABILITY, TRITON_PRIORITY


class _Kernel(NamedTuple):
    """One registration: ``triton.<op>``, implemented by ``impl`` (``"module:function"``
    below this package)."""

    op: str
    impl: str
    formats: list[dict[str, Any]]
    traits: dict[str, Any]
    doc: str
    #: Ran on an H200 (docs/benchmarks/h200-2026-11-30/README.md); none has run on an AMD GPU yet.
    hardware_validated: bool = True


_FLOAT = ("fp32", "bf16", "fp16")
_FP8_ACTIVATION = ("fp8_e4m3:per_tensor", "fp8_e4m3:per_token", "fp8_e4m3:block128")
_FP8_WEIGHT = ("fp8_e4m3:per_tensor", "fp8_e4m3:per_channel", "fp8_e4m3:block128")
_BOOL = (False, True)

#: Head sizes the attention kernels compile for: ``tl.arange`` over head_dim needs a power
#: of two, and ``tl.dot`` at least 16.
HEAD_DIMS = (16, 32, 64, 128, 256)
_ATTENTION_FORMATS = [{"q": dt, "kv": dt} for dt in ("bf16", "fp16", "fp32")]


def _attention_traits(*, causal: bool, paged: bool) -> dict[str, Any]:
    traits: dict[str, Any] = {
        "head_dim": HEAD_DIMS,
        # Groups larger than a tile's rows are split over several programs.
        "gqa_group": Range(1, 256),
        "window": _BOOL,
        "sinks": _BOOL,
        "logit_cap": _BOOL,
        "return_lse": _BOOL,
    }
    if causal:
        traits["causal"] = _BOOL
    if paged:
        traits["page_size"] = Range(1, 256, power_of_two=True)
    return traits


#: Expert weight formats the MoE GEMMs read in their canonical layout (no preprocessor).
_MOE_WEIGHTS = ("bf16", "fp16", "fp8_e4m3:per_channel", "fp8_e4m3:per_tensor", "mxfp4")
_MOE_X = ("bf16", "fp16")
_EXPERT_TRAITS = {
    "activation": ("swiglu", "silu"),
    "clamp": _BOOL,
    "bias": _BOOL,
    "gate_up_interleaved": _BOOL,
    "up_offset": ANY,  # a launch argument
}

_KERNELS = (
    # attention/
    _Kernel(
        "mha_prefill",
        "attention.prefill:mha_prefill",
        _ATTENTION_FORMATS,
        _attention_traits(causal=True, paged=False),
        "Triton varlen prefill: GQA-packed tiles, window block skipping, sinks, exp2 online softmax",
    ),
    _Kernel(
        "mha_extend_with_kvcache",
        "attention.extend:mha_extend_with_kvcache",
        _ATTENTION_FORMATS,
        _attention_traits(causal=True, paged=True),
        "Triton chunked prefill over the paged NHD cache (the prefill kernel, paged loads)",
    ),
    _Kernel(
        "mha_decode_with_kvcache",
        "attention.decode:mha_decode_with_kvcache",
        _ATTENTION_FORMATS,
        _attention_traits(causal=False, paged=True),
        "Triton split-KV paged decode, GQA group per program, the last split merges (stream counters) and adds sinks",
    ),
    _Kernel(
        "mha_decode_append_kvcache",
        "attention.decode:mha_decode_append_kvcache",
        _ATTENTION_FORMATS,
        {
            **{k: v for k, v in _attention_traits(causal=False, paged=True).items() if k != "return_lse"},
            "rotary": _BOOL,
            "style": ("neox", "gptj"),
        },
        "The Triton split-KV decode that first writes the new token's K/V (rotated with q) into the cache: the "
        "program whose key range holds it uses them from registers",
    ),
    _Kernel(
        "kvcache_store",
        "attention.store:kvcache_store",
        [{"kv": ("bf16", "fp16", "fp32")}],
        {},
        "Triton scatter of new K/V rows into the paged cache by slot",
    ),
    # moe/
    _Kernel(
        "moe_route",
        "moe.route:moe_route",
        [{"logits": _FLOAT}],
        {"renormalize": _BOOL},
        "Fused softmax top-k routing, one program per 16 tokens",
    ),
    _Kernel(
        "moe_gate",
        "moe.route:moe_gate",
        [{"x": _FLOAT}],
        {"renormalize": _BOOL, "bias": _BOOL, "norm": _BOOL, "fused_residual": _BOOL},
        "The router's linear layer and softmax top-k routing in one kernel (CUDA-core sums for a few tokens, tl.dot "
        "from 16), optionally after the RMSNorm it reads (a first pass over each row, the norm applied to each chunk "
        "the GEMM reads)",
    ),
    _Kernel(
        "moe_dispatch",
        "moe.dispatch:moe_dispatch",
        [{"x": _FLOAT}],
        {},
        "Stable sort of token rows by expert without a host sync, plus the row gather",
    ),
    _Kernel(
        "moe_experts",
        "moe.experts:moe_experts",
        [{"x": _MOE_X, "w": _MOE_WEIGHTS}],
        _EXPERT_TRAITS,
        "Grouped expert GEMMs (gate/up + SwiGLU, down), weights decoded in registers",
    ),
    _Kernel(
        "moe_combine",
        "moe.combine:moe_combine",
        [{"x": _FLOAT}],
        {},
        "Weighted sum of each token's expert rows in float32",
    ),
    _Kernel(
        "moe_apply",
        "moe.experts:moe_apply",
        [{"x": _MOE_X, "w": _MOE_WEIGHTS}],
        _EXPERT_TRAITS,
        "Fused MoE layer: weight-streaming path for a few tokens, sorted grouped GEMMs above",
    ),
    # linear attention (gated delta rule)
    _Kernel(
        "gdn_chunk_prefill",
        "linear_attention:gdn_chunk_prefill",
        [{"x": _FLOAT}],
        {"head_dim": HEAD_DIMS, "head_dim_v": HEAD_DIMS, "qk_l2norm": _BOOL},
        "Triton chunked gated delta rule: 64-token WY chunks, sequential fp32 state, varlen without host sync",
        # verify + GPU tests on an H200: docs/benchmarks/h200-2026-12-01/gdn/
    ),
    _Kernel(
        "gdn_decode",
        "linear_attention:gdn_decode",
        [{"x": _FLOAT}],
        {"head_dim": HEAD_DIMS, "head_dim_v": HEAD_DIMS, "qk_l2norm": _BOOL},
        "Triton gated-delta-rule decode step, fp32 state tile updated in place (state indices, padding rows)",
    ),
    # dense ops, one module each
    _Kernel(
        "mm",
        "mm:mm",
        [
            {"a": _FLOAT, "b": _FLOAT, "out": _FLOAT},
            {"a": _FP8_ACTIVATION, "b": _FP8_WEIGHT, "out": _FLOAT},
            {"a": ("bf16", "fp16"), "b": "mxfp4", "out": _FLOAT},
        ],
        {"bias": _BOOL},
        "Triton GEMM: 16/32-bit, FP8 (tensor/row/block128 scales), MXFP4 weights decoded in registers",
    ),
    _Kernel("rmsnorm", "rmsnorm:rmsnorm", [{"x": _FLOAT}], {"fused_residual": _BOOL}, "Triton RMSNorm (+ residual)"),
    _Kernel(
        "swiglu",
        "activation:swiglu",
        [{"x": _FLOAT}],
        {"interleaved": _BOOL, "clamp": _BOOL},
        "Triton GPT-OSS SwiGLU",
    ),
    _Kernel("silu_and_mul", "activation:silu_and_mul", [{"x": _FLOAT}], {}, "Triton SiLU-and-mul"),
    _Kernel(
        "apply_rotary",
        "rope:apply_rotary",
        [{"x": _FLOAT}],
        {"style": ("neox", "gptj"), "partial": _BOOL},
        "Triton rotary embedding of q and k in one launch",
    ),
    _Kernel(
        "apply_rotary_and_store",
        "rope:apply_rotary_and_store",
        [{"x": _FLOAT, "kv": ("bf16", "fp16", "fp32")}],
        {"style": ("neox", "gptj"), "partial": _BOOL},
        "Triton rotary embedding of q and k, the rotated k and v stored into the paged cache, in one launch",
    ),
    _Kernel(
        "quantize_fp8",
        "quantization:quantize_fp8",
        [{"x": _FLOAT}],
        {"granularity": ("per_tensor", "per_token", "block128"), "static": _BOOL},
        "Triton FP8 e4m3 quantization (per tensor without host sync, per token, 1x128 blocks)",
    ),
    _Kernel(
        "quantize_mxfp4",
        "quantization:quantize_mxfp4",
        [{"x": _FLOAT}],
        {},
        "Triton MXFP4 quantization (bit-exact with the reference)",
    ),
    _Kernel(
        "dequantize_mxfp4",
        "quantization:dequantize_mxfp4",
        [{"x": "mxfp4", "out": _FLOAT}],
        {},
        "Triton MXFP4 dequantization",
    ),
    _Kernel("argmax", "sampling:argmax", [{"logits": _FLOAT}], {}, "Triton two-stage argmax"),
    _Kernel(
        "top_k_top_p_sample",
        "sampling:top_k_top_p_sample",
        [{"logits": _FLOAT}],
        {},
        "Triton top-k/top-p sampling: exact radix select and threshold narrowing, many programs per row (no vocabulary sort)",
    ),
)

#: Bitwise repeatable (fixed split counts and merge orders; the only atomics add integer
#: counts) and no host synchronisation or allocation sized by device data: CUDA-graph safe.
_TAGS = ("deterministic", "cuda_graph_safe")


def register() -> None:
    """Register ``triton.<op>`` for every kernel of :data:`_KERNELS`."""
    from ._interpreter import apply_interpreter_fixes

    # Only under TRITON_INTERPRET=1 (CPU tests): the one case where registration imports Triton.
    apply_interpreter_fixes()
    for kernel in _KERNELS:
        register_kernel(
            kernel.op,
            name=f"triton.{kernel.op}",
            solution="triton",
            formats=kernel.formats,
            traits=kernel.traits,
            capability=TRITON_CAPABILITY,
            priority=TRITON_PRIORITY,
            tags=_TAGS,
            impl=f"tokenspeed_kernel_triton.{kernel.impl}",
            hardware_validated=kernel.hardware_validated,
            doc=kernel.doc,
        )

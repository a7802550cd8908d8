"""Registration of the dense Triton kernels (lazy implementations: nothing here imports Triton)."""

from __future__ import annotations

from tokenspeed_kernel import register_kernel

from .._common import TRITON_CAPABILITY, TRITON_PRIORITY

_FLOAT = ("fp32", "bf16", "fp16")
_FP8_ACTIVATION = ("fp8_e4m3:per_tensor", "fp8_e4m3:per_token", "fp8_e4m3:block128")
_FP8_WEIGHT = ("fp8_e4m3:per_tensor", "fp8_e4m3:per_channel", "fp8_e4m3:block128")
_MODULE = "tokenspeed_kernel_triton.dense"
#: No kernel here has run on a GPU yet (CPU interpreter + cross-compilation only);
#: flip once the gpu-marked tests pass on hardware.
_HARDWARE_VALIDATED = False
#: No atomics (same result every run) and no host synchronisation.
_TAGS = ("deterministic", "cuda_graph_safe")

#: op -> (module, formats, traits, one-line doc)
_KERNELS: dict[str, tuple[str, list[dict], dict, str]] = {
    "mm": (
        "gemm",
        [
            {"a": _FLOAT, "b": _FLOAT, "out": _FLOAT},
            {"a": _FP8_ACTIVATION, "b": _FP8_WEIGHT, "out": _FLOAT},
            {"a": ("bf16", "fp16"), "b": "mxfp4", "out": _FLOAT},
        ],
        {"bias": (False, True)},
        "Triton GEMM: 16/32-bit, FP8 (tensor/row/block128 scales), MXFP4 weights decoded in registers",
    ),
    "rmsnorm": ("norm", [{"x": _FLOAT}], {"fused_residual": (False, True)}, "Triton RMSNorm (+ residual)"),
    "swiglu": (
        "activation",
        [{"x": _FLOAT}],
        {"interleaved": (False, True), "clamp": (False, True)},
        "Triton GPT-OSS SwiGLU",
    ),
    "silu_and_mul": ("activation", [{"x": _FLOAT}], {}, "Triton SiLU-and-mul"),
    "apply_rotary": (
        "rope",
        [{"x": _FLOAT}],
        {"style": ("neox", "gptj"), "partial": (False, True)},
        "Triton rotary embedding of q and k in one launch",
    ),
    "quantize_fp8": (
        "quantization",
        [{"x": _FLOAT}],
        {"granularity": ("per_tensor", "per_token", "block128"), "static": (False, True)},
        "Triton FP8 e4m3 quantization (per tensor without host sync, per token, 1x128 blocks)",
    ),
    "quantize_mxfp4": ("quantization", [{"x": _FLOAT}], {}, "Triton MXFP4 quantization (bit-exact with the reference)"),
    "dequantize_mxfp4": ("quantization", [{"x": "mxfp4", "out": _FLOAT}], {}, "Triton MXFP4 dequantization"),
    "argmax": ("sampling", [{"logits": _FLOAT}], {}, "Triton two-stage argmax"),
    "top_k_top_p_sample": (
        "sampling",
        [{"logits": _FLOAT}],
        {},
        "Triton top-k/top-p sampling: exact radix select and threshold narrowing, many programs per row (no vocabulary sort)",
    ),
}


def register() -> None:
    """Register ``triton.<op>`` for every dense op."""
    for op, (module, formats, traits, doc) in _KERNELS.items():
        register_kernel(
            op,
            name=f"triton.{op}",
            solution="triton",
            formats=formats,
            traits=traits,
            capability=TRITON_CAPABILITY,
            priority=TRITON_PRIORITY,
            tags=_TAGS,
            impl=f"{_MODULE}.{module}:{op}",
            hardware_validated=_HARDWARE_VALIDATED,
            doc=doc,
        )

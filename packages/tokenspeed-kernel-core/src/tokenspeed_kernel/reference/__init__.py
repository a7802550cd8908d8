"""Plain PyTorch reference kernels: numerics ground truth and last resort.

One module per op family; each public op ``X`` has ``reference.<family>.X`` with
the public op's arguments (minus ``solution``/``override``, with
``softmax_scale`` already resolved to a float). They run on any device.
"""

from __future__ import annotations

from ..core.registry import Priority, register_kernel

_FLOAT = ("fp32", "bf16", "fp16")
_KV = (*_FLOAT, "fp8_e4m3")

#: op -> (module, formats, traits)
_SPECS: dict[str, tuple[str, list[dict], dict]] = {}


def _attention_traits(paged: bool, causal: bool) -> dict:
    from ..core.contracts import ANY

    t = {"head_dim": ANY, "gqa_group": ANY, "window": ANY, "sinks": ANY, "logit_cap": ANY, "return_lse": ANY}
    if causal:
        t["causal"] = ANY
    if paged:
        t["page_size"] = ANY
    return t


def _specs() -> dict[str, tuple[str, list[dict], dict]]:
    from ..core.contracts import ANY
    from ..ops.moe import WEIGHT_FORMATS

    fp8 = [f"fp8_e4m3:{g}" for g in ("per_tensor", "per_token", "block128")]
    fp8w = [f"fp8_e4m3:{g}" for g in ("per_tensor", "per_channel", "block128")]
    moe_traits = {"activation": ANY, "clamp": ANY, "bias": ANY, "gate_up_interleaved": ANY}
    return {
        "mha_prefill": ("attention", [{"q": _FLOAT, "kv": _FLOAT}], _attention_traits(False, True)),
        "mha_extend_with_kvcache": ("attention", [{"q": _FLOAT, "kv": _KV}], _attention_traits(True, True)),
        "mha_decode_with_kvcache": ("attention", [{"q": _FLOAT, "kv": _KV}], _attention_traits(True, False)),
        "kvcache_store": ("attention", [{"kv": _KV}], {}),
        "moe_route": ("moe", [{"logits": _FLOAT}], {"renormalize": ANY}),
        "moe_dispatch": ("moe", [{"x": _FLOAT}], {}),
        "moe_experts": ("moe", [{"x": _FLOAT, "w": WEIGHT_FORMATS}], moe_traits),
        "moe_combine": ("moe", [{"x": _FLOAT}], {}),
        "moe_apply": ("moe", [{"x": _FLOAT, "w": WEIGHT_FORMATS}], moe_traits),
        "mm": (
            "gemm",
            [
                {"a": _FLOAT, "b": _FLOAT, "out": _FLOAT},
                {"a": fp8, "b": fp8w, "out": _FLOAT},
                {"a": ("bf16", "fp16"), "b": "mxfp4", "out": _FLOAT},
            ],
            {"bias": ANY},
        ),
        "rmsnorm": ("norm", [{"x": _FLOAT}], {"fused_residual": ANY}),
        "swiglu": ("activation", [{"x": _FLOAT}], {"interleaved": ANY, "clamp": ANY}),
        "silu_and_mul": ("activation", [{"x": _FLOAT}], {}),
        "apply_rotary": ("rope", [{"x": _FLOAT}], {"style": ANY, "partial": ANY}),
        "quantize_fp8": ("quantization", [{"x": _FLOAT}], {"granularity": ANY, "static": ANY}),
        "quantize_mxfp4": ("quantization", [{"x": _FLOAT}], {}),
        "dequantize_mxfp4": ("quantization", [{"x": "mxfp4", "out": _FLOAT}], {}),
        "argmax": ("sampling", [{"logits": _FLOAT}], {}),
        "top_k_top_p_sample": ("sampling", [{"logits": _FLOAT}], {}),
    }


def register() -> None:
    """Register one reference kernel per public op (lazy: modules load on first use)."""
    for op, (module, formats, traits) in _specs().items():
        register_kernel(
            op,
            name=f"reference.{op}",
            solution="reference",
            formats=formats,
            traits=traits,
            priority=Priority.REFERENCE,
            tags=("deterministic",) if op != "top_k_top_p_sample" else (),
            impl=f"tokenspeed_kernel.reference.{module}:{op}",
            doc=f"PyTorch reference for {op}",
        )

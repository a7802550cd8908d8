"""The public API: one module per op family. Importing it defines every op contract.

``mha_prefill_with_kvcache`` and ``moe_fused`` (the upstream README's names) are the
``mha_extend_with_kvcache`` and ``moe_apply`` op objects themselves.
"""

from .activation import silu_and_mul, swiglu
from .attention import (
    AttentionPlan,
    kvcache_store,
    mha_decode_append_kvcache,
    mha_decode_with_kvcache,
    mha_extend_with_kvcache,
    mha_plan,
    mha_prefill,
    mha_prefill_with_kvcache,
)
from .gemm import mm
from .linear_attention import gdn_chunk_prefill, gdn_decode
from .moe import (
    MoEActivation,
    MoEDispatchResult,
    MoEPlan,
    MoEWeights,
    moe_apply,
    moe_combine,
    moe_dispatch,
    moe_experts,
    moe_fused,
    moe_gate,
    moe_plan,
    moe_process_weights,
    moe_route,
)
from .norm import rmsnorm
from .quantization import dequantize_mxfp4, quantize_fp8, quantize_mxfp4
from .rope import apply_rotary, apply_rotary_and_store
from .sampling import argmax, top_k_top_p_sample

__all__ = [
    "mha_prefill",
    "mha_extend_with_kvcache",
    "mha_prefill_with_kvcache",
    "mha_decode_with_kvcache",
    "mha_decode_append_kvcache",
    "kvcache_store",
    "mha_plan",
    "AttentionPlan",
    "gdn_chunk_prefill",
    "gdn_decode",
    "moe_route",
    "moe_gate",
    "moe_dispatch",
    "moe_experts",
    "moe_combine",
    "moe_apply",
    "moe_fused",
    "moe_plan",
    "moe_process_weights",
    "MoEActivation",
    "MoEWeights",
    "MoEDispatchResult",
    "MoEPlan",
    "mm",
    "rmsnorm",
    "swiglu",
    "silu_and_mul",
    "apply_rotary",
    "apply_rotary_and_store",
    "quantize_fp8",
    "quantize_mxfp4",
    "dequantize_mxfp4",
    "argmax",
    "top_k_top_p_sample",
]

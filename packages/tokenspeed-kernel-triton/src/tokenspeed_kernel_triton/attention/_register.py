"""Registration of this family's Triton kernels (lazy implementations).

Nothing here imports Triton: the implementations are ``"module:function"`` strings
resolved on the first call that selects them.
"""

from __future__ import annotations

from typing import Any

#: Head sizes the kernels compile for: ``tl.arange`` over head_dim needs a power of two,
#: and ``tl.dot`` at least 16.
HEAD_DIMS = (16, 32, 64, 128, 256)
_FORMATS = [{"q": dt, "kv": dt} for dt in ("bf16", "fp16", "fp32")]
_MODULE = "tokenspeed_kernel_triton.attention"


def _attention_traits(*, causal: bool, paged: bool) -> dict[str, Any]:
    from tokenspeed_kernel import Range

    traits: dict[str, Any] = {
        "head_dim": HEAD_DIMS,
        # Groups larger than a tile's rows are split over several programs.
        "gqa_group": Range(1, 256),
        "window": (False, True),
        "sinks": (False, True),
        "logit_cap": (False, True),
        "return_lse": (False, True),
    }
    if causal:
        traits["causal"] = (False, True)
    if paged:
        traits["page_size"] = Range(1, 256, power_of_two=True)
    return traits


def register() -> None:
    from tokenspeed_kernel import register_kernel

    from .._common import TRITON_CAPABILITY, TRITON_PRIORITY

    # No host sync, nothing sized by device data, deterministic reductions (fixed split
    # counts and merge order): safe to capture in a CUDA graph and bitwise repeatable.
    tags = ("cuda_graph_safe", "deterministic")
    common = {
        "solution": "triton",
        "capability": TRITON_CAPABILITY,
        "priority": TRITON_PRIORITY,
        "tags": tags,
        # Run on an H200 (2026-11-30): GPU tests passed (13) and verify at GPT-OSS shapes
        # passed (docs/benchmarks/h200-2026-11-30). Not yet run on an AMD GPU.
        "hardware_validated": True,
    }
    register_kernel(
        "mha_prefill",
        name="triton.mha_prefill",
        formats=_FORMATS,
        traits=_attention_traits(causal=True, paged=False),
        impl=f"{_MODULE}.prefill:mha_prefill",
        doc="Triton varlen prefill: GQA-packed tiles, window block skipping, sinks, exp2 online softmax",
        **common,
    )
    register_kernel(
        "mha_extend_with_kvcache",
        name="triton.mha_extend_with_kvcache",
        formats=_FORMATS,
        traits=_attention_traits(causal=True, paged=True),
        impl=f"{_MODULE}.extend:mha_extend_with_kvcache",
        doc="Triton chunked prefill over the paged NHD cache (the prefill kernel, paged loads)",
        **common,
    )
    register_kernel(
        "mha_decode_with_kvcache",
        name="triton.mha_decode_with_kvcache",
        formats=_FORMATS,
        traits=_attention_traits(causal=False, paged=True),
        impl=f"{_MODULE}.decode:mha_decode_with_kvcache",
        doc="Triton split-KV paged decode, GQA group per program, merge kernel adds sinks",
        **common,
    )
    register_kernel(
        "kvcache_store",
        name="triton.kvcache_store",
        formats=[{"kv": ("bf16", "fp16", "fp32")}],
        impl=f"{_MODULE}.store:kvcache_store",
        doc="Triton scatter of new K/V rows into the paged cache by slot",
        **common,
    )

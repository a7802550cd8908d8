"""Registration of the FlashInfer wrappers (``flashinfer-python``, import ``flashinfer``; written against 0.7.4).

:func:`register` registers only when FlashInfer is installed (``find_spec``:
nothing is imported here) and only for Hopper (sm90), where these wrappers were
written against FlashInfer's fa3/fa2 attention and its SM90 mixed-input MoE.
Implementations are lazy strings; FlashInfer is imported, and its modules
JIT-compiled, on first use. Every kernel is ``hardware_validated=False`` until
its GPU test passes on the H200.

Registered (traits are exactly what the wrappers serve):

- ``flashinfer.mha_prefill`` / ``mha_extend_with_kvcache`` / ``mha_decode_with_kvcache``:
  no sinks, soft-cap allowed; ``*_sink`` twins: sinks, no soft-cap (FlashInfer's
  attention-sink variant has no soft-cap, and the plain kernels ignore sinks on
  fa2/fa3). bf16/fp16, head dims 64/128/256 (FlashInfer's fa3 prefill set, also
  served by fa2), sliding window, both causal modes, lse. Page sizes: powers of
  two up to 256 (FlashInfer takes any; these are the ones tested). Not
  ``cuda_graph_safe``: each call reads the lengths on the host and may re-plan
  (see ``attention.py``).
- ``flashinfer.rmsnorm``: plain RMSNorm, bf16/fp16.
- ``flashinfer.moe_apply``: SM90 MXFP4-weight x bf16-activation fused MoE with a
  weight preprocessor (``moe_plan`` + ``moe_process_weights``).

Deliberately not registered:

- ``rmsnorm`` with ``fused_residual``: ``fused_add_rmsnorm`` overwrites both
  inputs and normalises the unrounded fp32 sum (see ``norm.py``).
- ``argmax``: FlashInfer 0.7.4 has no argmax.
- ``top_k_top_p_sample``: FlashInfer samples by rejection sampling driven by its
  own Philox stream (a seed/offset or a ``torch.Generator``); it cannot take the
  caller's per-row uniform, so it cannot draw the token our definition assigns
  to that uniform (inverse CDF of the kept probabilities in index order). Two
  kernels would return different tokens for the same ``uniform``.
- ``moe_experts``: FlashInfer's CUTLASS MoE is fused (routing weights and the
  top-k sum live in its epilogue); there is no staged entry point.
"""

from __future__ import annotations

import importlib.util

from tokenspeed_kernel import ANY, Capability, Priority, Range, register_kernel

__all__ = ["HOPPER", "PRIORITY", "register"]

#: What the registered paths need: sm90a kernels (FlashInfer's fa3 attention and the
#: CUTLASS warp-specialized mixed-input MoE GEMM use wgmma and TMA).
HOPPER = Capability(
    vendors=frozenset({"nvidia"}), min_arch="sm90", max_arch="sm90", features=frozenset({"wgmma", "tma"})
)
#: The PERFORMANT band, level with FlashAttention-3 (200). Equal priorities rank by kernel
#: name, so ``fa3.*`` comes first, as it should: FA3 needs no host sync per call and is
#: graph-safe. (Raising FA3 to ``PERFORMANT + 10`` would make that order explicit.)
PRIORITY = Priority.PERFORMANT

_PKG = "tokenspeed_kernel_nvidia.flashinfer"
_ATTN_FORMATS = [{"q": "bf16", "kv": "bf16"}, {"q": "fp16", "kv": "fp16"}]


def _attention_traits(op: str, sinks: bool) -> dict[str, object]:
    traits: dict[str, object] = {
        "head_dim": (64, 128, 256),
        "gqa_group": Range(1, 256),
        "window": (False, True),
        "sinks": (sinks,),
        "logit_cap": (False,) if sinks else (False, True),
        "return_lse": (False, True),
    }
    if op != "mha_prefill":
        traits["page_size"] = Range(1, 256, power_of_two=True)
    if op != "mha_decode_with_kvcache":
        traits["causal"] = (True, False)
    return traits


def register() -> None:
    """Register the FlashInfer wrappers when ``flashinfer`` is installed (imports nothing)."""
    if importlib.util.find_spec("flashinfer") is None:
        return
    common = {"solution": "flashinfer", "capability": HOPPER, "priority": PRIORITY, "hardware_validated": False}
    wrappers = {
        "mha_prefill": "BatchPrefillWithRaggedKVCacheWrapper",
        "mha_extend_with_kvcache": "BatchPrefillWithPagedKVCacheWrapper",
        "mha_decode_with_kvcache": "BatchDecodeWithPagedKVCacheWrapper (tensor cores)",
    }
    sink_wrappers = {
        "mha_prefill": "BatchAttentionWithAttentionSinkWrapper over 1-token pages",
        "mha_extend_with_kvcache": "BatchAttentionWithAttentionSinkWrapper",
        "mha_decode_with_kvcache": "BatchDecodeWithAttentionSinkWrapper",
    }
    for op, wrapper in wrappers.items():
        for sinks in (False, True):
            register_kernel(
                op,
                name=f"flashinfer.{op}{'_sink' if sinks else ''}",
                formats=_ATTN_FORMATS,
                traits=_attention_traits(op, sinks),
                impl=f"{_PKG}.attention:{op}",
                doc=f"FlashInfer {sink_wrappers[op] if sinks else wrapper}; plans on the host (one sync per call)",
                **common,
            )
    register_kernel(
        "rmsnorm",
        name="flashinfer.rmsnorm",
        formats=[{"x": ("bf16", "fp16")}],
        tags=("deterministic", "cuda_graph_safe"),
        impl=f"{_PKG}.norm:rmsnorm",
        doc="FlashInfer rmsnorm: fp32 math, weight multiplied in fp32, one cast (weight read in x's dtype)",
        **common,
    )
    register_kernel(
        "moe_apply",
        name="flashinfer.moe_apply",
        formats=[{"x": "bf16", "w": "mxfp4"}],
        traits={
            "activation": ("swiglu", "silu"),
            "clamp": (False, True),
            "bias": (False, True),
            "gate_up_interleaved": (False, True),
            "up_offset": ANY,  # SwigluBias' beta
        },
        impl=f"{_PKG}.moe:moe_apply",
        weight_preprocessor=f"{_PKG}.moe:preprocess_weights",
        doc="FlashInfer cutlass_fused_moe SM90 W4A16 (MXFP4 weights, bf16 x), SwigluBias epilogue",
        **common,
    )

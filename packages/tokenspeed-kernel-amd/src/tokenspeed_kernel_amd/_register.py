"""Entry point of the ``amd`` plugin: registers the Gluon kernels and, when AITER is
installed, its wrappers. Nothing here imports Triton or AITER: every implementation
is a lazy ``"module:attr"`` string.

No kernel of this package has run on an AMD GPU yet (CI cross-compiles them to
AMDGCN only), so every spec says ``hardware_validated=False``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from tokenspeed_kernel import ANY, Capability, Priority, Range, register_kernel

__all__ = ["register", "GLUON_TARGETS"]


@dataclass(frozen=True)
class _GluonTarget:
    arch: str
    #: Platform features the attention kernels use on this arch.
    attention_features: frozenset[str]


#: The archs the Gluon kernels are compiled for. gfx950 attention copies K/V straight
#: into LDS (async_copy); gfx942 stages them through registers.
GLUON_TARGETS = (
    _GluonTarget("gfx950", frozenset({"gluon", "mfma", "buffer_load", "async_copy"})),
    _GluonTarget("gfx942", frozenset({"gluon", "mfma", "buffer_load"})),
)

_ATTN_FORMATS = [{"q": "bf16", "kv": "bf16"}, {"q": "fp16", "kv": "fp16"}]
_BOTH = (False, True)
PREFILL_TRAITS = {
    "head_dim": (64, 128),
    # The group is packed into the 128-row tile: BLOCK_M / G query tokens per tile.
    "gqa_group": (1, 2, 4, 8, 16),
    "causal": _BOTH,
    "window": _BOTH,
    "sinks": _BOTH,
    "logit_cap": _BOTH,
    "return_lse": _BOTH,
}
DECODE_TRAITS = {
    "head_dim": (64, 128),
    # G rows of a 16x16-MFMA tile padded to a power of two >= 16.
    "gqa_group": Range(1, 64),
    "page_size": Range(1, 4096),
    "window": _BOTH,
    "sinks": _BOTH,
    "logit_cap": _BOTH,
    "return_lse": _BOTH,
}
_TAGS = ("deterministic", "cuda_graph_safe")
#: What the MoE kernels compute: SwiGLU with any constants (silu is its alpha=1, no-limit,
#: no-offset case), biases or not, either gate/up order (the preprocessor interleaves).
MOE_TRAITS = {
    "activation": ("swiglu", "silu"),
    "clamp": _BOTH,
    "bias": _BOTH,
    "gate_up_interleaved": _BOTH,
    "up_offset": ANY,
    # One layout for both archs: a plan made on either serves the other.
    "layout": "amd.cdna.mxfp4",
}
_MOE_DOC = {
    "gfx950": "Gluon MXFP4 MoE for gfx950: decode path (routing fused, 2 launches) / ragged grouped GEMMs",
    "gfx942": "Gluon MXFP4 MoE for gfx942: weights decoded to bf16 for the bf16 MFMA; decode / grouped paths",
}


def _register_gluon() -> None:
    for t in GLUON_TARGETS:
        pkg = f"tokenspeed_kernel_amd.{t.arch}"
        attn_cap = Capability(vendors={"amd"}, min_arch=t.arch, max_arch=t.arch, features=t.attention_features)
        register_kernel(
            "mha_prefill",
            name=f"amd.{t.arch}.mha_prefill",
            solution="gluon",
            formats=_ATTN_FORMATS,
            traits=PREFILL_TRAITS,
            capability=attn_cap,
            priority=Priority.PERFORMANT,
            tags=_TAGS,
            impl=f"{pkg}.attention:mha_prefill",
            hardware_validated=False,
            doc=f"Gluon flash attention prefill for {t.arch} (MFMA 32x32, GQA group in the tile)",
        )
        register_kernel(
            "mha_decode_with_kvcache",
            name=f"amd.{t.arch}.mha_decode_with_kvcache",
            solution="gluon",
            formats=_ATTN_FORMATS,
            traits=DECODE_TRAITS,
            capability=attn_cap,
            priority=Priority.PERFORMANT,
            tags=_TAGS,
            impl=f"{pkg}.attention:mha_decode_with_kvcache",
            hardware_validated=False,
            doc=f"Gluon split-KV paged decode for {t.arch} (MFMA 16x16, merge with sinks)",
        )
        register_kernel(
            "moe_apply",
            name=f"amd.{t.arch}.moe_apply",
            solution="gluon",
            formats=[{"x": ("bf16", "fp16"), "w": "mxfp4"}],
            traits=MOE_TRAITS,
            capability=attn_cap,
            priority=Priority.PERFORMANT,
            tags=_TAGS,
            impl=f"{pkg}.moe:moe_apply",
            weight_preprocessor=f"{pkg}.moe:preprocess_weights",
            hardware_validated=False,
            doc=_MOE_DOC[t.arch],
        )
        register_kernel(
            "rmsnorm",
            name=f"amd.{t.arch}.rmsnorm",
            solution="gluon",
            formats=[{"x": ("bf16", "fp16", "fp32")}],
            traits={"fused_residual": _BOTH},
            capability=Capability(vendors={"amd"}, min_arch=t.arch, max_arch=t.arch, features={"gluon", "buffer_load"}),
            priority=Priority.PERFORMANT,
            tags=_TAGS,
            impl=f"{pkg}.norm:rmsnorm",
            hardware_validated=False,
            doc=f"Gluon RMSNorm (+ residual) for {t.arch}",
        )


def aiter_available() -> bool:
    """Whether the ``aiter`` package is installed (found, not imported)."""
    return importlib.util.find_spec("aiter") is not None


def _register_aiter() -> None:
    # AITER ships kernels for CDNA3 and CDNA4. Ranked above the in-tree Gluon kernels:
    # AMD's library is tuned and run on these GPUs, only these wrappers are not.
    cap = Capability(vendors={"amd"}, min_arch="gfx942", max_arch="gfx950")
    register_kernel(
        "rmsnorm",
        name="aiter.rmsnorm",
        solution="aiter",
        formats=[{"x": ("bf16", "fp16")}],
        traits={"fused_residual": _BOTH},
        capability=cap,
        priority=Priority.PERFORMANT + 10,
        impl="tokenspeed_kernel_amd.aiter.norm:rmsnorm",
        hardware_validated=False,
        doc="AITER rmsnorm2d_fwd / rmsnorm2d_fwd_with_add",
    )
    register_kernel(
        "mha_decode_with_kvcache",
        name="aiter.mha_decode_with_kvcache",
        solution="aiter",
        formats=_ATTN_FORMATS,
        # What AITER's own paged-attention tests cover for the NHD layout.
        traits={"head_dim": (64, 128), "gqa_group": Range(1, 16), "page_size": (1, 16, 32), "logit_cap": _BOTH},
        capability=cap,
        priority=Priority.PERFORMANT + 10,
        impl="tokenspeed_kernel_amd.aiter.attention:mha_decode_with_kvcache",
        hardware_validated=False,
        doc="AITER paged_attention_v1 (NHD), no sinks / window / lse",
    )


def register() -> None:
    _register_gluon()
    if aiter_available():
        _register_aiter()

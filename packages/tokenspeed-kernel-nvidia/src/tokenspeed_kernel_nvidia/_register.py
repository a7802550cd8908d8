"""Entry point of the ``nvidia`` plugin.

Registers a wrapper only when its library is installed (``find_spec``: nothing is
imported here); implementations load on first use.
"""

from __future__ import annotations

import importlib.util
from importlib.resources import files

from tokenspeed_kernel import ANY, Capability, Priority, Range, register_kernel, register_measured_table

#: Measured tables shipped for NVIDIA devices (device-name substring -> file in data/), built with
#: ``tokenspeed-kernel oracle build`` from the reports under docs/benchmarks/ (see each table's sources).
MEASURED_TABLES = {"H200": "h200.json", "H100": "h100.json"}

#: FlashAttention-3 runs on Hopper only (wgmma + TMA).
HOPPER = Capability(
    vendors=frozenset({"nvidia"}), min_arch="sm90", max_arch="sm90", features=frozenset({"wgmma", "tma"})
)


def _fa3_build_flags() -> dict[str, bool]:
    """The head dims and features this FA3 build has (its config module, no CUDA import)."""
    spec = importlib.util.find_spec("flash_attn_config")
    if spec is None:
        return {}
    import flash_attn_config

    return dict(flash_attn_config.CONFIG.get("build_flags", {}))


def register_fa3() -> None:
    if importlib.util.find_spec("flash_attn_interface") is None:
        return
    flags = _fa3_build_flags()
    head_dims = tuple(d for d in (64, 96, 128, 192, 256) if not flags.get(f"FLASHATTENTION_DISABLE_HDIM{d}", False))
    softcap = (False,) if flags.get("FLASHATTENTION_DISABLE_SOFTCAP", False) else (False, True)
    common = {
        "head_dim": head_dims,
        "gqa_group": Range(1, 256),
        "window": (False, True),
        "sinks": (False, True),
        "logit_cap": softcap,
        # Not offered: FA3 rounds sinks to the q dtype, which moved its lse by up to
        # 5e-3 on the H200 (verify, 2026-11-30); calls that need lse go elsewhere.
        "return_lse": (False,),
    }
    # FA3's paged path takes any page size; powers of two up to 256 are what we verify.
    paged = {**common, "page_size": Range(1, 256, power_of_two=True)}
    formats = [{"q": "bf16", "kv": "bf16"}, {"q": "fp16", "kv": "fp16"}]
    module = "tokenspeed_kernel_nvidia.fa3.attention"
    for op, traits in (
        ("mha_prefill", {**common, "causal": (True, False)}),
        ("mha_extend_with_kvcache", {**paged, "causal": (True, False)}),
        ("mha_decode_with_kvcache", paged),
    ):
        register_kernel(
            op,
            name=f"fa3.{op}",
            solution="fa3",
            formats=formats,
            traits=traits,
            capability=HOPPER,
            # Above FlashInfer's wrappers (PERFORMANT): FA3 needs no host sync per call.
            priority=Priority.PERFORMANT + 10,
            tags=("cuda_graph_safe",),
            impl=f"{module}:{op}",
            doc=f"FlashAttention-3 {op}",
            peer=True,
        )


def register_cublas() -> None:
    """``mm`` through PyTorch's cuBLAS (always present with a CUDA build of torch)."""
    module = "tokenspeed_kernel_nvidia.cublas.gemm"
    for fmt in ("bf16", "fp16"):
        register_kernel(
            "mm",
            name=f"cublas.mm_{fmt}",
            solution="cublas",
            formats=[{"a": fmt, "b": fmt, "out": fmt}],
            traits={"bias": (False, True)},
            capability=Capability(vendors=frozenset({"nvidia"}), min_arch="sm80"),
            priority=Priority.PERFORMANT,
            tags=("cuda_graph_safe",),
            impl=f"{module}:mm_dense",
            doc=f"torch.mm / torch.addmm ({fmt}, cuBLAS)",
            peer=True,
        )
    register_kernel(
        "mm",
        name="cublas.mm_fp8",
        solution="cublas",
        formats=[
            {"a": "fp8_e4m3:per_tensor", "b": "fp8_e4m3:per_tensor", "out": ("bf16", "fp16", "fp32")},
            {"a": "fp8_e4m3:per_token", "b": "fp8_e4m3:per_channel", "out": "bf16"},
        ],
        traits={"bias": (False, True)},
        capability=Capability(vendors=frozenset({"nvidia"}), min_arch="sm90", features=frozenset({"fp8"})),
        priority=Priority.PERFORMANT,
        tags=("cuda_graph_safe",),
        impl=f"{module}:mm_fp8",
        doc="torch._scaled_mm (cuBLASLt FP8, per-tensor or row-wise scales)",
        peer=True,
    )


def register_triton_kernels() -> None:
    """OpenAI's triton_kernels MXFP4 MoE (the Hopper peer engines use for GPT-OSS), when installed."""
    if importlib.util.find_spec("triton_kernels") is None:
        return
    register_kernel(
        "moe_apply",
        name="triton_kernels.moe_apply",
        solution="triton_kernels",
        formats=[{"x": "bf16", "w": "mxfp4"}],
        traits={
            # The fused swiglu_fn: interleaved gate/up pairs (the preprocessor interleaves others),
            # any alpha and limit (or none), up + 1 fixed.
            "activation": ("swiglu",),
            "clamp": (False, True),
            "bias": (False, True),
            "gate_up_interleaved": (False, True),
            "up_offset": (1.0,),
        },
        capability=Capability(vendors=frozenset({"nvidia"}), min_arch="sm90", max_arch="sm90"),
        priority=Priority.PERFORMANT,
        tags=("cuda_graph_safe",),
        impl="tokenspeed_kernel_nvidia.triton_kernels.moe:moe_apply",
        weight_preprocessor="tokenspeed_kernel_nvidia.triton_kernels.moe:preprocess_weights",
        # GPU tests and bench on an H200: docs/benchmarks/h200-2026-12-01.
        hardware_validated=True,
        peer=True,
        doc="OpenAI triton_kernels MXFP4 MoE (Hopper layouts, gather + fused SwiGLU, scatter + routing weights)",
    )


def register_hopper() -> None:
    """In-tree Hopper kernels (Gluon, :mod:`tokenspeed_kernel_nvidia.hopper`): need only triton."""
    if importlib.util.find_spec("triton") is None:
        return
    # hopper.moe_apply and hopper.moe_apply_packed: one implementation, two weight layouts.
    bf16_moe = dict(
        solution="hopper",
        # bf16 activations only: the weights are decoded to bf16 for bf16 MMAs.
        formats=[{"x": "bf16", "w": "mxfp4"}],
        traits={
            "activation": ("swiglu", "silu"),
            "clamp": (False, True),
            "bias": (False, True),
            "gate_up_interleaved": (False, True),
            "up_offset": ANY,  # a launch argument
        },
        # Every token count: the GEMV kernel at 1-2 tokens (canonical layout), the MMA decode path below
        # PREFILL_MIN_TOKENS, the wgmma grouped GEMMs above.
        capability=Capability(vendors=frozenset({"nvidia"}), min_arch="sm90", max_arch="sm90"),
        priority=Priority.PERFORMANT,
        # No atomics: the k slots are summed in slot order.
        tags=("cuda_graph_safe", "deterministic"),
    )
    register_kernel(
        "moe_apply",
        name="hopper.moe_apply",
        impl="tokenspeed_kernel_nvidia.hopper.moe.layer:moe_apply",
        # GPU tests, numerics and bench on an H200: docs/benchmarks/h200-2026-12-01/hopper-moe; the GEMV kernel's
        # on an H100: docs/benchmarks/h200-2026-12-01/host-cost/s30-call7.
        hardware_validated=True,
        doc="Hopper MXFP4 MoE (Gluon), canonical layout: fp32 FMAs on CUDA cores at 1-2 tokens (GEMV), weights decoded "
        "in registers into mma.sync (decode) or wgmma (prefill) above",
        **bf16_moe,
    )
    register_kernel(
        "moe_apply",
        name="hopper.moe_apply_packed",
        impl="tokenspeed_kernel_nvidia.hopper.moe.layer:moe_apply_packed",
        # The same tensors with the bits of each code word permuted (hopper.moe.packed): its own layout.
        weight_preprocessor="tokenspeed_kernel_nvidia.hopper.moe.packed:preprocess_weights",
        # GPU tests (decode 11/11, prefill 15/15 on this layout) passed on the H200:
        # docs/benchmarks/h200-2026-12-01/hopper-moe/session11/call1/.
        hardware_validated=True,
        doc="Hopper MXFP4 MoE (Gluon), hopper.moe_apply on a bit-placed layout: 12 decode instructions a code "
        "word instead of 17",
        **bf16_moe,
    )
    register_kernel(
        "moe_apply",
        name="hopper.moe_apply_w4a8",
        solution="hopper",
        formats=[{"x": "bf16", "w": "mxfp4"}],
        traits={
            "activation": ("swiglu",),
            # The clamp bounds the SwiGLU output, which sets the intermediate's fp8 scale.
            "clamp": (True,),
            "bias": (False, True),
            "gate_up_interleaved": (False, True),
            "up_offset": ANY,
            # Only where the caller allows fp8 activations (moe_apply(fp8_activations=True)).
            "fp8_activations": (True,),
        },
        # The token counts where it runs fp8 MMAs (layer.FP8_MIN_TOKENS = 1024 and up): below, the
        # same layer keeps bf16 activations, which is hopper.moe_apply itself.
        sizes={"tokens": Range(1024, 2**31 - 1)},
        capability=Capability(vendors=frozenset({"nvidia"}), min_arch="sm90", max_arch="sm90"),
        priority=Priority.PERFORMANT,
        tags=("cuda_graph_safe", "deterministic"),
        impl="tokenspeed_kernel_nvidia.hopper.moe.layer:moe_apply_w4a8",
        # GPU tests, numerics against the W4A8 reference and bench on an H200:
        # docs/benchmarks/h200-2026-12-01/hopper-moe (session 5).
        hardware_validated=True,
        doc="Hopper MXFP4 MoE, W4A8 (Gluon): e4m3 activations (a scale a token; the clamped SwiGLU's bound for "
        "the intermediate), weights decoded to e4m3 by a per-block byte table, fp8 wgmma",
    )


def register_measurements() -> None:
    """The measured tables of this package's devices (read on the first selection on such a device)."""
    data = files("tokenspeed_kernel_nvidia").joinpath("data")
    for device, filename in MEASURED_TABLES.items():
        register_measured_table(data.joinpath(filename), device=device)


def register_fla() -> None:
    """flash-linear-attention's chunked gated delta rule (the peer of gdn_chunk_prefill), when installed."""
    if importlib.util.find_spec("fla") is None:
        return
    register_kernel(
        "gdn_chunk_prefill",
        name="fla.gdn_chunk_prefill",
        solution="fla",
        # Not fp32: fla multiplies fp32 as TF32, which missed the fp32 tolerance on the H200 (1.7-3.1x).
        formats=[{"x": ("bf16", "fp16")}],
        traits={"head_dim": (16, 32, 64, 128, 256), "head_dim_v": (16, 32, 64, 128, 256), "qk_l2norm": (False, True)},
        capability=Capability(vendors=frozenset({"nvidia"}), min_arch="sm80"),
        priority=Priority.PERFORMANT,
        # No tags: fla sizes its chunk grid from cu_seqlens on the host (not claimed graph-safe).
        impl="tokenspeed_kernel_nvidia.fla.linear_attention:gdn_chunk_prefill",
        # verify and bench on an H200: docs/benchmarks/h200-2026-12-01/gdn/ (bf16 and fp16 pass).
        hardware_validated=True,
        peer=True,
        doc="flash-linear-attention chunk_gated_delta_rule (beta rounded to q's dtype)",
    )


def register() -> None:
    from .flashinfer._register import register as register_flashinfer

    register_cublas()
    register_fa3()
    register_flashinfer()
    register_triton_kernels()
    register_hopper()
    register_fla()
    register_measurements()

"""``gluon_mxfp_fused_moe`` where vLLM's TokenSpeed MoE backend imports it (see :mod:`tokenspeed_kernel_amd.moe.vllm`)."""

from tokenspeed_kernel_amd.moe.vllm import gluon_mxfp_fused_moe

__all__ = ["gluon_mxfp_fused_moe"]

"""``gluon_mxfp_fused_moe`` under upstream's newer path (the same function as ``ops.moe.fused_mxfp_gfx950``)."""

from tokenspeed_kernel_amd.moe.vllm import gluon_mxfp_fused_moe

__all__ = ["gluon_mxfp_fused_moe"]

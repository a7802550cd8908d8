"""``preprocess_gluon_mxfp4_gfx950_moe_weights`` under upstream's newer path (same function as ``ops.moe``'s)."""

from tokenspeed_kernel_amd.moe.vllm import preprocess_gluon_mxfp4_gfx950_moe_weights

__all__ = ["preprocess_gluon_mxfp4_gfx950_moe_weights"]

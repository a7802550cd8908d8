"""``preprocess_gluon_mxfp4_gfx950_moe_weights`` where vLLM imports it (see :mod:`tokenspeed_kernel_amd.moe.vllm`)."""

from tokenspeed_kernel_amd.moe.vllm import preprocess_gluon_mxfp4_gfx950_moe_weights

__all__ = ["preprocess_gluon_mxfp4_gfx950_moe_weights"]

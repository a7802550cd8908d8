"""vLLM's import paths for the gfx950 MXFP4 MoE (see :mod:`tokenspeed_kernel_amd.moe.vllm`)."""

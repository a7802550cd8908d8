"""Upstream TokenSpeed's newer module paths for the gfx950 MoE (same functions as ``tokenspeed_kernel_amd.ops.moe``)."""

"""The CDNA MXFP4 MoE: one host plan (:mod:`.fused`, :mod:`.schedule`, :mod:`.weights`),
Gluon kernels for gfx950 / gfx942 (:mod:`tokenspeed_kernel_amd.cdna.moe_decode`,
:mod:`~tokenspeed_kernel_amd.cdna.moe_grouped`), a portable Triton twin (:mod:`.twin`),
and the functions vLLM calls (:mod:`.vllm`)."""

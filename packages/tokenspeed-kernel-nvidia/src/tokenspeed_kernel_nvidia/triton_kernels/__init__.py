"""OpenAI's ``triton_kernels`` MXFP4 MoE (PyPI ``tokenspeed-triton-kernels``): the Hopper path
vLLM and TensorRT-LLM take for GPT-OSS, registered as ``triton_kernels.moe_apply``.

Imported only when the kernel is first selected; :mod:`._compat` adapts the library
to the installed Triton (each shim applied only where an attribute is missing).
"""

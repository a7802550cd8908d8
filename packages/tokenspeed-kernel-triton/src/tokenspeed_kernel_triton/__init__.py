"""Portable Triton kernels for TokenSpeed-kernel.

Kernels are plain functions on torch tensors under ``tokenspeed_kernel_triton.<family>``;
``_register.register`` (the plugin entry point) adds them to the registry with lazy
implementations, so importing this package does not import Triton.
"""

__version__ = "0.1.0"

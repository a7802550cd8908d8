"""Plain PyTorch reference kernels: numerics ground truth and last resort.

One module per op family; each public op ``X`` has ``reference.<family>.X`` with
the public op's kernel arguments (what its ``bind`` passes on: ``softmax_scale``
already resolved to a float, ``solution``/``override`` removed). They run on any
device. Each op object names its reference and what it supports
(:class:`tokenspeed_kernel.core.op.Reference`); the core registers them as
``reference.<op>`` before any plugin.
"""

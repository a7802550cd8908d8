"""In-tree kernels for Hopper (sm90: H100, H200): Gluon and Triton with wgmma, TMA and mbarriers.

One module per op family (``hopper/moe/...``); each kernel registers from
``tokenspeed_kernel_nvidia._register`` like the wrappers, with
``Capability(vendors={"nvidia"}, min_arch="sm90", max_arch="sm90")`` and its
``hardware_validated`` state, and is cross-compiled for sm_90 in CI
(``tokenspeed_kernel.testing.compile_launch``).
"""

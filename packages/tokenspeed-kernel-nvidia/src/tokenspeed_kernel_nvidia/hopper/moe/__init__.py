"""In-tree MXFP4 MoE for Hopper: :mod:`.decode` (Gluon kernels), :mod:`.layer` (``moe_apply``)."""

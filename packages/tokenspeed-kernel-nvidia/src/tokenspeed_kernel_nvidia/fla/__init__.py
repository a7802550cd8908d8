"""flash-linear-attention (``fla``, PyPI ``fla-core``) as kernels of the linear-attention ops."""

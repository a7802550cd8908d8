"""AMD kernels for TokenSpeed-kernel."""

__version__ = "0.1.0"

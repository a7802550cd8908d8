"""NVIDIA kernels for TokenSpeed-kernel (vendor-library wrappers and Hopper kernels).

Importing this package imports no vendor library; ``_register.register`` (the
plugin entry point) registers wrappers only for libraries that are installed.
"""

__version__ = "0.1.0"

"""Portable Triton kernels for TokenSpeed-kernel.

One module per dense op (``mm``, ``rmsnorm``, ``activation``, ``rope``, ``quantization``,
``sampling``), each holding its kernels, launchers and config tables; the ``attention``
and ``moe`` packages hold those families. ``_register.register`` (the plugin entry
point) adds every kernel to the registry with lazy implementations, so importing this
package does not import Triton.
"""

__version__ = "0.1.0"

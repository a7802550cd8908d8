"""Capability and priority band shared by every kernel of this package (imports no Triton).

The package's shared ``@triton.jit`` helpers live in :mod:`._mxfp4` (the MXFP4 decoder);
they stay out of this module so that registration, which reads it, never imports Triton.
"""

from __future__ import annotations

from tokenspeed_kernel import Capability, Priority

#: Triton kernels run wherever the platform advertises Triton (NVIDIA, AMD, or the
#: CPU under TRITON_INTERPRET=1).
TRITON_CAPABILITY = Capability(features=frozenset({"triton"}))
TRITON_PRIORITY = Priority.PORTABLE

"""CDNA3 (gfx942: MI300X / MI325X) attention: ``mha_prefill``, ``mha_decode_with_kvcache``.

See :mod:`tokenspeed_kernel_amd.cdna.attention` for the kernels.
"""

from __future__ import annotations

from ..cdna import attention as _attention
from ..cdna import bind_arch
from ..cdna.arch import GFX942

__all__ = ["mha_prefill", "mha_decode_with_kvcache"]

mha_prefill = bind_arch(_attention.mha_prefill, GFX942, __name__)
mha_decode_with_kvcache = bind_arch(_attention.mha_decode_with_kvcache, GFX942, __name__)

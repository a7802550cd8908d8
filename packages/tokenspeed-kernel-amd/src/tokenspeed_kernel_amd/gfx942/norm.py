"""CDNA3 (gfx942: MI300X / MI325X) RMSNorm (see :mod:`tokenspeed_kernel_amd.cdna.norm`)."""

from __future__ import annotations

from ..cdna import bind_arch
from ..cdna import norm as _norm
from ..cdna.arch import GFX942

__all__ = ["rmsnorm"]

rmsnorm = bind_arch(_norm.rmsnorm, GFX942, __name__)

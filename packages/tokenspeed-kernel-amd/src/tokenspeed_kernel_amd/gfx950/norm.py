"""CDNA4 (gfx950: MI350X / MI355X) RMSNorm (see :mod:`tokenspeed_kernel_amd.cdna.norm`)."""

from __future__ import annotations

from ..cdna import bind_arch
from ..cdna import norm as _norm
from ..cdna.arch import GFX950

__all__ = ["rmsnorm"]

rmsnorm = bind_arch(_norm.rmsnorm, GFX950, __name__)

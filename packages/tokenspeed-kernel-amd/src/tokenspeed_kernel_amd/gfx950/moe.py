"""The MXFP4 MoE as ``moe_apply`` for gfx950 (see :mod:`tokenspeed_kernel_amd.moe`)."""

from __future__ import annotations

import functools

from ..moe import op as _op

__all__ = ["moe_apply", "preprocess_weights"]

moe_apply = functools.partial(_op.moe_apply, "gfx950")
preprocess_weights = _op.preprocess_weights

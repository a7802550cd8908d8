"""Quantization: FP8 (per tensor / token / 1x128 block) and OCP MXFP4.

MXFP4 (OCP Microscaling v1.0): blocks of 32 values along the last dim share one
E8M0 scale ``2**(s - 127)``; each value is E2M1 (codes 0..7 =
0, 0.5, 1, 1.5, 2, 3, 4, 6; 8..15 their negatives), two per byte, the low nibble
holding the even element. :func:`quantize_mxfp4` picks the scale
``floor(log2(amax)) - 2`` (2 = E2M1's largest exponent, so the block maximum
lands in [4, 8) before saturation at 6), and rounds each value to the nearest
E2M1 value, ties to the even code.
"""

from __future__ import annotations

import torch

from ..core.contracts import ANY, Size, TraitSpec
from ..core.formats import DTYPE_NAMES
from ..core.op import KernelCall, Op, Reference, kernel_call
from ..core.validation import check_same_device, check_tensor

__all__ = ["quantize_fp8", "quantize_mxfp4", "dequantize_mxfp4"]

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_FLOAT = ("fp32", "bf16", "fp16")
_ROWS = (Size("rows", "rows of the input (every dim but the last)"),)
_MODULE = "tokenspeed_kernel.reference.quantization"
_CASES = "tokenspeed_kernel.numerics.cases.quantization"


def _rows(t: torch.Tensor) -> int:
    return t.numel() // t.shape[-1] if t.dim() and t.shape[-1] else 0


def _bind_quantize_fp8(
    x: torch.Tensor, *, granularity: str = "per_token", scale: torch.Tensor | None = None
) -> KernelCall:
    """Quantize ``x [M, K]`` to ``float8_e4m3fn`` with ``float32`` scales.

    Dynamic scales are ``amax / 448`` per tensor (``[1]``), per row (``[M, 1]``)
    or per 1x128 block (``[M, ceil(K/128)]``); an all-zero group gets scale 1.
    ``scale`` (static, ``per_tensor`` only) is used as given. Values are
    ``clamp(x / scale, -448, 448)`` rounded to nearest.

    Returns ``(x_fp8, scale)``.
    """
    check_tensor("x", x, dtypes=_DTYPES, dim=2, last_dim_contiguous=True)
    if granularity not in ("per_tensor", "per_token", "block128"):
        raise ValueError(f"granularity: expected 'per_tensor', 'per_token' or 'block128', got {granularity!r}")
    if scale is not None:
        if granularity != "per_tensor":
            raise ValueError("scale: a static scale needs granularity='per_tensor'")
        check_tensor("scale", scale, dtypes=(torch.float32,), shape=(1,))
        check_same_device("x", x, scale=scale)
    traits = {"granularity": granularity, "static": scale is not None}
    return kernel_call(
        x.device, (DTYPE_NAMES[x.dtype],), traits, (x.shape[0],), x, granularity=granularity, scale=scale
    )


def _fake_quantize_fp8(x, *, granularity="per_token", scale=None):
    m, k = x.shape
    shape = {"per_tensor": (1,), "per_token": (m, 1), "block128": (m, -(-k // 128))}[granularity]
    return x.new_empty(x.shape, dtype=torch.float8_e4m3fn), x.new_empty(shape, dtype=torch.float32)


quantize_fp8 = Op(
    name="quantize_fp8",
    family="quantization",
    roles=("x",),
    traits={
        "granularity": TraitSpec(str, default="per_token", allowed=("per_tensor", "per_token", "block128")),
        "static": TraitSpec(bool, default=False, doc="scale given by the caller"),
    },
    sizes=(Size("rows", "M, rows of x"),),
    doc="Quantize to FP8 e4m3 with fp32 scales.",
    bind=_bind_quantize_fp8,
    fake=_fake_quantize_fp8,
    reference=Reference(f"{_MODULE}:quantize_fp8", formats=[{"x": _FLOAT}], traits={"granularity": ANY, "static": ANY}),
    workload=f"{_CASES}:QUANTIZE_FP8",
)


def _bind_quantize_mxfp4(x: torch.Tensor) -> KernelCall:
    """Quantize ``x [..., K]`` (K divisible by 32) to MXFP4.

    Returns ``(blocks uint8 [..., K/2], scales uint8 [..., K/32])``.
    """
    check_tensor("x", x, dtypes=_DTYPES, last_dim_contiguous=True)
    if x.dim() < 1 or x.shape[-1] % 32:
        raise ValueError(f"x: expected a last dim divisible by 32, got shape {list(x.shape)}")
    return kernel_call(x.device, (DTYPE_NAMES[x.dtype],), (), (_rows(x),), x)


def _fake_quantize_mxfp4(x):
    lead, k = tuple(x.shape[:-1]), x.shape[-1]
    return x.new_empty((*lead, k // 2), dtype=torch.uint8), x.new_empty((*lead, k // 32), dtype=torch.uint8)


quantize_mxfp4 = Op(
    name="quantize_mxfp4",
    family="quantization",
    roles=("x",),
    traits={},
    sizes=_ROWS,
    doc="Quantize to MXFP4.",
    bind=_bind_quantize_mxfp4,
    fake=_fake_quantize_mxfp4,
    reference=Reference(f"{_MODULE}:quantize_mxfp4", formats=[{"x": _FLOAT}]),
    workload=f"{_CASES}:QUANTIZE_MXFP4",
)


def _bind_dequantize_mxfp4(
    blocks: torch.Tensor, scales: torch.Tensor, *, dtype: torch.dtype = torch.bfloat16
) -> KernelCall:
    """``blocks uint8 [..., K/2]`` + ``scales uint8 [..., K/32]`` -> ``dtype [..., K]``."""
    check_tensor("blocks", blocks, dtypes=(torch.uint8,), last_dim_contiguous=True)
    if blocks.dim() < 1 or blocks.shape[-1] % 16:
        raise ValueError(f"blocks: expected a last dim divisible by 16 (32 values), got shape {list(blocks.shape)}")
    check_tensor("scales", scales, dtypes=(torch.uint8,), shape=(*blocks.shape[:-1], blocks.shape[-1] // 16))
    if dtype not in _DTYPES:
        raise TypeError(f"dtype: expected bf16, fp16 or fp32, got {dtype}")
    check_same_device("blocks", blocks, scales=scales)
    return kernel_call(blocks.device, ("mxfp4", DTYPE_NAMES[dtype]), (), (_rows(blocks),), blocks, scales, dtype=dtype)


def _fake_dequantize_mxfp4(blocks, scales, *, dtype=torch.bfloat16):
    return blocks.new_empty((*blocks.shape[:-1], blocks.shape[-1] * 2), dtype=dtype)


dequantize_mxfp4 = Op(
    name="dequantize_mxfp4",
    family="quantization",
    roles=("x", "out"),
    traits={},
    sizes=_ROWS,
    doc="MXFP4 to a float dtype.",
    bind=_bind_dequantize_mxfp4,
    fake=_fake_dequantize_mxfp4,
    reference=Reference(f"{_MODULE}:dequantize_mxfp4", formats=[{"x": "mxfp4", "out": _FLOAT}]),
    workload=f"{_CASES}:DEQUANTIZE_MXFP4",
)

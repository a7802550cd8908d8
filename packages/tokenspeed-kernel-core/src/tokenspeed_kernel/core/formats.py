"""Tensor formats: what a kernel must know about a tensor's storage.

A format is a short string, cheap to hash and compare, so that a call's format
signature (one format per tensor role, in the op contract's role order) can be
part of the selection cache key:

- dense dtypes: ``fp32``, ``bf16``, ``fp16``, ``int32``, ``int64``, ``uint8``, ``int8``;
- FP8 with its scale granularity: ``fp8_e4m3:<g>`` / ``fp8_e5m2:<g>`` where ``<g>`` is
  ``per_tensor`` (one scale), ``per_token`` (one per row of an activation),
  ``per_channel`` (one per output row of a weight) or ``block128`` (one per 1x128
  activation block / 128x128 weight block), or ``fp8_e4m3`` bare for a tensor
  without a scale (e.g. an FP8 KV cache at scale 1);
- ``mxfp4``: OCP MX FP4, two E2M1 values per ``uint8`` (low nibble = even element)
  plus one E8M0 ``uint8`` scale per 32 values along the reduction dim.
"""

from __future__ import annotations

import torch

__all__ = [
    "DTYPE_NAMES",
    "FP8_GRANULARITIES",
    "dtype_name",
    "fp8_format",
    "fp8_granularity",
    "is_known_format",
    "known_formats",
    "FLOAT_DTYPES",
]

DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float64: "fp64",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.float8_e4m3fn: "fp8_e4m3",
    torch.float8_e5m2: "fp8_e5m2",
}
FP8_GRANULARITIES = ("per_tensor", "per_token", "per_channel", "block128")
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_DENSE = frozenset(DTYPE_NAMES.values())
_KNOWN = _DENSE | {f"{d}:{g}" for d in ("fp8_e4m3", "fp8_e5m2") for g in FP8_GRANULARITIES} | {"mxfp4"}


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} is not supported by tokenspeed_kernel") from None


def known_formats() -> frozenset[str]:
    return _KNOWN


def is_known_format(fmt: str) -> bool:
    return fmt in _KNOWN


def fp8_granularity(scale: torch.Tensor, rows: int, cols: int, *, weight: bool, name: str) -> str:
    """Scale granularity of an FP8 operand of shape [rows, cols] from its scale's shape."""
    # A [rows, 1] scale is per row even when rows == 1 (a one-token batch quantized
    # per token): that keeps it paired with per-channel weights; [1] or [] is per tensor.
    if scale.dim() == 2 and scale.shape[0] == rows and scale.shape[1] == 1:
        return "per_channel" if weight else "per_token"
    if scale.numel() == 1:
        return "per_tensor"
    blocks_k = -(-cols // 128)
    blocks_r = -(-rows // 128) if weight else rows
    if scale.dim() == 2 and tuple(scale.shape) == (blocks_r, blocks_k):
        return "block128"
    expect = f"[1], [{rows}, 1] or [{blocks_r}, {blocks_k}]" if weight else f"[1], [{rows}, 1] or [{rows}, {blocks_k}]"
    raise ValueError(f"{name}: scale of shape {tuple(scale.shape)} matches no FP8 granularity; expected {expect}")


def fp8_format(dtype: torch.dtype, granularity: str) -> str:
    return f"{dtype_name(dtype)}:{granularity}"

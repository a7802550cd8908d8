"""Host-side pieces shared by the dense op modules (mm, rmsnorm, activation, rope, quantization, sampling).

Every config table of those modules is keyed by arch family: ``"nvidia"`` (CUDA
devices), ``"amd"`` (ROCm devices) and ``"interpret"`` (CPU tensors under
``TRITON_INTERPRET=1``, sized for test speed, not performance). A kernel reads its
config through :func:`arch_family` and its op's table, never from constants
scattered in the code; each table carries a note saying where its numbers come from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["RowConfig", "RowsOut", "arch_family", "as_rows", "row_config"]


def arch_family(device: torch.device) -> str:
    """``"interpret"`` for CPU tensors, else ``"amd"`` on ROCm builds of torch, else ``"nvidia"``."""
    if device.type == "cpu":
        return "interpret"
    return "amd" if torch.version.hip else "nvidia"


@dataclass(frozen=True)
class RowConfig:
    """A row-wise kernel: ``block`` elements of the row per step, ``rows`` rows per program.
    ``two_tiles`` (rmsnorm): hold a whole row as two power-of-two tiles instead of one."""

    block: int
    num_warps: int = 4
    rows: int = 1
    two_tiles: bool = False
    launch: Mapping[str, Any] = field(default_factory=dict)


def row_config(table: Mapping[str, RowConfig], device: torch.device) -> RowConfig:
    """The entry of a per-family ``table`` for ``device``."""
    return table[arch_family(device)]


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """``t [..., H]`` as a 2-D ``[rows, H]`` tensor with unit column stride.

    A view when the leading dims collapse into one stride, else a contiguous copy.
    """
    h = t.shape[-1]
    if t.dim() == 2 and t.stride(-1) == 1:
        return t
    try:
        rows = t.view(-1, h)
    except RuntimeError:
        rows = t.reshape(-1, h)
    return rows if rows.stride(-1) == 1 else rows.contiguous()


class RowsOut:
    """The output of a row-wise kernel: ``tensor`` (what the op returns, ``out`` if given)
    and ``rows``, the 2-D ``[rows, H]`` tensor the kernel writes. When ``out`` cannot be
    viewed as rows, the kernel writes a scratch tensor and :meth:`finish` copies it over."""

    def __init__(self, out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        h = shape[-1]
        if out is None:
            out = torch.empty(shape, dtype=dtype, device=device)
        self.tensor = out
        try:
            rows = out.view(-1, h)
            self.copy_back = rows.stride(-1) != 1
        except RuntimeError:
            self.copy_back = True
        if self.copy_back:
            rows = torch.empty((out.numel() // max(h, 1), h), dtype=out.dtype, device=out.device)
        self.rows = rows

    def finish(self) -> torch.Tensor:
        if self.copy_back:
            self.tensor.copy_(self.rows.view(self.tensor.shape))
        return self.tensor

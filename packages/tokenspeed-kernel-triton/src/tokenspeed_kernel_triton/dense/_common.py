"""Host-side helpers shared by the dense kernels' wrappers."""

from __future__ import annotations

import torch


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

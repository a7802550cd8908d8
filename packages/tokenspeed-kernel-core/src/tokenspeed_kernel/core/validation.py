"""Argument checks shared by every public op.

Each check raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (wrong
shape, device, layout, value) naming the argument and what was expected. Checks
that need a device synchronisation (values inside index tensors) run only when
``TOKENSPEED_KERNEL_DEBUG=1``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .formats import DTYPE_NAMES, dtype_name
from .settings import debug_checks_enabled

__all__ = [
    "check_tensor",
    "check_same_device",
    "check_cu_seqlens",
    "debug_checks_enabled",
]


def _dtypes_text(dtypes: Iterable[torch.dtype]) -> str:
    return " or ".join(dtype_name(d) if d in DTYPE_NAMES else str(d) for d in dtypes)


def check_tensor(
    name: str,
    t: object,
    *,
    dtypes: tuple[torch.dtype, ...] | None = None,
    dim: int | tuple[int, ...] | None = None,
    shape: tuple[int | None, ...] | None = None,
    contiguous: bool = False,
    last_dim_contiguous: bool = False,
) -> torch.Tensor:
    """Check one tensor argument; cheap on success (this runs on every call)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {_dtypes_text(dtypes)}, got {t.dtype}")
    if shape is not None:
        got = t.shape
        if None not in shape:
            if got != shape:
                _bad_shape(name, shape, got)
        elif len(got) != len(shape) or any(w is not None and w != n for w, n in zip(shape, got)):
            _bad_shape(name, shape, got)
    elif dim is not None:
        nd = t.dim()
        if nd != dim if isinstance(dim, int) else nd not in dim:
            want = dim if isinstance(dim, int) else " or ".join(str(d) for d in dim)
            raise ValueError(f"{name}: expected a {want}-D tensor, got shape {list(t.shape)}")
    if contiguous or last_dim_contiguous:
        if not t.is_contiguous():
            if contiguous:
                raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous()), got strides {t.stride()}")
            if t.dim() and t.stride(-1) != 1:
                raise ValueError(f"{name}: expected the last dim to be contiguous (stride 1), got strides {t.stride()}")
    return t


def _bad_shape(name: str, shape: tuple[int | None, ...], got: torch.Size) -> None:
    want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
    raise ValueError(f"{name}: expected shape {want}, got {list(got)}")


def check_same_device(ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    """Every tensor in ``others`` (None skipped) lives on ``ref``'s device."""
    dev = ref.device
    for name, t in others.items():
        if t is not None and t.device != dev:
            raise ValueError(f"{name}: expected device {dev} (like {ref_name}), got {t.device}")


def check_cu_seqlens(name: str, cu: torch.Tensor, *, batch: int | None = None) -> int:
    """Check a ``cu_seqlens`` tensor's form; returns the batch size."""
    check_tensor(name, cu, dtypes=(torch.int32,), dim=1)
    if cu.shape[0] < 2:
        raise ValueError(f"{name}: expected [batch + 1] >= 2 entries, got shape {list(cu.shape)}")
    b = cu.shape[0] - 1
    if batch is not None and b != batch:
        raise ValueError(f"{name}: expected batch {batch} (+1 entries), got {b}")
    if debug_checks_enabled():
        c = cu.cpu()
        if int(c[0]) != 0 or bool((c[1:] < c[:-1]).any()):
            raise ValueError(f"{name}: must start at 0 and be non-decreasing, got {c.tolist()}")
    return b

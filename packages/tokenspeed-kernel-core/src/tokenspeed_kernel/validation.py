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
    dtypes: Iterable[torch.dtype] | None = None,
    dim: int | tuple[int, ...] | None = None,
    shape: tuple[int | None, ...] | None = None,
    contiguous: bool = False,
    last_dim_contiguous: bool = False,
) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            raise TypeError(f"{name}: expected dtype {_dtypes_text(dtypes)}, got {t.dtype}")
    if dim is not None:
        dims = (dim,) if isinstance(dim, int) else dim
        if t.dim() not in dims:
            want = " or ".join(str(d) for d in dims)
            raise ValueError(f"{name}: expected a {want}-D tensor, got shape {tuple(t.shape)}")
    if shape is not None:
        if t.dim() != len(shape) or any(s is not None and s != n for s, n in zip(shape, t.shape, strict=True)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name}: expected shape {want}, got {list(t.shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous()), got strides {t.stride()}")
    if last_dim_contiguous and t.dim() and t.stride(-1) != 1:
        raise ValueError(f"{name}: expected the last dim to be contiguous (stride 1), got strides {t.stride()}")
    return t


def check_same_device(ref_name: str, ref: torch.Tensor, **others: torch.Tensor | None) -> None:
    for name, t in others.items():
        if t is not None and t.device != ref.device:
            raise ValueError(f"{name}: expected device {ref.device} (like {ref_name}), got {t.device}")


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


def debug_checks_enabled() -> bool:
    from .selection import settings

    return settings().debug

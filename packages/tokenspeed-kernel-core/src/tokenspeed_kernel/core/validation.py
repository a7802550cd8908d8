"""Argument checks shared by every public op.

Each check raises ``TypeError`` (wrong type or dtype) or ``ValueError`` (wrong
shape, device, layout, value) naming the argument and what was expected.

Checks that read a tensor's values (``cu_seqlens`` monotone and ending at the
token count, page ids and slots in range, expert ids in range, ...) run always
for a plain CPU tensor, where reading it costs no device synchronisation (engines
often keep ``cu_seqlens`` on the host), and for a device tensor only when
``TOKENSPEED_KERNEL_DEBUG=1``. They never run on tensor subclasses (the
``FakeTensor`` of ``torch.compile``, ...) or meta tensors, which have no values:
see :func:`readable_values`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from .formats import DTYPE_NAMES, dtype_name
from .settings import debug_checks_enabled

__all__ = [
    "check_tensor",
    "check_same_device",
    "check_cu_seqlens",
    "check_int",
    "check_float",
    "readable_values",
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


def readable_values(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` on the host, when the checks that read values should run on it; else None.

    A plain CPU tensor is read as it is (no sync, no copy). A device tensor is
    copied to the host (a sync) only under ``TOKENSPEED_KERNEL_DEBUG=1``. Tensor
    subclasses (``FakeTensor``, ``nn.Parameter``, ...) and meta tensors are never
    read: ``type(t) is torch.Tensor`` keeps this one comparison on the hot path.
    """
    if type(t) is not torch.Tensor:
        return None
    if t.is_cpu:
        return t
    if t.is_meta or not debug_checks_enabled():
        return None
    return t.cpu()


def check_int(name: str, value: object, *, minimum: int, expected: str) -> int:
    """A host ``int`` (not a bool, not a tensor) ``>= minimum``."""
    if type(value) is bool or not isinstance(value, int):
        raise TypeError(f"{name}: expected {expected}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return value


def check_float(
    name: str, value: object, *, expected: str, minimum: float | None = None, strict: bool = False
) -> float:
    """A finite host number (an int or a float, not a bool) ``>= minimum`` (``> minimum`` if ``strict``)."""
    if type(value) is bool or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected {expected}, got {value!r} ({type(value).__name__})")
    if not math.isfinite(value) or (minimum is not None and (value <= minimum if strict else value < minimum)):
        raise ValueError(f"{name}: expected {expected}, got {value!r}")
    return float(value)


def check_cu_seqlens(
    name: str,
    cu: torch.Tensor,
    *,
    batch: int | None = None,
    tokens: int | None = None,
    tokens_of: str = "q",
    max_seqlen: int | None = None,
    max_name: str = "",
) -> tuple[int, torch.Tensor | None]:
    """Check a ``cu_seqlens`` tensor; returns (batch size, the lengths on the host or None).

    The form always; the values when :func:`readable_values` reads them: start at
    0, non-decreasing, last entry ``== tokens`` (the packed rows of ``tokens_of``),
    no length above ``max_seqlen`` (the argument ``max_name``).
    """
    check_tensor(name, cu, dtypes=(torch.int32,), dim=1)
    if cu.shape[0] < 2:
        raise ValueError(f"{name}: expected [batch + 1] >= 2 entries, got shape {list(cu.shape)}")
    b = cu.shape[0] - 1
    if batch is not None and b != batch:
        raise ValueError(f"{name}: expected batch {batch} (+1 entries), got {b}")
    c = readable_values(cu)
    if c is None:
        return b, None
    lengths = c.diff()
    shortest, longest = (int(x) for x in torch.aminmax(lengths))
    if int(c[0]) != 0 or shortest < 0:
        raise ValueError(f"{name}: must start at 0 and be non-decreasing, got {_head(c)}")
    last = int(c[-1])
    if tokens is not None and last != tokens:
        raise ValueError(
            f"{name}: the last entry ({last}) must equal the {tokens} packed tokens of {tokens_of} "
            f"({tokens_of}.shape[0]), got {_head(c)}"
        )
    if max_seqlen is not None and longest > max_seqlen:
        raise ValueError(
            f"{max_name}: expected at least the longest sequence of {name} ({longest} tokens), got {max_seqlen}"
        )
    return b, lengths


def _head(t: torch.Tensor, n: int = 16) -> str:
    """The first values of a 1-D host tensor, as text."""
    values = t[:n].tolist()
    return str(values) if t.numel() <= n else str(values)[:-1] + ", ...]"

"""Shared CDNA (gfx942 / gfx950) kernel sources, parameterised by :class:`~.arch.CdnaArch`.

Each op is written once (``cdna.attention``, ``cdna.norm``) and takes the arch as its
first argument; :func:`bind_arch` turns it into the per-arch entry point that
``tokenspeed_kernel_amd.gfx950`` / ``.gfx942`` export.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from .._triton import require_triton
from .arch import CdnaArch

# Every Gluon kernel module lives under this package: check Triton before any of them imports it.
require_triton()

__all__ = ["bind_arch"]


def bind_arch(fn: Callable[..., Any], arch: CdnaArch, module: str) -> Callable[..., Any]:
    """``fn`` with its leading ``arch`` argument fixed, presented as a function of ``module``."""

    def entry(*args: Any, **kwargs: Any) -> Any:
        return fn(arch, *args, **kwargs)

    functools.update_wrapper(entry, fn)
    del entry.__wrapped__  # the public signature is the one without ``arch``
    params = list(inspect.signature(fn).parameters.values())[1:]
    entry.__signature__ = inspect.signature(fn).replace(parameters=params)  # type: ignore[attr-defined]
    entry.__module__ = module
    entry.__qualname__ = fn.__name__
    entry.__doc__ = f"[{arch.name}] {fn.__doc__ or ''}"
    return entry

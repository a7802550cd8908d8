"""The Triton this package's Gluon kernels need, checked at first use.

The package declares no ``triton`` requirement: a ROCm build of PyTorch ships its
own Triton (the ``pytorch-triton-rocm`` distribution, module ``triton``), and a
``triton`` requirement would make pip install the PyPI wheel, built for CUDA, over
it. Instead the kernel modules call :func:`require_triton` when they are first
imported (selection imports them lazily, on the first call that picks one), and a
missing or unsupported Triton gives an error naming the supported range.
"""

from __future__ import annotations

import importlib
import os
from importlib import metadata

__all__ = ["SUPPORTED", "TritonVersionError", "check_triton_version", "require_triton"]

#: Triton versions (major, minor) the Gluon kernels are written and cross-compiled for:
#: >= SUPPORTED[0], < SUPPORTED[1]. Gluon's AMD API changes between minor releases.
SUPPORTED = ((3, 6), (3, 7))
_RANGE = f">={SUPPORTED[0][0]}.{SUPPORTED[0][1]},<{SUPPORTED[1][0]}.{SUPPORTED[1][1]}"
_HOW = (
    "On a ROCm machine Triton comes with PyTorch's ROCm build (the 'pytorch-triton-rocm' distribution): "
    "install the ROCm torch whose Triton is in that range, and do not 'pip install triton' over it "
    "(the PyPI wheel is built for CUDA). On a CUDA machine, 'pip install \"triton" + _RANGE + "\"'."
)


class TritonVersionError(ImportError):
    """Triton is missing or outside :data:`SUPPORTED` (an ImportError: the kernel cannot load)."""


def _where(module: object) -> str:
    """The imported ``triton``'s folder and the distributions that claim the module name."""
    names = ", ".join(sorted(set(metadata.packages_distributions().get("triton") or []))) or "no distribution"
    return f"imported from {os.path.dirname(getattr(module, '__file__', '') or '?')}; installed: {names}"


def _problem(version: str) -> str | None:
    """Why ``version`` is not supported (None: it is)."""
    parts = version.split("+")[0].split(".")
    try:
        found = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return f"cannot read its version {version!r}"
    return None if SUPPORTED[0] <= found < SUPPORTED[1] else f"found {version}"


def _error(problem: str, source: str) -> TritonVersionError:
    return TritonVersionError(f"tokenspeed-kernel-amd needs Triton {_RANGE}, {problem} ({source}). {_HOW}")


def check_triton_version(version: str, *, source: str = "triton") -> None:
    """Raise :class:`TritonVersionError` unless ``version`` (e.g. ``"3.6.0+rocm7.0"``) is supported;
    ``source`` says in the message where that Triton comes from."""
    problem = _problem(version)
    if problem is not None:
        raise _error(problem, source)


def require_triton() -> None:
    """Import Triton and check its version (cheap after the first call)."""
    try:
        triton = importlib.import_module("triton")
    except ImportError as exc:
        raise _error("and none is importable", str(exc)) from exc
    problem = _problem(str(getattr(triton, "__version__", "")))
    if problem is not None:
        raise _error(problem, _where(triton))

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


def _distribution_of_triton() -> str:
    names = metadata.packages_distributions().get("triton") or []
    return ", ".join(sorted(set(names))) or "unknown distribution"


def check_triton_version(version: str, *, source: str = "triton") -> None:
    """Raise :class:`TritonVersionError` unless ``version`` (e.g. ``"3.6.0+rocm7.0"``) is supported."""
    parts = version.split("+")[0].split(".")
    try:
        found = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        raise TritonVersionError(
            f"tokenspeed-kernel-amd needs Triton {_RANGE}; cannot read the version {version!r} of {source}. {_HOW}"
        ) from None
    if not SUPPORTED[0] <= found < SUPPORTED[1]:
        raise TritonVersionError(f"tokenspeed-kernel-amd needs Triton {_RANGE}, found {version} ({source}). {_HOW}")


def require_triton() -> None:
    """Import Triton and check its version (cheap after the first call)."""
    try:
        triton = importlib.import_module("triton")
    except ImportError as exc:
        raise TritonVersionError(
            f"tokenspeed-kernel-amd needs Triton {_RANGE}, and none is importable ({exc}). {_HOW}"
        ) from exc
    check_triton_version(str(getattr(triton, "__version__", "")), source=_distribution_of_triton())

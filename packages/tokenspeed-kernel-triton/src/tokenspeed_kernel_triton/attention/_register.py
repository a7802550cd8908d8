"""Registration of this family's Triton kernels (lazy implementations)."""

from __future__ import annotations


def register() -> None:
    pass

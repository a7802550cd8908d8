"""Entry point of the ``triton`` plugin: registers every family's kernels."""

from __future__ import annotations


def register() -> None:
    from .attention._register import register as register_attention
    from .dense._register import register as register_dense
    from .moe._register import register as register_moe

    register_attention()
    register_moe()
    register_dense()

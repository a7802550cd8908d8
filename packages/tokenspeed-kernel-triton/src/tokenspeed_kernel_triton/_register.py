"""Entry point of the ``triton`` plugin: registers every family's kernels."""

from __future__ import annotations


def register() -> None:
    from ._interpreter import apply_interpreter_fixes

    # Only under TRITON_INTERPRET=1 (CPU tests): this is the one case where
    # registration imports Triton.
    apply_interpreter_fixes()

    from .attention._register import register as register_attention
    from .dense._register import register as register_dense
    from .moe._register import register as register_moe

    register_attention()
    register_moe()
    register_dense()

"""Fixes for Triton 3.6's interpreter (``TRITON_INTERPRET=1``), applied only in that mode.

The interpreter turns a scalar kernel argument used as a loop bound into
``int(<1-element array>)``, which numpy >= 2.4 refuses ("only 0-dimensional arrays
can be converted to Python scalars"); we convert through the element instead.
"""

from __future__ import annotations

import os

_applied = False


def apply_interpreter_fixes() -> None:
    global _applied
    if _applied or os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched
    _applied = True

"""Generated key functions of the hot paths (the validation memo, cached launches).

A call's key is built by a function generated once per argument pattern: one chain of guards
(each position's type), then one flat tuple. A hand-written loop built a tuple per argument and
described each by ``isinstance`` branches, which cost more than the checks it saved.
"""

from __future__ import annotations

from typing import Any

__all__ = ["guarded_tuple_function"]


def guarded_tuple_function(n: int, guards: list[str], parts: list[str], namespace: dict[str, Any], label: str) -> Any:
    """``f(a0, ..., a{n-1})``: the tuple of the expressions ``parts`` when every expression of ``guards``
    holds, else None. ``namespace``: the names the expressions use; ``label`` names the code object."""
    names = ", ".join(f"a{i}" for i in range(n))
    src = (
        f"def key({names}):\n"
        f"    if {' and '.join(guards) or 'True'}:\n"
        f"        return ({', '.join(parts)},)\n"
        f"    return None\n"
    )
    exec(compile(src, f"<tokenspeed_kernel {label} {n} args>", "exec"), namespace)
    return namespace["key"]

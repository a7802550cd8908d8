"""Generated key functions of the hot paths (the validation memo, cached launches).

A call's key is built by a function generated once per argument pattern: one chain of guards
(each position's type), then one flat tuple, where a hand-written loop built a tuple per argument and
described each by ``isinstance`` branches (a decode-attention memo hit: 8.2 -> 5.0-5.4 us on the 2-core
machine, meta tensors).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["VALUE_TYPES", "guarded_tuple_function", "plain_value"]

#: types whose values a generated key holds (or a guard compares) by value: hashable, never holding tensors.
VALUE_TYPES = frozenset({type(None), bool, int, float, str, torch.dtype, torch.device})


def plain_value(a: Any) -> bool:
    """Whether ``a`` is compared and hashed by value in a key or a guard: a value of :data:`VALUE_TYPES`, a tuple of
    plain values, or a frozen dataclass instance whose fields are plain values (a ``MoEPlan`` holding its
    ``MoEActivation``)."""
    t = type(a)
    if t in VALUE_TYPES:
        return True
    if t is tuple:
        return all(plain_value(x) for x in a)
    return (
        dataclasses.is_dataclass(a)
        and not isinstance(a, type)
        and t.__dataclass_params__.frozen
        and all(plain_value(getattr(a, f.name)) for f in dataclasses.fields(a))
    )


def guarded_tuple_function(
    n: int,
    guards: list[str],
    parts: list[str],
    namespace: dict[str, Any],
    label: str,
    *,
    prelude: list[str] = (),  # type: ignore[assignment]
    second: list[str] | None = None,
) -> Any:
    """``f(a0, ..., a{n-1})``: the tuple of the expressions ``parts`` when every expression of ``guards``
    holds, else None. ``prelude``: statements run after the guards (locals the expressions use);
    ``second``: expressions of a second tuple, returned with the first as a pair. ``namespace``: the
    names the expressions use; ``label`` names the code object."""
    names = ", ".join(f"a{i}" for i in range(n))
    body = "".join(f"    {stmt}\n" for stmt in prelude)
    result = f"({', '.join(parts)},)"
    if second is not None:
        result = f"({result}, ({', '.join(second)}{',' if len(second) == 1 else ''}))"
    src = (
        f"def key({names}):\n"
        f"    if not ({' and '.join(guards) or 'True'}):\n"
        f"        return None\n"
        f"{body}"
        f"    return {result}\n"
    )
    exec(compile(src, f"<tokenspeed_kernel {label} {n} args>", "exec"), namespace)
    return namespace["key"]

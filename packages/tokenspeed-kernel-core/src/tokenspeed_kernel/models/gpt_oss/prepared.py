"""Call sites of a fixed call sequence, each call prepared once (``Op.prepare``).

A decode step calls the same ops in the same order on arguments of the same metadata, step after
step: :class:`PreparedSites` stands in for the ops namespace in one layer's code, prepares the
``i``-th call it sees at its first step and calls that prepared call from then on. A call whose op
differs from the one recorded at its position (the code path changed) raises; an op that cannot be
prepared (the sampler) is called as it is.
"""

from __future__ import annotations

from typing import Any

import tokenspeed_kernel as tk
from tokenspeed_kernel.core.op import NotPreparable

__all__ = ["PreparedSites"]


class _Site:
    __slots__ = ("name", "owner")

    def __init__(self, owner: PreparedSites, name: str) -> None:
        self.owner, self.name = owner, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        owner = self.owner
        i = owner._next
        owner._next = i + 1
        try:
            name, call = owner._calls[i]
        except IndexError:
            return self._prepare(i, args, kwargs)
        if name is not self.name and name != self.name:
            raise RuntimeError(
                f"prepared call sites: call {i} is {self.name}, it was {name} when prepared (the code path changed)"
            )
        return call(*args, **kwargs)

    def _prepare(self, i: int, args: tuple, kwargs: dict) -> Any:
        owner = self.owner
        calls = owner._calls
        op = getattr(owner._ops, self.name)
        try:
            call = op.prepare(*args, **kwargs)
        except NotPreparable:  # bind builds arguments per call (the sampler): the op itself
            call = op
        calls.append((self.name, call))
        return call(*args, **kwargs)


class PreparedSites:
    """An ops namespace (``rmsnorm``, ``mm``, ...) whose calls are prepared by their order (module doc)."""

    def __init__(self, ops: Any = tk) -> None:
        self._ops = ops
        self._calls: list[tuple[str, Any]] = []
        self._next = 0
        for name in tk.all_contracts():
            setattr(self, name, _Site(self, name))

    def restart(self) -> PreparedSites:
        """The next call is the sequence's first again (a new step); returns self."""
        self._next = 0
        return self

    @property
    def prepared(self) -> list[tuple[str, str]]:
        """(op, kernel) of each call site, in order."""
        return [(name, getattr(call, "kernel", "op")) for name, call in self._calls]

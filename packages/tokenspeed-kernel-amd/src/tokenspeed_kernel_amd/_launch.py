"""One kernel launch as data: what the host code plans, runs, and what the
cross-compilation tests record and compile instead of running. Imports no Triton
(the launch goes through :func:`tokenspeed_kernel.launch.cached`)."""

from __future__ import annotations

from typing import Any

from tokenspeed_kernel.launch import cached

__all__ = ["KernelLaunch", "next_pow2"]


class KernelLaunch:
    """One kernel launch: the (Gluon or Triton) function, its grid, arguments and compile options."""

    __slots__ = ("args", "fn", "grid", "kwargs")

    def __init__(self, fn: Any, grid: tuple[int, ...], args: tuple, kwargs: dict[str, Any]) -> None:
        self.fn = fn
        self.grid = grid
        self.args = args
        self.kwargs = kwargs

    def __call__(self) -> None:
        cached(self.fn)[self.grid](*self.args, **self.kwargs)

    def __repr__(self) -> str:
        return f"KernelLaunch({getattr(self.fn, '__name__', self.fn)}, grid={self.grid})"


def next_pow2(n: int) -> int:
    """The smallest power of two >= ``n`` (1 for ``n <= 1``): block sizes of ``arange``."""
    return 1 << max(0, (int(n) - 1).bit_length())

"""Helpers the per-family case modules share: outputs, comparisons, bisect moves, upcasting."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..compare import Check, check_close, check_exact, check_tokens
from ..tolerances import tolerance
from . import Case

__all__ = [
    "single",
    "named",
    "compare_by",
    "close",
    "exact",
    "tokens",
    "dim",
    "upcast",
    "FLOAT_DTYPES_CPU",
]

FLOAT_DTYPES_CPU = ("fp32", "bf16")

Comparer = Callable[[Case, str, Any, torch.Tensor], Check]


def single(name: str = "out") -> Callable[[dict[str, Any], Any], dict[str, torch.Tensor]]:
    """Outputs of an op returning one tensor."""
    return lambda call, result: {name: result}


def named(*names: str) -> Callable[[dict[str, Any], Any], dict[str, torch.Tensor]]:
    """Outputs of an op returning a tuple (extra names beyond the tuple are ignored)."""

    def outputs(call: dict[str, Any], result: Any) -> dict[str, torch.Tensor]:
        if not isinstance(result, tuple):
            result = (result,)
        return dict(zip(names, result))

    return outputs


def close(kind: str, dtype_of: Callable[[Case], str] | None = None) -> Comparer:
    def cmp(case: Case, name: str, got: Any, want: torch.Tensor) -> Check:
        return check_close(name, got, want, tolerance(kind, dtype_of(case) if dtype_of else case.dtype))

    return cmp


def exact() -> Comparer:
    return lambda case, name, got, want: check_exact(name, got, want)


def tokens() -> Comparer:
    return lambda case, name, got, want: check_tokens(name, got, want, tolerance("tokens"))


def compare_by(spec: Mapping[str, Comparer]) -> Callable[[Case, dict, dict], list[Check]]:
    """Compare each named output with its comparer; an output missing on either side fails."""

    def compare(case: Case, got: dict[str, Any], want: dict[str, torch.Tensor]) -> list[Check]:
        checks = []
        for name, cmp in spec.items():
            if name not in want:
                continue
            if name not in got:
                checks.append(Check(name, False, "", note="missing from the kernel's result"))
                continue
            checks.append(cmp(case, name, got[name], want[name]))
        return checks

    return compare


def dim(name: str, lo: int = 1, *, step: int = 1, keep: Callable[[Case, int], bool] | None = None):
    """A bisect move shrinking int parameter ``name`` towards ``lo`` (multiples of ``step``)."""

    def move(case: Case) -> list[Case]:
        v = case[name]
        if v is None or v <= lo:
            return []
        cands = [lo, (v // 2) // step * step, v - step]
        out = []
        for c in cands:
            if lo <= c < v and c not in out and (keep is None or keep(case, c)):
                out.append(c)
        return [case.replace(**{name: c}) for c in out]

    return move


def upcast(call: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """``call`` with the named bf16/fp16 tensors in fp32 (the reference then computes exactly)."""
    out = dict(call)
    for n in names:
        t = out.get(n)
        if isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16):
            out[n] = t.float()
    return out

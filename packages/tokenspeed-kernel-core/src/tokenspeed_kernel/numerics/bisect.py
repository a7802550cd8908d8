"""``--bisect``: shrink a failing case to a minimal failing one.

Greedy: try the op's moves in order (batch, sequences, heads, tokens, experts,
...), each move's most aggressive candidate first; keep the first candidate that
still fails and start over; stop when no candidate fails or the step budget is
spent. Inputs of a shrunk case are drawn afresh from its own seed, so the result
is a failing case, not a slice of the original tensors.
"""

from __future__ import annotations

from .cases import Case

__all__ = ["shrink"]


def shrink(case: Case, fails, moves, *, max_steps: int = 200) -> tuple[Case, int]:
    """The smallest case reachable from ``case`` by ``moves`` for which ``fails`` holds.

    Args:
        case: a failing case.
        fails: ``Case -> bool``.
        moves: callables ``Case -> [smaller Case, ...]``.
        max_steps: how many candidates to try at most.

    Returns:
        ``(minimal case, candidates tried)``.
    """
    current, steps = case, 0
    seen: set[Case] = {case}
    progress = True
    while progress and steps < max_steps:
        progress = False
        for move in moves:
            for cand in move(current):
                if cand in seen:
                    continue
                seen.add(cand)
                steps += 1
                if fails(cand):
                    current, progress = cand, True
                    break
                if steps >= max_steps:
                    break
            if progress or steps >= max_steps:
                break
    return current, steps

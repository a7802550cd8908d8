"""Sampling: greedy and top-k / top-p.

:func:`top_k_top_p_sample` is defined so that every kernel draws the same token
from the same random number (no sort of the vocabulary needed):

1. ``p = softmax(logits / temperature)`` in fp32;
2. top-k keeps tokens with ``p >= p_(k)``, the k-th largest (ties kept);
3. top-p keeps, of those, tokens with ``p >= t`` where ``t`` is the largest
   value such that the kept mass ``sum(p_i : p_i >= t)`` is at least ``top_p``
   times the mass after step 2;
4. with one uniform ``u`` in [0, 1) per row, the sample is the smallest token
   index whose running sum of kept probabilities (in index order) exceeds
   ``u * kept_mass``.
"""

from __future__ import annotations

import torch

from ..core import dispatch
from ..core.contracts import define_op
from ..core.formats import DTYPE_NAMES
from ..core.selection import Target
from ..core.validation import check_same_device, check_tensor

__all__ = ["argmax", "top_k_top_p_sample"]

ARGMAX = define_op("argmax", family="sampling", roles=("logits",), doc="Greedy token per row.")
SAMPLE = define_op("top_k_top_p_sample", family="sampling", roles=("logits",), doc="Top-k/top-p sampling.")
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def argmax(logits: torch.Tensor, *, solution: Target | None = None, override: Target | None = None) -> torch.Tensor:
    """Index of the largest logit per row of ``logits [B, V]`` (first on ties) -> ``int64 [B]``."""
    check_tensor("logits", logits, dtypes=_DTYPES, dim=2, last_dim_contiguous=True)
    return dispatch.run("argmax", logits.device, (DTYPE_NAMES[logits.dtype],), {}, solution, override, logits)


def _per_row(name: str, value, batch: int, dtype: torch.dtype, device, lo, hi) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        check_tensor(name, value, dtypes=(dtype,), shape=(batch,))
        if value.device != device:
            raise ValueError(f"{name}: expected device {device}, got {value.device}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise ValueError(f"{name}: expected a number in [{lo}, {hi}] or a [{batch}] tensor, got {value!r}")
    return torch.full((batch,), value, dtype=dtype, device=device)


def top_k_top_p_sample(
    logits: torch.Tensor,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
    *,
    temperature: float | torch.Tensor = 1.0,
    generator: torch.Generator | None = None,
    uniform: torch.Tensor | None = None,
    solution: Target | None = None,
    override: Target | None = None,
) -> torch.Tensor:
    """Sample one token per row of ``logits [B, V]`` -> ``int64 [B]`` (see module doc).

    Args:
        top_k: int or ``int32 [B]``; 0 disables top-k.
        top_p: float or ``float32 [B]`` in (0, 1]; 1 disables top-p.
        temperature: float or ``float32 [B]``, > 0 (use :func:`argmax` for greedy).
        generator: seeds the per-row uniforms (``torch.rand`` on ``logits``' device).
        uniform: ``float32 [B]`` in [0, 1) to use instead of drawing (CUDA-graph
            friendly: the engine owns the random numbers).
    """
    check_tensor("logits", logits, dtypes=_DTYPES, dim=2, last_dim_contiguous=True)
    b, v = logits.shape
    dev = logits.device
    top_k_t = _per_row("top_k", top_k, b, torch.int32, dev, 0, v)
    top_p_t = _per_row("top_p", top_p, b, torch.float32, dev, 1e-9, 1.0)
    temp_t = _per_row("temperature", temperature, b, torch.float32, dev, 1e-9, float("inf"))
    if uniform is None:
        uniform = torch.rand(b, generator=generator, device=dev, dtype=torch.float32)
    elif generator is not None:
        raise ValueError("generator: pass either generator= or uniform=, not both")
    else:
        check_tensor("uniform", uniform, dtypes=(torch.float32,), shape=(b,))
        check_same_device("logits", logits, uniform=uniform)
    return dispatch.run(
        "top_k_top_p_sample", dev, (DTYPE_NAMES[logits.dtype],), {}, solution, override,
        logits, top_k_t, top_p_t, temp_t, uniform,
    )  # fmt: skip

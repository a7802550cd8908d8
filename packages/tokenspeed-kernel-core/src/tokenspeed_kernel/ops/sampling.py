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

from ..core.contracts import Size
from ..core.formats import DTYPE_NAMES
from ..core.op import KernelCall, Op, Reference, kernel_call
from ..core.platform import current_stream_id as _stream_of
from ..core.validation import check_same_device, check_tensor, readable_values

__all__ = ["argmax", "top_k_top_p_sample"]

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_FLOAT = ("fp32", "bf16", "fp16")
_BATCH = (Size("batch", "B, rows of logits"),)


def _fake_tokens(logits, *args, **kwargs):
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)


def _bind_argmax(logits: torch.Tensor) -> KernelCall:
    """Index of the largest logit per row of ``logits [B, V]`` (first on ties) -> ``int64 [B]``."""
    check_tensor("logits", logits, dtypes=_DTYPES, dim=2, last_dim_contiguous=True)
    return kernel_call(logits.device, (DTYPE_NAMES[logits.dtype],), (), (logits.shape[0],), logits)


argmax = Op(
    name="argmax",
    family="sampling",
    roles=("logits",),
    traits={},
    sizes=_BATCH,
    doc="Greedy token per row.",
    bind=_bind_argmax,
    fake=_fake_tokens,
    reference=Reference("tokenspeed_kernel.reference.sampling:argmax", formats=[{"logits": _FLOAT}]),
    workload="tokenspeed_kernel.numerics.cases.sampling:ARGMAX",
)


def _per_row(name: str, value, batch: int, dtype: torch.dtype, device, lo, hi, stream: int | None) -> torch.Tensor:
    kind = "an int" if dtype == torch.int32 else "a number"
    if isinstance(value, torch.Tensor):
        check_tensor(name, value, dtypes=(dtype,), shape=(batch,))
        if value.device != device:
            raise ValueError(f"{name}: expected device {device}, got {value.device}")
        host = readable_values(value)
        if host is not None and host.numel() and not bool(((host >= lo) & (host <= hi)).all()):
            bad = int((~((host >= lo) & (host <= hi))).nonzero()[0])
            raise ValueError(f"{name}: expected values in [{lo}, {hi}], got {host[bad].item()!r} in row {bad}")
        return value
    allowed = int if dtype == torch.int32 else (int, float)
    if isinstance(value, bool) or not isinstance(value, allowed) or not lo <= value <= hi:
        raise ValueError(f"{name}: expected {kind} in [{lo}, {hi}] or a [{batch}] tensor, got {value!r}")
    return _row_constant(value, batch, dtype, device, stream)


#: The ``[B]`` tensors of scalar sampling parameters, built once per (value, batch, dtype, device, stream) instead
#: of three allocations and fill launches per call. Kernels only read them. The stream is part of the key because
#: the fill runs on the stream of the call that built the tensor: a call on another stream gets its own, so it never
#: reads one whose fill has not run yet. An entry is never freed: a graph captured with one reads it by address.
#: Past :data:`_MAX_ROW_CONSTANTS` entries (parameters that vary per call) new tensors are built per call and not kept.
_ROW_CONSTANTS: dict[tuple, torch.Tensor] = {}
_MAX_ROW_CONSTANTS = 512


def _row_constant(
    value: int | float, batch: int, dtype: torch.dtype, device: torch.device, stream: int | None
) -> torch.Tensor:
    """The kept ``[batch]`` tensor of ``value`` for ``device`` and its current stream ``stream`` (``current_stream_id``)."""
    key = (type(value), value, batch, dtype, device, stream)
    t = _ROW_CONSTANTS.get(key)
    if t is not None:
        return t
    t = torch.full((batch,), value, dtype=dtype, device=device)
    # Not kept: a tensor filled inside a capture (it holds its value only once the graph replays) and a
    # fake or functional one (a call traced by torch.compile or run under a fake mode).
    if (
        type(t) is torch.Tensor
        and len(_ROW_CONSTANTS) < _MAX_ROW_CONSTANTS
        and not (device.type == "cuda" and torch.cuda.is_current_stream_capturing())
    ):
        _ROW_CONSTANTS[key] = t
    return t


def _check_logit_values(logits: torch.Tensor) -> None:
    """Every row has a finite logit and no NaN or +inf (they make every probability NaN)."""
    host = readable_values(logits)
    if host is None or not host.numel() or bool(torch.isfinite(host).all()):
        return
    broken = (torch.isnan(host) | torch.isposinf(host)).any(dim=1)
    if bool(broken.any()):
        row = int(broken.nonzero()[0])
        raise ValueError(f"logits: row {row} holds NaN or +inf (its probabilities would all be NaN)")
    masked = torch.isneginf(host).all(dim=1)
    if bool(masked.any()):
        row = int(masked.nonzero()[0])
        raise ValueError(f"logits: row {row} is -inf everywhere (no token can be sampled)")


def _bind_top_k_top_p_sample(
    logits: torch.Tensor,
    top_k: int | torch.Tensor = 0,
    top_p: float | torch.Tensor = 1.0,
    *,
    temperature: float | torch.Tensor = 1.0,
    generator: torch.Generator | None = None,
    uniform: torch.Tensor | None = None,
) -> KernelCall:
    """Sample one token per row of ``logits [B, V]`` -> ``int64 [B]`` (see the module doc of
    ``tokenspeed_kernel.ops.sampling``).

    Every row needs a finite logit and no NaN or +inf (checked for host tensors, and
    for device tensors under ``TOKENSPEED_KERNEL_DEBUG=1``, as the tensor arguments' ranges).

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
    _check_logit_values(logits)
    stream = _stream_of(dev)
    top_k_t = _per_row("top_k", top_k, b, torch.int32, dev, 0, v, stream)
    top_p_t = _per_row("top_p", top_p, b, torch.float32, dev, 1e-9, 1.0, stream)
    temp_t = _per_row("temperature", temperature, b, torch.float32, dev, 1e-9, float("inf"), stream)
    if uniform is None:
        uniform = torch.rand(b, generator=generator, device=dev, dtype=torch.float32)
    elif generator is not None:
        raise ValueError("generator: pass either generator= or uniform=, not both")
    else:
        check_tensor("uniform", uniform, dtypes=(torch.float32,), shape=(b,))
        check_same_device("logits", logits, uniform=uniform)
        host = readable_values(uniform)
        if host is not None and host.numel() and not bool(((host >= 0) & (host < 1)).all()):
            raise ValueError(f"uniform: expected values in [0, 1), got {host.tolist()[:16]}")
    return kernel_call(dev, (DTYPE_NAMES[logits.dtype],), (), (b,), logits, top_k_t, top_p_t, temp_t, uniform)


top_k_top_p_sample = Op(
    name="top_k_top_p_sample",
    family="sampling",
    roles=("logits",),
    traits={},
    sizes=_BATCH,
    doc="Top-k/top-p sampling.",
    bind=_bind_top_k_top_p_sample,
    fake=_fake_tokens,
    reference=Reference(
        "tokenspeed_kernel.reference.sampling:top_k_top_p_sample", formats=[{"logits": _FLOAT}], tags=()
    ),
    workload="tokenspeed_kernel.numerics.cases.sampling:TOP_K_TOP_P_SAMPLE",
)

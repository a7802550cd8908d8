"""Portable Triton RMSNorm with an optional fused residual add (GPT-OSS numerics).

``s = x + residual`` is rounded to ``x``'s dtype (and returned), then normalised in
fp32, multiplied by the weight in fp32, and cast once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2

from ._host import RowConfig, RowsOut, arch_family, as_rows

__all__ = ["RMSNORM_CONFIGS", "RowConfig", "rmsnorm", "rmsnorm_config", "rmsnorm_with_config", "TRITON_KERNELS"]

# rmsnorm, by row count: (largest row count, config), the last row catch-all. "block" is
# the widest row kept whole in registers (one read of x); longer rows take two passes.
# A GPT-OSS row (2880 bf16) is 360 16-byte vectors: one 4096-lane tile, or with
# ``two_tiles`` a 2048 + 1024-lane pair (a quarter fewer registers, but two reductions).
# H200, do_bench (2026-11-30), TB/s plain / with residual:
#   1 row per program, 8 warps, one tile:      4096 rows 2.52 / 2.30, 16384 rows 3.79 / 3.93
#   (this table's previous version) <= 8192 rows: 2 rows / 4 warps, two tiles: 4096 rows
#   2.59 / 2.84; more: 1 row / 8 warps, two tiles: 16384 rows 3.07 / 3.87
# so: 2 rows / 4 warps / two tiles up to 8192 rows (the residual case gained 23 %), one
# tile at 1 row / 8 warps above (two tiles lost 20 % there, plain). 4096 rows stays under
# the 3.6 TB/s target; the bench's copy-of-the-same-bytes and graph columns show how much
# of that is do_bench's fixed cost at 47 MB. Decode (<= 256 rows, reasoned): latency
# bound, one row over 8 warps, one tile (one reduction). --sweep times rows x warps.
RMSNORM_CONFIGS: dict[str, tuple[tuple[int | None, RowConfig], ...]] = {
    "nvidia": (
        (256, RowConfig(block=4096, num_warps=8, rows=1)),
        (8192, RowConfig(block=4096, num_warps=4, rows=2, two_tiles=True)),
        (None, RowConfig(block=4096, num_warps=8, rows=1)),
    ),
    # AMD (not measured): 64-lane wavefronts, so 4 warps is 256 lanes, like 8 NVIDIA warps.
    "amd": (
        (256, RowConfig(block=4096, num_warps=4, rows=1)),
        (8192, RowConfig(block=4096, num_warps=4, rows=2, two_tiles=True)),
        (None, RowConfig(block=4096, num_warps=4, rows=1)),
    ),
    # Interpreter: small enough that test rows take the one-tile, two-tile and two-pass paths.
    "interpret": (
        (4, RowConfig(block=64, rows=2)),
        (None, RowConfig(block=64, rows=2, two_tiles=True)),
    ),
}


def rmsnorm_config(n_rows: int, device: torch.device) -> RowConfig:
    """The rmsnorm config for ``n_rows`` rows on ``device``'s family."""
    for max_rows, cfg in RMSNORM_CONFIGS[arch_family(device)]:
        if max_rows is None or n_rows <= max_rows:
            return cfg
    raise AssertionError("rmsnorm config table has no catch-all row")


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    y_ptr,
    sum_ptr,
    n_rows,
    H,
    stride_x,
    stride_r,
    stride_y,
    stride_sum,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    ONE_PASS: tl.constexpr,
    BLOCK: tl.constexpr,
    BLOCK_TAIL: tl.constexpr,
    ROWS: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    rows = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK)
    if ONE_PASS:
        # The whole row stays in registers: read once, reduce, scale, write. With a tail
        # tile it is held as two power-of-two tiles, [0, BLOCK) and [BLOCK, BLOCK +
        # BLOCK_TAIL) (GPT-OSS's 2880 = 2048 + 832 of 1024), not one 4096-wide tile: a
        # quarter fewer registers and lanes (more rows in flight), one more reduction.
        x = _load_sum(x_ptr, res_ptr, sum_ptr, rows, row_ok, cols, H, stride_x, stride_r, stride_sum, HAS_RESIDUAL)
        sq = tl.sum(x * x, axis=1)
        if BLOCK_TAIL > 0:
            tcols = BLOCK + tl.arange(0, BLOCK_TAIL)
            xt = _load_sum(
                x_ptr, res_ptr, sum_ptr, rows, row_ok, tcols, H, stride_x, stride_r, stride_sum, HAS_RESIDUAL
            )
            sq += tl.sum(xt * xt, axis=1)
        rstd = tl.rsqrt(sq / H + eps)
        _scale_store(x, w_ptr, y_ptr, rows, row_ok, cols, H, stride_y, rstd)
        if BLOCK_TAIL > 0:
            _scale_store(xt, w_ptr, y_ptr, rows, row_ok, tcols, H, stride_y, rstd)
    else:
        # Long rows: one pass for the sum of squares, a second (from L2) to scale.
        acc = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
        for h0 in range(0, H, BLOCK):
            x = _load_sum(
                x_ptr, res_ptr, sum_ptr, rows, row_ok, h0 + cols, H, stride_x, stride_r, stride_sum, HAS_RESIDUAL
            )
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / H + eps)
        for h0 in range(0, H, BLOCK):
            c = h0 + cols
            # Recomputed rather than re-read from s: another thread may have
            # stored that element, and nothing orders the two passes' memory.
            x = stream_rows(x_ptr, res_ptr, rows, row_ok, c, H, stride_x, stride_r, HAS_RESIDUAL).to(tl.float32)
            _scale_store(x, w_ptr, y_ptr, rows, row_ok, c, H, stride_y, rstd)


@triton.jit
def stream_rows(x_ptr, res_ptr, rows, row_ok, cols, H, stride_x, stride_r, HAS_RESIDUAL: tl.constexpr):
    """x of ``rows`` x ``cols``, or with HAS_RESIDUAL the stream ``s = x + residual`` (fp32 sum rounded to x's
    dtype), in x's dtype (``moe_gate``'s norm reads it too)."""
    mask = row_ok[:, None] & (cols < H)[None, :]
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
    return x


@triton.jit
def _load_sum(
    x_ptr, res_ptr, sum_ptr, rows, row_ok, cols, H, stride_x, stride_r, stride_sum, HAS_RESIDUAL: tl.constexpr
):
    """:func:`stream_rows` in fp32, the stream also stored to ``sum_ptr`` with HAS_RESIDUAL."""
    s = stream_rows(x_ptr, res_ptr, rows, row_ok, cols, H, stride_x, stride_r, HAS_RESIDUAL)
    if HAS_RESIDUAL:
        mask = row_ok[:, None] & (cols < H)[None, :]
        tl.store(sum_ptr + rows[:, None] * stride_sum + cols[None, :], s, mask=mask)
    return s.to(tl.float32)


@triton.jit
def _scale_store(x, w_ptr, y_ptr, rows, row_ok, cols, H, stride_y, rstd):
    """y = x * rstd * weight (fp32), cast once to y's dtype."""
    w = tl.load(w_ptr + cols, mask=cols < H, other=0.0).to(tl.float32)
    y = x * rstd[:, None] * w[None, :]
    mask = row_ok[:, None] & (cols < H)[None, :]
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


TRITON_KERNELS = {"rmsnorm": _rmsnorm_kernel}
_RMSNORM = cached(_rmsnorm_kernel)


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``y = x * rsqrt(mean(x^2) + eps) * weight`` over the last dim (fp32 math, one cast).

    Args:
        x: ``[..., H]`` bf16/fp16/fp32, last dim contiguous.
        weight: ``[H]`` any float dtype (used in fp32).
        eps: added to the mean square.
        residual: optional, like ``x``: ``s = x + residual`` (rounded to ``x``'s
            dtype) is normalised instead, and ``(y, s)`` is returned.
        out: optional ``[..., H]`` like ``x`` for ``y``.

    Returns:
        ``y`` like ``x``, or ``(y, s)`` with a residual.
    """
    if out is None and x.dim() == 2:
        # The common call (rows of a 2-D activation, no out=): one dict lookup for the
        # launch plan of this shape and layout instead of recomputing it (host cost).
        key = (x.shape, x.stride(), x.dtype, x.device, None if residual is None else residual.stride())
        plan = _PLANS.get(key)
        if plan is None:
            if len(_PLANS) >= 1024:  # token counts that vary per call: start over
                _PLANS.clear()
            plan = _PLANS[key] = _plan(x, residual)
        if plan is not False:
            grid, kwargs = plan
            n_rows, h = x.shape
            y = torch.empty_like(x)
            if residual is None:
                _RMSNORM[grid](x, None, weight, y, None, n_rows, h, x.stride(0), 0, h, 0, eps, **kwargs)
                return y
            s = torch.empty_like(x)
            _RMSNORM[grid](x, residual, weight, y, s, n_rows, h, x.stride(0), residual.stride(0), h, h, eps, **kwargs)
            return y, s
    return rmsnorm_with_config(x, weight, eps, residual=residual, out=out, config=None)


#: launch plans of the fast path by (shape, strides, dtype, device, residual strides): (grid, kwargs) or False.
_PLANS: dict = {}


def _plan(x: torch.Tensor, residual: torch.Tensor | None):
    """(grid, kwargs) for 2-D ``x`` (and ``residual``) with contiguous rows; False when the general path is needed."""
    n_rows, h = x.shape
    if not (n_rows and h) or x.stride(1) != 1 or (residual is not None and residual.stride(1) != 1):
        return False
    # y and s come from empty_like(x): with unit column stride that is row stride h (or one row).
    return _launch_plan(n_rows, h, residual is not None, x.device, None)


def _launch_plan(n_rows: int, h: int, has_residual: bool, device: torch.device, config: RowConfig | None):
    cfg = config if config is not None else rmsnorm_config(n_rows, device)
    one_pass = h <= cfg.block
    if one_pass and cfg.two_tiles:
        # largest power of two <= H, then the rest rounded up to a power of two
        block = 1 << (h.bit_length() - 1)
        tail = next_power_of_2(h - block) if h > block else 0
    elif one_pass:
        block, tail = next_power_of_2(h), 0
    else:
        block, tail = cfg.block, 0
    kwargs = dict(
        HAS_RESIDUAL=has_residual, ONE_PASS=one_pass, BLOCK=block, BLOCK_TAIL=tail, ROWS=cfg.rows,
        num_warps=cfg.num_warps, **cfg.launch,
    )  # fmt: skip
    return (cdiv(n_rows, cfg.rows),), kwargs


def rmsnorm_with_config(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    residual: torch.Tensor | None,
    out: torch.Tensor | None,
    config: RowConfig | None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`rmsnorm` with an explicit config (None = the table's); benchmarks and sweeps use it."""
    h = x.shape[-1]
    x2 = as_rows(x)
    n_rows = x2.shape[0]
    y = RowsOut(out, tuple(x.shape), x.dtype, x.device)
    s = RowsOut(None, tuple(x.shape), x.dtype, x.device) if residual is not None else None
    r2 = as_rows(residual) if residual is not None else None
    if n_rows and h:
        grid, kwargs = _launch_plan(n_rows, h, residual is not None, x.device, config)
        _RMSNORM[grid](
            x2, r2, weight, y.rows, s.rows if s is not None else None,
            n_rows, h,
            x2.stride(0), r2.stride(0) if r2 is not None else 0, y.rows.stride(0), s.rows.stride(0) if s else 0,
            eps,
            **kwargs,
        )  # fmt: skip
    if s is not None:
        return y.finish(), s.finish()
    return y.finish()

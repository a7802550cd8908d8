"""``moe_experts`` (grouped expert MLPs) and ``moe_apply`` (the fused layer).

Both take canonical :class:`~tokenspeed_kernel.ops.moe.MoEWeights` (bf16/fp16,
FP8 e4m3 per-channel or per-tensor, MXFP4) as they are: the kernels read that
layout directly, so there is no weight preprocessor.

``moe_apply`` picks a path by token count (:data:`.configs.APPLY_PATH`):

- tiny (decode): gate/up GEMM -> down GEMM -> combine, no sort; each program
  streams one expert's weight tile once for all the tokens routed to it;
- grouped (prefill): sort the pairs by expert -> gate/up GEMM gathering x's rows ->
  down GEMM writing each row back at its (token, slot) place -> combine.

Intermediates (the SwiGLU output and the weighted expert outputs) are kept in x's
dtype; every product and the combine's sum accumulate in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2
from tokenspeed_kernel.ops.moe import MoEActivation, MoEWeights

from . import gemm
from .combine import sum_slots
from .configs import GemmConfig, apply_path, family_of, gemm_config
from .dispatch import sort_pairs

__all__ = ["moe_experts", "moe_apply", "ExpertOperand", "expert_operand", "launch_gate_up", "launch_down"]


@dataclass(frozen=True)
class ExpertOperand:
    """One projection's tensors and the constexprs that describe them to the kernel."""

    w: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor
    w_kind: tl.constexpr  # gemm.W_*
    scale_kind: tl.constexpr  # gemm.SCALE_*
    has_bias: bool
    scale_stride_e: int
    scale_stride_n: int

    @property
    def weight_kind(self) -> str:
        return "mxfp4" if self.w_kind == gemm.W_MXFP4 else "dense"

    def kernel_args(self) -> tuple:
        """The kernels' weight arguments: w, its expert and row strides, scale, its strides, bias, its stride."""
        return (self.w, self.w.stride(0), self.w.stride(1), self.scale, self.scale_stride_e, self.scale_stride_n,
                self.bias, self.bias.stride(0))  # fmt: skip


def _last_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def expert_operand(weights: MoEWeights, which: str) -> ExpertOperand:
    """The kernel's view of ``weights.w13`` (``which="w13"``) or ``weights.w2``."""
    w = _last_contiguous(getattr(weights, which))
    scale = getattr(weights, f"{which}_scale")
    bias = getattr(weights, f"{which}_bias")
    fmt = weights.format
    if fmt == "mxfp4":
        scale = _last_contiguous(scale)
        w_kind, scale_kind, scale_stride_e, scale_stride_n = (
            gemm.W_MXFP4,
            gemm.SCALE_NONE,
            scale.stride(0),
            scale.stride(1),
        )
    elif fmt == "fp8_e4m3:per_channel":
        scale = scale.contiguous()
        w_kind, scale_kind, scale_stride_e, scale_stride_n = gemm.W_FP8, gemm.SCALE_PER_CHANNEL, scale.stride(0), 1
    elif fmt == "fp8_e4m3:per_tensor":
        scale = scale.contiguous()
        w_kind, scale_kind, scale_stride_e, scale_stride_n = gemm.W_FP8, gemm.SCALE_PER_TENSOR, 1, 0
    else:
        scale, w_kind, scale_kind, scale_stride_e, scale_stride_n = w, gemm.W_DENSE, gemm.SCALE_NONE, 0, 0
    if bias is not None:
        bias = bias.contiguous()
    return ExpertOperand(
        w, scale, bias if bias is not None else w, w_kind, scale_kind, bias is not None, scale_stride_e, scale_stride_n
    )


def _grouped_tiles(rows: int, num_experts: int, block_m: int) -> int:
    # Every non-empty expert wastes at most one partial tile, so this bounds the row
    # tiles of any routing; tiles past the real count exit at once.
    return min(rows, cdiv(rows, block_m) + min(num_experts, rows))


def _pairs_pad(rows_mode: int, num_pairs: int) -> int:
    # Only the tiny path holds every pair's expert id in registers; elsewhere a
    # constant keeps one compiled kernel for all token counts.
    return next_power_of_2(num_pairs) if rows_mode == gemm.ROWS_TINY else 1


def _launch_grid(
    rows_mode: int, num_pairs: int, num_experts: int, block_m: int, tiles_n: int
) -> tuple[int, tuple[int]]:
    """(row tiles, grid): one program per (pair, N tile) on the tiny path, per (row tile, N tile) else."""
    if rows_mode == gemm.ROWS_TINY:
        return 0, (num_pairs * tiles_n,)
    tiles_m = _grouped_tiles(num_pairs, num_experts, block_m)
    return tiles_m, (tiles_m * tiles_n,)


def _shared_constexprs(
    op: ExpertOperand,
    cfg: GemmConfig,
    rows_mode: int,
    num_pairs: int,
    num_experts: int,
    block_m: int,
    k: int,
    device: torch.device,
) -> dict:
    """The constexprs and launch options both GEMM kernels take."""
    return dict(
        W_KIND=op.w_kind, SCALE=op.scale_kind, HAS_BIAS=op.has_bias, DECODE=cfg.decode, SWAP_AB=cfg.swap_ab,
        MMA_FP32=device.type == "cpu", EVEN_K=k % cfg.block_k == 0, USE_DOT=cfg.use_dot, STAGES=cfg.num_stages,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        E_PAD=next_power_of_2(num_experts), PAIRS_PAD=_pairs_pad(rows_mode, num_pairs),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip


def _block_m(rows_mode: int, cfg: GemmConfig, block_m: int | None) -> int:
    if not cfg.use_dot:
        if rows_mode != gemm.ROWS_TINY:
            raise ValueError("GemmConfig(use_dot=False) (GEMV) serves only the tiny path")
        return 1
    return block_m or cfg.block_m


def launch_gate_up(
    a: torch.Tensor,
    row_map: torch.Tensor,
    permutation: torch.Tensor | None,
    op: ExpertOperand,
    activation: MoEActivation,
    interleaved: bool,
    y: torch.Tensor,
    *,
    rows_mode: int,
    top_k: int,
    num_pairs: int,
    num_experts: int,
    cfg: GemmConfig,
    block_m: int | None = None,
) -> None:
    """Launch the gate/up GEMM + bias + activation into ``y``.

    Args:
        a: ``[rows, H]`` bf16/fp16 A rows: ``x [T, H]`` (``ROWS_TINY``, ``ROWS_GATHER``) or
            sorted rows (``ROWS_SORTED``).
        row_map: ``int32 [T, k]`` topk_ids (tiny) or ``int32 [E+1]`` expert_offsets.
        permutation: ``int32 [T*k]`` sorted row -> flat pair (``ROWS_GATHER``), else None.
        op: :func:`expert_operand` of ``w13``.
        activation: :class:`MoEActivation`.
        interleaved: gate/up rows alternate.
        y: ``[rows, I]`` of ``a``'s dtype: flat pair order (tiny) or sorted order.
        rows_mode: ``gemm.ROWS_SORTED`` / ``ROWS_GATHER`` / ``ROWS_TINY``.
        top_k: ``k`` (1 for sorted rows).
        num_pairs: ``T * k`` (rows of ``y``).
        num_experts: ``E``.
        cfg: tile config; ``block_m`` overrides its row tile (tiny path).
    """
    i = y.shape[1]
    bm = _block_m(rows_mode, cfg, block_m)
    tiles_m, grid = _launch_grid(rows_mode, num_pairs, num_experts, bm, cdiv(i, cfg.block_n // 2))
    limit = activation.limit
    cached(gemm.moe_gate_up_kernel)[grid](
        a, a.stride(0), row_map, permutation if permutation is not None else row_map, *op.kernel_args(),
        y, y.stride(0), num_pairs, tiles_m, num_experts, a.shape[1], i,
        float(activation.alpha), float(limit if limit is not None else 0.0), float(activation.up_offset),
        ROWS=rows_mode, TOPK=top_k, INTERLEAVED=interleaved, HAS_LIMIT=limit is not None,
        **_shared_constexprs(op, cfg, rows_mode, num_pairs, num_experts, bm, a.shape[1], y.device),
    )  # fmt: skip


def launch_down(
    a: torch.Tensor,
    row_map: torch.Tensor,
    permutation: torch.Tensor | None,
    topk_weights: torch.Tensor | None,
    op: ExpertOperand,
    y: torch.Tensor,
    *,
    rows_mode: int,
    num_pairs: int,
    num_experts: int,
    cfg: GemmConfig,
    block_m: int | None = None,
) -> None:
    """Launch the down GEMM + bias (x routing weight when given) into ``y``.

    Args:
        a: ``[rows, I]`` intermediate rows (flat pair order on the tiny path, else sorted).
        row_map: ``int32 [T, k]`` topk_ids (tiny) or ``int32 [E+1]`` expert_offsets.
        permutation: ``int32 [T*k]`` (``ROWS_GATHER``: row ``r`` is written at
            ``permutation[r]``), else None.
        topk_weights: ``float32 [T, k]`` routing weights to apply, or None.
        op: :func:`expert_operand` of ``w2``.
        y: ``[rows, H]`` of ``a``'s dtype.
        rows_mode, num_pairs, num_experts, cfg, block_m: as :func:`launch_gate_up`.
    """
    n = y.shape[1]
    bm = _block_m(rows_mode, cfg, block_m)
    tiles_m, grid = _launch_grid(rows_mode, num_pairs, num_experts, bm, cdiv(n, cfg.block_n))
    cached(gemm.moe_down_kernel)[grid](
        a, a.stride(0), row_map, permutation if permutation is not None else row_map,
        topk_weights if topk_weights is not None else a, *op.kernel_args(),
        y, y.stride(0), num_pairs, tiles_m, num_experts, a.shape[1], n,
        ROWS=rows_mode, ROUTE_WEIGHT=topk_weights is not None,
        **_shared_constexprs(op, cfg, rows_mode, num_pairs, num_experts, bm, a.shape[1], y.device),
    )  # fmt: skip


def moe_experts(
    hidden: torch.Tensor,
    expert_offsets: torch.Tensor,
    weights: MoEWeights,
    activation: MoEActivation,
    *,
    out: torch.Tensor | None = None,
    configs: tuple[GemmConfig, GemmConfig] | None = None,
) -> torch.Tensor:
    """Each expert's MLP on its rows (no routing weight).

    Args:
        hidden: ``[N, H]`` bf16/fp16 rows grouped by expert.
        expert_offsets: ``int32 [E+1]``; expert ``e`` owns rows
            ``expert_offsets[e]:expert_offsets[e+1]``, and ``expert_offsets[E] == N``.
        weights: canonical :class:`MoEWeights` (bf16/fp16, fp8_e4m3 per-channel or
            per-tensor, mxfp4), optional biases, either gate/up order.
        activation: :class:`MoEActivation`.
        out: optional ``[N, H]`` of ``hidden``'s dtype.
        configs: (gate/up, down) tile configs overriding the tables (tuning only).

    Returns:
        ``[N, H]`` in ``hidden``'s dtype (``out`` when given).
    """
    rows, h = hidden.shape
    e, i = weights.num_experts, weights.intermediate
    result = out if out is not None and out.stride(-1) == 1 else torch.empty_like(hidden)
    if rows and h:
        hidden = _last_contiguous(hidden)
        family = family_of(hidden.device)
        w13, w2 = expert_operand(weights, "w13"), expert_operand(weights, "w2")
        cfg13 = configs[0] if configs else gemm_config(family, "grouped", w13.weight_kind, "gate_up", rows)
        cfg2 = configs[1] if configs else gemm_config(family, "grouped", w2.weight_kind, "down", rows)
        inter = torch.empty((rows, i), dtype=hidden.dtype, device=hidden.device)
        launch_gate_up(
            hidden, expert_offsets, None, w13, activation, weights.gate_up_interleaved, inter,
            rows_mode=gemm.ROWS_SORTED, top_k=1, num_pairs=rows, num_experts=e, cfg=cfg13,
        )  # fmt: skip
        launch_down(
            inter, expert_offsets, None, None, w2, result,
            rows_mode=gemm.ROWS_SORTED, num_pairs=rows, num_experts=e, cfg=cfg2,
        )  # fmt: skip
    if out is not None and result is not out:
        out.copy_(result)
        return out
    return result


def moe_apply(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: MoEWeights,
    activation: MoEActivation,
    *,
    out: torch.Tensor | None = None,
    path: str | None = None,
    configs: tuple[GemmConfig, GemmConfig] | None = None,
) -> torch.Tensor:
    """The fused MoE layer ``out[t] = sum_s topk_weights[t, s] * expert_{topk_ids[t, s]}(x[t])``.

    Args:
        x: ``[T, H]`` bf16/fp16.
        topk_weights: ``float32 [T, k]``.
        topk_ids: ``int32 [T, k]`` contiguous, values in ``[0, E)``.
        weights: canonical :class:`MoEWeights` (see :func:`moe_experts`).
        activation: :class:`MoEActivation`.
        out: optional ``[T, H]`` of ``x``'s dtype.
        path: ``"tiny"`` or ``"grouped"`` overriding :data:`.configs.APPLY_PATH`
            (tests and tuning).
        configs: (gate/up, down) tile configs overriding the tables (tuning only).

    Returns:
        ``[T, H]`` in ``x``'s dtype (``out`` when given).
    """
    t, h = x.shape
    k = topk_ids.shape[1]
    e, i = weights.num_experts, weights.intermediate
    result = out if out is not None and out.stride(-1) == 1 else torch.empty_like(x)
    if t and h:
        x = _last_contiguous(x)
        topk_ids = topk_ids.contiguous()
        topk_weights = topk_weights.contiguous()
        family = family_of(x.device)
        path = path or apply_path(family, t)
        pairs = t * k
        w13, w2 = expert_operand(weights, "w13"), expert_operand(weights, "w2")
        size = t if path == "tiny" else pairs
        cfg13 = configs[0] if configs else gemm_config(family, path, w13.weight_kind, "gate_up", size)
        cfg2 = configs[1] if configs else gemm_config(family, path, w2.weight_kind, "down", size)
        inter = torch.empty((pairs, i), dtype=x.dtype, device=x.device)
        # Weighted expert outputs in flat (token, slot) order: the combine reads each
        # token's k rows contiguously and needs no permutation.
        expert_out = torch.empty((pairs, h), dtype=x.dtype, device=x.device)
        if path == "tiny":
            # One row tile holds every token of an expert (an expert appears once
            # per token); more rows than that (repeated ids) loop in the kernel.
            bm = max(16, next_power_of_2(t))
            launch_gate_up(
                x, topk_ids, None, w13, activation, weights.gate_up_interleaved, inter,
                rows_mode=gemm.ROWS_TINY, top_k=k, num_pairs=pairs, num_experts=e, cfg=cfg13, block_m=bm,
            )  # fmt: skip
            launch_down(
                inter, topk_ids, None, topk_weights, w2, expert_out,
                rows_mode=gemm.ROWS_TINY, num_pairs=pairs, num_experts=e, cfg=cfg2, block_m=bm,
            )  # fmt: skip
        elif path == "grouped":
            offsets, perm = sort_pairs(topk_ids, e)
            launch_gate_up(
                x, offsets, perm, w13, activation, weights.gate_up_interleaved, inter,
                rows_mode=gemm.ROWS_GATHER, top_k=k, num_pairs=pairs, num_experts=e, cfg=cfg13,
            )  # fmt: skip
            launch_down(
                inter, offsets, perm, topk_weights, w2, expert_out,
                rows_mode=gemm.ROWS_GATHER, num_pairs=pairs, num_experts=e, cfg=cfg2,
            )  # fmt: skip
        else:
            raise ValueError(f"path: expected 'tiny' or 'grouped', got {path!r}")
        sum_slots(expert_out, k, result)
    if out is not None and result is not out:
        out.copy_(result)
        return out
    return result

"""The MXFP4 expert weights as the CDNA MoE kernels (and their twin) read them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tokenspeed_kernel.ops.moe import interleave_gate_up

__all__ = ["MxfpMoeWeights", "prepare_weights"]


@dataclass(frozen=True)
class MxfpMoeWeights:
    """MXFP4 experts in the kernels' layout: the checkpoint's row-major layout, contiguous.

    Attributes:
        w13: ``uint8 [E, 2I, H/2]`` gate/up rows (two E2M1 codes a byte, low nibble first).
        w13_scale: ``uint8 [E, 2I, H/32]`` E8M0.
        w2: ``uint8 [E, H, I/2]``; w2_scale: ``uint8 [E, H, I/32]``.
        w13_bias: ``float32 [E, 2I]`` or None; w2_bias: ``float32 [E, H]`` or None.
        interleaved: gate and up rows alternate (gate = even rows, GPT-OSS), else the
            first ``I`` rows are the gate.
    """

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w13_bias: torch.Tensor | None = None
    w2_bias: torch.Tensor | None = None
    interleaved: bool = True

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden(self) -> int:
        return self.w2.shape[1]

    @property
    def inter(self) -> int:
        return self.w13.shape[1] // 2


def _check(name: str, t: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")


def prepare_weights(
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    *,
    interleaved: bool = True,
) -> MxfpMoeWeights:
    """Check shapes and dtypes and convert to the kernels' layout (once, at load time).

    Gate/up rows end interleaved (one contiguous 2 x BLOCK_N-row block per N tile),
    biases float32, every tensor contiguous.
    """
    if not isinstance(w13, torch.Tensor) or w13.dim() != 3:
        raise ValueError(f"w13: expected uint8 [E, 2I, H/2], got {getattr(w13, 'shape', type(w13).__name__)}")
    if not isinstance(w2, torch.Tensor) or w2.dim() != 3:
        raise ValueError(f"w2: expected uint8 [E, H, I/2], got {getattr(w2, 'shape', type(w2).__name__)}")
    e, two_i, h_half = w13.shape
    h, i = w2.shape[1], two_i // 2
    if two_i % 2 or h % 32 or i % 32 or h != 2 * h_half:
        raise ValueError(
            f"w13 {list(w13.shape)} / w2 {list(w2.shape)}: expected [E, 2I, H/2] and [E, H, I/2] with H and I "
            "multiples of 32 (the MX block)"
        )
    _check("w13", w13, torch.uint8, (e, two_i, h // 2))
    _check("w2", w2, torch.uint8, (e, h, i // 2))
    _check("w13_scale", w13_scale, torch.uint8, (e, two_i, h // 32))
    _check("w2_scale", w2_scale, torch.uint8, (e, h, i // 32))
    if w13_bias is not None:
        if not w13_bias.is_floating_point() or tuple(w13_bias.shape) != (e, two_i):
            raise ValueError(
                f"w13_bias: expected a float [E, 2I] = {[e, two_i]}, got {w13_bias.dtype} {list(w13_bias.shape)}"
            )
        w13_bias = w13_bias.to(torch.float32)
    if w2_bias is not None:
        if not w2_bias.is_floating_point() or tuple(w2_bias.shape) != (e, h):
            raise ValueError(f"w2_bias: expected a float [E, H] = {[e, h]}, got {w2_bias.dtype} {list(w2_bias.shape)}")
        w2_bias = w2_bias.to(torch.float32)
    if not interleaved:
        w13, w13_scale = interleave_gate_up(w13, i), interleave_gate_up(w13_scale, i)
        if w13_bias is not None:
            w13_bias = interleave_gate_up(w13_bias, i)
    return MxfpMoeWeights(
        w13=w13.contiguous(),
        w13_scale=w13_scale.contiguous(),
        w2=w2.contiguous(),
        w2_scale=w2_scale.contiguous(),
        w13_bias=None if w13_bias is None else w13_bias.contiguous(),
        w2_bias=None if w2_bias is None else w2_bias.contiguous(),
        interleaved=True,
    )

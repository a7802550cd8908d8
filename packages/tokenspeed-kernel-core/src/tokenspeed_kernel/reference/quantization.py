"""Reference FP8 and MXFP4 (de)quantization, plus MXFP4 helpers other references reuse.

MXFP4 choices the public docstring leaves open, fixed here so that every kernel
can match the reference bit for bit:

- scale byte ``s = clamp(floor(log2(amax)) - 2 + 127, 0, 254)`` (255 is E8M0's NaN);
  an all-zero block gets ``s = 127`` (scale 1) and zero codes;
- the sign bit of a code is the sign bit of the input, so a negative value that
  rounds to zero (and ``-0.0``) is stored as code 8 (``-0``);
- magnitudes above 6 after scaling saturate to 6 (code 7);
- NaN and infinity inputs are outside the contract.
"""

from __future__ import annotations

import torch

__all__ = [
    "E2M1_VALUES",
    "FP8_E4M3_MAX",
    "e2m1_table",
    "e2m1_encode",
    "mxfp4_to_float",
    "fp8_to_float",
    "quantize_fp8",
    "quantize_mxfp4",
    "dequantize_mxfp4",
]

#: Value of each E2M1 code 0..15 (8..15 are the negatives of 0..7; code 8 is -0).
E2M1_VALUES: tuple[float, ...] = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
#: Largest finite ``float8_e4m3fn`` magnitude.
FP8_E4M3_MAX = 448.0
_MX_BLOCK = 32
_FP8_BLOCK = 128


def e2m1_table(device: torch.device | str | None = None) -> torch.Tensor:
    """``float32 [16]`` lookup table of :data:`E2M1_VALUES` on ``device``."""
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)


def e2m1_encode(v: torch.Tensor) -> torch.Tensor:
    """Round float values (already divided by their scale) to E2M1 codes.

    Args:
        v: float tensor of any shape.

    Returns:
        ``uint8`` codes of ``v``'s shape: nearest E2M1 value, ties to the even
        code, saturating at 6; the sign bit is ``v``'s sign bit.
    """
    a = v.float().abs()
    # Each comparison is one boundary between adjacent magnitude codes c and c+1;
    # at a midpoint ties go to the even code, hence ">" when c is even and ">=" when odd.
    mag = (a > 0.25).to(torch.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5) + (a > 5.0)
    return mag | (torch.signbit(v).to(torch.uint8) << 3)


def _scale_values(scales: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> float32 ``2**(s - 127)`` (exact: powers of two, down to the subnormal 2**-127)."""
    return torch.exp2(scales.to(torch.float32) - 127.0)


def mxfp4_to_float(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Decode MXFP4 to float32 (exact).

    Args:
        blocks: ``uint8 [..., K/2]``, two E2M1 codes a byte, low nibble = even element.
        scales: ``uint8 [..., K/32]`` E8M0 exponents, one per 32 values.

    Returns:
        ``float32 [..., K]``.
    """
    table = e2m1_table(blocks.device)
    codes = torch.stack((blocks & 0xF, blocks >> 4), dim=-1).flatten(-2)
    values = table[codes.long()]
    k = values.shape[-1]
    values = values.unflatten(-1, (k // _MX_BLOCK, _MX_BLOCK)) * _scale_values(scales).unsqueeze(-1)
    return values.flatten(-2)


def fp8_to_float(w: torch.Tensor, scale: torch.Tensor | None, *, per_row: bool) -> torch.Tensor:
    """Dequantize an FP8 matrix ``w [N, K]`` to float32.

    Args:
        w: ``float8_e4m3fn [N, K]``.
        scale: ``float32`` scalar-like (``[]`` or ``[1]``) or ``[N]`` when ``per_row``; None = 1.
        per_row: ``scale`` holds one value per row of ``w``.
    """
    wf = w.to(torch.float32)
    if scale is None:
        return wf
    s = scale.to(torch.float32)
    return wf * (s.reshape(-1, 1) if per_row else s.reshape(()))


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, *, dtype: torch.dtype) -> torch.Tensor:
    """``blocks uint8 [..., K/2]`` + ``scales uint8 [..., K/32]`` -> ``dtype [..., K]``."""
    return mxfp4_to_float(blocks, scales).to(dtype)


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [..., K]`` (K divisible by 32) to MXFP4.

    Returns:
        ``(blocks uint8 [..., K/2], scales uint8 [..., K/32])``; see the module
        docstring for the scale, sign and saturation rules.
    """
    lead = x.shape[:-1]
    k = x.shape[-1]
    xb = x.to(torch.float32).reshape(*lead, k // _MX_BLOCK, _MX_BLOCK)
    amax = xb.abs().amax(dim=-1)
    # frexp: amax = m * 2**e with m in [0.5, 1), so floor(log2(amax)) = e - 1 exactly.
    _, exponent = torch.frexp(amax)
    s = (exponent.to(torch.int32) - 1 - 2 + 127).clamp(0, 254)
    s = torch.where(amax == 0, torch.full_like(s, 127), s)
    scales = s.to(torch.uint8)
    # 2**(127 - s) lies in [2**-127, 2**127]: a power of two in fp32, so the division is exact.
    codes = e2m1_encode(xb * torch.exp2(127.0 - s.to(torch.float32)).unsqueeze(-1)).reshape(*lead, k)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.contiguous(), scales


def quantize_fp8(x: torch.Tensor, *, granularity: str, scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x [M, K]`` to ``float8_e4m3fn`` with ``float32`` scales.

    Args:
        x: ``[M, K]`` bf16/fp16/fp32.
        granularity: ``"per_tensor"`` (scale ``[1]``), ``"per_token"`` (``[M, 1]``) or
            ``"block128"`` (``[M, ceil(K/128)]``, 1x128 blocks along K, the last one partial).
        scale: static ``float32 [1]`` scale (``per_tensor`` only), or None for ``amax / 448``
            (an all-zero group gets 1).

    Returns:
        ``(x_fp8 float8_e4m3fn [M, K], scale float32)``.
    """
    xf = x.to(torch.float32)
    m, k = xf.shape
    if scale is not None:
        s = scale.to(torch.float32).reshape(1)
        per_elem = s.reshape(1, 1)
    elif granularity == "per_tensor":
        amax = xf.abs().amax() if xf.numel() else xf.new_zeros(())
        s = _amax_to_scale(amax).reshape(1)
        per_elem = s.reshape(1, 1)
    elif granularity == "per_token":
        amax = xf.abs().amax(dim=1, keepdim=True) if k else xf.new_zeros(m, 1)
        s = _amax_to_scale(amax)
        per_elem = s
    else:
        nb = -(-k // _FP8_BLOCK)
        padded = torch.nn.functional.pad(xf, (0, nb * _FP8_BLOCK - k))
        amax = padded.abs().reshape(m, nb, _FP8_BLOCK).amax(dim=-1) if m * nb else xf.new_zeros(m, nb)
        s = _amax_to_scale(amax)
        per_elem = s.repeat_interleave(_FP8_BLOCK, dim=1)[:, :k]
    q = (xf / per_elem).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q, s


def _amax_to_scale(amax: torch.Tensor) -> torch.Tensor:
    # A true fp32 division on every device: dividing a CUDA tensor by a Python number
    # makes PyTorch multiply by the fp32 reciprocal 1/448 instead (one ulp off for
    # about half the inputs, which flips ties of x / scale in bf16 data).
    return torch.where(amax > 0, amax / torch.full_like(amax, FP8_E4M3_MAX), torch.ones_like(amax))

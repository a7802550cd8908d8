"""Dense matmul: ``out = a @ b.T (+ bias)``, ``b`` stored as rows = output features.

Formats of ``a`` / ``b``: bf16/fp16/fp32 dense; FP8 e4m3 with scales
(``a_scale``: ``[1]`` per tensor, ``[M, 1]`` per token, ``[M, K/128]`` per 1x128
block; ``b_scale``: ``[1]``, ``[N, 1]`` per channel, ``[N/128, K/128]`` per
128x128 block); ``b`` in MXFP4 (``uint8 [N, K/2]`` + E8M0 ``uint8 b_scale [N,
K/32]``) with a bf16/fp16 ``a``. The dequantised product is
``(a * a_scale) @ (b * b_scale).T``, accumulated in fp32.
"""

from __future__ import annotations

import torch

from ..core.contracts import ANY, Size, TraitSpec
from ..core.formats import DTYPE_NAMES, fp8_format, fp8_granularity
from ..core.op import KernelCall, Op, Reference, kernel_call
from ..core.validation import check_same_device, check_tensor

__all__ = ["mm"]

_FP8 = (torch.float8_e4m3fn,)
_DENSE = (torch.bfloat16, torch.float16, torch.float32)
_FLOAT = ("fp32", "bf16", "fp16")


def _bind_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    a_scale: torch.Tensor | None = None,
    b_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> KernelCall:
    """``out [M, N] = a [M, K] @ b [N, K].T + bias [N]``.

    Args:
        a: ``[M, K]`` bf16/fp16/fp32, or fp8 e4m3 with ``a_scale float32``.
        b: ``[N, K]`` of ``a``'s dtype; fp8 e4m3 with ``b_scale float32``; or
            MXFP4 ``uint8 [N, K/2]`` with ``b_scale uint8 [N, K/32]``.
        bias: optional ``[N]`` (any float dtype).
        out_dtype: default ``a``'s dtype, bf16 for fp8 inputs.
        out: optional ``[M, N]`` of ``out_dtype``.
    """
    check_tensor("a", a, dtypes=_DENSE + _FP8, dim=2)
    check_tensor("b", b, dtypes=_DENSE + _FP8 + (torch.uint8,), dim=2)
    m, k = a.shape
    n = b.shape[0]
    if a.dtype in _FP8:
        if a_scale is None:
            raise ValueError("a_scale: an fp8 a needs a float32 scale")
        check_tensor("a_scale", a_scale, dtypes=(torch.float32,))
        fa = fp8_format(a.dtype, fp8_granularity(a_scale, m, k, weight=False, name="a_scale"))
    else:
        if a_scale is not None:
            raise ValueError(f"a_scale: a {a.dtype} a takes no scale")
        fa = DTYPE_NAMES[a.dtype]
    if b.dtype == torch.uint8:
        if a.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"a: an MXFP4 b needs a bf16 or fp16 a, got {a.dtype}")
        if k % 32:
            raise ValueError(f"a: MXFP4 needs K divisible by 32, got K={k}")
        check_tensor("b", b, shape=(None, k // 2))
        check_tensor("b_scale", b_scale, dtypes=(torch.uint8,), shape=(n, k // 32))
        fb = "mxfp4"
    elif b.dtype in _FP8:
        if a.dtype not in _FP8:
            raise TypeError(f"a: an fp8 b needs an fp8 a, got {a.dtype}")
        check_tensor("b", b, shape=(None, k))
        if b_scale is None:
            raise ValueError("b_scale: an fp8 b needs a float32 scale")
        check_tensor("b_scale", b_scale, dtypes=(torch.float32,))
        fb = fp8_format(b.dtype, fp8_granularity(b_scale, n, k, weight=True, name="b_scale"))
    else:
        check_tensor("b", b, dtypes=(a.dtype,), shape=(None, k))
        if b_scale is not None:
            raise ValueError(f"b_scale: a {b.dtype} b takes no scale")
        fb = DTYPE_NAMES[b.dtype]
    if bias is not None:
        check_tensor("bias", bias, dtypes=_DENSE, shape=(n,))
    if out_dtype is None:
        out_dtype = torch.bfloat16 if a.dtype in _FP8 else a.dtype
    if out_dtype not in _DENSE:
        raise TypeError(f"out_dtype: expected bf16, fp16 or fp32, got {out_dtype}")
    if out is not None:
        check_tensor("out", out, dtypes=(out_dtype,), shape=(m, n))
    check_same_device("a", a, b=b, bias=bias, a_scale=a_scale, b_scale=b_scale, out=out)
    return kernel_call(
        a.device, (fa, fb, DTYPE_NAMES[out_dtype]), {"bias": bias is not None}, (m,),
        a, b, bias, a_scale=a_scale, b_scale=b_scale, out_dtype=out_dtype, out=out,
    )  # fmt: skip


def _fake_mm(a, b, bias=None, *, a_scale=None, b_scale=None, out_dtype=None, out=None):
    if out_dtype is None:
        out_dtype = torch.bfloat16 if a.dtype in _FP8 else a.dtype
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


_FP8_A = [f"fp8_e4m3:{g}" for g in ("per_tensor", "per_token", "block128")]
_FP8_B = [f"fp8_e4m3:{g}" for g in ("per_tensor", "per_channel", "block128")]

mm = Op(
    name="mm",
    memo_bind=True,
    family="gemm",
    roles=("a", "b", "out"),
    traits={"bias": TraitSpec(bool, default=False, doc="bias added to the output")},
    sizes=(Size("m", "M, rows of a (tokens)"),),
    doc="out = a @ b.T (+ bias).",
    bind=_bind_mm,
    fake=_fake_mm,
    reference=Reference(
        "tokenspeed_kernel.reference.gemm:mm",
        formats=[
            {"a": _FLOAT, "b": _FLOAT, "out": _FLOAT},
            {"a": _FP8_A, "b": _FP8_B, "out": _FLOAT},
            {"a": ("bf16", "fp16"), "b": "mxfp4", "out": _FLOAT},
        ],
        traits={"bias": ANY},
    ),
    workload="tokenspeed_kernel.numerics.cases.gemm:MM",
)

"""Cases for ``mm``: dense, FP8 (per tensor, per token x per channel, 1x128 x 128x128 blocks), MXFP4 weights.

GPU shapes are GPT-OSS's projections: qkv (N = (64 + 2 * 8) * 64 = 5120, K = 2880),
o (N = 2880, K = 64 * 64 = 4096) and the router (N = 128, K = 2880).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ... import ops
from ..inputs import fp8_quantize_blocks, randn, torch_dtype
from . import CapturedCall, Case, Cost, OpCases, Peer, PeerCall, PeerSkip, nbytes, needs_cuda
from ._common import close, compare_by, dim, single

_FP8_A_GRANULARITY = {
    "fp8_e4m3:per_tensor": "per_tensor",
    "fp8_e4m3:per_token": "per_token",
    "fp8_e4m3:block128": "block128",
}


def out_dtype_name(case: Case) -> str:
    """The output dtype of an mm case (the op's default when the case names none)."""
    if case["out_dtype"] is not None:
        return case["out_dtype"]
    return "bf16" if case["b_format"].startswith("fp8") else case.dtype


def _make(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    dt = torch_dtype(case.dtype)
    m, n, k = case["m"], case["n"], case["k"]
    fmt = case["b_format"]
    a32 = randn((m, k), torch.float32, gen)
    b32 = randn((n, k), torch.float32, gen, scale=1.0 / math.sqrt(k))
    call: dict[str, Any] = {}
    if fmt == "dense":
        call.update(a=a32.to(dt), b=b32.to(dt))
    elif fmt in _FP8_A_GRANULARITY:
        gran = _FP8_A_GRANULARITY[fmt]
        a, a_scale = ops.quantize_fp8(a32.to(dt), granularity=gran, solution="reference")
        if gran == "block128":
            b, b_scale = fp8_quantize_blocks(b32)
        else:
            b, b_scale = ops.quantize_fp8(b32.to(dt), granularity=gran, solution="reference")
        call.update(a=a, b=b, a_scale=a_scale, b_scale=b_scale)
    elif fmt == "mxfp4":
        if dt not in (torch.bfloat16, torch.float16):
            raise ValueError(f"b_format mxfp4 needs a bf16 or fp16 a, the case has {case.dtype}")
        b, b_scale = ops.quantize_mxfp4(b32.to(dt), solution="reference")
        call.update(a=a32.to(dt), b=b, b_scale=b_scale)
    else:
        raise ValueError(f"b_format: expected dense, mxfp4 or one of {sorted(_FP8_A_GRANULARITY)}, got {fmt!r}")
    call["bias"] = randn((n,), torch_dtype(out_dtype_name(case)), gen, scale=0.5) if case["bias"] else None
    if case["out_dtype"] is not None:
        call["out_dtype"] = torch_dtype(case["out_dtype"])
    return call


def _reference_call(case: Case, call: dict[str, Any]) -> dict[str, Any]:
    out = dict(call)
    if case["b_format"] == "dense":
        for name in ("a", "b"):
            out[name] = call[name].float()
    if call.get("bias") is not None:
        out["bias"] = call["bias"].float()
    out["out_dtype"] = torch.float32
    return out


def _from_capture(c: CapturedCall) -> Case | None:
    a, b = c.shape(0), c.shape(1)
    if a is None or b is None or len(c.signature) != 3:
        return None
    fa, fb, fout = c.signature
    if fb == "mxfp4":
        fmt, dtype = "mxfp4", fa
    elif fb.startswith("fp8"):
        # The unquantized source dtype is not recorded; the output's stands in for it.
        fmt, dtype = "fp8_e4m3:" + fa.split(":")[-1], fout
    else:
        fmt, dtype = "dense", fa
    default_out = "bf16" if fmt.startswith("fp8") else dtype
    params = {
        "m": a[0],
        "n": b[0],
        "k": a[1],
        "b_format": fmt,
        "bias": not c.is_none(2),
        "out_dtype": None if fout == default_out else fout,
    }
    return Case.make("mm", dtype, params)


_BF16 = {"dtypes": ("bf16",)}
_QKV, _O, _ROUTER = {"n": 5120, "k": 2880}, {"n": 2880, "k": 4096}, {"n": 128, "k": 2880}


def _mm_cost(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    """2 M N K FLOPs; bytes of a, b (and scales, bias) read and the output written."""
    m, n, k = case["m"], case["n"], case["k"]
    moved = nbytes(call["a"], call["b"], call.get("a_scale"), call.get("b_scale"), call.get("bias"))
    return Cost(
        2.0 * m * n * k, moved + nbytes(*outputs.values()), "fp8" if case["b_format"].startswith("fp8") else "bf16"
    )


def _torch_mm(case: Case, call: dict[str, Any], device: torch.device) -> PeerCall:
    fmt = case["b_format"]
    if fmt.startswith("fp8"):
        raise PeerSkip("fp8 operands: see torch._scaled_mm")
    a, b, bias = call["a"], call["b"], call.get("bias")
    note = ""
    if fmt == "mxfp4":
        from ...reference.quantization import mxfp4_to_float

        b = mxfp4_to_float(b, call["b_scale"]).to(a.dtype)
        note = "bf16 weights (mxfp4 dequantized)"
    bt = b.t()
    if bias is not None:
        bias = bias.to(a.dtype)
        return PeerCall(lambda: torch.addmm(bias, a, bt), note)
    return PeerCall(lambda: torch.mm(a, bt), note)


def _scaled_mm(case: Case, call: dict[str, Any], device: torch.device) -> PeerCall:
    fmt = case["b_format"]
    if fmt not in ("fp8_e4m3:per_tensor", "fp8_e4m3:per_token"):
        raise PeerSkip("torch._scaled_mm here: FP8 per tensor or per token x per channel only")
    a, b = call["a"], call["b"]
    a_scale = call["a_scale"].reshape(()) if fmt.endswith("per_tensor") else call["a_scale"]
    b_scale = call["b_scale"].reshape(()) if fmt.endswith("per_tensor") else call["b_scale"].reshape(1, -1)
    bias = call.get("bias")
    out_dtype = call.get("out_dtype") or torch.bfloat16
    bias = None if bias is None else bias.to(out_dtype)
    bt = b.t()
    return PeerCall(lambda: torch._scaled_mm(a, bt, scale_a=a_scale, scale_b=b_scale, bias=bias, out_dtype=out_dtype))


MM = OpCases(
    op="mm",
    cost=_mm_cost,
    metric="tflops",
    peers=[
        Peer("torch.mm", _torch_mm, doc="cuBLAS (or the CPU BLAS)"),
        Peer("torch._scaled_mm", _scaled_mm, needs_cuda, "cuBLASLt FP8"),
    ],
    defaults={"m": 16, "n": 48, "k": 64, "b_format": "dense", "bias": False, "out_dtype": None},
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp16", "fp32")},
    sets={
        "cpu": [
            {"m": 16, "n": 48, "k": 64},
            {"m": 1, "n": 33, "k": 100, "bias": True},
            {"m": 7, "n": 40, "k": 64, "out_dtype": "fp32", **_BF16},
            {"m": 5, "n": 64, "k": 256, "b_format": "fp8_e4m3:per_tensor", **_BF16},
            {"m": 5, "n": 64, "k": 256, "b_format": "fp8_e4m3:per_token", "bias": True, **_BF16},
            {"m": 5, "n": 200, "k": 300, "b_format": "fp8_e4m3:block128", **_BF16},
            {"m": 3, "n": 48, "k": 128, "b_format": "mxfp4", "bias": True, **_BF16},
        ],
        "gpu": [
            {"m": 1, **_QKV, "bias": True},
            {"m": 4096, **_QKV, "bias": True},
            {"m": 333, **_O},
            {"m": 64, **_ROUTER, "bias": True, "out_dtype": "fp32", **_BF16},
            {"m": 4096, **_QKV, "b_format": "fp8_e4m3:per_token", **_BF16},
            {"m": 64, **_O, "b_format": "fp8_e4m3:per_tensor", **_BF16},
            {"m": 100, **_QKV, "b_format": "fp8_e4m3:block128", **_BF16},
            {"m": 64, **_QKV, "b_format": "mxfp4", "bias": True, **_BF16},
        ],
        "bench-cpu": [{"m": 64, "n": 256, "k": 256}],
        "bench-gpu": [
            {"m": m, **shape, "b_format": f, "dtype": "bf16"}
            for f in ("dense", "fp8_e4m3:per_token", "fp8_e4m3:per_tensor")
            for shape in (_QKV, _O)
            for m in (1, 64, 4096, 16384)
        ],
    },
    make=_make,
    reference_call=_reference_call,
    outputs=single(),
    compare=compare_by({"out": close("matmul", out_dtype_name)}),
    shrink=[
        dim("m"),
        dim("n"),
        lambda c: dim("k", lo=32 if c["b_format"] == "mxfp4" else 1, step=32 if c["b_format"] == "mxfp4" else 1)(c),
    ],
    from_capture=_from_capture,
    always_show=("m", "n", "k", "b_format"),
)

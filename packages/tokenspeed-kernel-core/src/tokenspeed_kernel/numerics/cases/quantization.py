"""Cases for ``quantize_fp8``, ``quantize_mxfp4`` and ``dequantize_mxfp4``.

Quantized outputs are compared code by code (see ``quantized`` in
:mod:`tokenspeed_kernel.numerics.tolerances`); scales must agree to a couple of
fp32 ulp (FP8) or exactly (E8M0).
"""

from __future__ import annotations

from typing import Any

import torch

from ..compare import Check, check_close, check_codes, check_exact
from ..inputs import decode_e2m1, randn, torch_dtype
from ..tolerances import EPS, Tolerance, tolerance
from . import CapturedCall, Case, OpCases
from ._common import compare_by, dim, exact, single

#: FP8 scales: amax / 448 in fp32 (or amax * (1/448)): a couple of ulp apart.
_SCALE_TOL = Tolerance("scale", rtol=4 * EPS["fp32"], atol_rms=0.0)


def _e4m3_step(codes: torch.Tensor) -> torch.Tensor:
    """The spacing of e4m3 values at each code (3 mantissa bits; subnormal spacing 2**-9)."""
    mag = codes.abs().clamp(min=2.0**-6)
    return torch.exp2(torch.floor(torch.log2(mag)) - 3)


def _compare_fp8(case: Case, got: dict[str, Any], want: dict[str, torch.Tensor]) -> list[Check]:
    checks = [check_close("scale", got.get("scale"), want["scale"], _SCALE_TOL)]
    gq, wq = got.get("q"), want["q"]
    if not isinstance(gq, torch.Tensor) or gq.dtype != wq.dtype:
        checks.append(
            Check("q", False, "codes", note=f"expected {wq.dtype} codes, got {getattr(gq, 'dtype', type(gq))}")
        )
        return checks
    wc = wq.float()
    checks.append(check_codes("q", gq.float(), wc, _e4m3_step(wc), tolerance("quantized")))
    return checks


def _make_fp8(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    x = randn((case["m"], case["k"]), torch_dtype(case.dtype), gen, scale=case["scale"])
    if case["zero_row"]:
        x[0] = 0
    call: dict[str, Any] = {"x": x, "granularity": case["granularity"]}
    if case["static"]:
        # A caller's calibrated scale, 25 % above the data's amax/448 (no clipping).
        call["scale"] = (x.float().abs().amax() / 448.0 * 1.25).reshape(1).clamp(min=1e-12)
    return call


def _fp8_from_capture(c: CapturedCall) -> Case | None:
    x = c.shape(0)
    if x is None:
        return None
    return Case.make(
        "quantize_fp8",
        c.dtype(0),
        {
            "m": x[0],
            "k": x[1],
            "granularity": c.value("granularity", "per_token"),
            "static": not c.is_none("scale"),
            "scale": 2.0,
            "zero_row": False,
        },
    )


QUANTIZE_FP8 = OpCases(
    op="quantize_fp8",
    defaults={"m": 8, "k": 256, "granularity": "per_token", "static": False, "scale": 2.0, "zero_row": False},
    dtypes={"cpu": ("bf16", "fp32"), "cuda": ("bf16", "fp32")},
    sets={
        "cpu": [
            {"granularity": "per_token", "zero_row": True},
            {"granularity": "per_tensor"},
            {"granularity": "per_tensor", "static": True},
            {"granularity": "block128", "m": 3, "k": 300, "zero_row": True},
            {"granularity": "per_token", "scale": 1e-3, "label": "subnormal-heavy"},
        ],
        "gpu": [{"granularity": g, "m": 4096, "k": 2880} for g in ("per_token", "per_tensor", "block128")]
        + [{"granularity": "per_tensor", "static": True, "m": 64, "k": 2880}],
        "bench-cpu": [{"m": 64, "k": 1024}],
        "bench-gpu": [
            {"granularity": g, "m": m, "k": 2880, "dtype": "bf16"}
            for g in ("per_token", "block128")
            for m in (64, 4096, 16384)
        ],
    },
    make=_make_fp8,
    outputs=lambda call, r: {"q": r[0], "scale": r[1]},
    compare=_compare_fp8,
    shrink=[dim("m"), dim("k")],
    from_capture=_fp8_from_capture,
    always_show=("m", "k", "granularity"),
)


def _e2m1_step(values: torch.Tensor) -> torch.Tensor:
    """Spacing of E2M1 values {0, .5, 1, 1.5, 2, 3, 4, 6} around each value (the larger side)."""
    a = values.abs()
    return torch.where(a < 2, torch.full_like(a, 0.5), torch.where(a < 4, torch.ones_like(a), torch.full_like(a, 2.0)))


def _compare_mxfp4(case: Case, got: dict[str, Any], want: dict[str, torch.Tensor]) -> list[Check]:
    checks = [check_exact("scales", got.get("scales"), want["scales"])]
    gb, wb = got.get("blocks"), want["blocks"]
    if not isinstance(gb, torch.Tensor) or gb.dtype != torch.uint8 or gb.shape != wb.shape:
        checks.append(Check("blocks", False, "codes", note=f"expected uint8 {list(wb.shape)}, got {gb!r:.60}"))
        return checks
    wv = decode_e2m1(wb)
    checks.append(check_codes("blocks", decode_e2m1(gb), wv, _e2m1_step(wv), tolerance("quantized")))
    return checks


def _make_mxfp4(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    x = randn((case["rows"], case["k"]), torch_dtype(case.dtype), gen, scale=case["scale"])
    if case["zero_row"]:
        x[0] = 0
    return {"x": x}


def _mxfp4_from_capture(c: CapturedCall) -> Case | None:
    x = c.shape(0)
    if x is None:
        return None
    rows = 1
    for n in x[:-1]:
        rows *= n
    return Case.make("quantize_mxfp4", c.dtype(0), {"rows": rows, "k": x[-1], "scale": 1.0, "zero_row": False})


QUANTIZE_MXFP4 = OpCases(
    op="quantize_mxfp4",
    defaults={"rows": 8, "k": 128, "scale": 1.0, "zero_row": False},
    dtypes={"cpu": ("bf16", "fp32"), "cuda": ("bf16",)},
    sets={
        "cpu": [{"rows": 8, "k": 128}, {"rows": 3, "k": 64, "scale": 100.0, "zero_row": True}],
        "gpu": [{"rows": 5760, "k": 2880}, {"rows": 2880, "k": 2880, "scale": 0.01}],
        "bench-cpu": [{"rows": 256, "k": 256}],
        "bench-gpu": [{"rows": r, "k": 2880, "dtype": "bf16"} for r in (5760, 128 * 5760)],
    },
    make=_make_mxfp4,
    outputs=lambda call, r: {"blocks": r[0], "scales": r[1]},
    compare=_compare_mxfp4,
    shrink=[dim("rows"), dim("k", lo=32, step=32)],
    from_capture=_mxfp4_from_capture,
    always_show=("rows", "k"),
)


def _make_dequant(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    r, k = case["rows"], case["k"]
    blocks = torch.randint(0, 256, (r, k // 2), generator=gen, device=device, dtype=torch.int32).to(torch.uint8)
    # Exponents within +-8 of 1.0: every value is exact in fp16 as well as bf16/fp32.
    scales = torch.randint(119, 136, (r, k // 32), generator=gen, device=device, dtype=torch.int32).to(torch.uint8)
    return {"blocks": blocks, "scales": scales, "dtype": torch_dtype(case.dtype)}


def _dequant_from_capture(c: CapturedCall) -> Case | None:
    b = c.shape(0)
    if b is None or len(c.signature) != 2:
        return None
    rows = 1
    for n in b[:-1]:
        rows *= n
    return Case.make("dequantize_mxfp4", c.signature[1], {"rows": rows, "k": 2 * b[-1]})


DEQUANTIZE_MXFP4 = OpCases(
    op="dequantize_mxfp4",
    defaults={"rows": 8, "k": 128},
    dtypes={"cpu": ("bf16", "fp16", "fp32"), "cuda": ("bf16", "fp32")},
    sets={
        "cpu": [{"rows": 8, "k": 128}, {"rows": 1, "k": 32}],
        "gpu": [{"rows": 5760, "k": 2880}],
        "bench-cpu": [{"rows": 256, "k": 256}],
        "bench-gpu": [{"rows": r, "k": 2880, "dtype": "bf16"} for r in (5760, 128 * 5760)],
    },
    make=_make_dequant,
    outputs=single(),
    compare=compare_by({"out": exact()}),
    shrink=[dim("rows"), dim("k", lo=32, step=32)],
    from_capture=_dequant_from_capture,
    always_show=("rows", "k"),
)

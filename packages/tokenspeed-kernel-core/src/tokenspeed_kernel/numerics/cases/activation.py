"""Cases for ``swiglu`` and ``silu_and_mul``.

SwiGLU inputs are N(0, 3^2) so the GPT-OSS clamp (limit 7) is hit by a few
percent of the elements, and both the gate's one-sided and the up's two-sided
clamp are exercised.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..inputs import randn, torch_dtype
from . import CapturedCall, Case, OpCases, io_cost
from ._common import close, compare_by, dim, single, upcast


def _make_swiglu(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    x = randn((case["tokens"], 2 * case["inter"]), torch_dtype(case.dtype), gen, scale=case["scale"])
    return {
        "x": x,
        "alpha": case["alpha"],
        "limit": case["limit"],
        "up_offset": case["up_offset"],
        "interleaved": case["interleaved"],
    }


def _swiglu_from_capture(c: CapturedCall) -> Case | None:
    shape = c.shape(0)
    if shape is None:
        return None
    return Case.make(
        "swiglu",
        c.dtype(0),
        {
            "tokens": math.prod(shape[:-1]),
            "inter": shape[-1] // 2,
            "interleaved": bool(c.value("interleaved", True)),
            "limit": c.value("limit", 7.0),
            "alpha": float(c.value("alpha", 1.702)),
            "up_offset": float(c.value("up_offset", 1.0)),
            "scale": 3.0,
        },
    )


SWIGLU = OpCases(
    op="swiglu",
    cost=io_cost(8.0),
    defaults={
        "tokens": 4,
        "inter": 64,
        "interleaved": True,
        "limit": 7.0,
        "alpha": 1.702,
        "up_offset": 1.0,
        "scale": 3.0,
    },
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp32")},
    sets={
        "cpu": [
            {"tokens": 3, "inter": 64},
            {"tokens": 5, "inter": 96, "interleaved": False},
            {"tokens": 2, "inter": 32, "limit": None, "alpha": 1.0, "up_offset": 0.0},
        ],
        "gpu": [
            {"tokens": 1, "inter": 2880},
            {"tokens": 4096, "inter": 2880},
            {"tokens": 77, "inter": 2880, "interleaved": False},
        ],
        "bench-cpu": [{"tokens": 64, "inter": 256}],
        "bench-gpu": [{"tokens": t, "inter": 2880, "dtype": "bf16"} for t in (64, 4096, 16384)],
    },
    make=_make_swiglu,
    reference_call=lambda case, call: upcast(call, ("x",)),
    outputs=single(),
    compare=compare_by({"out": close("elementwise")}),
    shrink=[dim("tokens"), dim("inter")],
    from_capture=_swiglu_from_capture,
    always_show=("tokens", "inter"),
)


def _make_silu(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    return {"x": randn((case["tokens"], 2 * case["inter"]), torch_dtype(case.dtype), gen, scale=2.0)}


def _silu_from_capture(c: CapturedCall) -> Case | None:
    shape = c.shape(0)
    if shape is None:
        return None
    return Case.make("silu_and_mul", c.dtype(0), {"tokens": math.prod(shape[:-1]), "inter": shape[-1] // 2})


SILU_AND_MUL = OpCases(
    op="silu_and_mul",
    cost=io_cost(5.0),
    defaults={"tokens": 4, "inter": 64},
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp32")},
    sets={
        "cpu": [{"tokens": 3, "inter": 64}, {"tokens": 7, "inter": 100}],
        "gpu": [{"tokens": 1, "inter": 2880}, {"tokens": 4096, "inter": 2880}],
        "bench-cpu": [{"tokens": 64, "inter": 256}],
        "bench-gpu": [{"tokens": t, "inter": 2880, "dtype": "bf16"} for t in (64, 4096, 16384)],
    },
    make=_make_silu,
    reference_call=lambda case, call: upcast(call, ("x",)),
    outputs=single(),
    compare=compare_by({"out": close("elementwise")}),
    shrink=[dim("tokens"), dim("inter")],
    from_capture=_silu_from_capture,
    always_show=("tokens", "inter"),
)

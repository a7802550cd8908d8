"""Cases for ``apply_rotary`` (GPT-OSS: neox style over the whole head, 64 / 8 heads, D 64)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..inputs import randn, rope_cos_sin_cache, torch_dtype
from . import CapturedCall, Case, Cost, OpCases, nbytes
from ._common import close, compare_by, dim, named, upcast


def _make(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    dt = torch_dtype(case.dtype)
    t, d = case["tokens"], case["head_dim"]
    positions = torch.randint(0, case["max_position"], (t,), generator=gen, device=device, dtype=torch.int64)
    return {
        "q": randn((t, case["heads_q"], d), dt, gen),
        "k": randn((t, case["heads_k"], d), dt, gen),
        "cos_sin_cache": rope_cos_sin_cache(case["max_position"], case["rotary_dim"], device),
        "positions": positions,
        "style": case["style"],
    }


def _from_capture(c: CapturedCall) -> Case | None:
    q, k, cache = c.shape(0), c.shape(1), c.shape(2)
    if q is None or k is None or cache is None:
        return None
    return Case.make(
        "apply_rotary",
        c.dtype(0),
        {
            "tokens": q[0],
            "heads_q": q[1],
            "heads_k": k[1],
            "head_dim": q[2],
            "rotary_dim": cache[1],
            "style": c.value("style", "neox"),
            "max_position": cache[0],
        },
    )


def _rope_cost(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    # Only the cache rows of the tokens' positions are read, not the whole table.
    rows = call["positions"].numel() * call["cos_sin_cache"].shape[1] * 4.0
    qk = nbytes(call["q"], call["k"])
    return Cost(6.0 * qk / call["q"].element_size(), 2 * qk + rows)


APPLY_ROTARY = OpCases(
    op="apply_rotary",
    cost=_rope_cost,
    defaults={
        "tokens": 8,
        "heads_q": 4,
        "heads_k": 2,
        "head_dim": 64,
        "rotary_dim": 64,
        "style": "neox",
        "max_position": 4096,
    },
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp32")},
    sets={
        "cpu": [
            {"tokens": 5},
            {"tokens": 6, "style": "gptj"},
            {"tokens": 3, "rotary_dim": 32, "label": "partial rotary"},
        ],
        "gpu": [
            {"tokens": 1, "heads_q": 64, "heads_k": 8},
            {"tokens": 4096, "heads_q": 64, "heads_k": 8, "max_position": 131072},
        ],
        "bench-cpu": [{"tokens": 64}],
        "bench-gpu": [
            {"tokens": t, "heads_q": 64, "heads_k": 8, "max_position": 131072, "dtype": "bf16"}
            for t in (64, 4096, 16384)
        ],
    },
    make=_make,
    reference_call=lambda case, call: upcast(call, ("q", "k")),
    outputs=named("q", "k"),
    compare=compare_by({"q": close("elementwise"), "k": close("elementwise")}),
    shrink=[dim("tokens"), dim("heads_q", keep=lambda c, v: True), dim("heads_k")],
    from_capture=_from_capture,
    always_show=("tokens", "heads_q", "heads_k"),
)

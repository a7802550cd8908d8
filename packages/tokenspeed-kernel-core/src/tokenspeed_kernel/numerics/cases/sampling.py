"""Cases for ``argmax`` and ``top_k_top_p_sample``.

Sampling draws its uniforms here and passes them as ``uniform=``: kernel and
reference then sample from the same random numbers and must pick the same tokens
(up to the ``tokens`` tolerance). Logits are N(0, 3^2) so the distributions are
peaked and top-k/top-p cut real mass.
"""

from __future__ import annotations

from typing import Any

import torch

from ..inputs import randn, torch_dtype, uniform
from . import CapturedCall, Case, OpCases
from ._common import compare_by, dim, exact, single, tokens

_VOCAB = 201088


def _make_argmax(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    return {"logits": randn((case["batch"], case["vocab"]), torch_dtype(case.dtype), gen, scale=3.0)}


def _argmax_from_capture(c: CapturedCall) -> Case | None:
    s = c.shape(0)
    return None if s is None else Case.make("argmax", c.dtype(0), {"batch": s[0], "vocab": s[1]})


ARGMAX = OpCases(
    op="argmax",
    defaults={"batch": 4, "vocab": 1000},
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp32")},
    sets={
        "cpu": [{"batch": 4, "vocab": 1000}, {"batch": 1, "vocab": 7}],
        "gpu": [{"batch": 1, "vocab": _VOCAB}, {"batch": 64, "vocab": _VOCAB}],
        "bench-cpu": [{"batch": 16, "vocab": 32000}],
        "bench-gpu": [{"batch": b, "vocab": _VOCAB, "dtype": "bf16"} for b in (1, 64, 256)],
    },
    make=_make_argmax,
    outputs=single("tokens"),
    compare=compare_by({"tokens": exact()}),
    shrink=[dim("batch"), dim("vocab")],
    from_capture=_argmax_from_capture,
    always_show=("batch", "vocab"),
)


def _make_sample(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    b, v = case["batch"], case["vocab"]
    call: dict[str, Any] = {"logits": randn((b, v), torch_dtype(case.dtype), gen, scale=3.0)}
    if case["per_row"]:
        call["top_k"] = torch.randint(0, min(v, 2 * max(case["top_k"], 1)) + 1, (b,), generator=gen, device=device).to(
            torch.int32
        )
        call["top_p"] = uniform((b,), gen, 0.5, 1.0)
        call["temperature"] = uniform((b,), gen, 0.5, 1.5)
    else:
        call.update(top_k=case["top_k"], top_p=case["top_p"], temperature=case["temperature"])
    call["uniform"] = uniform((b,), gen)
    return call


def _sample_from_capture(c: CapturedCall) -> Case | None:
    s = c.shape(0)
    if s is None:
        return None
    # Recorded: top_k's values, the (min, max) of top_p and temperature.
    ks, ps, ts = c.sample(1), c.sample(2), c.sample(3)
    same = ks is not None and len(set(ks)) == 1 and all(isinstance(x, dict) and x["min"] == x["max"] for x in (ps, ts))
    params = {"batch": s[0], "vocab": s[1], "per_row": not same, "top_k": 50, "top_p": 0.9, "temperature": 1.0}
    if same:
        params.update(top_k=int(ks[0]), top_p=float(ps["min"]), temperature=float(ts["min"]))
    return Case.make("top_k_top_p_sample", c.dtype(0), params)


TOP_K_TOP_P_SAMPLE = OpCases(
    op="top_k_top_p_sample",
    defaults={"batch": 64, "vocab": 500, "top_k": 50, "top_p": 0.9, "temperature": 1.0, "per_row": False},
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp32")},
    sets={
        "cpu": [
            {"batch": 64, "vocab": 500},
            {"batch": 64, "vocab": 300, "top_k": 0, "top_p": 0.5},
            {"batch": 64, "vocab": 300, "top_k": 5, "top_p": 1.0, "temperature": 0.7},
            {"batch": 100, "vocab": 200, "per_row": True},
        ],
        "gpu": [
            {"batch": 256, "vocab": _VOCAB},
            {"batch": 256, "vocab": _VOCAB, "per_row": True},
            {"batch": 200, "vocab": _VOCAB, "top_k": 0, "top_p": 0.95},
        ],
        "bench-cpu": [{"batch": 16, "vocab": 32000}],
        "bench-gpu": [{"batch": b, "vocab": _VOCAB, "dtype": "bf16"} for b in (1, 64, 256)],
    },
    make=_make_sample,
    outputs=single("tokens"),
    compare=compare_by({"tokens": tokens()}),
    shrink=[dim("batch"), dim("vocab", keep=lambda c, v: v >= max(c["top_k"], 1))],
    from_capture=_sample_from_capture,
    always_show=("batch", "vocab"),
)

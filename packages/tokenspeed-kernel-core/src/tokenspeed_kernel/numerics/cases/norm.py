"""Cases for ``rmsnorm``.

``scale`` sets the input magnitude: at ``1e-3`` the mean square (1e-6) is smaller
than eps (1e-5), so a kernel that mishandles eps fails visibly.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..inputs import randn, torch_dtype
from . import CapturedCall, Case, OpCases, Peer, PeerCall, io_cost
from ._common import close, compare_by, dim, upcast


def _make(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    dt = torch_dtype(case.dtype)
    shape = (case["tokens"], case["hidden"])
    call: dict[str, Any] = {
        "x": randn(shape, dt, gen, scale=case["scale"]),
        "weight": randn((case["hidden"],), dt, gen, scale=0.1, mean=1.0),
        "eps": case["eps"],
    }
    if case["residual"]:
        call["residual"] = randn(shape, dt, gen, scale=case["scale"])
    return call


def _from_capture(c: CapturedCall) -> Case | None:
    shape = c.shape(0)
    if shape is None or c.dtype(0) is None:
        return None
    return Case.make(
        "rmsnorm",
        c.dtype(0),
        {
            "tokens": math.prod(shape[:-1]),
            "hidden": shape[-1],
            "residual": not c.is_none("residual"),
            "eps": float(c.value(2, 1e-5)),
            "scale": 1.0,
        },
    )


def _torch_rms_norm(case: Case, call: dict[str, Any], device: torch.device) -> PeerCall:
    x, w, eps = call["x"], call["weight"].to(call["x"].dtype), call["eps"]
    res = call.get("residual")
    shape = (x.shape[-1],)
    f = torch.nn.functional.rms_norm
    if res is None:
        return PeerCall(lambda: f(x, shape, w, eps))
    return PeerCall(lambda: f(x + res, shape, w, eps), "residual added unfused")


RMSNORM = OpCases(
    op="rmsnorm",
    cost=io_cost(4.0),
    peers=[Peer("torch.rms_norm", _torch_rms_norm, doc="torch.nn.functional.rms_norm")],
    defaults={"tokens": 4, "hidden": 64, "residual": False, "eps": 1e-5, "scale": 1.0},
    dtypes={"cpu": ("fp32", "bf16", "fp16"), "cuda": ("bf16", "fp16", "fp32")},
    sets={
        "cpu": [
            {"tokens": 1, "hidden": 64},
            {"tokens": 9, "hidden": 300, "residual": True},
            {"tokens": 5, "hidden": 2880, "residual": True},
            {"tokens": 3, "hidden": 128, "scale": 1e-3, "label": "mean square below eps"},
        ],
        "gpu": [
            {"tokens": 1, "hidden": 2880},
            {"tokens": 64, "hidden": 2880, "residual": True},
            {"tokens": 4096, "hidden": 2880, "residual": True},
            {"tokens": 333, "hidden": 2880, "scale": 1e-3, "label": "mean square below eps"},
        ],
        "bench-cpu": [{"tokens": 16, "hidden": 256}, {"tokens": 64, "hidden": 2880, "residual": True}],
        "bench-gpu": [
            {"tokens": t, "hidden": 2880, "residual": r, "dtype": "bf16"}
            for t in (1, 64, 4096, 16384)
            for r in (False, True)
        ],
    },
    make=_make,
    reference_call=lambda case, call: upcast(call, ("x", "weight", "residual")),
    outputs=lambda call, result: (
        dict(zip(("out", "residual_sum"), result)) if isinstance(result, tuple) else {"out": result}
    ),
    compare=compare_by({"out": close("elementwise"), "residual_sum": close("elementwise")}),
    shrink=[dim("tokens"), dim("hidden")],
    from_capture=_from_capture,
    always_show=("tokens", "hidden"),
)

"""Cases for ``apply_rotary`` (GPT-OSS: neox style over the whole head, 64 / 8 heads, D 64)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..inputs import randn, rope_cos_sin_cache, torch_dtype
from . import CapturedCall, Case, Cost, OpCases, nbytes
from ._common import close, compare_by, dim, exact, named, upcast


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


def _rotary_params(c: CapturedCall, cache_at: int) -> dict[str, Any] | None:
    """The rotation's case parameters of a captured call (q and k first, the cos/sin table at ``cache_at``)."""
    q, k, cache = c.shape(0), c.shape(1), c.shape(cache_at)
    if q is None or k is None or cache is None:
        return None
    return {
        "tokens": q[0],
        "heads_q": q[1],
        "heads_k": k[1],
        "head_dim": q[2],
        "rotary_dim": cache[1],
        "style": c.value("style", "neox"),
        "max_position": cache[0],
    }


def _from_capture(c: CapturedCall) -> Case | None:
    params = _rotary_params(c, 2)
    return None if params is None else Case.make("apply_rotary", c.dtype(0), params)


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


# ---------------------------------------------------------------------------
# apply_rotary_and_store: the rotation, and the rotated k and v written into a paged cache by slot.


def _make_store(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    call = _make(case, device, gen)
    dt = torch_dtype(case.dtype)
    cache_dt = torch.float8_e4m3fn if case["cache_dtype"] == "fp8_e4m3" else dt
    t, hk, d, ps, pages = case["tokens"], case["heads_k"], case["head_dim"], case["page_size"], case["num_pages"]
    if t > pages * ps:
        raise ValueError(f"tokens: {t} tokens do not fit {pages} pages of {ps}")
    slots = torch.randperm(pages * ps, generator=gen, device=device)[:t]
    if case["pad"]:
        slots[torch.randperm(t, generator=gen, device=device)[: case["pad"]]] = -1
    src = torch.float32 if cache_dt == torch.float8_e4m3fn else cache_dt
    style = call.pop("style")
    call.update(
        v=randn((t, hk, d), dt, gen),
        k_cache=randn((pages, ps, hk, d), src, gen).to(cache_dt),
        v_cache=randn((pages, ps, hk, d), src, gen).to(cache_dt),
        slot_mapping=slots,
        style=style,
    )
    order = ("q", "k", "v", "cos_sin_cache", "positions", "k_cache", "v_cache", "slot_mapping", "style")
    return {name: call[name] for name in order}


def _store_from_capture(c: CapturedCall) -> Case | None:
    params, kc = _rotary_params(c, 3), c.shape(5)
    if params is None or kc is None:
        return None
    sample = c.sample(7)
    params.update(
        page_size=kc[1],
        num_pages=kc[0],
        pad=sum(1 for s in sample if s < 0) if sample is not None else 0,
        cache_dtype="fp8_e4m3" if c.dtype(5) == "fp8_e4m3" else "same",
    )
    return Case.make("apply_rotary_and_store", c.dtype(0), params)


def _store_cost(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    rows = call["positions"].numel() * call["cos_sin_cache"].shape[1] * 4.0
    kc = call["k_cache"]
    written = 2.0 * (case["tokens"] - case["pad"]) * kc.shape[2] * kc.shape[3] * kc.element_size()
    moved = 2 * nbytes(call["q"]) + nbytes(call["k"], call["v"], call["slot_mapping"]) + rows + written
    return Cost(6.0 * nbytes(call["q"], call["k"]) / call["q"].element_size(), moved)


def _cache_dtype(case: Case) -> str:
    return "fp8_e4m3" if case["cache_dtype"] == "fp8_e4m3" else case.dtype


_GPT_OSS_STORE = {"heads_q": 64, "heads_k": 8}

APPLY_ROTARY_AND_STORE = OpCases(
    op="apply_rotary_and_store",
    cost=_store_cost,
    defaults={
        **APPLY_ROTARY.defaults,
        "page_size": 16,
        "num_pages": 4,
        "pad": 1,
        "cache_dtype": "same",
    },
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp32")},
    sets={
        "cpu": [
            {"tokens": 5},
            {"tokens": 6, "style": "gptj", "pad": 0, "page_size": 8},
            {"tokens": 3, "rotary_dim": 32, "label": "partial rotary"},
            {"tokens": 7, "cache_dtype": "fp8_e4m3", "dtype": "bf16"},
        ],
        "gpu": [
            {"tokens": 1, **_GPT_OSS_STORE, "num_pages": 256, "pad": 0},
            {"tokens": 64, **_GPT_OSS_STORE, "num_pages": 256, "pad": 3},
            {"tokens": 4096, **_GPT_OSS_STORE, "max_position": 131072, "num_pages": 512, "pad": 0},
            {"tokens": 64, **_GPT_OSS_STORE, "num_pages": 64, "cache_dtype": "fp8_e4m3", "dtype": "bf16"},
        ],
        "bench-cpu": [{"tokens": 64, "num_pages": 8, "pad": 0}],
        "bench-gpu": [
            {"tokens": t, **_GPT_OSS_STORE, "max_position": 131072, "num_pages": 2048, "pad": 0, "dtype": "bf16"}
            for t in (1, 64, 4096)
        ],
    },
    make=_make_store,
    # The reference rotates in fp32 and rounds once, to the cache's dtype; the kernel rounds k to its own dtype
    # first (the contract): the same value for a cache of k's dtype, within a step of an fp8 cache's.
    reference_call=lambda case, call: upcast(call, ("q", "k", "v")),
    outputs=lambda call, result: {"q": result, "k_cache": call["k_cache"], "v_cache": call["v_cache"]},
    compare=compare_by(
        {
            "q": close("elementwise"),
            "k_cache": close("elementwise", dtype_of=_cache_dtype),
            "v_cache": exact(),
        }
    ),
    shrink=[
        dim("tokens", keep=lambda c, v: v > c["pad"]),
        dim("pad", lo=0),
        dim("heads_q", keep=lambda c, v: True),
        dim("heads_k"),
        dim("num_pages", keep=lambda c, v: v * c["page_size"] >= c["tokens"]),
    ],
    from_capture=_store_from_capture,
    always_show=("tokens", "heads_q", "heads_k", "page_size", "cache_dtype"),
)

"""Cases for the linear-attention ops (gated delta rule): ``gdn_chunk_prefill``, ``gdn_decode``.

Inputs as the models make them: ``g`` a negative log decay (``-0.5 .. -0.01`` per token),
``beta`` a sigmoid, keys of unit norm on average (``randn * K ** -0.5``; with
``l2norm`` exactly unit), so the recurrence stays bounded. GPU sets use Qwen3-Next's
linear-attention heads: 16 q/k heads, 32 value heads, K = V = 128, q/k L2-normalised.
flash-linear-attention: its ``chunk_gated_delta_rule`` is a registered kernel of the nvidia
package (``fla.gdn_chunk_prefill``, ``peer=True``); ``fused_recurrent_gated_delta_rule`` is
``gdn_decode``'s peer here (timed only: it returns a new state instead of updating a cache).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from ..inputs import cu_seqlens, randn, torch_dtype
from . import Case, Cost, OpCases, Peer, PeerCall, PeerSkip, nbytes
from ._common import close, compare_by, dim, named, upcast

_COMMON = {"heads": 2, "heads_v": 4, "head_dim": 32, "head_dim_v": 32, "l2norm": False, "scale": None}
_QWEN3_NEXT = {"heads": 16, "heads_v": 32, "head_dim": 128, "head_dim_v": 128, "l2norm": True}


def _qkv(case: Case, n: int, gen: torch.Generator) -> dict[str, Any]:
    dt = torch_dtype(case.dtype)
    h, hv, dk, dv = case["heads"], case["heads_v"], case["head_dim"], case["head_dim_v"]
    g = -(torch.rand((n, hv), generator=gen, device=gen.device) * 0.49 + 0.01)
    beta = torch.sigmoid(torch.randn((n, hv), generator=gen, device=gen.device))
    return {
        "q": randn((n, h, dk), dt, gen),
        "k": randn((n, h, dk), dt, gen, scale=dk**-0.5),
        "v": randn((n, hv, dv), dt, gen),
        "g": g,
        "beta": beta,
        "scale": case["scale"],
        "use_qk_l2norm": case["l2norm"],
    }


def _state(case: Case, n: int, gen: torch.Generator) -> torch.Tensor:
    shape = (n, case["heads_v"], case["head_dim"], case["head_dim_v"])
    return randn(shape, torch.float32, gen, scale=0.1)


def _make_prefill(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    lengths = tuple(case["seqlens"])
    call = _qkv(case, sum(lengths), gen)
    call["cu_seqlens"] = cu_seqlens(lengths, device) if case["varlen"] else None
    if case["initial_state"]:
        call["initial_state"] = _state(case, len(lengths), gen)
    call["output_final_state"] = case["final_state"]
    return call


def _gdn_flops(tokens: int, case: Case) -> float:
    # The recurrence's work: decay, S^T k, k u^T, S^T q: about 7 K V flops per token and value head.
    return 7.0 * tokens * case["heads_v"] * case["head_dim"] * case["head_dim_v"]


def _prefill_cost(case: Case, call: dict[str, Any], outputs: dict[str, Any]) -> Cost:
    moved = nbytes(*(v for v in call.values() if isinstance(v, torch.Tensor)), *outputs.values())
    return Cost(_gdn_flops(call["q"].shape[0], case), moved)


def _fla_available(device: torch.device) -> str | None:
    if device.type != "cuda":
        return "needs a CUDA device"
    return None if importlib.util.find_spec("fla") is not None else "flash-linear-attention (fla) is not installed"


GDN_CHUNK_PREFILL = OpCases(
    op="gdn_chunk_prefill",
    defaults={**_COMMON, "seqlens": (40,), "varlen": True, "initial_state": False, "final_state": False},
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp16", "fp32")},
    sets={
        "cpu": [
            {"seqlens": (1,)},
            {"seqlens": (70,), "varlen": False, "final_state": True},
            {"seqlens": (65, 0, 3, 130), "initial_state": True, "final_state": True},
            {"seqlens": (50,), "l2norm": True, "heads": 4, "heads_v": 4, "head_dim": 16, "head_dim_v": 48},
            {"seqlens": (33, 31), "heads": 1, "heads_v": 3, "scale": 0.3, "label": "3 value heads per q/k head"},
        ],
        "gpu": [
            {**_QWEN3_NEXT, "seqlens": (4096,), "final_state": True},
            {**_QWEN3_NEXT, "seqlens": (1000, 3000, 77, 1), "initial_state": True, "final_state": True},
            {**_QWEN3_NEXT, "seqlens": (63, 64, 65, 129), "l2norm": False, "label": "chunk edges, no l2norm"},
            {"seqlens": (300,), "heads": 4, "heads_v": 4, "head_dim": 64, "head_dim_v": 64},
        ],
        "bench-cpu": [{"seqlens": (128,)}],
        "bench-gpu": [
            {**_QWEN3_NEXT, "seqlens": s, "dtype": "bf16", "final_state": True}
            for s in ((4096,), (16384,), (8 * (2048,)), (32 * (512,)))
        ],
    },
    make=_make_prefill,
    reference_call=lambda case, call: upcast(call, ("q", "k", "v")),
    outputs=named("out", "final_state"),
    compare=compare_by({"out": close("recurrence"), "final_state": close("recurrence")}),
    shrink=[dim("heads_v"), dim("heads")],
    tuple_params=("seqlens",),
    cost=_prefill_cost,
    metric="tflops",
    always_show=("seqlens", "heads", "heads_v", "head_dim"),
)


def _make_decode(case: Case, device: torch.device, gen: torch.Generator) -> dict[str, Any]:
    b = case["batch"]
    call = _qkv(case, b, gen)
    slots = b + case["spare_states"]
    call["state"] = _state(case, slots, gen)
    if case["indexed"]:
        perm = torch.randperm(slots, generator=gen, device=gen.device)[:b].to(torch.int32)
        if b > 1:
            perm[b // 2] = -1  # a padding row
        call["state_indices"] = perm
    return call


def _decode_cost(case: Case, call: dict[str, Any], outputs: dict[str, Any]) -> Cost:
    state_bytes = 2.0 * case["batch"] * call["state"][0].numel() * 4  # each touched state read and written
    moved = state_bytes + nbytes(*(call[n] for n in ("q", "k", "v", "g", "beta")), *outputs.values())
    return Cost(_gdn_flops(case["batch"], case), moved)


def _fla_decode(case: Case, call: dict[str, Any], device: torch.device) -> PeerCall:
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    if case["indexed"]:
        raise PeerSkip("state indices (fla reads initial_state[b])")
    b = case["batch"]
    q, k, v = (call[n][:, None] for n in ("q", "k", "v"))  # [B, 1, H, K]: B sequences of one token
    g, beta = call["g"][:, None], call["beta"][:, None].to(q.dtype)
    state = call["state"][:b]
    kwargs = dict(beta=beta, scale=call["scale"], initial_state=state, output_final_state=True,
                  use_qk_l2norm_in_kernel=call["use_qk_l2norm"])  # fmt: skip
    return PeerCall(
        lambda: fused_recurrent_gated_delta_rule(q, k, v, g, **kwargs),
        "returns a new state (no in-place cache update)",
    )


def _decode_outputs(call: dict[str, Any], result: Any) -> dict[str, torch.Tensor]:
    return {"out": result, "state": call["state"]}


GDN_DECODE = OpCases(
    op="gdn_decode",
    defaults={**_COMMON, "batch": 3, "spare_states": 2, "indexed": False},
    dtypes={"cpu": ("fp32", "bf16"), "cuda": ("bf16", "fp16", "fp32")},
    sets={
        "cpu": [
            {"batch": 1},
            {"batch": 5, "indexed": True},
            {"batch": 4, "l2norm": True, "heads": 1, "heads_v": 2, "head_dim": 16, "head_dim_v": 48, "scale": 0.5},
        ],
        "gpu": [
            {**_QWEN3_NEXT, "batch": 1},
            {**_QWEN3_NEXT, "batch": 64, "indexed": True, "spare_states": 100},
            {"batch": 7, "heads": 2, "heads_v": 6, "head_dim": 64, "head_dim_v": 32},
        ],
        "bench-cpu": [{"batch": 4}],
        "bench-gpu": [{**_QWEN3_NEXT, "batch": b, "dtype": "bf16"} for b in (1, 16, 64, 256)],
    },
    make=_make_decode,
    reference_call=lambda case, call: upcast(call, ("q", "k", "v")),
    outputs=_decode_outputs,
    compare=compare_by({"out": close("recurrence"), "state": close("recurrence")}),
    shrink=[dim("batch"), dim("heads_v")],
    cost=_decode_cost,
    peers=[Peer("fla.fused_recurrent_gated_delta_rule", _fla_decode, _fla_available, "flash-linear-attention")],
    always_show=("batch", "heads", "heads_v", "head_dim"),
)

__all__ = ["GDN_CHUNK_PREFILL", "GDN_DECODE"]

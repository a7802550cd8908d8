"""FLOP and byte models per op: what a call must compute and move at least.

Conventions (so numbers compare with PERFORMANCE.md):

- a multiply-add is 2 FLOPs;
- attention counts only the (query, key) pairs the mask lets through: causal
  halves the work, a window of ``w`` keeps ``w + 1`` keys per query. FLOPs are
  ``4 * D * Hq * pairs`` (``Q K^T`` and ``P V``). Prefill bytes are q, k, v read
  and the output written; decode bytes are the K and V rows the visible keys
  occupy, read once; extend bytes add q and the output;
- MoE weights are counted for *active* experts only (those that received a
  row), at their storage size (MXFP4: 4.25 bits a value with its E8M0 scales);
  FLOPs are ``2 * rows * (2I * H + I * H)``;
- ``mm``: ``2 * M * N * K``, bytes of a, b (and scales) read and the output written;
- element-wise ops (norm, activations, rope, quantization, sampling): the bytes of
  every input read and every output written.

``compute`` names the matmul ceiling the FLOP rate is compared with (``fp8`` for
FP8 GEMMs, ``bf16`` otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..numerics.cases import Case

__all__ = ["Cost", "cost_of", "attention_pairs", "PRIMARY_METRIC"]


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float
    compute: str = "bf16"


#: Which rate a report plots for an op: "tflops" (compute-bound work) or "tbps".
PRIMARY_METRIC: dict[str, str] = {
    "mha_prefill": "tflops",
    "mha_extend_with_kvcache": "tflops",
    "mha_decode_with_kvcache": "tbps",
    "moe_experts": "tflops",
    "moe_apply": "tflops",
    "mm": "tflops",
}


def _nbytes(*tensors: Any) -> float:
    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
    return float(total)


def _visible(p: int, lk: int, causal: bool, window: int) -> tuple[int, int]:
    hi = min(p, lk - 1) if causal else lk - 1
    lo = max(0, p - window) if window >= 0 else 0
    return lo, hi


def attention_pairs(q_lens, k_lens, *, causal: bool, window: int) -> int:
    """Visible (query, key) pairs; query ``i`` of sequence ``b`` sits at ``k_lens[b] - q_lens[b] + i``."""
    total = 0
    for lq, lk in zip(q_lens, k_lens):
        if lq <= 0 or lk <= 0:
            continue
        start = lk - lq
        for p in range(start, start + lq):
            lo, hi = _visible(p, lk, causal, window)
            if hi >= lo:
                total += hi - lo + 1
    return total


def _key_span(lq: int, lk: int, causal: bool, window: int) -> int:
    """Keys of one sequence any of its queries sees (each is read once)."""
    if lq <= 0 or lk <= 0:
        return 0
    lo, _ = _visible(lk - lq, lk, causal, window)
    _, hi = _visible(lk - 1, lk, causal, window)
    return max(0, hi - lo + 1)


def _out_bytes(outputs: Mapping[str, Any]) -> float:
    return _nbytes(*outputs.values())


def _prefill(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    lq = case["seqlens_q"]
    lk = case["seqlens_k"] or lq
    pairs = attention_pairs(lq, lk, causal=case["causal"], window=case["window_left"])
    flops = 4.0 * case["head_dim"] * case["heads_q"] * pairs
    return Cost(flops, _nbytes(call["q"], call["k"], call["v"]) + _out_bytes(outputs))


def _paged_kv_bytes(call: dict[str, Any], keys: int) -> float:
    kc = call["k_cache"]
    return 2.0 * keys * kc.shape[2] * kc.shape[3] * kc.element_size()


def _extend(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    ql, cl = case["q_lens"], case["cache_lens"]
    pairs = attention_pairs(ql, cl, causal=case["causal"], window=case["window_left"])
    keys = sum(_key_span(q, n, case["causal"], case["window_left"]) for q, n in zip(ql, cl))
    flops = 4.0 * case["head_dim"] * case["heads_q"] * pairs
    return Cost(flops, _paged_kv_bytes(call, keys) + _nbytes(call["q"]) + _out_bytes(outputs))


def _decode(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    cl = case["cache_lens"]
    pairs = attention_pairs((1,) * len(cl), cl, causal=True, window=case["window_left"])
    return Cost(4.0 * case["head_dim"] * case["heads_q"] * pairs, _paged_kv_bytes(call, pairs))


def _store(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    kc = call["k_cache"]
    written = 2.0 * (case["tokens"] - case["pad"]) * kc.shape[2] * kc.shape[3] * kc.element_size()
    return Cost(0.0, _nbytes(call["k"], call["v"], call["slot_mapping"]) + written)


def _expert_bytes(weights: Any, experts: int) -> float:
    """Storage of ``experts`` experts' weights (scales and biases included)."""
    e = weights.num_experts
    total = _nbytes(weights.w13, weights.w2, weights.w13_scale, weights.w2_scale, weights.w13_bias, weights.w2_bias)
    return total * experts / max(e, 1)


def _moe_flops(rows: int, case: Case) -> float:
    h, i = case["hidden"], case["inter"]
    return 2.0 * rows * (2 * i * h + i * h)


def _experts(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    offs = call["expert_offsets"]
    active = int(((offs[1:] - offs[:-1]) > 0).sum())
    rows = call["hidden"].shape[0]
    moved = _expert_bytes(call["weights"], active) + _nbytes(call["hidden"]) + _out_bytes(outputs)
    return Cost(_moe_flops(rows, case), moved)


def _apply(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    active = int(torch.unique(call["topk_ids"]).numel())
    rows = call["topk_ids"].numel()
    moved = _expert_bytes(call["weights"], active) + _nbytes(call["x"], call["topk_ids"], call["topk_weights"])
    return Cost(_moe_flops(rows, case), moved + _out_bytes(outputs))


def _mm(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    m, n, k = case["m"], case["n"], case["k"]
    moved = _nbytes(call["a"], call["b"], call.get("a_scale"), call.get("b_scale"), call.get("bias")) + _out_bytes(
        outputs
    )
    return Cost(2.0 * m * n * k, moved, "fp8" if case["b_format"].startswith("fp8") else "bf16")


def _io(flops_per_output: float = 0.0) -> Callable[[Case, dict[str, Any], Mapping[str, Any]], Cost]:
    def cost(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
        inputs = [v for v in call.values() if isinstance(v, torch.Tensor)]
        out_elems = sum(t.numel() for t in outputs.values() if isinstance(t, torch.Tensor))
        return Cost(flops_per_output * out_elems, _nbytes(*inputs) + _out_bytes(outputs))

    return cost


def _rope(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    # Only the cache rows of the tokens' positions are read, not the whole table.
    rows = call["positions"].numel() * call["cos_sin_cache"].shape[1] * 4.0
    return Cost(
        6.0 * _nbytes(call["q"], call["k"]) / call["q"].element_size(), 2 * _nbytes(call["q"], call["k"]) + rows
    )


_MODELS: dict[str, Callable[[Case, dict[str, Any], Mapping[str, Any]], Cost]] = {
    "mha_prefill": _prefill,
    "mha_extend_with_kvcache": _extend,
    "mha_decode_with_kvcache": _decode,
    "kvcache_store": _store,
    "moe_experts": _experts,
    "moe_apply": _apply,
    "mm": _mm,
    "apply_rotary": _rope,
    "rmsnorm": _io(4.0),
    "swiglu": _io(8.0),
    "silu_and_mul": _io(5.0),
}


def cost_of(case: Case, call: dict[str, Any], outputs: Mapping[str, Any]) -> Cost:
    """The FLOP/byte model of one call (``outputs``: the named outputs of a run, for their sizes)."""
    model = _MODELS.get(case.op, _io())
    return model(case, call, outputs)

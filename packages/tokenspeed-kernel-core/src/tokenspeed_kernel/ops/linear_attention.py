"""Linear attention: the gated delta rule (Gated DeltaNet), chunked prefill and decode step.

Semantics (flash-linear-attention's ``chunk_gated_delta_rule`` / ``fused_recurrent_gated_delta_rule``,
Qwen3-Next's linear-attention layers): per value head a float32 state ``S [K, V]``; per token t

    S <- S * exp(g_t)
    u  = beta_t * (v_t - S^T k_t)
    S <- S + k_t u^T
    o_t = S^T (scale * q_t)

with ``q, k`` optionally L2-normalised first (``use_qk_l2norm``: ``x / sqrt(sum x^2 + 1e-6)``).
``g`` is the log decay (``exp(g) <= 1`` for ``g <= 0``), ``beta`` the write strength (already
through its sigmoid). Grouped value heads: ``HV`` is a multiple of ``H``; value head ``j``
reads q/k head ``j // (HV // H)`` (Qwen3-Next: 16 q/k heads, 32 value heads).
"""

from __future__ import annotations

import torch

from ..core.contracts import ANY, Size, TraitSpec
from ..core.formats import DTYPE_NAMES
from ..core.op import KernelCall, Op, Reference, kernel_call
from ..core.validation import check_cu_seqlens, check_float, check_same_device, check_tensor, readable_values

__all__ = ["gdn_chunk_prefill", "gdn_decode"]

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_FLOAT = ("fp32", "bf16", "fp16")
_GATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_TRAITS = {
    "head_dim": TraitSpec(int, default=128, doc="K, the q/k head dim"),
    "head_dim_v": TraitSpec(int, default=128, doc="V, the value head dim"),
    "qk_l2norm": TraitSpec(bool, default=False, doc="q and k L2-normalised inside"),
}
_ANY = {"head_dim": ANY, "head_dim_v": ANY, "qk_l2norm": ANY}
_REFERENCE = "tokenspeed_kernel.reference.linear_attention"
_CASES = "tokenspeed_kernel.numerics.cases.linear_attention"


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lead: str) -> tuple[int, int, int, int]:
    check_tensor("q", q, dtypes=_DTYPES, dim=3, last_dim_contiguous=True)
    check_tensor("k", k, dtypes=(q.dtype,), shape=tuple(q.shape), last_dim_contiguous=True)
    check_tensor("v", v, dtypes=(q.dtype,), dim=3, last_dim_contiguous=True)
    n, h, dk = q.shape
    if v.shape[0] != n:
        raise ValueError(f"v: expected {n} {lead} (like q), got shape {list(v.shape)}")
    hv, dv = v.shape[1], v.shape[2]
    if hv % h:
        raise ValueError(f"v: the {hv} value heads must be a multiple of the {h} q/k heads")
    if dk < 1 or dv < 1:
        raise ValueError(f"q / v: expected head dims >= 1, got K={dk}, V={dv}")
    return n, h, hv, dk


def _check_gates(g: torch.Tensor, beta: torch.Tensor, n: int, hv: int) -> None:
    check_tensor("g", g, dtypes=_GATE_DTYPES, shape=(n, hv))
    check_tensor("beta", beta, dtypes=_GATE_DTYPES, shape=(n, hv))


def _scale(scale: float | None, dk: int) -> float:
    if scale is None:
        return dk**-0.5
    return check_float("scale", scale, minimum=0.0, strict=True, expected="None or a finite float > 0")


def _bind_gdn_chunk_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm: bool = False,
    out: torch.Tensor | None = None,
) -> KernelCall:
    """Gated delta rule over packed sequences (prefill: every token, chunk-parallel).

    Args:
        q, k: ``[T, H, K]`` bf16/fp16/fp32 (tokens of all sequences packed), last dim contiguous.
        v: ``[T, HV, V]``, q's dtype; ``HV`` a multiple of ``H``.
        g: ``[T, HV]`` log decays (fp32, bf16 or fp16; used in fp32).
        beta: ``[T, HV]`` write strengths (post-sigmoid; used in fp32).
        scale: on q, a finite float > 0; None means ``K ** -0.5``.
        initial_state: ``float32 [B, HV, K, V]`` states the sequences start from, or None (zeros).
        cu_seqlens: ``int32 [B+1]`` prefix sums of the sequence lengths (0, non-decreasing,
            last entry T); None means one sequence of T tokens.
        output_final_state: also return ``float32 [B, HV, K, V]``, the states after the last token.
        use_qk_l2norm: L2-normalise q and k (per token and head) first.
        out: optional ``[T, HV, V]`` output of q's dtype.

    Returns:
        ``o [T, HV, V]`` (q's dtype), or ``(o, final_state)`` with ``output_final_state``.
    """
    t, _, hv, dk = _check_qkv(q, k, v, "tokens")
    _check_gates(g, beta, t, hv)
    dv = v.shape[2]
    if cu_seqlens is not None:
        batch, _ = check_cu_seqlens("cu_seqlens", cu_seqlens, tokens=t)
    else:
        batch = 1
    if initial_state is not None:
        check_tensor(
            "initial_state", initial_state, dtypes=(torch.float32,), shape=(batch, hv, dk, dv), contiguous=True
        )
    if out is not None:
        check_tensor("out", out, dtypes=(q.dtype,), shape=(t, hv, dv), last_dim_contiguous=True)
    check_same_device("q", q, k=k, v=v, g=g, beta=beta, initial_state=initial_state, cu_seqlens=cu_seqlens, out=out)
    traits = (("head_dim", dk), ("head_dim_v", dv), ("qk_l2norm", bool(use_qk_l2norm)))
    return kernel_call(
        q.device, (DTYPE_NAMES[q.dtype],), traits, (t,),
        q, k, v, g, beta, scale=_scale(scale, dk), initial_state=initial_state, cu_seqlens=cu_seqlens,
        output_final_state=bool(output_final_state), use_qk_l2norm=bool(use_qk_l2norm), out=out,
    )  # fmt: skip


def _fake_gdn_chunk_prefill(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None,
                            output_final_state=False, use_qk_l2norm=False, out=None):  # fmt: skip
    o = v.new_empty(v.shape, dtype=q.dtype)
    if not output_final_state:
        return o
    batch = 1 if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return o, q.new_empty((batch, v.shape[1], q.shape[2], v.shape[2]), dtype=torch.float32)


gdn_chunk_prefill = Op(
    name="gdn_chunk_prefill",
    family="linear_attention",
    roles=("x",),
    traits=_TRAITS,
    sizes=(Size("tokens", "T, the packed tokens"),),
    doc="Gated delta rule (Gated DeltaNet) prefill over packed sequences.",
    bind=_bind_gdn_chunk_prefill,
    fake=_fake_gdn_chunk_prefill,
    reference=Reference(f"{_REFERENCE}:gdn_chunk_prefill", formats=[{"x": _FLOAT}], traits=_ANY),
    workload=f"{_CASES}:GDN_CHUNK_PREFILL",
)


def _bind_gdn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    *,
    scale: float | None = None,
    state_indices: torch.Tensor | None = None,
    use_qk_l2norm: bool = False,
    out: torch.Tensor | None = None,
) -> KernelCall:
    """One gated-delta-rule step per sequence (decode); the states are updated in place.

    Args:
        q, k: ``[B, H, K]`` (one token per sequence), bf16/fp16/fp32, last dim contiguous.
        v: ``[B, HV, V]``, q's dtype.
        g, beta: ``[B, HV]`` log decays / write strengths (used in fp32).
        state: ``float32 [N, HV, K, V]`` state cache, contiguous; updated in place.
        scale: on q; None means ``K ** -0.5``.
        state_indices: ``int32 [B]``: sequence b reads and writes ``state[state_indices[b]]``;
            a negative index (padding) leaves every state alone and gives a zero output row.
            None means ``state[b]`` (``N >= B``).
        use_qk_l2norm: L2-normalise q and k first.
        out: optional ``[B, HV, V]`` output of q's dtype.

    Returns:
        ``o [B, HV, V]``.
    """
    b, _, hv, dk = _check_qkv(q, k, v, "sequences")
    _check_gates(g, beta, b, hv)
    dv = v.shape[2]
    check_tensor("state", state, dtypes=(torch.float32,), dim=4, contiguous=True)
    if tuple(state.shape[1:]) != (hv, dk, dv):
        raise ValueError(f"state: expected shape [N, {hv}, {dk}, {dv}] (HV, K, V), got {list(state.shape)}")
    if state_indices is None:
        if state.shape[0] < b:
            raise ValueError(f"state: expected at least {b} states (one per sequence) without state_indices, "
                             f"got {state.shape[0]}")  # fmt: skip
    else:
        check_tensor("state_indices", state_indices, dtypes=(torch.int32,), shape=(b,))
        idx = readable_values(state_indices)
        if idx is not None and idx.numel() and int(idx.max()) >= state.shape[0]:
            raise ValueError(f"state_indices: entries must be < {state.shape[0]} (the states), got {int(idx.max())}")
    if out is not None:
        check_tensor("out", out, dtypes=(q.dtype,), shape=(b, hv, dv), last_dim_contiguous=True)
    check_same_device("q", q, k=k, v=v, g=g, beta=beta, state=state, state_indices=state_indices, out=out)
    traits = (("head_dim", dk), ("head_dim_v", dv), ("qk_l2norm", bool(use_qk_l2norm)))
    return kernel_call(
        q.device, (DTYPE_NAMES[q.dtype],), traits, (b,),
        q, k, v, g, beta, state, scale=_scale(scale, dk), state_indices=state_indices,
        use_qk_l2norm=bool(use_qk_l2norm), out=out,
    )  # fmt: skip


def _fake_gdn_decode(q, k, v, g, beta, state, *, scale=None, state_indices=None, use_qk_l2norm=False, out=None):
    return v.new_empty(v.shape, dtype=q.dtype)


gdn_decode = Op(
    name="gdn_decode",
    family="linear_attention",
    roles=("x",),
    traits=_TRAITS,
    sizes=(Size("batch", "B, the sequences (one token each)"),),
    doc="Gated delta rule decode step (state cache updated in place).",
    bind=_bind_gdn_decode,
    fake=_fake_gdn_decode,
    reference=Reference(f"{_REFERENCE}:gdn_decode", formats=[{"x": _FLOAT}], traits=_ANY),
    workload=f"{_CASES}:GDN_DECODE",
    mutates=("state",),
    mutating_result=True,
)

"""Mixture of experts: routing, the staged path, the fused path, plan + weight processing.

Staged (what an expert-parallel engine needs)::

    topk_weights, topk_ids = moe_route(router_logits, top_k)   # or moe_gate(x, W_r, b_r, top_k): the router
    d = moe_dispatch(x, topk_ids, num_experts)          # rows sorted by expert
    y = moe_experts(d.hidden, d.expert_offsets, weights, activation)
    out = moe_combine(y, d.permutation, topk_weights)

Fused: ``out = moe_apply(x, topk_weights, topk_ids, weights, activation)``.

Plan once, convert weights once (FlashInfer's plan/run split)::

    plan = moe_plan(weights, activation, dtype=torch.bfloat16, device="cuda")
    kernel_weights = moe_process_weights(plan, weights)
    out = moe_apply(x, topk_weights, topk_ids, kernel_weights, activation, plan=plan)

Expert math for one token and expert ``e`` (GPT-OSS, ``kind="swiglu"``)::

    h = x @ W13[e].T + b13[e]                 # 2I outputs
    gate, up = h[0::2], h[1::2]               # interleaved (else h[:I], h[I:])
    gate = min(gate, limit); up = clamp(up, -limit, limit)     # if limit
    y = (up + up_offset) * gate * sigmoid(alpha * gate)
    out_e = y @ W2[e].T + b2[e]

``kind="silu"``: ``y = silu(gate) * up`` (alpha 1, no limit, no offset).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ..core.contracts import ANY, Size, TraitSpec
from ..core.formats import DTYPE_NAMES
from ..core.op import KernelCall, Op, Reference, kernel_call
from ..core.platform import platform_for_device
from ..core.registry import registry
from ..core.selection import Target, select_spec
from ..core.validation import check_float, check_same_device, check_tensor, readable_values

__all__ = [
    "MoEActivation",
    "MoEWeights",
    "MoEDispatchResult",
    "MoEPlan",
    "moe_route",
    "moe_gate",
    "moe_dispatch",
    "moe_experts",
    "moe_combine",
    "moe_apply",
    "moe_fused",
    "moe_plan",
    "moe_process_weights",
    "WEIGHT_FORMATS",
    "interleave_gate_up",
]

#: Expert weight formats (the ``w`` role).
WEIGHT_FORMATS = ("bf16", "fp16", "fp32", "fp8_e4m3:per_channel", "fp8_e4m3:per_tensor", "mxfp4")
_X_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@dataclass(frozen=True)
class MoEActivation:
    """The expert activation, with every constant explicit (no per-backend defaults).

    The defaults are GPT-OSS's clamped SwiGLU.
    """

    kind: str = "swiglu"
    alpha: float = 1.702
    limit: float | None = 7.0
    up_offset: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("swiglu", "silu"):
            raise ValueError(f"kind: expected 'swiglu' or 'silu', got {self.kind!r}")
        if self.kind == "silu" and (self.alpha != 1.0 or self.limit is not None or self.up_offset != 0.0):
            raise ValueError("MoEActivation(kind='silu') takes no alpha/limit/up_offset; use kind='swiglu' for those")
        check_float("alpha", self.alpha, expected="a finite float")
        check_float("up_offset", self.up_offset, expected="a finite float")
        if self.limit is not None:
            check_float("limit", self.limit, minimum=0.0, strict=True, expected="None or a finite float > 0")

    @classmethod
    def silu(cls) -> MoEActivation:
        return cls(kind="silu", alpha=1.0, limit=None, up_offset=0.0)


def w4a8_inter_scale(activation: MoEActivation) -> float:
    """W4A8 (fp8 activations): the power of two the SwiGLU output is multiplied by before its E4M3
    rounding. The clamped SwiGLU bounds that output: ``|gate * sigmoid(alpha * gate)| <=
    max(limit, 0.279 / alpha)`` for ``gate <= limit`` (its minimum is about ``-0.2785 / alpha``) and
    ``|up + up_offset| <= limit + |up_offset|``; the scale is the largest power of two keeping the
    bound within E4M3's 448 (GPT-OSS: ``7 * 8 = 56`` -> 8), so no value saturates and no per-token
    reduction is needed. Needs ``activation.limit``."""
    if activation.limit is None:
        raise ValueError("activation: W4A8 needs a clamped SwiGLU (limit): it bounds the intermediate's fp8 range")
    bound = max(activation.limit, 0.279 / activation.alpha) * (activation.limit + abs(activation.up_offset))
    return 2.0 ** math.floor(math.log2(448.0 / bound))


def interleave_gate_up(rows: torch.Tensor, inter: int) -> torch.Tensor:
    """Rows ``[gate_0 .. gate_{I-1}, up_0 .. up_{I-1}]`` along dim 1 -> ``[gate_0, up_0, gate_1, ...]``
    (``gate_up_interleaved``): the layout change weight preprocessors make for kernels that read
    gate/up pairs. Works for weights, scales (``[E, 2I, *]``) and biases (``[E, 2I]``); a new tensor."""
    gate, up = rows[:, :inter], rows[:, inter:]
    return torch.stack((gate, up), dim=2).flatten(1, 2)


@dataclass(frozen=True)
class MoEWeights:
    """Expert weights in one typed object. Rows are output features.

    Canonical layout (what GPT-OSS checkpoints ship), ``E`` experts, hidden ``H``,
    intermediate ``I``:

    - dense (``bf16``/``fp16``/``fp32``): ``w13 [E, 2I, H]``, ``w2 [E, H, I]``;
    - ``fp8_e4m3:per_channel``: fp8 ``w13``/``w2`` as above with ``float32``
      scales ``w13_scale [E, 2I]``, ``w2_scale [E, H]`` (``per_tensor``: ``[E]``);
    - ``mxfp4``: ``uint8 w13 [E, 2I, H/2]`` (two E2M1 codes a byte, low nibble =
      even element), ``uint8 w13_scale [E, 2I, H/32]`` (E8M0), likewise
      ``w2 [E, H, I/2]``, ``w2_scale [E, H, I/32]``.

    ``w13_bias [E, 2I]`` / ``w2_bias [E, H]`` are optional (any float dtype).
    ``gate_up_interleaved``: gate and up rows alternate (gate = even rows), as in
    GPT-OSS; otherwise the first ``I`` rows are the gate. ``layout`` is
    ``"canonical"`` or the name of the kernel whose layout
    :func:`moe_process_weights` converted the weights to.
    """

    w13: torch.Tensor
    w2: torch.Tensor
    format: str
    w13_bias: torch.Tensor | None = None
    w2_bias: torch.Tensor | None = None
    w13_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None
    gate_up_interleaved: bool = True
    layout: str = "canonical"
    #: Kernel-specific extra tensors after processing (opaque to everyone else).
    extra: tuple = ()
    #: What the ops' checks read of these weights, set once they passed them (:meth:`validate`, or
    #: :func:`moe_process_weights`); None before. Calls whose other arguments match too skip the checks
    #: (``tokenspeed_kernel.core.op``, the validation memo). Not a field: ``replace`` starts without it.
    __memo_key__ = None

    def _checked(self) -> None:
        """Record :attr:`__memo_key__`: format, layout, row order, which optional tensors there are, and every
        tensor's shape, dtype and device (the checks read the shapes, the device and the flags)."""
        tensors = tuple(
            None if t is None else (tuple(t.shape), t.dtype, t.device)
            for t in (self.w13, self.w2, self.w13_bias, self.w2_bias, self.w13_scale, self.w2_scale)
        )
        object.__setattr__(self, "__memo_key__", (self.format, self.layout, self.gate_up_interleaved, tensors))

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def intermediate(self) -> int:
        return self.w13.shape[1] // 2

    @property
    def hidden(self) -> int:
        return self.w2.shape[1]

    def validate(self) -> None:
        """Check shapes, dtypes and devices of the canonical layout (the ops call it once per object)."""
        if self.format not in WEIGHT_FORMATS:
            raise ValueError(f"format: expected one of {WEIGHT_FORMATS}, got {self.format!r}")
        if self.layout != "canonical":
            return
        check_tensor("w13", self.w13, dim=3)
        e, two_i, _ = self.w13.shape
        if two_i % 2:
            raise ValueError(f"w13: expected an even number of rows (gate + up), got {two_i}")
        i = two_i // 2
        h = self.w2.shape[1] if self.w2.dim() == 3 else -1
        if self.format == "mxfp4":
            check_tensor("w13", self.w13, dtypes=(torch.uint8,), shape=(e, two_i, h // 2))
            check_tensor("w2", self.w2, dtypes=(torch.uint8,), shape=(e, h, i // 2))
            check_tensor("w13_scale", self.w13_scale, dtypes=(torch.uint8,), shape=(e, two_i, h // 32))
            check_tensor("w2_scale", self.w2_scale, dtypes=(torch.uint8,), shape=(e, h, i // 32))
            if h % 32 or i % 32:
                raise ValueError(f"mxfp4 weights need hidden ({h}) and intermediate ({i}) divisible by 32")
        elif self.format.startswith("fp8"):
            check_tensor("w13", self.w13, dtypes=(torch.float8_e4m3fn,), dim=3)
            check_tensor("w2", self.w2, dtypes=(torch.float8_e4m3fn,), shape=(e, h, i))
            per_tensor = self.format.endswith("per_tensor")
            check_tensor("w13_scale", self.w13_scale, dtypes=(torch.float32,), shape=(e,) if per_tensor else (e, two_i))
            check_tensor("w2_scale", self.w2_scale, dtypes=(torch.float32,), shape=(e,) if per_tensor else (e, h))
        else:
            dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[self.format]
            check_tensor("w13", self.w13, dtypes=(dt,), dim=3)
            check_tensor("w2", self.w2, dtypes=(dt,), shape=(e, h, i))
            for n in ("w13_scale", "w2_scale"):
                if getattr(self, n) is not None:
                    raise ValueError(f"{n}: dense {self.format} weights take no scale")
        if self.w13_bias is not None:
            check_tensor("w13_bias", self.w13_bias, shape=(e, two_i))
        if self.w2_bias is not None:
            check_tensor("w2_bias", self.w2_bias, shape=(e, h))
        check_same_device(
            "w13", self.w13, w2=self.w2, w13_bias=self.w13_bias, w2_bias=self.w2_bias,
            w13_scale=self.w13_scale, w2_scale=self.w2_scale,
        )  # fmt: skip
        # Checked once per object (the tensors are fixed at construction): every op call asks.
        object.__setattr__(self, "_validated", True)
        self._checked()

    @classmethod
    def from_gpt_oss(
        cls,
        gate_up_proj_blocks: torch.Tensor,
        gate_up_proj_scales: torch.Tensor,
        gate_up_proj_bias: torch.Tensor | None,
        down_proj_blocks: torch.Tensor,
        down_proj_scales: torch.Tensor,
        down_proj_bias: torch.Tensor | None,
    ) -> MoEWeights:
        """From a GPT-OSS checkpoint's ``*_blocks [E, N, K/32, 16]`` / ``*_scales [E, N, K/32]``."""
        for name, t in (("gate_up_proj_blocks", gate_up_proj_blocks), ("down_proj_blocks", down_proj_blocks)):
            check_tensor(name, t, dtypes=(torch.uint8,), dim=4)
            if t.shape[-1] != 16:
                raise ValueError(f"{name}: expected a last dim of 16 bytes (32 FP4 values), got {t.shape[-1]}")
        w = cls(
            w13=gate_up_proj_blocks.flatten(-2),
            w2=down_proj_blocks.flatten(-2),
            format="mxfp4",
            w13_bias=gate_up_proj_bias,
            w2_bias=down_proj_bias,
            w13_scale=gate_up_proj_scales,
            w2_scale=down_proj_scales,
            gate_up_interleaved=True,
        )
        w.validate()
        return w


@dataclass(frozen=True)
class MoEDispatchResult:
    """Token rows grouped by expert.

    ``hidden [T*k, H]``: row ``r`` is token ``permutation[r] // k``'s hidden state;
    rows of expert ``e`` are ``expert_offsets[e]:expert_offsets[e+1]``, in token
    order. ``permutation int32 [T*k]``: the flat ``(token * k + slot)`` index of
    each row. ``expert_offsets int32 [E+1]``.
    """

    hidden: torch.Tensor
    expert_offsets: torch.Tensor
    permutation: torch.Tensor


@dataclass(frozen=True)
class MoEPlan:
    """A MoE layer's weight layout, picked once (see :func:`moe_plan`).

    ``kernel`` is the kernel the plan ranked first; ``layout`` the weight layout
    it takes (``"canonical"``, or the layout its weight preprocessor writes).
    Calls with weights in that layout select, per token-count bucket, among the
    kernels that take it.
    """

    kernel: str
    layout: str
    format: str
    activation: MoEActivation


_MOE_TRAITS = {
    "activation": TraitSpec(str, default="swiglu", allowed=("swiglu", "silu"), doc="expert activation kind"),
    "clamp": TraitSpec(bool, default=False, doc="activation limit set"),
    "bias": TraitSpec(bool, default=False, doc="expert biases"),
    "gate_up_interleaved": TraitSpec(bool, default=False, doc="gate/up rows alternate"),
    # A kernel whose activation fixes the offset (triton_kernels' fused SwiGLU computes up + 1)
    # declares the values it computes; most take any (ANY).
    "up_offset": TraitSpec(float, default=1.0, doc="added to up before the product (GPT-OSS: 1.0; silu: 0.0)"),
    # The weights' layout: "canonical", or the one a kernel's weight preprocessor writes
    # (set by the registry for such kernels). It belongs to the kernel, not to the call,
    # so measured tables compare kernels of every layout with each other.
    "layout": TraitSpec(str, default="canonical", doc="weight layout (moe_process_weights)", measured=False),
    # The caller's permission, not a property of the data: moe_apply(fp8_activations=True) binds ANY,
    # so every kernel competes, W4A8 ones (declaring True) included; the default admits only kernels
    # that keep the activations in x's dtype. Kernels of both kinds are compared in one measured table.
    "fp8_activations": TraitSpec(
        bool, default=False, doc="the caller allows activations rounded to fp8 e4m3 (W4A8)", measured=False
    ),
}
_FLOAT = ("fp32", "bf16", "fp16")
_REFERENCE = "tokenspeed_kernel.reference.moe"
_CASES = "tokenspeed_kernel.numerics.cases.moe"
_TOKENS = (Size("tokens", "T, the tokens routed"),)
_ANY_MOE = {"activation": ANY, "clamp": ANY, "bias": ANY, "gate_up_interleaved": ANY, "up_offset": ANY}


def _bind_moe_route(router_logits: torch.Tensor, top_k: int, *, renormalize: bool = True) -> KernelCall:
    """Softmax top-k routing.

    Args:
        router_logits: ``[T, E]`` float logits (GPT-OSS: ``x @ W_r.T + b_r``).
        top_k: experts per token, ``1 <= top_k <= E``.
        renormalize: weights are ``softmax`` over the top-k logits (GPT-OSS);
            otherwise the full-softmax probabilities of the chosen experts.

    Returns:
        ``topk_weights float32 [T, top_k]`` (descending), ``topk_ids int32 [T, top_k]``.
        Ties go to the lower expert index.
    """
    check_tensor("router_logits", router_logits, dtypes=_X_DTYPES, dim=2)
    if not isinstance(top_k, int) or not 1 <= top_k <= router_logits.shape[1]:
        raise ValueError(f"top_k: expected an int in [1, {router_logits.shape[1]}], got {top_k!r}")
    sig = (DTYPE_NAMES[router_logits.dtype],)
    return kernel_call(
        router_logits.device, sig, {"renormalize": bool(renormalize)}, (router_logits.shape[0],),
        router_logits, top_k, renormalize=bool(renormalize),
    )  # fmt: skip


def _fake_moe_route(router_logits, top_k, *, renormalize=True):
    t = router_logits.shape[0]
    return (
        router_logits.new_empty((t, top_k), dtype=torch.float32),
        router_logits.new_empty((t, top_k), dtype=torch.int32),
    )


moe_route = Op(
    name="moe_route",
    family="moe",
    roles=("logits",),
    traits={"renormalize": TraitSpec(bool, default=True, doc="renormalize the top-k weights to sum to 1")},
    sizes=_TOKENS,
    doc="Softmax top-k routing.",
    bind=_bind_moe_route,
    fake=_fake_moe_route,
    reference=Reference(f"{_REFERENCE}:moe_route", formats=[{"logits": _FLOAT}], traits={"renormalize": ANY}),
    workload=f"{_CASES}:MOE_ROUTE",
)


def _bind_moe_gate(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    top_k: int,
    *,
    renormalize: bool = True,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float | None = None,
    residual: torch.Tensor | None = None,
) -> KernelCall:
    """The router: its linear layer and softmax top-k routing in one call, optionally after the RMSNorm it reads.

    The same results as ``moe_route(mm(x, weight, bias), top_k, renormalize=renormalize)``: the logits
    ``x @ weight.T + bias`` are accumulated in fp32 and rounded to ``x``'s dtype (as ``mm`` returns them), then
    routed; no logits tensor is made (a decode step's router: one call and one launch where there were two).

    With ``norm_weight``, the router reads ``h = rmsnorm(x, norm_weight, norm_eps, residual=residual)`` (``rmsnorm``'s
    numerics) instead of ``x`` and returns it too: the norm before a MoE layer, whose experts read ``h``, in the same
    call (a decode layer's post-attention norm: one call and one launch fewer).

    Args:
        x: ``[T, H]`` bf16/fp16/fp32, last dim contiguous.
        weight: ``[E, H]`` (the router's ``W_r``), ``x``'s dtype.
        bias: ``[E]`` of ``x``'s dtype, or None.
        top_k: experts per token, ``1 <= top_k <= E``.
        renormalize: as :func:`moe_route`.
        norm_weight: ``[H]`` (any float dtype; used in fp32), or None: no norm.
        norm_eps: with ``norm_weight`` (required then), added to the mean square.
        residual: with ``norm_weight``, ``[T, H]`` like ``x`` (last dim contiguous): the norm is of the stream
            ``s = x + residual``, rounded to ``x``'s dtype, which is returned too.

    Returns:
        ``topk_weights float32 [T, top_k]`` (descending), ``topk_ids int32 [T, top_k]``; ties go to the lower
        expert index. With ``norm_weight``, then ``h [T, H]`` (``x``'s dtype); with ``residual``, then ``s``.
    """
    check_tensor("x", x, dtypes=_X_DTYPES, dim=2, last_dim_contiguous=True)
    check_tensor("weight", weight, dtypes=(x.dtype,), shape=(None, x.shape[1]), contiguous=True)
    if bias is not None:
        check_tensor("bias", bias, dtypes=(x.dtype,), shape=(weight.shape[0],), contiguous=True)
    if norm_weight is None:
        if norm_eps is not None:
            raise ValueError("norm_eps: given without norm_weight (the norm needs both)")
        if residual is not None:
            raise ValueError("residual: given without norm_weight (the residual is added before the norm)")
    else:
        check_tensor("norm_weight", norm_weight, dtypes=_X_DTYPES, shape=(x.shape[1],), contiguous=True)
        if norm_eps is None:
            raise ValueError("norm_eps: required with norm_weight")
        norm_eps = check_float("norm_eps", norm_eps, minimum=0.0, expected="a finite float >= 0")
        if residual is not None:
            check_tensor("residual", residual, dtypes=(x.dtype,), shape=tuple(x.shape), last_dim_contiguous=True)
    check_same_device("x", x, weight=weight, bias=bias, norm_weight=norm_weight, residual=residual)
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= weight.shape[0]:
        raise ValueError(f"top_k: expected an int in [1, {weight.shape[0]}] (the experts of weight), got {top_k!r}")
    traits = {"renormalize": bool(renormalize), "bias": bias is not None}
    kwargs: dict = {"renormalize": bool(renormalize)}
    if norm_weight is not None:  # (only then: kernels without the norm take the plain call)
        traits["norm"] = True
        traits["fused_residual"] = residual is not None
        kwargs.update(norm_weight=norm_weight, norm_eps=norm_eps, residual=residual)
    return kernel_call(x.device, (DTYPE_NAMES[x.dtype],), traits, (x.shape[0],), x, weight, bias, top_k, **kwargs)


def _fake_moe_gate(x, weight, bias, top_k, *, renormalize=True, norm_weight=None, norm_eps=None, residual=None):
    t = x.shape[0]
    routed = (x.new_empty((t, top_k), dtype=torch.float32), x.new_empty((t, top_k), dtype=torch.int32))
    if norm_weight is None:
        return routed
    h = torch.empty_like(x, memory_format=torch.contiguous_format)
    return (*routed, h) if residual is None else (*routed, h, torch.empty_like(h))


moe_gate = Op(
    name="moe_gate",
    family="moe",
    roles=("x",),
    traits={
        "renormalize": TraitSpec(bool, default=True, doc="renormalize the top-k weights to sum to 1"),
        "bias": TraitSpec(bool, default=False, doc="the router has a bias"),
        "norm": TraitSpec(bool, default=False, doc="an RMSNorm of x first (norm_weight), its output returned"),
        "fused_residual": TraitSpec(bool, default=False, doc="with norm: add a residual first and return the sum"),
    },
    sizes=_TOKENS,
    doc="The router: logits by its linear layer, then softmax top-k routing, in one call (optionally after an "
    "RMSNorm of its input).",
    bind=_bind_moe_gate,
    fake=_fake_moe_gate,
    reference=Reference(
        f"{_REFERENCE}:moe_gate",
        formats=[{"x": _FLOAT}],
        traits={"renormalize": ANY, "bias": ANY, "norm": ANY, "fused_residual": ANY},
    ),
    workload=f"{_CASES}:MOE_GATE",
)


def _check_topk(topk_ids: torch.Tensor, tokens: int, num_experts: int, name: str = "topk_ids") -> None:
    check_tensor(name, topk_ids, dtypes=(torch.int32,), dim=2, contiguous=True)
    if topk_ids.shape[0] != tokens:
        raise ValueError(f"{name}: expected {tokens} rows (one per token), got {topk_ids.shape[0]}")
    ids = readable_values(topk_ids)
    if ids is not None and ids.numel():
        lo, hi = (int(v) for v in torch.aminmax(ids))
        if lo < 0 or hi >= num_experts:
            raise ValueError(f"{name}: expert ids must lie in [0, {num_experts}), got [{lo}, {hi}]")


def _bind_moe_dispatch(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int) -> KernelCall:
    """Group the ``T * k`` (token, expert) pairs by expert, without a host sync.

    Args:
        x: ``[T, H]`` hidden states.
        topk_ids: ``int32 [T, k]``.
        num_experts: ``E``.
    """
    check_tensor("x", x, dtypes=_X_DTYPES, dim=2)
    if not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts: expected an int >= 1, got {num_experts!r}")
    _check_topk(topk_ids, x.shape[0], num_experts)
    check_same_device("x", x, topk_ids=topk_ids)
    return kernel_call(x.device, (DTYPE_NAMES[x.dtype],), (), (x.shape[0],), x, topk_ids, num_experts)


def _fake_moe_dispatch(x, topk_ids, num_experts):
    rows = topk_ids.numel()
    return MoEDispatchResult(
        hidden=x.new_empty((rows, x.shape[1])),
        expert_offsets=x.new_empty((num_experts + 1,), dtype=torch.int32),
        permutation=x.new_empty((rows,), dtype=torch.int32),
    )


moe_dispatch = Op(
    name="moe_dispatch",
    family="moe",
    roles=("x",),
    traits={},
    sizes=_TOKENS,
    doc="Group token rows by expert.",
    bind=_bind_moe_dispatch,
    fake=_fake_moe_dispatch,
    reference=Reference(f"{_REFERENCE}:moe_dispatch", formats=[{"x": _FLOAT}]),
    workload=f"{_CASES}:MOE_DISPATCH",
)


def _weight_traits(weights: MoEWeights, activation: MoEActivation) -> dict[str, object]:
    return {
        "activation": activation.kind,
        "clamp": activation.limit is not None,
        "bias": weights.w13_bias is not None or weights.w2_bias is not None,
        "gate_up_interleaved": weights.gate_up_interleaved,
        "up_offset": float(activation.up_offset),
        "layout": weights.layout,
    }


def _check_weights(x: torch.Tensor, weights: MoEWeights, activation: MoEActivation) -> None:
    if not isinstance(weights, MoEWeights):
        raise TypeError(f"weights: expected MoEWeights, got {type(weights).__name__}")
    if not isinstance(activation, MoEActivation):
        raise TypeError(f"activation: expected MoEActivation, got {type(activation).__name__}")
    if weights.layout == "canonical":
        if not weights.__dict__.get("_validated"):
            try:
                weights.validate()
            except (TypeError, ValueError) as exc:  # name the op's argument too: "weights.w2: expected ..."
                raise type(exc)(f"weights.{exc}") from None
        if x.shape[-1] != weights.hidden:
            raise ValueError(f"x: expected hidden size {weights.hidden} (the weights'), got {x.shape[-1]}")
    if weights.w13.device != x.device:
        raise ValueError(f"weights: expected device {x.device} (like x), got {weights.w13.device}")


def _bind_moe_experts(
    hidden: torch.Tensor,
    expert_offsets: torch.Tensor,
    weights: MoEWeights,
    activation: MoEActivation,
    *,
    out: torch.Tensor | None = None,
) -> KernelCall:
    """Run each expert's MLP on its rows (no routing weight applied).

    Args:
        hidden: ``[N, H]`` rows grouped by expert (see :func:`moe_dispatch`).
        expert_offsets: ``int32 [E+1]``.
        weights: canonical :class:`MoEWeights` (or processed for the selected kernel).
        activation: :class:`MoEActivation`.
        out: optional ``[N, H]`` of ``hidden``'s dtype.
    """
    check_tensor("hidden", hidden, dtypes=_X_DTYPES, dim=2)
    _check_weights(hidden, weights, activation)
    check_tensor("expert_offsets", expert_offsets, dtypes=(torch.int32,), shape=(weights.num_experts + 1,))
    check_same_device("hidden", hidden, expert_offsets=expert_offsets, out=out)
    offsets = readable_values(expert_offsets)
    if offsets is not None:
        if int(offsets[0]) != 0 or bool((offsets.diff() < 0).any()) or int(offsets[-1]) != hidden.shape[0]:
            raise ValueError(
                f"expert_offsets: expected to start at 0, be non-decreasing and end at the {hidden.shape[0]} "
                f"rows of hidden, got {offsets.tolist()}"
            )
    if out is not None:
        check_tensor("out", out, dtypes=(hidden.dtype,), shape=tuple(hidden.shape))
    sig = (DTYPE_NAMES[hidden.dtype], weights.format)
    return kernel_call(
        hidden.device, sig, _weight_traits(weights, activation), (hidden.shape[0],),
        hidden, expert_offsets, weights, activation, out=out,
    )  # fmt: skip


def _fake_moe_experts(hidden, expert_offsets, weights, activation, *, out=None):
    return hidden.new_empty(hidden.shape)


moe_experts = Op(
    name="moe_experts",
    family="moe",
    roles=("x", "w"),
    traits=_MOE_TRAITS,
    sizes=(Size("rows", "N, the dispatched (token, expert) rows"),),
    doc="Grouped expert MLPs.",
    bind=_bind_moe_experts,
    fake=_fake_moe_experts,
    reference=Reference(f"{_REFERENCE}:moe_experts", formats=[{"x": _FLOAT, "w": WEIGHT_FORMATS}], traits=_ANY_MOE),
    workload=f"{_CASES}:MOE_EXPERTS",
)


def _bind_moe_combine(
    expert_out: torch.Tensor,
    permutation: torch.Tensor,
    topk_weights: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
) -> KernelCall:
    """``out[t] = sum_s topk_weights[t, s] * expert_out[row of (t, s)]``.

    Args:
        expert_out: ``[T*k, H]`` rows in dispatch order.
        permutation: ``int32 [T*k]`` from :func:`moe_dispatch`.
        topk_weights: ``float32 [T, k]``.
        out: optional ``[T, H]`` of ``expert_out``'s dtype.
    """
    check_tensor("expert_out", expert_out, dtypes=_X_DTYPES, dim=2)
    check_tensor("topk_weights", topk_weights, dtypes=(torch.float32,), dim=2)
    check_tensor("permutation", permutation, dtypes=(torch.int32,), shape=(topk_weights.numel(),))
    if expert_out.shape[0] != topk_weights.numel():
        raise ValueError(f"expert_out: expected {topk_weights.numel()} rows (T * k), got {expert_out.shape[0]}")
    check_same_device("expert_out", expert_out, permutation=permutation, topk_weights=topk_weights, out=out)
    perm = readable_values(permutation)
    if perm is not None and perm.numel():
        lo, hi = (int(v) for v in torch.aminmax(perm))
        if lo < 0 or hi >= perm.numel():
            raise ValueError(
                f"permutation: entries must lie in [0, {perm.numel()}) (token * k + slot), got [{lo}, {hi}]"
            )
    if out is not None:
        check_tensor("out", out, dtypes=(expert_out.dtype,), shape=(topk_weights.shape[0], expert_out.shape[1]))
    return kernel_call(
        expert_out.device, (DTYPE_NAMES[expert_out.dtype],), (), (topk_weights.shape[0],),
        expert_out, permutation, topk_weights, out=out,
    )  # fmt: skip


def _fake_moe_combine(expert_out, permutation, topk_weights, *, out=None):
    return expert_out.new_empty((topk_weights.shape[0], expert_out.shape[1]))


moe_combine = Op(
    name="moe_combine",
    family="moe",
    roles=("x",),
    traits={},
    sizes=_TOKENS,
    doc="Weighted sum of expert rows per token.",
    bind=_bind_moe_combine,
    fake=_fake_moe_combine,
    reference=Reference(f"{_REFERENCE}:moe_combine", formats=[{"x": _FLOAT}]),
    workload=f"{_CASES}:MOE_COMBINE",
)


def _bind_moe_apply(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: MoEWeights,
    activation: MoEActivation,
    *,
    plan: MoEPlan | None = None,
    out: torch.Tensor | None = None,
    fp8_activations: bool = False,
) -> KernelCall:
    """The fused MoE layer: ``sum_s w[t,s] * expert_{ids[t,s]}(x[t])``.

    Also exported as ``moe_fused`` (the name in the upstream README's API list): the
    same op object.

    Args:
        x: ``[T, H]``.
        topk_weights: ``float32 [T, k]``; topk_ids: ``int32 [T, k]``.
        weights: :class:`MoEWeights`, canonical or processed for ``plan``.
        activation: :class:`MoEActivation`.
        plan: from :func:`moe_plan`, for weights processed for it: checked against
            the weights and the activation (each call selects among the kernels
            of the plan's layout, by token count).
        out: optional ``[T, H]`` of ``x``'s dtype.
        fp8_activations: allow kernels that round the activations to fp8 e4m3 inside the layer
            (W4A8: ``x`` per token and the SwiGLU output, see
            :func:`tokenspeed_kernel.reference.moe.moe_apply_w4a8`); selection then ranks them with
            the others by measurement. Off by default: every eligible kernel keeps ``x``'s dtype.
    """
    check_tensor("x", x, dtypes=_X_DTYPES, dim=2)
    if not isinstance(fp8_activations, bool):
        raise TypeError(f"fp8_activations: expected a bool, got {type(fp8_activations).__name__}")
    _check_weights(x, weights, activation)
    _check_topk(topk_ids, x.shape[0], weights.num_experts)
    check_tensor("topk_weights", topk_weights, dtypes=(torch.float32,), shape=tuple(topk_ids.shape))
    check_same_device("x", x, topk_weights=topk_weights, topk_ids=topk_ids, out=out)
    if out is not None:
        check_tensor("out", out, dtypes=(x.dtype,), shape=tuple(x.shape))
    if plan is not None:
        if not isinstance(plan, MoEPlan):
            raise TypeError(f"plan: expected a MoEPlan (from moe_plan), got {type(plan).__name__}")
        if plan.activation != activation:
            raise ValueError(f"activation: {activation} differs from the plan's {plan.activation}")
        if plan.layout != weights.layout:
            raise ValueError(
                f"weights: layout {weights.layout!r} is not the plan's {plan.layout!r}; "
                "convert them with moe_process_weights(plan, weights)"
            )
    sig = (DTYPE_NAMES[x.dtype], weights.format)
    traits = _weight_traits(weights, activation)
    if fp8_activations:
        traits["fp8_activations"] = ANY
    return kernel_call(
        x.device, sig, traits, (x.shape[0],),
        x, topk_weights, topk_ids, weights, activation, out=out,
    )  # fmt: skip


def _fake_moe_apply(x, topk_weights, topk_ids, weights, activation, *, plan=None, out=None, fp8_activations=False):
    return x.new_empty(x.shape)


moe_apply = Op(
    name="moe_apply",
    family="moe",
    roles=("x", "w"),
    traits=_MOE_TRAITS,
    sizes=_TOKENS,
    doc="Fused MoE layer.",
    bind=_bind_moe_apply,
    fake=_fake_moe_apply,
    reference=Reference(f"{_REFERENCE}:moe_apply", formats=[{"x": _FLOAT, "w": WEIGHT_FORMATS}], traits=_ANY_MOE),
    workload=f"{_CASES}:MOE_APPLY",
)
#: Alias (the upstream README's name): the same op object, so its name, selection and custom op are
#: ``moe_apply``'s.
moe_fused = moe_apply


def moe_plan(
    weights: MoEWeights,
    activation: MoEActivation,
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str | None = None,
    tokens: int | None = None,
    solution: Target | None = None,
    override: Target | None = None,
    fp8_activations: bool = False,
) -> MoEPlan:
    """Pick this layer's weight layout once: the layout of the ``moe_apply`` kernel
    ranked first (host-side work only).

    Args:
        weights: canonical :class:`MoEWeights` (their format, biases, interleaving
            decide the traits).
        activation: :class:`MoEActivation`.
        dtype: the activations' dtype.
        device: where the layer runs (default: the weights' device).
        tokens: the typical tokens per call, if known (ranks kernels for that
            bucket); None ranks by the measurements of every token count.
        fp8_activations: the calls will allow W4A8 kernels (``moe_apply(fp8_activations=True)``):
            their layouts compete too.
    """
    if not isinstance(weights, MoEWeights):
        raise TypeError(f"weights: expected MoEWeights, got {type(weights).__name__}")
    weights.validate()
    if dtype not in _X_DTYPES:
        raise TypeError(f"dtype: expected bf16, fp16 or fp32, got {dtype}")
    dev = torch.device(device) if device is not None else weights.w13.device
    sig = (DTYPE_NAMES[dtype], weights.format)
    # layout=ANY: kernels of every layout compete; the winner's layout is the plan's.
    traits = {**_weight_traits(weights, activation), "layout": ANY}
    if fp8_activations:
        traits["fp8_activations"] = ANY
    sizes = None if tokens is None else {"tokens": tokens}
    sel = select_spec(
        "moe_apply", sig, traits, sizes=sizes, platform=platform_for_device(dev), solution=solution, override=override
    ).for_graph  # (a plan fixes the weights' layout for eager and captured calls alike: ranked by device time)
    return MoEPlan(kernel=sel.spec.name, layout=sel.spec.weight_layout, format=weights.format, activation=activation)


def moe_process_weights(plan: MoEPlan, weights: MoEWeights) -> MoEWeights:
    """Convert canonical weights to the planned kernel's layout; returns new tensors.

    The input is never modified. Weights already in the plan's layout are
    returned as they are.
    """
    if weights.layout == plan.layout:
        return weights
    if weights.layout != "canonical":
        raise ValueError(f"weights: layout {weights.layout!r} can only be converted from 'canonical'")
    weights.validate()
    spec = registry.get(plan.kernel)
    if spec is None:
        raise ValueError(f"plan: kernel {plan.kernel!r} is no longer registered")
    if spec.weight_preprocessor is None:
        # The plan's kernel reads a layout another kernel's preprocessor writes.
        spec = next((s for s in registry.for_op("moe_apply") if s.weight_preprocessor is not None
                     and s.weight_layout == plan.layout), None)  # fmt: skip
        if spec is None:
            raise ValueError(f"plan: no registered kernel converts weights to layout {plan.layout!r}")
    converted = spec.resolve_weight_preprocessor()(weights)
    if not isinstance(converted, MoEWeights):
        raise TypeError(f"weight preprocessor of {spec.name!r} returned {type(converted).__name__}, not MoEWeights")
    converted = replace(converted, layout=plan.layout)
    converted._checked()  # (a converted layout is opaque: the ops check its layout, device and flags)
    return converted

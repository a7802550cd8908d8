"""Every tolerance ``verify`` uses, in one place, with the reason for each.

A kernel's output is compared with the reference run on the same inputs, upcast
to fp32 where the op allows it (see each op's cases), so the reference stands for
the exact result and the tolerance only has to cover the kernel's own rounding.
Notation: ``eps(dt)`` is the machine epsilon of ``dt`` (the spacing of numbers
just above 1): fp32 ``2**-23``, tf32 ``2**-10``, fp16 ``2**-10``, bf16 ``2**-7``.
Rounding to nearest costs at most ``eps/2`` relative.

An element passes when ``|got - want| <= atol + rtol * |want|`` with
``atol = atol_rms * rms(want) + atol_floor``: the absolute part scales with the
output's magnitude so that one tolerance fits a tensor of any scale, and covers
elements near zero whose error is relative to their neighbours, not to
themselves (cancellation in ``x1*cos - x2*sin``, in ``sum p*v`` over keys).

======================  ========================  ==========================================================
kind                    rtol / atol_rms           why
======================  ========================  ==========================================================
``elementwise``         2 eps(out) / 8 eps(fp32)  computed in fp32 from inputs the reference sees exactly,
                                                  rounded once (eps/2), maybe twice (rmsnorm's residual sum
                                                  is rounded to the input dtype before normalising); fp32
                                                  transcendentals (exp2, rsqrt approximations) are within a
                                                  few ulp, hence the fp32 term.
``matmul``              2 eps(out) / 4 eps(op)    fp32 accumulation of products that are exact in fp32
                                                  (bf16/fp16/fp8/e2m1 operands), plus up to two roundings of
                                                  an intermediate to the activation dtype (attention's P
                                                  before P@V; MoE's gate/up and the activation before the
                                                  down projection). Each costs eps/2 relative per term;
                                                  summed over the reduction with random signs the error is
                                                  ~eps/2 * rms(out), and the largest of ~1e7 such errors is
                                                  ~5 sigma, hence 4 eps. fp32 operands use eps(tf32):
                                                  Triton's ``tl.dot`` and cuBLAS may use TF32 tensor cores.
``lse``                 16 eps(fp32) / 8 eps(op)  the log-sum-exp is fp32; scores are exact products summed
                                                  in fp32 (TF32 for fp32 inputs), exp2/log2 approximations
                                                  add ~2 ulp; floor 1e-4 for the natural-log units.
``softmax``             2**-16 / 0                router weights: fp32 softmax over <= 256 logits; summation
                                                  order moves the result by a few ulp per term.
``recurrence``          2 eps(out) / 8 eps(op)    linear attention (gated delta rule): ``matmul``'s error plus the
                                                  chunked forms' roundings of the corrected values and the
                                                  decayed keys to the operand dtype before the state and output
                                                  dots (tensor cores), which then propagate through the state
                                                  from chunk to chunk (damped by the decay): twice matmul's.
``fp8_matmul``          ``matmul``, and up to     W4A8 (a kernel rounding activations to E4M3) against the
                        0.1 % of the elements     float32 W4A8 reference, which rounds the same values: the
                        within 16 x it            two compute the values before each rounding in different
                                                  orders, so a value on a code boundary can round to the
                                                  neighbouring code (one E4M3 step, 16 x bf16's), which moves
                                                  the outputs of its token. A broken kernel misses on most
                                                  elements, or by more than a step.
``exact``               0 / 0                     integers, copies, permutations, and dequantisation (every
                                                  E2M1 x E8M0 value is exact in bf16/fp16/fp32 in range).
``quantized``           one code step, 0.1 %      FP8/E2M1 codes: ``x / scale`` and ``x * (1 / scale)``
                                                  differ by an ulp, which flips the rounding of values that
                                                  sit on a code boundary. At most 0.1 % of the codes may
                                                  differ, each by one step; scales must match to 2 ulp.
``tokens``              max(1, 1 %) of the rows   sampling: the same uniforms pick the same token unless
                                                  ``u * mass`` falls within fp32 rounding of a cumulative
                                                  sum boundary, or a probability sits on the top-k/top-p
                                                  threshold; kernels summing in another order may then pick
                                                  a neighbour. A broken kernel misses on most rows.
======================  ========================  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["EPS", "Tolerance", "tolerance", "dtype_eps", "TOKEN_MISMATCH_FRACTION", "CODE_MISMATCH_FRACTION"]

#: Machine epsilon per precision name (tf32: the tensor-core format fp32 matmuls may use).
EPS: dict[str, float] = {
    "fp32": 2.0**-23,
    "tf32": 2.0**-10,
    "fp16": 2.0**-10,
    "bf16": 2.0**-7,
    "fp8_e4m3": 2.0**-3,
}

#: ``tokens``: rows allowed to differ, as a fraction (at least one row is always allowed).
TOKEN_MISMATCH_FRACTION = 0.01
#: ``quantized``: codes allowed to differ (each by one step at most).
CODE_MISMATCH_FRACTION = 1e-3


@dataclass(frozen=True)
class Tolerance:
    """``|got - want| <= atol_rms * rms(want) + atol_floor + rtol * |want|``, elementwise."""

    kind: str
    rtol: float
    atol_rms: float
    atol_floor: float = 0.0
    #: Fraction of elements (codes, rows) allowed to differ at all (``quantized`` / ``tokens``), or
    #: to exceed the tolerance by up to ``outlier_scale`` times (``fp8_matmul``).
    mismatch_fraction: float = 0.0
    outlier_scale: float = 0.0

    def atol(self, rms: float) -> float:
        return self.atol_rms * rms + self.atol_floor

    def describe(self) -> str:
        if self.kind == "exact":
            return "exact"
        if self.kind == "tokens":
            return f"tokens: <= max(1, {self.mismatch_fraction:.0%}) rows differ"
        if self.kind == "quantized":
            return f"codes: <= {self.mismatch_fraction:.1%} differ by one step"
        floor = f" + {self.atol_floor:.2g}" if self.atol_floor else ""
        text = f"rtol {self.rtol:.2g}, atol {self.atol_rms:.2g} x rms{floor}"
        if self.outlier_scale:
            text += f"; <= {self.mismatch_fraction:.1%} within {self.outlier_scale:g} x"
        return text


def dtype_eps(dtype: str | torch.dtype) -> float:
    """Machine epsilon of a dtype (``torch.dtype`` or its short name)."""
    if isinstance(dtype, torch.dtype):
        from ..core.formats import dtype_name

        dtype = dtype_name(dtype)
    try:
        return EPS[dtype]
    except KeyError:
        raise ValueError(f"dtype: no epsilon for {dtype!r}; known: {sorted(EPS)}") from None


def tolerance(kind: str, dtype: str | torch.dtype = "fp32") -> Tolerance:
    """The tolerance of ``kind`` (see the module table) for outputs of ``dtype``.

    Args:
        kind: ``elementwise``, ``matmul``, ``fp8_matmul``, ``recurrence``, ``lse``, ``softmax``,
            ``exact``, ``quantized`` or ``tokens``.
        dtype: the dtype the kernel computes in (its activation dtype; for
            ``lse`` the dtype of ``q``), a ``torch.dtype`` or a short name.
    """
    name = dtype if isinstance(dtype, str) else None
    if name is None:
        from ..core.formats import dtype_name

        name = dtype_name(dtype)  # type: ignore[arg-type]
    eps32 = EPS["fp32"]
    # The precision matmul-like work runs at: TF32 for fp32 operands (tensor cores).
    op_eps = EPS["tf32"] if name == "fp32" else EPS.get(name, EPS["bf16"])
    out_eps = EPS.get(name, eps32)
    if kind == "elementwise":
        return Tolerance(kind, rtol=2 * out_eps, atol_rms=8 * eps32)
    if kind == "matmul":
        return Tolerance(kind, rtol=2 * out_eps, atol_rms=4 * op_eps)
    if kind == "fp8_matmul":
        return Tolerance(kind, rtol=2 * out_eps, atol_rms=4 * op_eps, mismatch_fraction=CODE_MISMATCH_FRACTION,
                         outlier_scale=EPS["fp8_e4m3"] / EPS["bf16"])  # fmt: skip
    if kind == "lse":
        lse_eps = EPS["tf32"] if name == "fp32" else eps32
        return Tolerance(kind, rtol=16 * eps32, atol_rms=8 * lse_eps, atol_floor=1e-4)
    if kind == "recurrence":
        return Tolerance(kind, rtol=2 * out_eps, atol_rms=8 * op_eps)
    if kind == "softmax":
        return Tolerance(kind, rtol=2.0**-16, atol_rms=0.0, atol_floor=1e-7)
    if kind == "exact":
        return Tolerance(kind, rtol=0.0, atol_rms=0.0)
    if kind == "quantized":
        return Tolerance(kind, rtol=0.0, atol_rms=0.0, mismatch_fraction=CODE_MISMATCH_FRACTION)
    if kind == "tokens":
        return Tolerance(kind, rtol=0.0, atol_rms=0.0, mismatch_fraction=TOKEN_MISMATCH_FRACTION)
    raise ValueError(
        f"kind: unknown tolerance kind {kind!r}; expected elementwise, matmul, fp8_matmul, recurrence, lse, softmax, exact, "
        "quantized or tokens"
    )

"""Comparing a kernel's outputs with the reference's: errors, worst elements, verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .tolerances import Tolerance

__all__ = ["Check", "check_close", "check_exact", "check_codes", "check_tokens", "WORST"]

#: How many of the worst elements a failing check shows.
WORST = 5


@dataclass
class Check:
    """The verdict on one output tensor."""

    output: str
    passed: bool
    tolerance: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    #: largest ``error / allowed error`` (< 1 passes; None for exact/count checks).
    ratio: float | None = None
    mismatches: int = 0
    total: int = 0
    #: ``(index, got, want)`` of the worst elements (failing checks only).
    worst: list[tuple[tuple[int, ...], float, float]] = field(default_factory=list)
    note: str = ""

    def summary(self) -> str:
        if self.note and not self.total:
            return f"{self.output}: {self.note}"
        parts = [f"{self.output}: max_abs {self.max_abs:.3g} max_rel {self.max_rel:.3g}"]
        if self.ratio is not None:
            parts.append(f"({self.ratio:.2g} x tol)")
        if self.mismatches:
            parts.append(f"{self.mismatches}/{self.total} differ")
        if self.note:
            parts.append(self.note)
        return " ".join(parts)

    def worst_text(self) -> str:
        return "; ".join(f"[{','.join(str(i) for i in idx)}] got {g:.6g} want {w:.6g}" for idx, g, w in self.worst)

    def to_json(self) -> dict:
        return {
            "output": self.output,
            "passed": self.passed,
            "tolerance": self.tolerance,
            "max_abs": _finite(self.max_abs),
            "max_rel": _finite(self.max_rel),
            "ratio": _finite(self.ratio),
            "mismatches": self.mismatches,
            "total": self.total,
            "worst": [{"index": list(i), "got": _finite(g), "want": _finite(w)} for i, g, w in self.worst],
            "note": self.note,
        }


def _finite(x: float | None) -> float | str | None:
    if x is None or math.isfinite(x):
        return x
    return str(x)


def _unravel(flat: int, shape: torch.Size) -> tuple[int, ...]:
    idx = []
    for n in reversed(shape):
        idx.append(flat % n if n else 0)
        flat //= max(n, 1)
    return tuple(reversed(idx))


def _shape_mismatch(name: str, got: object, want: torch.Tensor, tol: str) -> Check | None:
    if not isinstance(got, torch.Tensor):
        return Check(name, False, tol, note=f"expected a tensor, got {type(got).__name__}")
    if tuple(got.shape) != tuple(want.shape):
        return Check(name, False, tol, note=f"shape {list(got.shape)} != reference {list(want.shape)}")
    return None


def _stats(got: torch.Tensor, want: torch.Tensor, scale: float) -> tuple[torch.Tensor, float, float]:
    err = (got - want).abs()
    same = (got == want) | (got.isnan() & want.isnan())
    err = torch.where(same, torch.zeros_like(err), err)
    err = torch.nan_to_num(err, nan=math.inf)
    max_abs = float(err.max()) if err.numel() else 0.0
    rel = err / torch.clamp(want.abs(), min=max(scale * 1e-3, 1e-30))
    max_rel = float(rel.max()) if rel.numel() else 0.0
    return err, max_abs, max_rel


def check_close(name: str, got: object, want: torch.Tensor, tol: Tolerance) -> Check:
    """``|got - want| <= atol + rtol * |want|`` elementwise (equal infinities and NaN pairs match).

    The relative error shown divides by ``max(|want|, 1e-3 * rms(want))`` so that
    elements near zero do not swamp it.
    """
    bad = _shape_mismatch(name, got, want, tol.describe())
    if bad is not None:
        return bad
    assert isinstance(got, torch.Tensor)
    g = got.detach().to(torch.float32)
    w = want.detach().to(g.device, torch.float32)
    ref_nan = int(w.isnan().sum())
    if ref_nan:
        # No case is built to produce NaN: a NaN reference means a degenerate case, never a pass.
        return Check(name, False, tol.describe(), total=g.numel(), note=f"the reference has {ref_nan} NaN")
    finite = w[w.isfinite()]
    rms = float(finite.square().mean().sqrt()) if finite.numel() else 0.0
    err, max_abs, max_rel = _stats(g, w, rms)
    allowed = tol.atol(rms) + tol.rtol * torch.nan_to_num(w.abs(), posinf=0.0)
    ratio_t = err / allowed.clamp(min=1e-30)
    violations = ratio_t > 1.0
    mismatches = int(violations.sum())
    ratio = float(ratio_t.max()) if ratio_t.numel() else 0.0
    worst = []
    if mismatches:
        k = min(WORST, mismatches)
        top = ratio_t.flatten().topk(k).indices.tolist()
        gf, wf = g.flatten(), w.flatten()
        worst = [(_unravel(i, g.shape), float(gf[i]), float(wf[i])) for i in top]
    passed = mismatches == 0
    if tol.outlier_scale:
        passed = mismatches <= math.floor(tol.mismatch_fraction * g.numel()) and ratio <= tol.outlier_scale
    return Check(name, passed, tol.describe(), max_abs, max_rel, ratio, mismatches, g.numel(), worst)


def check_exact(name: str, got: object, want: torch.Tensor) -> Check:
    """Bitwise-equal values (NaN pairs match)."""
    bad = _shape_mismatch(name, got, want, "exact")
    if bad is not None:
        return bad
    assert isinstance(got, torch.Tensor)
    g = got.detach()
    w = want.detach().to(g.device)
    if g.dtype != w.dtype:
        return Check(name, False, "exact", note=f"dtype {g.dtype} != reference {w.dtype}")
    if g.is_floating_point() and g.dtype.itemsize == 1:
        g, w = g.float(), w.float()
    same = g == w
    if g.is_floating_point():
        same |= g.isnan() & w.isnan()
    mismatches = int((~same).sum())
    max_abs = max_rel = 0.0
    worst = []
    if mismatches:
        gf, wf = g.flatten().double(), w.flatten().double()
        diff = torch.where(same.flatten(), torch.zeros_like(gf), (gf - wf).abs().nan_to_num(nan=math.inf))
        max_abs = float(diff.max())
        max_rel = float((diff / wf.abs().clamp(min=1e-30)).max())
        idx = (~same).flatten().nonzero().flatten()[:WORST].tolist()
        worst = [(_unravel(i, g.shape), float(gf[i]), float(wf[i])) for i in idx]
    return Check(name, mismatches == 0, "exact", max_abs, max_rel, None, mismatches, g.numel(), worst)


def check_codes(name: str, got: torch.Tensor, want: torch.Tensor, step: torch.Tensor, tol: Tolerance) -> Check:
    """Quantized values (dequantized, so scale and code both count): at most
    ``tol.mismatch_fraction`` of them may differ, each by at most one code ``step``."""
    bad = _shape_mismatch(name, got, want, tol.describe())
    if bad is not None:
        return bad
    g = got.detach().to(torch.float32)
    w = want.detach().to(g.device, torch.float32)
    st = step.to(g.device, torch.float32)
    diff = (g - w).abs().nan_to_num(nan=math.inf)
    differ = diff > 0
    mismatches = int(differ.sum())
    too_far = diff > st * (1 + 1e-6)
    far = int(too_far.sum())
    allowed = math.floor(tol.mismatch_fraction * g.numel())
    passed = far == 0 and mismatches <= allowed
    max_abs = float(diff.max()) if diff.numel() else 0.0
    max_rel = float((diff / w.abs().clamp(min=1e-30)).max()) if diff.numel() else 0.0
    worst = []
    if not passed:
        order = (diff / st.clamp(min=1e-30)).flatten()
        top = order.topk(min(WORST, max(mismatches, 1))).indices.tolist()
        gf, wf = g.flatten(), w.flatten()
        worst = [(_unravel(i, g.shape), float(gf[i]), float(wf[i])) for i in top]
    note = f"{far} beyond one step" if far else ""
    return Check(name, passed, tol.describe(), max_abs, max_rel, None, mismatches, g.numel(), worst, note)


def check_tokens(name: str, got: object, want: torch.Tensor, tol: Tolerance) -> Check:
    """Sampled token ids: at most ``max(1, mismatch_fraction * rows)`` rows may differ."""
    bad = _shape_mismatch(name, got, want, tol.describe())
    if bad is not None:
        return bad
    assert isinstance(got, torch.Tensor)
    if got.dtype != want.dtype:
        return Check(name, False, tol.describe(), note=f"dtype {got.dtype} != reference {want.dtype}")
    differ = got.detach() != want.detach().to(got.device)
    mismatches = int(differ.sum())
    allowed = max(1, math.floor(tol.mismatch_fraction * got.numel()))
    worst = []
    if mismatches:
        idx = differ.flatten().nonzero().flatten()[:WORST].tolist()
        gf, wf = got.flatten(), want.flatten()
        worst = [(_unravel(i, got.shape), float(gf[i]), float(wf[i])) for i in idx]
    passed = mismatches <= allowed
    note = f"{mismatches} of {got.numel()} rows differ (<= {allowed} allowed)" if mismatches else ""
    return Check(
        name, passed, tol.describe(), 0.0, 0.0, None, mismatches, got.numel(), worst if not passed else [], note
    )

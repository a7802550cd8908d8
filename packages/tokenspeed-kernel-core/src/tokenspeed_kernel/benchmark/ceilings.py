"""The device's ceilings, measured at the start of a run (PERFORMANCE.md: ratios, not absolutes).

- copy bandwidth: a device-to-device copy of 1 GiB (bytes read + written) / time;
- bf16 matmul rate: ``torch.mm`` 8192^3;
- fp8 matmul rate: ``torch._scaled_mm`` 8192^3, e4m3, per-tensor scales (None if unsupported).

On a CPU the same quantities are measured small (64 MiB copy, fp32 ``torch.mm`` 512^3,
no fp8) so that percentages are defined; they mean little there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .timer import time_fn

__all__ = ["Ceilings", "measure_ceilings"]


@dataclass
class Ceilings:
    copy_tbps: float | None = None
    bf16_tflops: float | None = None
    fp8_tflops: float | None = None
    notes: list[str] = field(default_factory=list)

    def compute_tflops(self, compute: str) -> float | None:
        return self.fp8_tflops if compute == "fp8" else self.bf16_tflops

    def to_json(self) -> dict[str, Any]:
        return {
            "copy_tbps": self.copy_tbps,
            "bf16_tflops": self.bf16_tflops,
            "fp8_tflops": self.fp8_tflops,
            "notes": list(self.notes),
        }


def _copy_rate(nbytes: int, device: torch.device, **timing: Any) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    t = time_fn(lambda: dst.copy_(src), device=device, flush_l2=False, **timing)
    return 2.0 * nbytes / (t.median_us * 1e-6) / 1e12


def _matmul_rate(n: int, dtype: torch.dtype, device: torch.device, **timing: Any) -> float:
    a = torch.randn(n, n, device=device, dtype=torch.float32).to(dtype)
    b = torch.randn(n, n, device=device, dtype=torch.float32).to(dtype)
    t = time_fn(lambda: torch.mm(a, b), device=device, flush_l2=False, **timing)
    return 2.0 * n**3 / (t.median_us * 1e-6) / 1e12


def _fp8_rate(n: int, device: torch.device, **timing: Any) -> float:
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    # _scaled_mm wants the second operand column-major: the transpose of a row-major matrix.
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device=device, dtype=torch.float32)
    fn = lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    fn()
    t = time_fn(fn, device=device, flush_l2=False, **timing)
    return 2.0 * n**3 / (t.median_us * 1e-6) / 1e12


def measure_ceilings(device: torch.device | str) -> Ceilings:
    """Measure copy bandwidth and matmul rates on ``device`` (a few seconds on a GPU)."""
    dev = torch.device(device)
    c = Ceilings()
    if dev.type == "cuda":
        nbytes, n, dtype, timing = 2**30, 8192, torch.bfloat16, {"warmup_ms": 50.0, "rep_ms": 200.0}
    else:
        nbytes, n, dtype, timing = 64 * 2**20, 512, torch.float32, {"warmup_ms": 5.0, "rep_ms": 50.0}
        c.notes.append("cpu: 64 MiB copy and fp32 512^3 matmul stand in for the device ceilings")
    c.copy_tbps = _copy_rate(nbytes, dev, **timing)
    c.bf16_tflops = _matmul_rate(n, dtype, dev, **timing)
    if dev.type == "cuda":
        try:
            c.fp8_tflops = _fp8_rate(n, dev, **timing)
        except Exception as exc:  # no fp8 on this GPU / torch build
            c.notes.append(f"fp8 matmul ceiling unavailable: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    return c

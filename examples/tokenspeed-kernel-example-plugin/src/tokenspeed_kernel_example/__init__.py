"""Example plugin: a fused SiLU-and-mul written in plain torch, registered for the CPU.

It shows the three things a kernel package does: implement a function with the
public op's kernel arguments, declare what it supports (formats, traits,
capability, priority), and expose a zero-argument ``register()`` as an entry point.
"""

from __future__ import annotations

import torch

from tokenspeed_kernel import Capability, Priority, register_kernel


def silu_and_mul_chunked(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(gate) * up`` computed with torch.chunk (fp32 math, one cast)."""
    gate, up = x.float().chunk(2, dim=-1)
    y = (torch.nn.functional.silu(gate) * up).to(x.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y


def register() -> None:
    register_kernel(
        "silu_and_mul",
        name="example.silu_and_mul",
        solution="example",
        formats=[{"x": ("fp32", "bf16")}],
        capability=Capability(vendors=frozenset({"cpu"})),
        priority=Priority.PORTABLE + 1,
        tags=("deterministic",),
        impl=silu_and_mul_chunked,
    )

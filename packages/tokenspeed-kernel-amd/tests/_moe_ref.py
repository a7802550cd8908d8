"""An independent PyTorch reference of the MXFP4 MoE layer, W4A8 included, and random
GPT-OSS-style inputs (the tests' helpers; nothing here calls the package's kernels).

Routing and dequantization come from ``tokenspeed_kernel.reference`` (core); the FP8
rounding of the GEMM inputs is torch's E4M3 cast (round to nearest even, saturated
first), as vLLM's ``torch_experts`` reference does.
"""

from __future__ import annotations

import torch

from tokenspeed_kernel.reference.moe import moe_route
from tokenspeed_kernel.reference.quantization import mxfp4_to_float


def fp8_round(v: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    if scale is None:
        return v
    s = scale.reshape(()).to(torch.float32)
    return (v / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32) * s


def moe_reference(x, weights, *, top_k, router_logits=None, topk=None, a1=None, a2=None, alpha=1.702, limit=7.0,
                  beta=1.0, interleaved=True):  # fmt: skip
    """``float32 [T, H]``. ``weights = (w13, s13, w2, s2, b13, b2)`` canonical MXFP4 (b* may be None)."""
    w13, s13, w2, s2, b13, b2 = weights
    if topk is None:
        wts, ids = moe_route(router_logits, top_k, renormalize=True)
    else:
        wts, ids = topk
    xf = fp8_round(x.to(torch.float32), a1)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    inter = w13.shape[1] // 2
    for e in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == e, as_tuple=True)
        h = xf[tok] @ mxfp4_to_float(w13[e], s13[e]).T
        if b13 is not None:
            h = h + b13[e].float()
        gate, up = (h[:, 0::2], h[:, 1::2]) if interleaved else (h[:, :inter], h[:, inter:])
        if limit is not None:
            gate = gate.clamp(max=limit)
            up = up.clamp(-limit, limit)
        y = fp8_round((up + beta) * gate * torch.sigmoid(alpha * gate), a2)
        o = y @ mxfp4_to_float(w2[e], s2[e]).T
        if b2 is not None:
            o = o + b2[e].float()
        out.index_add_(0, tok, o * wts[tok, slot].unsqueeze(1))
    return out


def random_experts(e, h, i, *, bias=True, device="cpu", seed=0):
    """MXFP4 experts with every E2M1 code and E8M0 scales 2^-9 .. 2^-5 (vLLM's test range)."""
    g = torch.Generator().manual_seed(seed)

    def ri(lo, hi, *shape):
        return torch.randint(lo, hi, shape, generator=g, dtype=torch.uint8).to(device)

    w13, s13 = ri(0, 256, e, 2 * i, h // 2), ri(118, 123, e, 2 * i, h // 32)
    w2, s2 = ri(0, 256, e, h, i // 2), ri(118, 123, e, h, i // 32)
    b13 = (torch.randn(e, 2 * i, generator=g) * 0.1).to(device) if bias else None
    b2 = (torch.randn(e, h, generator=g) * 0.1).to(device) if bias else None
    return w13, s13, w2, s2, b13, b2

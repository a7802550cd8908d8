"""Float64 emulation of the f16 GEMV gate/up (GemvTile dot "f16i": activations times 2**t as f16, four f16 sums
of 8 products a block, each rounded to f16 once an FMA) against the exact sums, before and after GPT-OSS SwiGLU
(alpha 1.702, limit 7, up offset 1), for 1024 random feature pairs of K = 2880 (session 34, issue 13; CPU only).

    python docs/benchmarks/h200-2026-12-01/host-cost/s34-sass/f16_swiglu_emulation.py
"""

import torch

torch.manual_seed(0)
E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float64)
R, K = 1024, 2880


def run(xs, lo=118, hi=128):
    w = E2M1[torch.randint(0, 16, (2, R, K))]
    sc = torch.randint(lo, hi, (2, R, K // 32)).double()
    x = (torch.randn(K) * xs).to(torch.bfloat16).double()
    terms = (w * x).view(2, R, K // 32, 32) * 2.0 ** (sc - 127)[..., None]
    ref = terms.sum((-1, -2))
    t = 14 - torch.floor(torch.log2(x.abs().max()))
    xh = (x * 2.0**t).half().double()
    prod = (w * 2.0**-14 * xh).view(2, R, K // 32, 4, 8)  # 4 chains of 8 products a block
    acc = torch.zeros(2, R, K // 32, 4, dtype=torch.float64)
    for i in range(8):
        acc = (acc + prod[..., i]).half().double()
    got = (acc.sum(-1) * 2.0 ** (sc - 127 + 14 - t)).sum(-1)

    def swiglu(g, u):
        g = g.clamp(max=7.0)
        u = u.clamp(-7.0, 7.0)
        return g * torch.sigmoid(1.702 * g) * (u + 1)

    a, b = swiglu(ref[0], ref[1]), swiglu(got[0], got[1])
    pre = ((got - ref).norm() / ref.norm()).item()
    return pre, ((b - a).norm() / a.norm()).item(), ((a.to(torch.bfloat16).double() - a).norm() / a.norm()).item()


for xs in (1.0, 2.0**10, 2.0**20, 2.0**-30):
    pre, inter, bf16 = run(xs)
    print(
        f"x scale {xs}: pre-activation rel err {pre:.2e}, inter rel err {inter:.2e}, bf16 rounding of inter {bf16:.2e}"
    )
pre, inter, bf16 = run(1.0, 118, 230)
print(f"scale bytes 118-229, x scale 1: pre-activation rel err {pre:.2e}, inter rel err {inter:.2e}, bf16 {bf16:.2e}")

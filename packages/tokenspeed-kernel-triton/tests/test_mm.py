"""Triton ``mm`` through the public API: 16/32-bit, FP8 (tensor/row/block128 scales), MXFP4 weights.

Every call goes through ``tokenspeed_kernel.mm``; selection must pick the Triton kernel
(asserted with ``select_spec``). Results are checked against an independent float64
formula written here and against ``tokenspeed_kernel.reference``. On CPU the kernel runs
under ``TRITON_INTERPRET=1`` at tiny shapes chosen to hit the edges of the interpreter
tiles (K tails, odd N, wrap-around rows, M = 1, split-K, the MXFP4 GEMV); every row of
every family's config table runs too. The ``gpu``-marked tests repeat them at GPT-OSS shapes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _checks import E2M1, assert_close, assert_triton

import tokenspeed_kernel as tk
from tokenspeed_kernel.core.formats import DTYPE_NAMES
from tokenspeed_kernel.reference import gemm as ref_gemm
from tokenspeed_kernel.reference import quantization as ref_quant
from tokenspeed_kernel_triton import mm
from tokenspeed_kernel_triton._host import arch_family
from tokenspeed_kernel_triton.mm import MM_CONFIGS

pytestmark = pytest.mark.usefixtures("triton_on_gpu")


def _mm64(a, b, bias=None, a_scale=None, b_scale=None) -> torch.Tensor:
    """Independent float64 GEMM: dequantise with explicit loops over scale blocks."""
    a64 = a.to(torch.float64)
    m, k = a.shape
    if a_scale is not None:
        a64 = a64 * _expand64(a_scale, m, k, weight=False)
    if b.dtype == torch.uint8:
        b64 = _mxfp4_64(b, b_scale)
    else:
        b64 = b.to(torch.float64)
        if b_scale is not None:
            b64 = b64 * _expand64(b_scale, b.shape[0], k, weight=True)
    y = a64 @ b64.T
    return y + bias.to(torch.float64) if bias is not None else y


def _expand64(scale: torch.Tensor, rows: int, cols: int, *, weight: bool) -> torch.Tensor:
    s = scale.to(torch.float64)
    if s.numel() == 1:
        return s.reshape(1, 1).expand(rows, cols)
    if s.shape == (rows, 1):
        return s.expand(rows, cols)
    # element (r, c) takes the scale of block (r // 128 for weights, else r; c // 128)
    r = torch.arange(rows) // (128 if weight else 1)
    return s[r[:, None], (torch.arange(cols) // 128)[None, :]]


def _mxfp4_64(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    n, half = blocks.shape
    codes = torch.stack((blocks & 15, blocks >> 4), dim=-1).reshape(n, 2 * half).long()
    values = E2M1[codes & 7] * torch.where(codes >= 8, -1.0, 1.0).to(torch.float64)
    return values * torch.pow(2.0, scales.to(torch.float64) - 127).repeat_interleave(32, dim=1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 33, 40), (37, 50, 96)])
def test_mm_dense(device, dtype, m, n, k):
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    a = torch.randn(m, k, generator=g).to(dtype).to(device)
    b = torch.randn(n, k, generator=g).to(dtype).to(device)
    bias = torch.randn(n, generator=g).to(device) if m == 37 else None
    assert_triton("mm", (DTYPE_NAMES[dtype],) * 3, {"bias": bias is not None}, a.device)
    y = tk.mm(a, b, bias)
    assert y.dtype == dtype and y.shape == (m, n)
    expected = _mm64(a.cpu(), b.cpu(), None if bias is None else bias.cpu())
    assert_close(y.cpu(), expected, dtype)
    assert_close(y.cpu(), ref_gemm.mm(a, b, bias, a_scale=None, b_scale=None, out_dtype=dtype, out=None).cpu(), dtype)


def test_mm_out_and_out_dtype(device):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(20, 64, generator=g).to(torch.bfloat16).to(device)
    b = torch.randn(17, 64, generator=g).to(torch.bfloat16).to(device)
    # a strided [20, 17] window of a wider buffer: the kernel must honour out's strides
    buffer = torch.full((20, 40), 7.0, device=device)
    out = buffer[:, 3:20]
    assert_triton("mm", ("bf16", "bf16", "fp32"), {"bias": False}, a.device)
    y = tk.mm(a, b, out_dtype=torch.float32, out=out)
    assert y.data_ptr() == out.data_ptr()
    assert_close(out.cpu(), _mm64(a.cpu(), b.cpu()), torch.float32)
    assert bool((buffer[:, :3] == 7).all()) and bool((buffer[:, 20:] == 7).all())


_FP8_CASES = [
    ("per_tensor", "per_tensor"),
    ("per_token", "per_channel"),
    ("block128", "block128"),
    ("per_token", "block128"),
]


@pytest.mark.parametrize(("ga", "gb"), _FP8_CASES)
def test_mm_fp8(device, ga, gb):
    # K = 200: two 128-blocks, the last partial; N = 130: two weight row-blocks.
    m, n, k = 3, 130, 200
    g = torch.Generator().manual_seed(7)
    a = torch.randn(m, k, generator=g).to(device)
    b = torch.randn(n, k, generator=g).to(device)
    # operands quantised by the reference (the Triton quantizers have their own tests)
    qa, sa = tk.quantize_fp8(a, granularity=ga, solution="reference")
    if gb == "block128":
        qb, _ = tk.quantize_fp8(b, granularity="per_tensor", solution="reference")
        sb = (torch.rand(2, 2, generator=g) + 0.5).to(device)  # [ceil(N/128), ceil(K/128)]
    else:
        weight_granularity = "per_tensor" if gb == "per_tensor" else "per_token"  # [N, 1] = per channel
        qb, sb = tk.quantize_fp8(b, granularity=weight_granularity, solution="reference")
    sig = (f"fp8_e4m3:{ga}", f"fp8_e4m3:{gb}", "bf16")
    assert_triton("mm", sig, {"bias": True}, a.device)
    bias = torch.randn(n, generator=g).to(torch.bfloat16).to(device)
    y = tk.mm(qa, qb, bias, a_scale=sa, b_scale=sb)
    assert y.dtype == torch.bfloat16
    expected = _mm64(qa.cpu(), qb.cpu(), bias.cpu(), sa.cpu(), sb.cpu())
    assert_close(y.cpu(), expected, torch.bfloat16)
    ref = ref_gemm.mm(qa, qb, bias, a_scale=sa, b_scale=sb, out_dtype=torch.float32, out=None)
    assert_close(y.cpu(), ref.cpu(), torch.bfloat16)


@pytest.mark.parametrize("aligned", [True, False], ids=["words", "bytes"])
@pytest.mark.parametrize(("m", "dtype"), [(1, torch.bfloat16), (20, torch.float16)])
def test_mm_mxfp4(device, m, dtype, aligned):
    # K = 96 is not a multiple of the interpreter's BLOCK_K (64): the last step is a tail.
    # M = 1 runs the GEMV (split-K); codes whose rows are not 4-byte aligned are read
    # byte by byte (an MMA tile even at M = 1).
    n, k = 33, 96
    g = torch.Generator().manual_seed(m)
    w = torch.randn(n, k, generator=g) * torch.logspace(-2, 1, k)
    blocks, scales = ref_quant.quantize_mxfp4(w)
    if not aligned:
        blocks = torch.cat((torch.zeros(n, 1, dtype=torch.uint8), blocks), dim=1)[:, 1:]  # row stride k/2 + 1
    a = torch.randn(m, k, generator=g).to(dtype).to(device)
    bias = torch.randn(n, generator=g).to(device)
    assert_triton("mm", (DTYPE_NAMES[dtype], "mxfp4", "fp32"), {"bias": True}, a.device)
    y = tk.mm(a, blocks.to(device), bias, b_scale=scales.to(device), out_dtype=torch.float32)
    expected = _mm64(a.cpu(), blocks, bias.cpu(), None, scales)
    # Decoded weights are exact in a's dtype, so only fp32 accumulation rounding remains.
    scale = (a.double().abs().cpu() @ _mxfp4_64(blocks, scales).abs().T).max().item()
    assert_close(y.cpu(), expected, torch.float32, scale=scale * 16)
    ref = ref_gemm.mm(
        a, blocks.to(device), bias, a_scale=None, b_scale=scales.to(device), out_dtype=torch.float32, out=None
    )
    assert_close(y.cpu(), ref.cpu(), torch.float32, scale=scale * 16)


def _config_rows() -> list[tuple[str, str, int]]:
    # the "interpret" tables are what every other mm test here runs
    families = {f: k for f, k in MM_CONFIGS.items() if f != "interpret"}
    return [(fam, kind, i) for fam, kinds in families.items() for kind, rows in kinds.items() for i in range(len(rows))]


def _mm_operands(kind: str, scales: tuple[str, str], g: torch.Generator, device: str):
    """(a, b, a_scale, b_scale) of operand ``kind`` at M = 3, N = 260 (two full 128-row
    weight blocks and a partial one), K = 300 (K = 288 for MXFP4, whose K is a multiple of
    32): every tile straddles scale blocks and ends in a K tail."""
    m, n = 3, 260
    k = 288 if kind == "mxfp4" else 300
    a = torch.randn(m, k, generator=g)
    w = torch.randn(n, k, generator=g)
    if kind in ("16bit", "fp32"):
        dtype = torch.bfloat16 if kind == "16bit" else torch.float32
        return a.to(dtype).to(device), w.to(dtype).to(device), None, None
    if kind == "mxfp4":
        blocks, block_scales = ref_quant.quantize_mxfp4(w * torch.logspace(-2, 1, k))
        return a.to(torch.bfloat16).to(device), blocks.to(device), None, block_scales.to(device)
    ga, gb = scales
    qa, sa = ref_quant.quantize_fp8(a, granularity=ga, scale=None)
    if gb == "block128":
        qb, _ = ref_quant.quantize_fp8(w, granularity="per_tensor", scale=None)
        sb = torch.rand(3, 3, generator=g) * 2**-5 + 2**-6  # realistic magnitudes: |b| ~ 1
    else:
        qb, sb = ref_quant.quantize_fp8(w, granularity="per_tensor" if gb == "per_tensor" else "per_token", scale=None)
    return qa.to(device), qb.to(device), sa.to(device), sb.to(device)


_KIND_SCALES = {
    "fp8": [("per_tensor", "per_tensor"), ("per_token", "per_channel")],
    "fp8_block128": [("block128", "block128"), ("per_token", "block128")],
}


@pytest.mark.parametrize(("family", "kind", "row"), _config_rows(), ids=lambda v: str(v))
def test_mm_every_config_row(device, family, kind, row):
    """Every tile of every family's table (split-K, GEMV and block-scale rows included) on
    operands that straddle 128-blocks in N and K. On CPU every row runs under the
    interpreter (its dot upcast to fp32, the only change); on a GPU, its own family's rows."""
    cfg = MM_CONFIGS[family][kind][row][1]
    if device == "cpu":
        cfg = dataclasses.replace(cfg, dot_in_fp32=not cfg.gemv, launch={})
    elif family != arch_family(torch.device(device)):
        pytest.skip(f"{family} tiles run on {family} devices")
    for case, scales in enumerate(_KIND_SCALES.get(kind, [("", "")])):
        g = torch.Generator().manual_seed(100 * row + case)
        a, b, sa, sb = _mm_operands(kind, scales, g, device)
        bias = torch.randn(b.shape[0], generator=g).to(device)
        y = mm.mm_with_config(a, b, bias, a_scale=sa, b_scale=sb, out_dtype=torch.bfloat16, out=None, config=cfg)
        expected = _mm64(
            a.cpu(), b.cpu(), bias.cpu(), None if sa is None else sa.cpu(), None if sb is None else sb.cpu()
        )
        # bf16 output rounding; fp8 wgmma adds ~2**-14 of sum |a_k b_k| (the scale below)
        assert_close(y.cpu(), expected, torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("m", "n", "k", "block_m"), [(1, 37, 100, 4), (3, 8, 64, 4), (5, 20, 33, 2), (2, 3, 1, 1)])
def test_mm_dense_gemv(device, dtype, m, n, k, block_m):
    """The MMA-free dense GEMV (``gemv=True`` on a 16/32-bit kind): K tails and K below one step, N tails and N
    below one tile (wrap-around rows), rows over several programs, a bias, a strided ``a`` and ``out``."""
    cfg = mm.MMConfig(block_m, 16, 32, num_warps=2, num_stages=1, gemv=True)
    g = torch.Generator().manual_seed(m * 100 + n + k)
    a = torch.randn(m, 2 * k, generator=g).to(dtype)[:, ::2].to(device)  # (strided along K)
    b = torch.randn(n, k, generator=g).to(dtype).to(device)
    bias = torch.randn(n, generator=g).to(torch.bfloat16).to(device)
    buffer = torch.full((m, n + 5), 7.0, dtype=dtype, device=device)
    out = buffer[:, 2 : n + 2]
    y = mm.mm_with_config(a, b, bias, a_scale=None, b_scale=None, out_dtype=dtype, out=out, config=cfg)
    assert y.data_ptr() == out.data_ptr()
    assert_close(y.cpu(), _mm64(a.cpu(), b.cpu(), bias.cpu()), dtype)
    assert bool((buffer[:, :2] == 7).all()) and bool((buffer[:, n + 2 :] == 7).all())
    # b strided along K: the GEMV reads vectors of unit stride, so the MMA tile runs instead (same result)
    bt = torch.randn(k, n, generator=g).to(dtype).to(device).T
    y = mm.mm_with_config(a, bt, None, a_scale=None, b_scale=None, out_dtype=dtype, out=None,
                          config=dataclasses.replace(cfg, dot_in_fp32=device == "cpu"))  # fmt: skip
    assert_close(y.cpu(), _mm64(a.cpu(), bt.cpu()), dtype)


# -- GPU, GPT-OSS shapes -------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
_QKV_N = 64 * 64 + 2 * 8 * 64  # 5120


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(
    ("m", "n", "k"), [(1, _QKV_N, 2880), (64, _QKV_N, 2880), (4096, 2880, 4096), (4096, _QKV_N, 2880)]
)
def test_mm_bf16_gpt_oss_gpu(m, n, k):
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    assert_triton("mm", ("bf16",) * 3, {"bias": True}, a.device)
    y = tk.mm(a, b, bias)
    expected = a.float() @ b.float().T + bias.float()
    torch.testing.assert_close(y.float(), expected, atol=2e-2, rtol=1e-2)


def _weight_block128(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``w [N, K]`` quantized per 128x128 block with its own amax / 448 (as checkpoints
    ship block-scaled weights): ``(fp8 [N, K], float32 [ceil(N/128), ceil(K/128)])``."""
    n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    tiles = torch.nn.functional.pad(w.float(), (0, kb * 128 - k, 0, nb * 128 - n)).view(nb, 128, kb, 128)
    amax = tiles.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / torch.full_like(amax, 448.0), torch.ones_like(amax))
    q = (tiles / scale[:, None, :, None]).clamp(-448, 448).view(nb * 128, kb * 128)[:n, :k]
    return q.to(torch.float8_e4m3fn), scale


def _dequant(q: torch.Tensor, scale: torch.Tensor, *, weight: bool) -> torch.Tensor:
    rows, cols = q.shape
    if scale.numel() == 1 or scale.shape == (rows, 1):
        return q.float() * scale.reshape(-1, 1)
    s = scale.repeat_interleave(128, dim=1)[:, :cols]
    return q.float() * (s.repeat_interleave(128, dim=0)[:rows] if weight else s)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 64, 4096])
@pytest.mark.parametrize(("ga", "gb"), _FP8_CASES)
def test_mm_fp8_gpt_oss_gpu(m, ga, gb):
    n, k = _QKV_N, 2880
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(n, k, device="cuda") / k**0.5
    qa, sa = tk.quantize_fp8(a, granularity=ga)
    if gb == "block128":
        qb, sb = _weight_block128(b)
    else:
        qb, sb = tk.quantize_fp8(b, granularity="per_tensor" if gb == "per_tensor" else "per_token")
    assert_triton("mm", (f"fp8_e4m3:{ga}", f"fp8_e4m3:{gb}", "bf16"), {"bias": False}, a.device)
    y = tk.mm(qa, qb, a_scale=sa, b_scale=sb).float()
    ref = ref_gemm.mm(qa, qb, None, a_scale=sa, b_scale=sb, out_dtype=torch.float32, out=None)
    # Hopper's fp8 wgmma accumulates with ~14 significant bits between the kernel's fp32
    # promotions (every 128 K), so its error scales with sum_k |a_k b_k|, not |result|:
    # seen on the H200, up to 2**-14.8 of it. 2**-10 of it (plus the bf16 output
    # rounding) leaves a wide margin, while one 128-block of K with a wrong scale moves
    # typical results by ~2**-9 of it.
    abs_dot = _dequant(qa, sa, weight=False).abs() @ _dequant(qb, sb, weight=True).abs().T
    err = (y - ref).abs()
    bound = abs_dot * 2.0**-10 + ref.abs() * 2.0**-8
    worst = int((err - bound).argmax())
    assert bool((err <= bound).all()), (
        f"{int((err > bound).sum())} results off; worst {err.flatten()[worst]:.3g} > {bound.flatten()[worst]:.3g}"
    )
    # and realistic magnitudes (|b| ~ 1/sqrt(K)), so the usual absolute check applies too
    torch.testing.assert_close(y, ref, atol=3e-2, rtol=2e-2)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("m", [1, 64, 4096])
def test_mm_mxfp4_gpt_oss_gpu(m):
    n, k = 5760, 2880
    torch.manual_seed(0)
    w = torch.randn(n, k, device="cuda") / k**0.5
    blocks, scales = tk.quantize_mxfp4(w)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    assert_triton("mm", ("bf16", "mxfp4", "bf16"), {"bias": False}, a.device)
    y = tk.mm(a, blocks, b_scale=scales)
    ref = ref_gemm.mm(a, blocks, None, a_scale=None, b_scale=scales, out_dtype=torch.float32, out=None)
    torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=1e-2)

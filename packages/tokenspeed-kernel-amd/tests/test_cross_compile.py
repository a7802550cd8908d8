"""Every AMD kernel compiles for its target, through the public op, with no GPU.

Each case calls the public op (``tokenspeed_kernel.mha_prefill``, ...) on CPU tensors
under ``fake_platform(arch)``: selection picks this package's kernel, the host code
plans the launch, and the recorded launch is compiled for ``hip:<arch>`` with the
argument specialisation a GPU launch would get. The AMDGCN must then contain:

- exactly the intended MFMA variant (32x32 for prefill, 16x16 for decode; the K of
  the instruction is the arch's: x16/x8 for 32x32 and x32/x16 for 16x16 bf16/fp16);
- buffer loads, and on gfx950 direct-to-LDS buffer loads (``buffer_load_dwordx4 ... lds``)
  for K/V (gfx942 has none: it stages K/V through registers);
- no register spills: the bound is 0 VGPR and 0 SGPR spills, what every case
  measures today with Triton 3.6 (a regression here is a real performance bug);
- LDS within the arch's budget.

Compiles take 1-5 s each on a CPU (Triton caches them afterwards).
"""

from __future__ import annotations

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.testing import amdgcn_stats, compile_launch
from tokenspeed_kernel_amd.cdna.arch import ARCHS

#: Register spill bounds stated by this package (see the module docstring).
MAX_VGPR_SPILLS = 0
MAX_SGPR_SPILLS = 0

#: MFMA instruction per (arch, 16-bit dtype, tile).
MFMA = {
    ("gfx950", "bf16", 32): "v_mfma_f32_32x32x16_bf16",
    ("gfx950", "fp16", 32): "v_mfma_f32_32x32x16_f16",
    ("gfx950", "bf16", 16): "v_mfma_f32_16x16x32_bf16",
    ("gfx950", "fp16", 16): "v_mfma_f32_16x16x32_f16",
    ("gfx942", "bf16", 32): "v_mfma_f32_32x32x8_bf16",
    ("gfx942", "fp16", 32): "v_mfma_f32_32x32x8_f16",
    ("gfx942", "bf16", 16): "v_mfma_f32_16x16x16_bf16",
    ("gfx942", "fp16", 16): "v_mfma_f32_16x16x16_f16",
}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _compile_all(launches, arch):
    """[(kernel name, AmdgcnStats, LDS bytes)] for every recorded launch."""
    out = []
    for launch in launches:
        kernel = compile_launch(launch.fn, launch.args, launch.kwargs, arch)
        out.append((launch.fn.__name__, amdgcn_stats(kernel.asm["amdgcn"]), kernel.metadata.shared))
    return out


def _check_common(stats, lds, arch):
    assert stats.vgpr_spills <= MAX_VGPR_SPILLS, stats
    assert stats.sgpr_spills <= MAX_SGPR_SPILLS, stats
    assert lds <= ARCHS[arch].lds_bytes, (lds, stats)


def _check_attention(stats, lds, arch, dtype, tile, *, kv_buffer_loads=True):
    _check_common(stats, lds, arch)
    assert stats.mfma == {MFMA[arch, dtype, tile]}, stats.mfma
    assert stats.buffer_loads > 0
    kv_lds = stats.lds_buffer_loads if kv_buffer_loads else stats.lds_global_loads
    if arch == "gfx950":
        assert kv_lds > 0, f"gfx950 K/V tiles must be copied straight into LDS: {stats}"
    else:
        assert stats.lds_buffer_loads == stats.lds_global_loads == 0


# (label, dtype, head_dim, Hq, Hkv, kwargs of mha_prefill)
PREFILL_CASES = [
    ("gpt_oss_sliding", "bf16", 64, 16, 2, dict(window_left=127, sinks=True)),
    ("hd128_fp16_noncausal_cap_lse", "fp16", 128, 8, 2, dict(causal=False, logit_cap=30.0, return_lse=True)),
]


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
@pytest.mark.parametrize("label,dtype,head_dim,hq,hkv,kw", PREFILL_CASES, ids=[c[0] for c in PREFILL_CASES])
def test_prefill_compiles(recorded_launches, arch, label, dtype, head_dim, hq, hkv, kw):
    torch.manual_seed(0)
    dt = DTYPES[dtype]
    lens = [37, 200]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    total = int(cu[-1])
    q = torch.randn(total, hq, head_dim, dtype=dt)
    k = torch.randn(total, hkv, head_dim, dtype=dt)
    v = torch.randn(total, hkv, head_dim, dtype=dt)
    kw = dict(kw)
    if kw.pop("sinks", False):
        kw["sinks"] = torch.randn(hq)
    with tk.fake_platform(arch):
        tk.mha_prefill(q, k, v, cu, cu, max(lens), max(lens), **kw)
    assert [launch.fn.__name__ for launch in recorded_launches] == ["_prefill_kernel"]
    assert recorded_launches[0].kwargs["GROUP"] == hq // hkv
    [(_, stats, lds)] = _compile_all(recorded_launches, arch)
    _check_attention(stats, lds, arch, dtype, 32)


def _paged_cache(num_pages, page_size, hkv, head_dim, dt, *, huge=False):
    if huge:
        # > 2 GiB of logical cache without the memory: every page aliases one page.
        one = torch.randn(1, page_size, hkv, head_dim, dtype=dt)
        pages = (2**31 // one.numel() // one.element_size()) + 1
        return one.expand(pages, -1, -1, -1), one.expand(pages, -1, -1, -1)
    k = torch.randn(num_pages, page_size, hkv, head_dim, dtype=dt)
    return k, torch.randn_like(k)


# (label, dtype, head_dim, Hq, Hkv, batch, page_size, huge cache, kwargs, expected KV_MODE, splits > 1)
DECODE_CASES = [
    ("gpt_oss_page16_split", "bf16", 64, 64, 8, 2, 16, False, dict(window_left=127, sinks=True), 2, True),
    ("hd128_page64_one_split_lse", "fp16", 128, 32, 8, 128, 64, False, dict(return_lse=True), 1, False),
    ("page16_cache_over_2gib", "bf16", 64, 64, 8, 2, 16, True, dict(sinks=True), 3, True),
    ("group64", "bf16", 64, 64, 1, 2, 64, False, dict(logit_cap=30.0), 1, True),
]


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
@pytest.mark.parametrize(
    "label,dtype,head_dim,hq,hkv,batch,page_size,huge,kw,kv_mode,split", DECODE_CASES, ids=[c[0] for c in DECODE_CASES]
)
def test_decode_compiles(recorded_launches, arch, label, dtype, head_dim, hq, hkv, batch, page_size, huge, kw,
                         kv_mode, split):  # fmt: skip
    torch.manual_seed(0)
    dt = DTYPES[dtype]
    k_cache, v_cache = _paged_cache(8 * batch, page_size, hkv, head_dim, dt, huge=huge)
    max_pages = 512 // page_size
    page_table = torch.randint(0, k_cache.shape[0], (batch, max_pages), dtype=torch.int32)
    cache_seqlens = torch.randint(1, max_pages * page_size + 1, (batch,), dtype=torch.int32)
    q = torch.randn(batch, hq, head_dim, dtype=dt)
    kw = dict(kw)
    if kw.pop("sinks", False):
        kw["sinks"] = torch.randn(hq)
    with tk.fake_platform(arch):
        tk.mha_decode_with_kvcache(q, k_cache, v_cache, page_table, cache_seqlens, **kw)
    names = [launch.fn.__name__ for launch in recorded_launches]
    assert names == (["_decode_kernel", "_decode_merge_kernel"] if split else ["_decode_kernel"])
    assert recorded_launches[0].kwargs["KV_MODE"] == kv_mode
    compiled = _compile_all(recorded_launches, arch)
    _, stats, lds = compiled[0]
    # Over 2 GiB the paged K/V reads need 64-bit addresses: global loads, not buffer loads.
    _check_attention(stats, lds, arch, dtype, 16, kv_buffer_loads=kv_mode != 3)
    if kv_mode == 3 and arch == "gfx942":
        assert stats.global_loads > 0
    for _, merge_stats, merge_lds in compiled[1:]:
        _check_common(merge_stats, merge_lds, arch)
        assert merge_stats.buffer_loads > 0 and not merge_stats.mfma


RMSNORM_CASES = [
    ("gpt_oss_hidden_residual", torch.bfloat16, 2880, True, 1),
    ("fp32_head_dim", torch.float32, 64, False, 1),
    ("two_pass_residual", torch.float16, 20000, True, 3),
]


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
@pytest.mark.parametrize("label,dtype,hidden,residual,chunks", RMSNORM_CASES, ids=[c[0] for c in RMSNORM_CASES])
def test_rmsnorm_compiles(recorded_launches, arch, label, dtype, hidden, residual, chunks):
    x = torch.randn(3, 5, hidden, dtype=dtype)
    w = torch.randn(hidden)
    r = torch.randn_like(x) if residual else None
    with tk.fake_platform(arch):
        tk.rmsnorm(x, w, 1e-5, residual=r)
    [launch] = recorded_launches
    assert launch.grid == (15,) and launch.kwargs["NUM_CHUNKS"] == chunks
    [(_, stats, lds)] = _compile_all(recorded_launches, arch)
    _check_common(stats, lds, arch)
    assert not stats.mfma
    # x, weight (+ residual) loads; 16-byte vectors whenever a lane owns >= 16 bytes.
    assert stats.buffer_loads >= (3 if residual else 2) * chunks


@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
def test_prefill_with_unaligned_rows_compiles(recorded_launches, arch):
    """Rows 65 elements apart cannot be copied 16 bytes per lane: gfx950 falls back to
    the register-staged path instead of failing to compile the direct-to-LDS copy."""
    q = torch.randn(50, 16, 65, dtype=torch.bfloat16)[..., :64]
    k = torch.randn(50, 2, 65, dtype=torch.bfloat16)[..., :64]
    cu = torch.tensor([0, 50], dtype=torch.int32)
    with tk.fake_platform(arch):
        tk.mha_prefill(q, k, k, cu, cu, 50, 50)
    [launch] = recorded_launches
    assert launch.kwargs["ASYNC_COPY"] is False
    [(_, stats, lds)] = _compile_all(recorded_launches, arch)
    _check_common(stats, lds, arch)
    assert stats.mfma == {MFMA[arch, "bf16", 32]} and stats.lds_buffer_loads == 0 and stats.buffer_loads > 0

"""Shared input generators: the building blocks every op's cases use.

``verify`` and ``bench`` build their inputs here (through the per-op cases in
:mod:`tokenspeed_kernel.numerics.cases`), so a kernel is timed on exactly the kind
of data it is verified on. Everything draws from one seeded ``torch.Generator``
on the target device: the same case and seed give the same tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "DTYPES",
    "torch_dtype",
    "make_generator",
    "randn",
    "uniform",
    "cu_seqlens",
    "paged_kv_cache",
    "random_topk_ids",
    "random_topk_weights",
    "rope_cos_sin_cache",
    "fp8_quantize_blocks",
    "E2M1_VALUES",
    "decode_e2m1",
]

#: Short dtype names accepted by cases (and the CLI) -> torch dtypes.
DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8_e4m3": torch.float8_e4m3fn,
}

#: The 16 E2M1 code values (code 8-15 are the negatives of 0-7).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def torch_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype: unknown dtype {name!r}; expected one of {sorted(DTYPES)}") from None


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def randn(
    shape: Sequence[int], dtype: torch.dtype, gen: torch.Generator, *, scale: float = 1.0, mean: float = 0.0
) -> torch.Tensor:
    """Normal(mean, scale^2) values drawn in fp32, then cast to ``dtype``."""
    t = torch.randn(tuple(shape), generator=gen, device=gen.device, dtype=torch.float32)
    if scale != 1.0:
        t.mul_(scale)
    if mean != 0.0:
        t.add_(mean)
    return t.to(dtype)


def uniform(shape: Sequence[int], gen: torch.Generator, lo: float = 0.0, hi: float = 1.0) -> torch.Tensor:
    """fp32 Uniform[lo, hi)."""
    t = torch.rand(tuple(shape), generator=gen, device=gen.device, dtype=torch.float32)
    return t.mul_(hi - lo).add_(lo)


def cu_seqlens(lengths: Sequence[int], device: torch.device) -> torch.Tensor:
    """``int32 [B+1]`` prefix sums of ``lengths``."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + int(n))
    return torch.tensor(out, dtype=torch.int32, device=device)


def paged_kv_cache(
    cache_lens: Sequence[int],
    page_size: int,
    heads_kv: int,
    head_dim: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    *,
    num_pages: int | None = None,
    spare_pages: int = 3,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A paged NHD cache holding ``cache_lens[b]`` tokens for sequence ``b``.

    Pages are handed out in a random order (so a sequence's pages are neither
    contiguous nor ascending) and every slot, used or not, holds random values: a
    kernel that reads past a sequence's length or through the wrong page row gets
    visibly wrong results. The page table has one spare column past the longest
    sequence; unused entries point at page 0 (a valid page).

    Returns:
        ``k_cache, v_cache [num_pages, page_size, Hkv, D]`` of ``dtype`` (fp8 caches
        hold N(0, 1) values rounded to e4m3), ``page_table int32 [B, max_pages]``,
        ``cache_seqlens int32 [B]``.
    """
    device = gen.device
    pages_per_seq = [-(-int(n) // page_size) for n in cache_lens]
    need = sum(pages_per_seq)
    total = num_pages if num_pages is not None else need + spare_pages
    if total < need:
        raise ValueError(f"num_pages: {total} pages cannot hold {need} pages of sequences {list(cache_lens)}")
    total = max(total, 1)
    src_dtype = torch.float32 if dtype == torch.float8_e4m3fn else dtype
    k_cache = randn((total, page_size, heads_kv, head_dim), src_dtype, gen).to(dtype)
    v_cache = randn((total, page_size, heads_kv, head_dim), src_dtype, gen).to(dtype)
    order = torch.randperm(total, generator=gen, device=device).to(torch.int32)
    max_pages = max(pages_per_seq, default=0) + 1
    table = torch.zeros((len(cache_lens), max_pages), dtype=torch.int32, device=device)
    at = 0
    for b, n in enumerate(pages_per_seq):
        table[b, :n] = order[at : at + n]
        at += n
    seqlens = torch.tensor([int(n) for n in cache_lens], dtype=torch.int32, device=device)
    return k_cache, v_cache, table, seqlens


def random_topk_ids(tokens: int, experts: int, top_k: int, gen: torch.Generator) -> torch.Tensor:
    """``int32 [T, k]``: k distinct experts per token, uniformly at random (balanced in expectation)."""
    scores = torch.rand((tokens, experts), generator=gen, device=gen.device)
    return scores.argsort(dim=1)[:, :top_k].to(torch.int32).contiguous()


def random_topk_weights(tokens: int, top_k: int, gen: torch.Generator) -> torch.Tensor:
    """``float32 [T, k]``: softmax of random logits, descending (as ``moe_route`` returns them)."""
    w = torch.softmax(torch.randn((tokens, top_k), generator=gen, device=gen.device), dim=-1)
    return w.sort(dim=-1, descending=True).values.contiguous()


def rope_cos_sin_cache(
    max_position: int, rotary_dim: int, device: torch.device, *, theta: float = 150000.0
) -> torch.Tensor:
    """``float32 [max_position, R]`` cos | sin table of plain RoPE (the op takes any table)."""
    half = rotary_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(half, device=device, dtype=torch.float32) * 2.0 / rotary_dim))
    ang = torch.arange(max_position, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=-1).contiguous()


def fp8_quantize_blocks(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``w [N, K]`` to e4m3 with one fp32 scale per ``block x block`` tile.

    Returns ``(w_fp8 [N, K], scale float32 [ceil(N/block), ceil(K/block)])``. The
    public ``quantize_fp8`` makes activation scales (1 x 128); weights need 128 x 128.
    """
    n, k = w.shape
    bn, bk = -(-n // block), -(-k // block)
    padded = torch.zeros((bn * block, bk * block), dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.float()
    tiles = padded.view(bn, block, bk, block)
    amax = tiles.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    q = (tiles / scale[:, None, :, None]).clamp(-448.0, 448.0).view(bn * block, bk * block)[:n, :k]
    return q.to(torch.float8_e4m3fn).contiguous(), scale.contiguous()


def decode_e2m1(blocks: torch.Tensor) -> torch.Tensor:
    """``uint8 [..., K/2]`` -> float32 E2M1 values ``[..., K]`` (low nibble = even element), no scale."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=blocks.device)
    lo = (blocks & 0x0F).long()
    hi = (blocks >> 4).long()
    return torch.stack([lut[lo], lut[hi]], dim=-1).flatten(-2)


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """``uint8`` E8M0 -> float32 ``2**(s - 127)``."""
    return torch.exp2(scales.to(torch.float32) - 127.0)

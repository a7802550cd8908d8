"""GPT-OSS decoder layers on the public API only (no backend or vendor named here).

The math follows /shared/design/GPT_OSS.md (OpenAI's release and the
``transformers`` implementation): RMSNorm with the weight applied in fp32, fused
QKV projection with biases, YaRN rotary (neox style), attention with per-head
sinks alternating sliding-window (128 keys) and full layers, MoE with a biased
router, top-4 softmax, MXFP4 experts with biases and the clamped SwiGLU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

import tokenspeed_kernel as tk

__all__ = [
    "GptOssConfig",
    "GptOssLayer",
    "PagedKVCache",
    "yarn_cos_sin_cache",
    "random_layer",
    "layer_prefill",
    "layer_decode",
]


@dataclass(frozen=True)
class GptOssConfig:
    hidden_size: int = 2880
    num_attention_heads: int = 64
    num_key_value_heads: int = 8
    head_dim: int = 64
    num_local_experts: int = 32
    num_experts_per_tok: int = 4
    intermediate_size: int = 2880
    num_hidden_layers: int = 24
    vocab_size: int = 201088
    sliding_window: int = 128
    rms_norm_eps: float = 1e-5
    rope_theta: float = 150000.0
    rope_factor: float = 32.0
    rope_original_max_position: int = 4096
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    layer_types: tuple[str, ...] = field(default=())

    def layer_type(self, i: int) -> str:
        if self.layer_types:
            return self.layer_types[i]
        return "sliding_attention" if i % 2 == 0 else "full_attention"

    @classmethod
    def gpt_oss_20b(cls) -> GptOssConfig:
        return cls()

    @classmethod
    def gpt_oss_120b(cls) -> GptOssConfig:
        return cls(num_local_experts=128, num_hidden_layers=36)

    @classmethod
    def tiny(cls) -> GptOssConfig:
        """A CPU-sized config with GPT-OSS's structure (GQA 8:1, head_dim 64, top-4 of 8 experts)."""
        return cls(
            hidden_size=256,
            num_attention_heads=8,
            num_key_value_heads=1,
            num_local_experts=8,
            intermediate_size=256,
            num_hidden_layers=2,
            vocab_size=512,
            sliding_window=16,
        )

    @property
    def activation(self) -> tk.MoEActivation:
        return tk.MoEActivation(kind="swiglu", alpha=self.swiglu_alpha, limit=self.swiglu_limit, up_offset=1.0)


def yarn_cos_sin_cache(cfg: GptOssConfig, max_positions: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """``float32 [max_positions, head_dim]``: YaRN-scaled cos | sin, times YaRN's attention factor."""
    dim = cfg.head_dim
    base, factor = cfg.rope_theta, cfg.rope_factor
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(cfg.rope_original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(base))

    # GPT-OSS does not truncate the correction range to integers.
    low = max(correction_dim(cfg.rope_beta_fast), 0.0)
    high = min(correction_dim(cfg.rope_beta_slow), dim - 1.0)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1.0 - ramp
    inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    attention_factor = 0.1 * math.log(factor) + 1.0
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1) * attention_factor
    return cache.to(torch.float32).to(device)


@dataclass
class GptOssLayer:
    """One decoder layer's weights (bf16 except the MXFP4 experts and fp32 sinks)."""

    index: int
    input_norm: torch.Tensor  # [H]
    qkv_weight: torch.Tensor  # [(Hq + 2 Hkv) D, H]
    qkv_bias: torch.Tensor
    o_weight: torch.Tensor  # [H, Hq D]
    o_bias: torch.Tensor
    sinks: torch.Tensor  # float32 [Hq]
    post_norm: torch.Tensor  # [H]
    router_weight: torch.Tensor  # [E, H]
    router_bias: torch.Tensor  # [E]
    experts: tk.MoEWeights
    moe_plan: tk.MoEPlan | None = None


def random_layer(
    cfg: GptOssConfig, index: int, *, device: torch.device | str = "cpu", seed: int = 0, dtype=torch.bfloat16
) -> GptOssLayer:
    """A layer with random weights of realistic scale; experts quantized to MXFP4 through the public op."""
    g = torch.Generator(device="cpu").manual_seed(seed + 1000 * index)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(device)

    h, d, e, i = cfg.hidden_size, cfg.head_dim, cfg.num_local_experts, cfg.intermediate_size
    qkv_out = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
    w13, w13_scale = tk.quantize_mxfp4(rand(e, 2 * i, h, scale=h**-0.5).float(), solution="reference")
    w2, w2_scale = tk.quantize_mxfp4(rand(e, h, i, scale=i**-0.5).float(), solution="reference")
    experts = tk.MoEWeights(
        w13=w13,
        w2=w2,
        format="mxfp4",
        w13_bias=rand(e, 2 * i, scale=0.02),
        w2_bias=rand(e, h, scale=0.02),
        w13_scale=w13_scale,
        w2_scale=w2_scale,
        gate_up_interleaved=True,
    )
    return GptOssLayer(
        index=index,
        input_norm=(1 + rand(h, scale=0.1)).to(dtype),
        qkv_weight=rand(qkv_out, h, scale=h**-0.5),
        qkv_bias=rand(qkv_out, scale=0.02),
        o_weight=rand(h, cfg.num_attention_heads * d, scale=(cfg.num_attention_heads * d) ** -0.5),
        o_bias=rand(h, scale=0.02),
        sinks=rand(cfg.num_attention_heads).float(),
        post_norm=(1 + rand(h, scale=0.1)).to(dtype),
        router_weight=rand(e, h, scale=h**-0.5),
        router_bias=rand(e, scale=0.02),
        experts=experts,
    )


class PagedKVCache:
    """A simple block manager: fixed pages, handed out in order, one page table row per sequence."""

    def __init__(
        self,
        cfg: GptOssConfig,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        max_batch: int,
        max_pages_per_seq: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        shape = (num_pages, page_size, cfg.num_key_value_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.page_size = page_size
        self.page_table = torch.zeros(max_batch, max_pages_per_seq, dtype=torch.int32, device=device)
        self.seqlens = [0] * max_batch
        self._pages: list[list[int]] = [[] for _ in range(max_batch)]
        self._free = list(range(num_pages))

    def reserve(self, seq: int, new_tokens: int) -> torch.Tensor:
        """Make room for ``new_tokens`` more tokens of ``seq``; returns their int64 slots."""
        start = self.seqlens[seq]
        end = start + new_tokens
        need = -(-end // self.page_size) - len(self._pages[seq])
        if need > len(self._free):
            raise RuntimeError(f"PagedKVCache: out of pages ({need} needed, {len(self._free)} free)")
        if -(-end // self.page_size) > self.page_table.shape[1]:
            raise RuntimeError(f"PagedKVCache: sequence {seq} would exceed {self.page_table.shape[1]} pages")
        for _ in range(need):
            page = self._free.pop(0)
            self.page_table[seq, len(self._pages[seq])] = page
            self._pages[seq].append(page)
        self.seqlens[seq] = end
        pos = torch.arange(start, end)
        pages = torch.tensor(self._pages[seq], dtype=torch.int64)[pos // self.page_size]
        return (pages * self.page_size + pos % self.page_size).to(self.page_table.device)


def _attention_window(cfg: GptOssConfig, layer: GptOssLayer) -> int:
    # sliding_window=128 means 128 keys including the query itself: window_left = 127.
    return cfg.sliding_window - 1 if cfg.layer_type(layer.index) == "sliding_attention" else -1


def _qkv(cfg: GptOssConfig, layer: GptOssLayer, h: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor):
    qkv = tk.mm(h, layer.qkv_weight, layer.qkv_bias)
    nq, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q, k, v = qkv.split([nq * d, nkv * d, nkv * d], dim=-1)
    q = q.reshape(-1, nq, d)
    k = k.reshape(-1, nkv, d)
    v = v.reshape(-1, nkv, d).contiguous()
    q, k = tk.apply_rotary(q.contiguous(), k.contiguous(), cos_sin, positions, style="neox")
    return q, k, v


def _moe(cfg: GptOssConfig, layer: GptOssLayer, h: torch.Tensor) -> torch.Tensor:
    logits = tk.mm(h, layer.router_weight, layer.router_bias)
    topk_weights, topk_ids = tk.moe_route(logits, cfg.num_experts_per_tok, renormalize=True)
    return tk.moe_apply(h, topk_weights, topk_ids, layer.experts, cfg.activation, plan=layer.moe_plan)


def layer_prefill(
    cfg: GptOssConfig,
    layer: GptOssLayer,
    x: torch.Tensor,
    positions: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    cos_sin: torch.Tensor,
    cache: PagedKVCache | None = None,
    slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer over a packed batch of new sequences ``x [T, H]``; writes K/V to ``cache``."""
    h = tk.rmsnorm(x, layer.input_norm, cfg.rms_norm_eps)
    q, k, v = _qkv(cfg, layer, h, cos_sin, positions)
    if cache is not None:
        tk.kvcache_store(k, v, cache.k[layer.index], cache.v[layer.index], slots)
    attn = tk.mha_prefill(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
        causal=True, window_left=_attention_window(cfg, layer), sinks=layer.sinks,
    )  # fmt: skip
    o = tk.mm(attn.reshape(attn.shape[0], -1), layer.o_weight, layer.o_bias)
    h, x = tk.rmsnorm(o, layer.post_norm, cfg.rms_norm_eps, residual=x)
    return x + _moe(cfg, layer, h)


def layer_decode(
    cfg: GptOssConfig,
    layer: GptOssLayer,
    x: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    cache: PagedKVCache,
    slots: torch.Tensor,
    cache_seqlens: torch.Tensor,
    page_table: torch.Tensor,
) -> torch.Tensor:
    """One layer for one new token per sequence ``x [B, H]`` over the paged cache."""
    h = tk.rmsnorm(x, layer.input_norm, cfg.rms_norm_eps)
    q, k, v = _qkv(cfg, layer, h, cos_sin, positions)
    tk.kvcache_store(k, v, cache.k[layer.index], cache.v[layer.index], slots)
    attn = tk.mha_decode_with_kvcache(
        q, cache.k[layer.index], cache.v[layer.index], page_table, cache_seqlens,
        window_left=_attention_window(cfg, layer), sinks=layer.sinks,
    )  # fmt: skip
    o = tk.mm(attn.reshape(attn.shape[0], -1), layer.o_weight, layer.o_bias)
    h, x = tk.rmsnorm(o, layer.post_norm, cfg.rms_norm_eps, residual=x)
    return x + _moe(cfg, layer, h)

"""GPT-OSS configuration and the YaRN rotary table."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

import tokenspeed_kernel as tk

__all__ = ["GptOssConfig", "yarn_cos_sin_cache"]


@dataclass(frozen=True)
class GptOssConfig:
    """The sizes and constants of a GPT-OSS model (defaults: GPT-OSS-20B).

    Field names follow the Hugging Face ``config.json`` of the released checkpoints;
    the rope fields flatten its ``rope_scaling`` / ``rope_parameters`` table.
    """

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
    #: ``"sliding_attention"`` / ``"full_attention"`` per layer; left empty, layers alternate from sliding.
    layer_types: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        types = tuple(self.layer_types) or tuple(
            "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(self.num_hidden_layers)
        )
        if len(types) != self.num_hidden_layers:
            raise ValueError(f"layer_types: expected {self.num_hidden_layers} entries, got {len(types)}")
        unknown = set(types) - {"sliding_attention", "full_attention"}
        if unknown:
            raise ValueError(f"layer_types: unknown {sorted(unknown)}")
        object.__setattr__(self, "layer_types", types)

    def layer_type(self, i: int) -> str:
        return self.layer_types[i]

    def window_left(self, i: int) -> int:
        """The attention ops' ``window_left`` of layer ``i``.

        ``sliding_window = W`` means a query sees W keys, itself included
        (``p - W < k <= p``), so ``window_left = W - 1``; full layers use -1.
        """
        return self.sliding_window - 1 if self.layer_type(i) == "sliding_attention" else -1

    def with_layers(self, num_layers: int) -> GptOssConfig:
        """The same model cut to its first ``num_layers`` layers (benchmarks, quick demos)."""
        return replace(self, num_hidden_layers=num_layers, layer_types=self.layer_types[:num_layers])

    @functools.cached_property
    def activation(self) -> tk.MoEActivation:
        """The MoE activation (one frozen object per config: a decode step reads it in every layer)."""
        return tk.MoEActivation(kind="swiglu", alpha=self.swiglu_alpha, limit=self.swiglu_limit, up_offset=1.0)

    @classmethod
    def gpt_oss_20b(cls) -> GptOssConfig:
        return cls()

    @classmethod
    def gpt_oss_120b(cls) -> GptOssConfig:
        return cls(num_local_experts=128, num_hidden_layers=36)

    @classmethod
    def tiny(cls) -> GptOssConfig:
        """A CPU-sized config with GPT-OSS's structure: GQA, alternating windows, top-4 of 8 MXFP4 experts.

        Small enough that the PyTorch references run a whole generation in a
        second; ``sliding_window`` is short so prompts of ~20 tokens cross it.
        """
        return cls(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_local_experts=8,
            num_experts_per_tok=4,
            intermediate_size=64,
            num_hidden_layers=4,
            vocab_size=128,
            sliding_window=8,
        )

    @classmethod
    def small(cls) -> GptOssConfig:
        """A GPU-test-sized config with GPT-OSS's attention shapes: head_dim 64, 8 query heads per KV head.

        Vendor attention kernels that only compile GPT-OSS-like head sizes can run
        it (the tiny config's head_dim 16 is below what most accept).
        """
        return cls(
            hidden_size=512,
            num_attention_heads=8,
            num_key_value_heads=1,
            head_dim=64,
            num_local_experts=8,
            num_experts_per_tok=4,
            intermediate_size=512,
            num_hidden_layers=4,
            vocab_size=1024,
            sliding_window=16,
        )

    # ------------------------------------------------------------------ config.json

    @classmethod
    def from_hf_dict(cls, data: Mapping[str, Any]) -> GptOssConfig:
        """From a checkpoint's ``config.json`` (``rope_scaling`` + ``rope_theta``, or ``rope_parameters``)."""
        rope = dict(data.get("rope_parameters") or data.get("rope_scaling") or {})
        if rope.get("rope_type", "yarn") != "yarn":
            raise ValueError(f"config.json: GPT-OSS uses YaRN rope, got rope_type {rope.get('rope_type')!r}")
        if rope.get("truncate", False):
            raise ValueError("config.json: GPT-OSS's YaRN does not truncate the correction range (truncate=false)")
        plain = {f.name for f in fields(cls)} - {"layer_types"}
        kwargs: dict[str, Any] = {k: data[k] for k in plain if k in data}
        renamed = {
            "rope_theta": "rope_theta",
            "rope_factor": "factor",
            "rope_original_max_position": "original_max_position_embeddings",
            "rope_beta_fast": "beta_fast",
            "rope_beta_slow": "beta_slow",
        }
        for ours, theirs in renamed.items():
            if theirs in rope:
                kwargs[ours] = rope[theirs]
        if data.get("layer_types"):
            kwargs["layer_types"] = tuple(data["layer_types"])
        return cls(**kwargs)

    def to_hf_dict(self) -> dict[str, Any]:
        """The ``config.json`` of a GPT-OSS checkpoint with these sizes (MXFP4 experts)."""
        out: dict[str, Any] = {
            "architectures": ["GptOssForCausalLM"],
            "model_type": "gpt_oss",
            "attention_bias": True,
            "tie_word_embeddings": False,
            "hidden_act": "silu",
            "max_position_embeddings": 131072,
            "torch_dtype": "bfloat16",
        }
        for f in fields(self):
            if not f.name.startswith("rope_") and f.name != "layer_types":
                out[f.name] = getattr(self, f.name)
        out["layer_types"] = list(self.layer_types)
        out["rope_theta"] = self.rope_theta
        out["rope_parameters"] = {
            "rope_type": "yarn",
            "rope_theta": self.rope_theta,
            "factor": self.rope_factor,
            "original_max_position_embeddings": self.rope_original_max_position,
            "beta_fast": self.rope_beta_fast,
            "beta_slow": self.rope_beta_slow,
            "truncate": False,
        }
        out["quantization_config"] = {
            "quant_method": "mxfp4",
            "modules_to_not_convert": [
                "model.layers.*.self_attn",
                "model.layers.*.mlp.router",
                "model.embed_tokens",
                "lm_head",
            ],
        }
        return out


def yarn_cos_sin_cache(cfg: GptOssConfig, max_positions: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The rotary table of ``apply_rotary``: ``float32 [max_positions, head_dim]``, cos | sin.

    YaRN (GPT-OSS flavour): per frequency pair ``j`` the inverse frequency blends
    the extrapolated ``theta^(-2j/D)`` and the interpolated ``theta^(-2j/D) /
    factor`` with a linear ramp between the correction dims of ``beta_fast`` and
    ``beta_slow`` (not rounded to integers); cos and sin are then multiplied by
    ``0.1 ln(factor) + 1``. Angles are computed in float64, so large positions
    keep their precision, and stored as float32.

    Args:
        cfg: the model config.
        max_positions: rows of the table (positions ``0 .. max_positions - 1``).
        device: where the table lives.
    """
    dim = cfg.head_dim
    base, factor = cfg.rope_theta, cfg.rope_factor
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(cfg.rope_original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(correction_dim(cfg.rope_beta_fast), 0.0)
    high = min(correction_dim(cfg.rope_beta_slow), dim - 1.0)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1.0 - ramp
    inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cache = torch.cat([angles.cos(), angles.sin()], dim=-1) * attention_factor
    return cache.to(torch.float32).to(device)

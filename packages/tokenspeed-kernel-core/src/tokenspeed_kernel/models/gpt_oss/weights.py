"""GPT-OSS weights: the typed containers, random weights, and the checkpoint layout.

Weights are held at checkpoint precision: dense tensors bf16, sinks float32
(holding the checkpoint's bf16 values), experts MXFP4 in the canonical
:class:`tokenspeed_kernel.MoEWeights` layout (which is the checkpoint's, with the
``[..., K/32, 16]`` block dims flattened). :class:`~.model.GptOssModel` converts
what it needs for its compute dtype and plans the expert kernel.

Checkpoint layout (Hugging Face ``GptOssForCausalLM``, as released)::

    model.embed_tokens.weight                              [V, H]
    model.layers.N.input_layernorm.weight                  [H]
    model.layers.N.self_attn.{q,k,v,o}_proj.{weight,bias}  q [Hq*D, H], k/v [Hkv*D, H], o [H, Hq*D]
    model.layers.N.self_attn.sinks                         [Hq]
    model.layers.N.post_attention_layernorm.weight         [H]
    model.layers.N.mlp.router.{weight,bias}                [E, H], [E]
    model.layers.N.mlp.experts.gate_up_proj_blocks         uint8 [E, 2I, H/32, 16]  (gate/up rows interleaved)
    model.layers.N.mlp.experts.gate_up_proj_scales         uint8 [E, 2I, H/32]      (E8M0)
    model.layers.N.mlp.experts.gate_up_proj_bias           [E, 2I]
    model.layers.N.mlp.experts.down_proj_{blocks,scales}   uint8 [E, H, I/32, 16], [E, H, I/32]
    model.layers.N.mlp.experts.down_proj_bias              [E, H]
    model.norm.weight                                      [H]
    lm_head.weight                                         [V, H]

in ``model.safetensors`` or shards named by ``model.safetensors.index.json``,
next to ``config.json``. Reading and writing need the ``safetensors`` package.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import torch

import tokenspeed_kernel as tk

from .config import GptOssConfig

__all__ = [
    "GptOssLayer",
    "GptOssWeights",
    "random_layer",
    "random_weights",
    "checkpoint_state_dict",
    "save_checkpoint",
    "load_checkpoint",
]


@dataclass
class GptOssLayer:
    """One decoder layer's weights."""

    index: int
    input_norm: torch.Tensor  # [H]
    qkv_weight: torch.Tensor  # [(Hq + 2 Hkv) D, H]: q rows, then k, then v
    qkv_bias: torch.Tensor  # [(Hq + 2 Hkv) D]
    o_weight: torch.Tensor  # [H, Hq D]
    o_bias: torch.Tensor  # [H]
    sinks: torch.Tensor  # float32 [Hq]
    post_norm: torch.Tensor  # [H]
    router_weight: torch.Tensor  # [E, H]
    router_bias: torch.Tensor  # [E]
    experts: tk.MoEWeights
    moe_plan: tk.MoEPlan | None = None
    #: the layer's moe_apply calls allow fp8 activations (W4A8 kernels): ``GptOssModel(fp8_activations=)``.
    moe_fp8: bool = False


@dataclass
class GptOssWeights:
    """A whole model's weights (``layers`` may be fewer than the config's layer count)."""

    embed_tokens: torch.Tensor  # [V, H]
    layers: list[GptOssLayer]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H]

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device


# ---------------------------------------------------------------------------- random weights

# Mean square of the 16 E2M1 values (0, .5, 1, 1.5, 2, 3, 4, 6 and their negatives).
_E2M1_MEAN_SQUARE = (0 + 0.25 + 1 + 2.25 + 4 + 9 + 16 + 36) / 8


def _random_mxfp4(
    rows: tuple[int, ...], k: int, rms: float, g: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniformly random E2M1 codes, with E8M0 scales of ``2^e`` or ``2^(e-1)`` (at random, per group of 32)
    chosen so the values' root mean square is about ``rms``. Drawn directly in MXFP4: no dense
    tensor is made, so GPT-OSS-20B's experts appear in a moment on a GPU."""
    # With the two scales equally likely, the mean square is E2M1_MS * 4^e * (1/4 + 1)/2.
    e = round(math.log2(rms / math.sqrt(_E2M1_MEAN_SQUARE * 0.625)))
    blocks = torch.randint(0, 256, (*rows, k // 2), dtype=torch.uint8, device=device, generator=g)
    scales = torch.randint(0, 2, (*rows, k // 32), dtype=torch.uint8, device=device, generator=g) + (126 + e)
    return blocks, scales


def random_layer(
    cfg: GptOssConfig,
    index: int,
    *,
    device: torch.device | str = "cpu",
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
) -> GptOssLayer:
    """A layer with random weights of realistic scale (deterministic in ``seed``, ``index`` and the device type).

    Projections have unit-gain scale (``1/sqrt(fan_in)``), biases are small,
    norms are near 1, sink logits ~N(0, 1), the router's logits on a normalised
    input ~N(0, 1); experts are drawn directly as MXFP4 codes and scales.
    """
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed * 100003 + index)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * scale).to(dtype)

    h, d, e, i = cfg.hidden_size, cfg.head_dim, cfg.num_local_experts, cfg.intermediate_size
    qkv_out = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
    w13, w13_scale = _random_mxfp4((e, 2 * i), h, h**-0.5, g, device)
    w2, w2_scale = _random_mxfp4((e, h), i, i**-0.5, g, device)
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
        input_norm=1 + rand(h, scale=0.1),
        qkv_weight=rand(qkv_out, h, scale=h**-0.5),
        qkv_bias=rand(qkv_out, scale=0.02),
        o_weight=rand(h, cfg.num_attention_heads * d, scale=(cfg.num_attention_heads * d) ** -0.5),
        o_bias=rand(h, scale=0.02),
        sinks=rand(cfg.num_attention_heads).float(),
        post_norm=1 + rand(h, scale=0.1),
        router_weight=rand(e, h, scale=h**-0.5),
        router_bias=rand(e, scale=0.02),
        experts=experts,
    )


def random_weights(
    cfg: GptOssConfig,
    *,
    num_layers: int | None = None,
    device: torch.device | str = "cpu",
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
) -> GptOssWeights:
    """Random weights for the first ``num_layers`` (default all) layers of ``cfg`` (see :func:`random_layer`)."""
    device = torch.device(device)
    n = cfg.num_hidden_layers if num_layers is None else num_layers
    g = torch.Generator(device=device).manual_seed(seed * 100003 + 99991)
    h, v = cfg.hidden_size, cfg.vocab_size

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device, dtype=dtype) * scale).to(dtype)

    return GptOssWeights(
        embed_tokens=rand(v, h),
        layers=[random_layer(cfg, i, device=device, seed=seed, dtype=dtype) for i in range(n)],
        norm=1 + rand(h, scale=0.1),
        lm_head=rand(v, h, scale=h**-0.5),
    )


# ---------------------------------------------------------------------------- checkpoint layout


def _layer_tensors(cfg: GptOssConfig, layer: GptOssLayer) -> dict[str, torch.Tensor]:
    nq, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    split = [nq * d, nkv * d, nkv * d]
    qw, kw, vw = layer.qkv_weight.split(split, dim=0)
    qb, kb, vb = layer.qkv_bias.split(split, dim=0)
    ex = layer.experts
    if ex.layout != "canonical" or ex.format != "mxfp4":
        raise ValueError(f"layer {layer.index}: only canonical MXFP4 experts have a checkpoint layout")
    e, h, i = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    p = f"model.layers.{layer.index}."
    return {
        p + "input_layernorm.weight": layer.input_norm,
        p + "self_attn.q_proj.weight": qw,
        p + "self_attn.q_proj.bias": qb,
        p + "self_attn.k_proj.weight": kw,
        p + "self_attn.k_proj.bias": kb,
        p + "self_attn.v_proj.weight": vw,
        p + "self_attn.v_proj.bias": vb,
        p + "self_attn.o_proj.weight": layer.o_weight,
        p + "self_attn.o_proj.bias": layer.o_bias,
        p + "self_attn.sinks": layer.sinks.to(torch.bfloat16),
        p + "post_attention_layernorm.weight": layer.post_norm,
        p + "mlp.router.weight": layer.router_weight,
        p + "mlp.router.bias": layer.router_bias,
        p + "mlp.experts.gate_up_proj_blocks": ex.w13.reshape(e, 2 * i, h // 32, 16),
        p + "mlp.experts.gate_up_proj_scales": ex.w13_scale,
        p + "mlp.experts.gate_up_proj_bias": ex.w13_bias,
        p + "mlp.experts.down_proj_blocks": ex.w2.reshape(e, h, i // 32, 16),
        p + "mlp.experts.down_proj_scales": ex.w2_scale,
        p + "mlp.experts.down_proj_bias": ex.w2_bias,
    }


def checkpoint_state_dict(cfg: GptOssConfig, weights: GptOssWeights) -> dict[str, torch.Tensor]:
    """The tensors of a GPT-OSS checkpoint holding ``weights`` (contiguous, on the CPU)."""
    out = {"model.embed_tokens.weight": weights.embed_tokens}
    for layer in weights.layers:
        out.update(_layer_tensors(cfg, layer))
    out["model.norm.weight"] = weights.norm
    out["lm_head.weight"] = weights.lm_head
    return {k: v.detach().to("cpu").contiguous() for k, v in out.items()}


def save_checkpoint(path: str | os.PathLike, cfg: GptOssConfig, weights: GptOssWeights) -> None:
    """Write ``config.json`` and ``model.safetensors`` in the GPT-OSS checkpoint layout under ``path``."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    n = len(weights.layers)
    cfg = cfg if n == cfg.num_hidden_layers else cfg.with_layers(n)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg.to_hf_dict(), f, indent=2)
    save_file(checkpoint_state_dict(cfg, weights), os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


class _Checkpoint:
    """Lazy access to the tensors of one checkpoint directory (single file or index + shards)."""

    def __init__(self, path: str) -> None:
        from safetensors import safe_open

        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                weight_map: dict[str, str] = json.load(f)["weight_map"]
        else:
            single = os.path.join(path, "model.safetensors")
            if not os.path.exists(single):
                raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")
            with safe_open(single, framework="pt") as f:
                weight_map = dict.fromkeys(f.keys(), "model.safetensors")
        self._files = {name: safe_open(os.path.join(path, name), framework="pt") for name in set(weight_map.values())}
        self._where = weight_map

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(f"checkpoint: missing tensor {name!r}")
        return self._files[self._where[name]].get_tensor(name)


def load_checkpoint(
    path: str | os.PathLike,
    *,
    device: torch.device | str = "cpu",
    num_layers: int | None = None,
) -> tuple[GptOssConfig, GptOssWeights]:
    """Read a GPT-OSS checkpoint directory (``config.json`` + safetensors in the released layout).

    Args:
        path: the directory.
        device: where the weights go.
        num_layers: load only the first layers (default: all of ``config.json``'s).

    Returns:
        ``(config, weights)``; the config has ``num_layers`` layers when given.
    """
    path = os.fspath(path)
    with open(os.path.join(path, "config.json")) as f:
        cfg = GptOssConfig.from_hf_dict(json.load(f))
    if num_layers is not None:
        if not 1 <= num_layers <= cfg.num_hidden_layers:
            raise ValueError(f"num_layers: expected 1..{cfg.num_hidden_layers}, got {num_layers}")
        cfg = cfg.with_layers(num_layers)
    ckpt = _Checkpoint(path)
    device = torch.device(device)

    def t(name: str, dtype: torch.dtype | None = torch.bfloat16) -> torch.Tensor:
        x = ckpt.get(name)
        return x.to(device=device, dtype=dtype) if dtype is not None else x.to(device)

    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        attn = [t(p + f"self_attn.{n}_proj.weight") for n in "qkv"]
        attn_bias = [t(p + f"self_attn.{n}_proj.bias") for n in "qkv"]
        ex = p + "mlp.experts."
        experts = tk.MoEWeights.from_gpt_oss(
            t(ex + "gate_up_proj_blocks", None),
            t(ex + "gate_up_proj_scales", None),
            t(ex + "gate_up_proj_bias"),
            t(ex + "down_proj_blocks", None),
            t(ex + "down_proj_scales", None),
            t(ex + "down_proj_bias"),
        )
        layers.append(
            GptOssLayer(
                index=i,
                input_norm=t(p + "input_layernorm.weight"),
                qkv_weight=torch.cat(attn, dim=0),
                qkv_bias=torch.cat(attn_bias, dim=0),
                o_weight=t(p + "self_attn.o_proj.weight"),
                o_bias=t(p + "self_attn.o_proj.bias"),
                sinks=t(p + "self_attn.sinks", torch.float32),
                post_norm=t(p + "post_attention_layernorm.weight"),
                router_weight=t(p + "mlp.router.weight"),
                router_bias=t(p + "mlp.router.bias"),
                experts=experts,
            )
        )
    weights = GptOssWeights(
        embed_tokens=t("model.embed_tokens.weight"),
        layers=layers,
        norm=t("model.norm.weight"),
        lm_head=t("lm_head.weight"),
    )
    return cfg, weights

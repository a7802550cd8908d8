"""GPT-OSS on the public API against the upstream ``transformers`` implementation (CPU, tiny config).

A tiny GPT-OSS checkpoint with random weights is written in the released layout
(MXFP4 ``*_blocks`` + ``*_scales``, interleaved gate/up, safetensors). Our side
loads it with :func:`load_checkpoint`; the upstream side is ``GptOssForCausalLM``
built from a ``transformers.GptOssConfig`` made from the same ``config.json``,
its experts dequantized by transformers' own MXFP4 decoder
(``integrations.mxfp4.convert_moe_packed_tensors``, the function its loader uses;
its ``from_pretrained`` MXFP4 path also wants ``accelerate``), every other tensor
loaded by name with ``strict=True`` (so the checkpoint's names are the upstream's).
Upstream runs the readable eager attention and eager expert loop.

Tolerances:

- float32 (both sides): the weights are identical and both compute in fp32, so
  the only differences are summation order (fp32 eps 1.2e-7 over sums of <= 128
  terms, through 4 layers): measured max |logit error| 1.5e-6 .. 1.4e-5 on logits
  of magnitude ~4, over 14 seeds. The bound is 2e-4. Every math slip we tried
  (window off by one, no +1 on up, no clamp, plain rope, no YaRN attention factor,
  no top-k renormalisation, no router bias, no sinks) moves the logits by 0.1 to
  4, four orders of magnitude above it. Greedy tokens must match exactly; the
  test first checks the upstream top-1/top-2 margins are far above the error.
- bf16 (ours) against fp32 upstream: every op boundary rounds to bf16 (2^-8 =
  0.004 relative), and at the odd position bf16 router logits flip a near-tied
  top-4 choice, a jump no tolerance bounds (upstream's own bf16 run does it
  too, at other positions). So the statistic is the median over positions of the
  relative L2 error of a position's logits, and the bound is what upstream itself
  loses in bf16: ours <= 1.25x transformers' bf16 model's, both against the same
  fp32 upstream run, and <= 0.02. Measured over 8 seeds: ours 0.0056 .. 0.0067,
  upstream bf16 0.0074 .. 0.0091 (our ops compute in fp32 and round once).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.models import gpt_oss as m

transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.torch import load_file  # noqa: E402
from transformers.integrations.mxfp4 import convert_moe_packed_tensors  # noqa: E402

PROMPTS = [list(range(1, 14)), [5, 6, 7, 8, 9], list(range(20, 40))]  # 13, 5, 20 tokens: window 8 is crossed
NEW_TOKENS = 9  # one from the prefill, then 8 decode steps
FP32_TOL = 2e-4


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # Tiny tensors: intra-op threads only add overhead (and the CI machine has 2 cores).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _test_weights(cfg: m.GptOssConfig) -> m.GptOssWeights:
    w = m.random_weights(cfg, seed=0)
    for layer in w.layers:
        # Gate/up biases of std 6 push a good share of gate/up values past +-7, so the clamp matters.
        layer.experts = replace(layer.experts, w13_bias=(layer.experts.w13_bias.float() * 300).to(torch.bfloat16))
    return w


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    cfg = m.GptOssConfig.tiny()
    path = tmp_path_factory.mktemp("gpt_oss_tiny")
    m.save_checkpoint(path, cfg, _test_weights(cfg))
    return path


def _upstream_config(path) -> transformers.GptOssConfig:
    data = json.loads((path / "config.json").read_text())
    data.pop("quantization_config")  # experts are dequantized below; the model is the dense one
    hf_cfg = transformers.GptOssConfig(**data)
    hf_cfg._attn_implementation = "eager"
    hf_cfg._experts_implementation = "eager"
    return hf_cfg


@pytest.fixture(scope="module")
def upstream(checkpoint):
    model = transformers.GptOssForCausalLM(_upstream_config(checkpoint)).eval()
    tensors = load_file(checkpoint / "model.safetensors")
    state = {}
    for name, t in tensors.items():
        if name.endswith("_blocks"):
            base = name[: -len("_blocks")]
            state[base] = convert_moe_packed_tensors(t, tensors[base + "_scales"], dtype=torch.float32)
        elif not name.endswith("_scales"):
            state[name] = t.float()
    model.load_state_dict(state, strict=True)
    return model


def _upstream_logits(model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    """Upstream logits of every position of ``prompt + generated[:-1]`` (one causal forward)."""
    ids = torch.tensor([prompt + generated[:-1]])
    with torch.no_grad():
        return model(ids).logits[0].float()


def _ours(checkpoint, dtype: torch.dtype) -> m.GenerationResult:
    cfg, weights = m.load_checkpoint(checkpoint)
    model = m.GptOssModel(cfg, weights, dtype=dtype, max_positions=64)
    # page_size 4: every sequence spans several pages, and its decode pages are not next to its prompt's.
    with tk.kernel_override("reference"):
        return m.generate(model, PROMPTS, NEW_TOKENS, page_size=4, return_logits=True, all_prefill_logits=True)


def _ours_per_sequence(result: m.GenerationResult) -> list[torch.Tensor]:
    """Our logits per sequence, ``[len(prompt) + 8, V]``: the prefill's, then the decode steps'."""
    out, start = [], 0
    for b, prompt in enumerate(PROMPTS):
        prefill = result.prefill_logits[start : start + len(prompt)].float()
        decode = torch.stack([step[b] for step in result.decode_logits]).float()
        out.append(torch.cat([prefill, decode]))
        start += len(prompt)
    return out


def test_config_roundtrip_through_transformers(checkpoint):
    cfg = m.GptOssConfig.tiny()
    hf_cfg = _upstream_config(checkpoint)
    assert hf_cfg.layer_types == ["sliding_attention", "full_attention"] * 2
    assert m.GptOssConfig.from_hf_dict(hf_cfg.to_dict()) == cfg


def test_yarn_table_matches_transformers(checkpoint):
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    for cfg, hf_cfg in (
        (m.GptOssConfig.tiny(), _upstream_config(checkpoint)),
        (m.GptOssConfig.gpt_oss_20b(), transformers.GptOssConfig()),
    ):
        rotary = GptOssRotaryEmbedding(hf_cfg)
        assert rotary.attention_scaling == pytest.approx(0.1 * math.log(32) + 1)
        positions = torch.arange(4096)
        cos, sin = rotary(torch.zeros(1, dtype=torch.float32), positions[None])
        ours = m.yarn_cos_sin_cache(cfg, 4096)
        half = cfg.head_dim // 2
        # Upstream forms angles in fp32 (error ~ position * 2^-24 rad); ours in fp64.
        tol = (positions[:, None] * 2.0**-23 + 1e-6) * rotary.attention_scaling
        assert ((ours[:, :half] - cos[0]).abs() <= tol).all()
        assert ((ours[:, half:] - sin[0]).abs() <= tol).all()


def test_checkpoint_names_and_shapes_are_upstreams(checkpoint, upstream):
    tensors = load_file(checkpoint / "model.safetensors")
    expected = {}
    for name, p in upstream.state_dict().items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            e, k, n = p.shape  # upstream's dense expert is [E, K, N]; the checkpoint is by output row
            expected[name + "_blocks"] = (e, n, k // 32, 16)
            expected[name + "_scales"] = (e, n, k // 32)
        else:
            expected[name] = tuple(p.shape)
    assert {k: tuple(v.shape) for k, v in tensors.items()} == expected
    blocks = [t for k, t in tensors.items() if k.endswith(("_blocks", "_scales"))]
    assert blocks and all(t.dtype == torch.uint8 for t in blocks)


def test_clamp_is_exercised(checkpoint):
    """The test weights drive gate/up past the +-7 limit, so the parity tests cover the clamp."""
    _, weights = m.load_checkpoint(checkpoint)
    bias = weights.layers[0].experts.w13_bias.float()
    assert (bias.abs() > 7).float().mean() > 0.1


def test_fp32_logits_and_greedy_tokens_match_transformers(checkpoint, upstream):
    result = _ours(checkpoint, torch.float32)
    for b, (prompt, ours) in enumerate(zip(PROMPTS, _ours_per_sequence(result))):
        generated = result.tokens[b]
        assert len(generated) == NEW_TOKENS
        theirs = _upstream_logits(upstream, prompt, generated)
        assert ours.shape == theirs.shape == (len(prompt) + NEW_TOKENS - 1, 128)
        n = len(prompt)
        err_prefill = (ours[:n] - theirs[:n]).abs().max().item()
        err_decode = (ours[n:] - theirs[n:]).abs().max().item()
        assert err_prefill <= FP32_TOL, f"sequence {b}: prefill logits off by {err_prefill:.3g}"
        assert err_decode <= FP32_TOL, f"sequence {b}: decode logits off by {err_decode:.3g}"
        # Greedy: each generated token is upstream's argmax at the previous position.
        top2 = theirs[n - 1 :].topk(2, dim=-1).values
        assert (top2[:, 0] - top2[:, 1]).min() > 2 * FP32_TOL, "a near-tie makes the token comparison ill-posed"
        assert theirs[n - 1 :].argmax(dim=-1).tolist() == generated


def test_fp32_greedy_matches_transformers_generate(checkpoint, upstream):
    """Upstream's own cached generation (its KV cache and sliding-window cache) gives our tokens."""
    result = _ours(checkpoint, torch.float32)
    for b, prompt in enumerate(PROMPTS):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = upstream.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=0,
            )
        assert out[0, len(prompt) :].tolist() == result.tokens[b]


def test_bf16_within_upstream_bf16_error(checkpoint, upstream):
    ours = _ours(checkpoint, torch.bfloat16)
    upstream_bf16 = transformers.GptOssForCausalLM(_upstream_config(checkpoint)).eval()
    upstream_bf16.load_state_dict(upstream.state_dict())
    upstream_bf16.to(torch.bfloat16)
    for name, module in upstream_bf16.named_modules():
        if name.endswith("norm"):  # as from_pretrained keeps them (_keep_in_fp32_modules)
            module.float()
    ours_err, upstream_err = [], []
    for b, (prompt, our_logits) in enumerate(zip(PROMPTS, _ours_per_sequence(ours))):
        truth = _upstream_logits(upstream, prompt, ours.tokens[b])
        ids = torch.tensor([prompt + ours.tokens[b][:-1]])
        with torch.no_grad():
            theirs_bf16 = upstream_bf16(ids).logits[0].float()
        ours_err.append((our_logits - truth).norm(dim=-1) / truth.norm(dim=-1))
        upstream_err.append((theirs_bf16 - truth).norm(dim=-1) / truth.norm(dim=-1))
    ours_median = torch.cat(ours_err).median().item()
    upstream_median = torch.cat(upstream_err).median().item()
    assert ours_median <= 1.25 * upstream_median, f"ours {ours_median:.4f}, upstream bf16 {upstream_median:.4f}"
    assert ours_median <= 0.02

"""GPT-OSS on the public API only: the model code never names a backend or a vendor.

- :mod:`.config`: :class:`GptOssConfig` (20B / 120B / tiny), the YaRN rotary table;
- :mod:`.weights`: typed weights, random weights, the released checkpoint layout
  (MXFP4 ``*_blocks`` + ``*_scales``, interleaved gate/up) read and written with safetensors;
- :mod:`.kvcache`: :class:`PagedKVCache`, a paged cache with a simple block manager;
- :mod:`.model`: :class:`GptOssModel` (prefill of a packed batch, decode over the cache);
- :mod:`.generate`: the generation loop (ragged prefill, then decode; CUDA graph on GPUs),
  greedy and top-k / top-p sampling.

The math follows the project's GPT_OSS.md (the parity target is the
``transformers`` implementation; see ``tests/test_gpt_oss_model.py``).
"""

from __future__ import annotations

from .config import GptOssConfig, yarn_cos_sin_cache
from .generate import DecodeRunner, GenerationResult, Sampler, SamplingParams, generate, pack_prompts
from .kvcache import PagedKVCache
from .model import GptOssModel, layer_decode, layer_prefill, plan_layer
from .weights import (
    GptOssLayer,
    GptOssWeights,
    checkpoint_state_dict,
    load_checkpoint,
    random_layer,
    random_weights,
    save_checkpoint,
)

__all__ = [
    "GptOssConfig",
    "yarn_cos_sin_cache",
    "GptOssLayer",
    "GptOssWeights",
    "random_layer",
    "random_weights",
    "checkpoint_state_dict",
    "save_checkpoint",
    "load_checkpoint",
    "PagedKVCache",
    "GptOssModel",
    "layer_prefill",
    "layer_decode",
    "plan_layer",
    "SamplingParams",
    "Sampler",
    "DecodeRunner",
    "GenerationResult",
    "generate",
    "pack_prompts",
]

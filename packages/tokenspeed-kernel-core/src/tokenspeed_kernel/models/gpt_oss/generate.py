"""Generation: prefill a batch of prompts, then decode, with the decode step in a CUDA graph on GPUs.

The decode step works on static buffers (current token and cache length per
sequence; the page-table rows) and advances them itself: it runs the model (each
layer's attention call rotates the new token's q and k, writes k and v into the cache
at position ``cache_seqlens - 1``, found in the page table on the device, and
attends), samples, writes the sampled token back into the token buffer and adds one
to the cache lengths: two small launches and no allocation besides the model's and
the sampler's. The host only replays it, so the hot path launches one graph and
never waits for the device. Pages for every step are reserved at prefill time.

Before capture the step runs once eagerly (on a side stream): that first call
resolves and caches every kernel selection and compiles/loads the kernels, so
capture records only kernel launches.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

import tokenspeed_kernel as tk

from .kvcache import PagedKVCache
from .model import GptOssModel

__all__ = ["SamplingParams", "Sampler", "DecodeRunner", "GenerationResult", "generate", "pack_prompts"]


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0``: greedy (``argmax``); otherwise ``top_k_top_p_sample``."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Sampler:
    """Samples one token per row with static parameter tensors (so it can sit inside a CUDA graph).

    The uniform random numbers live in a static buffer that :meth:`refresh` refills
    from a seeded generator before each step, outside any graph.
    """

    def __init__(self, params: SamplingParams, batch: int, device: torch.device) -> None:
        self.params = params
        if not params.greedy:
            self.top_k = torch.full((batch,), params.top_k, dtype=torch.int32, device=device)
            self.top_p = torch.full((batch,), params.top_p, dtype=torch.float32, device=device)
            self.temperature = torch.full((batch,), params.temperature, dtype=torch.float32, device=device)
            self.uniform = torch.zeros(batch, dtype=torch.float32, device=device)
            self.generator = torch.Generator(device=device).manual_seed(params.seed)

    def refresh(self) -> None:
        if not self.params.greedy:
            self.uniform.uniform_(0.0, 1.0, generator=self.generator)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits [B, V]`` -> ``int64 [B]``."""
        if self.params.greedy:
            return tk.argmax(logits)
        return tk.top_k_top_p_sample(logits, self.top_k, self.top_p, temperature=self.temperature, uniform=self.uniform)


class DecodeRunner:
    """The decode step of a fixed batch (sequence slots ``0 .. batch-1`` of ``cache``) on static buffers.

    Args:
        model: the model.
        cache: its paged cache; each sequence's pages for all coming steps must be reserved.
        batch: number of sequences.
        sampler: a :class:`Sampler` for ``batch`` rows.
        cuda_graph: capture the step after its first (eager) run.
        on_capture_error: ``"raise"``, or ``"warn"`` and go on eagerly.
        attention_plans: eager steps only: keep the positions on the host too (read once per
            :meth:`set_state`) and give each step's attention an attention plan of its lengths
            (``tk.mha_plan``), so no kernel reads them from the device on the host's behalf.
    """

    def __init__(
        self,
        model: GptOssModel,
        cache: PagedKVCache,
        batch: int,
        sampler: Sampler,
        *,
        cuda_graph: bool,
        on_capture_error: str = "raise",
        attention_plans: bool = False,
    ) -> None:
        if attention_plans and cuda_graph:
            raise ValueError(
                "attention_plans: eager steps only (a captured step reads the lengths on the device); "
                "pass cuda_graph=False"
            )
        dev = model.device
        self.model, self.cache, self.sampler = model, cache, sampler
        self.tokens = torch.zeros(batch, dtype=torch.int64, device=dev)
        #: the tokens in each sequence's cache, the new one included: the new token sits at ``cache_seqlens - 1``.
        self.cache_seqlens = torch.ones(batch, dtype=torch.int32, device=dev)
        self.page_table = cache.page_table[:batch]
        self.want_graph = cuda_graph
        self.on_capture_error = on_capture_error
        self.capture_error: str | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self._graph_logits: torch.Tensor | None = None
        #: the positions on the host (``attention_plans``): read by set_state, advanced by each step.
        self.host_positions: list[int] | None = [0] * batch if attention_plans else None

    def set_state(self, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """The next step processes ``tokens int64 [B]`` at ``positions int64 [B]``."""
        self.tokens.copy_(tokens)
        self.cache_seqlens.copy_(positions + 1)
        if self.host_positions is not None:
            self.host_positions = [int(p) for p in positions.tolist()]

    @property
    def positions(self) -> torch.Tensor:
        """The next step's positions, ``int64 [B]`` (a new tensor: ``cache_seqlens - 1``)."""
        return self.cache_seqlens.long() - 1

    def _step(self) -> torch.Tensor:
        plan = None
        if self.host_positions is not None:
            plan = tk.mha_plan(cache_seqlens=[p + 1 for p in self.host_positions])
        logits = self.model.decode(
            self.tokens, None, self.cache, None, self.cache_seqlens, self.page_table, attention_plan=plan
        )
        self.tokens.copy_(self.sampler(logits))
        self.cache_seqlens.add_(1)
        if self.host_positions is not None:
            self.host_positions = [p + 1 for p in self.host_positions]
        return logits

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self._step()
        self.graph, self._graph_logits = graph, logits

    def step(self) -> torch.Tensor:
        """Run one step; returns its logits ``[B, V]`` (a graph's static buffer: clone to keep)."""
        self.sampler.refresh()
        if self.graph is not None:
            self.graph.replay()
            return self._graph_logits
        if not self.want_graph:
            return self._step()
        # Warm-up on a side stream (what torch recommends before capture): selections get
        # cached and kernels compiled by this real step, so capture records launches only.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            logits = self._step()
        torch.cuda.current_stream().wait_stream(side)
        logits.record_stream(torch.cuda.current_stream())  # the caller reads it on the main stream
        try:
            self._capture()
        except Exception as exc:
            if self.on_capture_error != "warn":
                raise
            self.want_graph = False
            self.capture_error = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"DecodeRunner: CUDA-graph capture failed, decoding eagerly: {exc}", RuntimeWarning, stacklevel=2
            )
        return logits


@dataclass
class GenerationResult:
    """What :func:`generate` produced.

    ``tokens``: the sampled tokens per prompt (``max_new_tokens`` each; under
    teacher forcing still what the model sampled). ``prefill_logits``: ``[B, V]``
    for each prompt's last token, or ``[T, V]`` for every prompt token.
    ``decode_logits``: one ``[B, V]`` per decode step when asked for.
    ``decode_seconds`` covers every decode step, the first (eager warm-up and
    graph capture) included; ``steady_decode_seconds`` the ``decode_steps - 1``
    steps after it.
    """

    tokens: list[list[int]]
    prefill_logits: torch.Tensor
    decode_logits: list[torch.Tensor] = field(default_factory=list)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_steps: int = 0
    steady_decode_seconds: float = 0.0
    cuda_graph: bool = False


def pack_prompts(
    prompts: Sequence[Sequence[int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(tokens int64 [T], positions int64 [T], cu_seqlens int32 [B+1], last_index int64 [B])``."""
    lens = [len(p) for p in prompts]
    tokens = torch.tensor([t for p in prompts for t in p], dtype=torch.int64)
    positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in lens])
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    last = cu[1:].to(torch.int64) - 1
    return tokens.to(device), positions.to(device), cu.to(device), last.to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def generate(
    model: GptOssModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    sampling: SamplingParams | None = None,
    page_size: int = 16,
    cuda_graph: bool | None = None,
    return_logits: bool = False,
    all_prefill_logits: bool = False,
    teacher_tokens: torch.Tensor | None = None,
    attention_plans: bool = False,
) -> GenerationResult:
    """Prefill ``prompts`` (a ragged batch) in one packed forward, then decode ``max_new_tokens - 1`` steps.

    Args:
        model: the model.
        prompts: token ids per sequence (lengths may differ).
        max_new_tokens: tokens to generate per sequence (the first comes from the prefill).
        sampling: :class:`SamplingParams` (default greedy).
        page_size: KV-cache page size.
        cuda_graph: capture the decode step (default: on CUDA devices; if capture
            fails then, a warning is given and the steps run eagerly).
        return_logits: keep every decode step's logits.
        all_prefill_logits: return the logits of every prompt token, not only the last.
        teacher_tokens: ``int64 [B, max_new_tokens]``: feed these tokens instead of the
            sampled ones (to compare two runs step by step).
        attention_plans: give the prefill and every (eager) decode step an attention plan
            of their lengths from the host (``tk.mha_plan``); the decode then runs eagerly
            (``cuda_graph=True`` with it is refused).

    Returns:
        :class:`GenerationResult`; the timings include a device synchronisation at each end.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: expected at least one non-empty prompt")
    device = model.device
    batch = len(prompts)
    lens = [len(p) for p in prompts]
    total = max(lens) + max_new_tokens
    if total > model.max_positions:
        raise ValueError(f"prompts: {total} positions needed, the model's rotary table has {model.max_positions}")
    if teacher_tokens is not None and tuple(teacher_tokens.shape) != (batch, max_new_tokens):
        raise ValueError(
            f"teacher_tokens: expected shape [{batch}, {max_new_tokens}], got {list(teacher_tokens.shape)}"
        )
    sampling = sampling or SamplingParams()
    if cuda_graph is None:
        auto_graph, cuda_graph = True, device.type == "cuda" and not attention_plans
    else:
        auto_graph = False
    if cuda_graph and device.type != "cuda":
        raise ValueError("cuda_graph: needs a CUDA device")

    cache = model.new_cache(batch, total, page_size=page_size)
    slots = torch.cat([cache.reserve(b, n) for b, n in enumerate(lens)])
    for b in range(batch):
        cache.reserve(b, max_new_tokens - 1)  # every decode step's page, so steps need no host work
    tokens, positions, cu, last = pack_prompts(prompts, device)
    sampler = Sampler(sampling, batch, device)

    _sync(device)
    t0 = time.perf_counter()
    cu_host = [0]
    for n in lens:
        cu_host.append(cu_host[-1] + n)
    plan = tk.mha_plan(cu_seqlens_q=cu_host, cu_seqlens_k=cu_host) if attention_plans else None
    logits = model.prefill(
        tokens,
        positions,
        cu,
        max(lens),
        cache,
        slots,
        last_index=None if all_prefill_logits else last,
        attention_plan=plan,
    )
    sampler.refresh()
    first = sampler(logits if not all_prefill_logits else logits[last])
    _sync(device)
    t1 = time.perf_counter()

    generated = [first]
    runner = DecodeRunner(
        model,
        cache,
        batch,
        sampler,
        cuda_graph=cuda_graph,
        on_capture_error="warn" if auto_graph else "raise",
        attention_plans=attention_plans,
    )
    runner.set_state(first if teacher_tokens is None else teacher_tokens[:, 0], torch.tensor(lens, device=device))
    decode_logits = []
    t_steady = t1
    for step in range(1, max_new_tokens):
        step_logits = runner.step()
        if return_logits:
            decode_logits.append(step_logits.clone())
        generated.append(runner.tokens.clone())
        if teacher_tokens is not None:
            runner.tokens.copy_(teacher_tokens[:, step])
        if step == 1:
            _sync(device)
            t_steady = time.perf_counter()
    _sync(device)
    t2 = time.perf_counter()
    return GenerationResult(
        tokens=torch.stack(generated, dim=1).tolist(),
        prefill_logits=logits,
        decode_logits=decode_logits,
        prefill_seconds=t1 - t0,
        decode_seconds=t2 - t1,
        decode_steps=max_new_tokens - 1,
        steady_decode_seconds=t2 - t_steady if max_new_tokens > 2 else 0.0,
        cuda_graph=runner.graph is not None,
    )

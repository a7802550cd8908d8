"""The GPT-OSS forward pass on the public ops only (no backend or vendor is named here).

Block (see the project's GPT_OSS.md): ``x = x + attn(rmsnorm(x))``, then
``x = x + moe(rmsnorm(x))``; final ``rmsnorm``, then the unembedding.

- attention: one ``mm`` for q|k|v with biases, YaRN rotary embedding (neox) and the
  paged cache's new K/V (prefill: ``apply_rotary`` then ``kvcache_store``, since attention
  reads the rotated k), then ``mha_prefill`` (new sequences) with per-head sinks,
  ``window_left = 127`` on the sliding layers, softmax scale ``1/sqrt(head_dim)``; decode:
  ``mha_decode_append_kvcache`` (the rotation, the cache write at position
  ``cache_seqlens - 1`` and the attention in one call), or, when the caller gives the
  positions and slots, ``apply_rotary_and_store`` then ``mha_decode_with_kvcache``;
  ``mm`` for o with bias;
- MoE: the router, ``moe_gate`` (the post-attention norm of the stream, then the router's linear
  layer with bias, then top-4 with the softmax over the four, in one call), ``moe_apply`` with the
  MXFP4 experts, their biases and the clamped SwiGLU, through a kernel picked once by ``moe_plan``
  (weights converted once by ``moe_process_weights``);
- both norms of a layer fuse the residual add before them (``rmsnorm(..., residual=)``, and
  ``moe_gate(..., residual=)``): the model carries a layer's MoE output and the residual stream
  apart, and the next layer's input norm (or the final norm) adds them, so no block ends in a
  separate add.

The embedding is a row gather (``embed_tokens[ids]``): engine-side indexing, not a
kernel op.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

import tokenspeed_kernel as tk

from .config import GptOssConfig, yarn_cos_sin_cache
from .kvcache import PagedKVCache
from .prepared import PreparedSites
from .weights import GptOssLayer, GptOssWeights

__all__ = ["GptOssModel", "layer_prefill", "layer_decode", "plan_layer"]


def _qkv_views(cfg: GptOssConfig, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k and v: views of one projection ``[T, (nq + 2 nkv) * d]`` (heads first, then one split: two view calls).
    The rotary ops and the cache store read strided rows."""
    nq, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    # (split_with_sizes: the C method under Tensor.split's Python wrapper)
    q, k, v = qkv.reshape(qkv.shape[0], nq + 2 * nkv, d).split_with_sizes([nq, nkv, nkv], dim=1)
    return q, k, v


def _qkv(
    cfg: GptOssConfig, layer: GptOssLayer, h: torch.Tensor, ops: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k and v (:func:`_qkv_views` of the projection)."""
    return _qkv_views(cfg, ops.mm(h, layer.qkv_weight, layer.qkv_bias))


class DecodeBuffers:
    """The buffers a decode of ``batch`` sequences writes the projection and the attention into, with their views
    made once: a layer's ``mm`` writes ``qkv`` (``out=``) and the attention ``attn`` (``out=``), so a step makes no
    view call (reshape, split) and no allocation for them. Every layer uses the same ones: the stream orders a layer's
    readers before the next layer's writers."""

    def __init__(self, cfg: GptOssConfig, batch: int, dtype: torch.dtype, device: torch.device) -> None:
        nq, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv = torch.empty((batch, (nq + 2 * nkv) * d), dtype=dtype, device=device)
        self.q, self.k, self.v = _qkv_views(cfg, self.qkv)
        self.attn = torch.empty((batch, nq, d), dtype=dtype, device=device)
        self.attn_rows = self.attn.view(batch, nq * d)


def _moe(cfg: GptOssConfig, layer: GptOssLayer, o: torch.Tensor, x: torch.Tensor, ops: Any) -> tuple[torch.Tensor, ...]:
    """The post-attention norm of the stream ``x + o`` and the router in one call, then the experts on the norm's
    output: ``(moe, stream)``."""
    topk_weights, topk_ids, h, x = ops.moe_gate(
        o, layer.router_weight, layer.router_bias, cfg.num_experts_per_tok,
        norm_weight=layer.post_norm, norm_eps=cfg.rms_norm_eps, residual=x,
    )  # fmt: skip
    moe = ops.moe_apply(
        h, topk_weights, topk_ids, layer.experts, cfg.activation, plan=layer.moe_plan, fp8_activations=layer.moe_fp8
    )
    return moe, x


def plan_layer(
    cfg: GptOssConfig, layer: GptOssLayer, dtype: torch.dtype, device: torch.device, *, fp8_activations: bool = False
) -> GptOssLayer:
    """A copy of ``layer`` whose experts are converted for the ``moe_apply`` kernel selected now.

    An override active at the call (context, environment, config file) applies to the plan.
    ``fp8_activations``: the layer's calls allow W4A8 kernels (plan and calls).
    The input layer is not modified.
    """
    plan = tk.moe_plan(layer.experts, cfg.activation, dtype=dtype, device=device, fp8_activations=fp8_activations)
    return replace(layer, moe_plan=plan, moe_fp8=fp8_activations, experts=tk.moe_process_weights(plan, layer.experts))


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
    *,
    ops: Any = tk,
    attention_plan: tk.AttentionPlan | None = None,
) -> torch.Tensor:
    """One layer over a packed batch of new sequences.

    Args:
        x: ``[T, H]`` hidden states, sequences packed by ``cu_seqlens int32 [B+1]``.
        positions: ``int64 [T]``, each token's position in its sequence.
        max_seqlen: host int, the longest sequence.
        cos_sin: the YaRN table (:func:`yarn_cos_sin_cache`).
        cache, slots: when given, K/V are written to ``cache`` at ``slots int64 [T]``.
        ops: what the ops are called through: ``tokenspeed_kernel`` (eager), or
            ``tokenspeed_kernel.compile.ops`` (torch custom ops) to trace under ``torch.compile``.
        attention_plan: ``tk.mha_plan(cu_seqlens_q=..., cu_seqlens_k=...)`` of ``cu_seqlens``
            from the host, or None.

    Returns:
        ``[T, H]``, the layer's output (residual stream).
    """
    moe, x = _block_prefill(
        cfg, layer, x, None, positions, cu_seqlens, max_seqlen, cos_sin, cache, slots,
        ops=ops, attention_plan=attention_plan,
    )  # fmt: skip
    return x + moe


def _input_norm(
    cfg: GptOssConfig, layer: GptOssLayer, x: torch.Tensor, residual: torch.Tensor | None, ops: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's input norm of the stream ``x + residual`` (``x`` alone without one): ``(h, stream)``."""
    if residual is None:
        return ops.rmsnorm(x, layer.input_norm, cfg.rms_norm_eps), x
    return ops.rmsnorm(x, layer.input_norm, cfg.rms_norm_eps, residual=residual)


def _post_attention(
    cfg: GptOssConfig, layer: GptOssLayer, attn: torch.Tensor, x: torch.Tensor, ops: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """The o projection of ``attn`` (``[T, nq, d]``, or its ``[T, nq * d]`` rows), the post-attention norm adding it
    to the stream ``x`` (inside the router's call), the MoE: ``(moe, stream)``."""
    o = ops.mm(attn if attn.dim() == 2 else attn.reshape(attn.shape[0], -1), layer.o_weight, layer.o_bias)
    return _moe(cfg, layer, o, x, ops)


def _block_prefill(
    cfg: GptOssConfig,
    layer: GptOssLayer,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    positions: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    cos_sin: torch.Tensor,
    cache: PagedKVCache | None,
    slots: torch.Tensor | None,
    *,
    ops: Any,
    attention_plan: tk.AttentionPlan | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`layer_prefill` on the stream ``x + residual`` (``x`` alone without one), its residual add left to
    the caller: ``(moe, stream)``, whose sum is the layer's output."""
    h, x = _input_norm(cfg, layer, x, residual, ops)
    q, k, v = _qkv(cfg, layer, h, ops)
    q, k = ops.apply_rotary(q, k, cos_sin, positions, style="neox")
    v = v.contiguous()  # attention reads it (the store reads strided rows)
    if cache is not None:
        ops.kvcache_store(k, v, cache.k[layer.index], cache.v[layer.index], slots)
    attn = ops.mha_prefill(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
        causal=True, window_left=cfg.window_left(layer.index), sinks=layer.sinks, plan=attention_plan,
    )  # fmt: skip
    return _post_attention(cfg, layer, attn, x, ops)


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
    *,
    ops: Any = tk,
    attention_plan: tk.AttentionPlan | None = None,
) -> torch.Tensor:
    """One layer for one new token per sequence over the paged cache.

    Args:
        x: ``[B, H]``.
        positions, slots: ``int64 [B]``, the new token's position and the cache slot its K/V go to; both None: the
            position ``cache_seqlens - 1`` and its slot in ``page_table``, found by the attention's call
            (``mha_decode_append_kvcache``: one call for the rotation, the cache write and the attention).
        cache_seqlens: ``int32 [B]``, tokens in the cache including the new one.
        page_table: ``int32 [B, max_pages]``, rows of ``cache.page_table``.
        ops: as :func:`layer_prefill`.
        attention_plan: the step's ``tk.mha_plan(cache_seqlens=...)`` (host lengths), or None.
    """
    moe, x = _block_decode(
        cfg, layer, x, None, positions, cos_sin, cache, slots, cache_seqlens, page_table,
        ops=ops, attention_plan=attention_plan,
    )  # fmt: skip
    return x + moe


def _block_decode(
    cfg: GptOssConfig,
    layer: GptOssLayer,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    positions: torch.Tensor | None,
    cos_sin: torch.Tensor,
    cache: PagedKVCache,
    slots: torch.Tensor | None,
    cache_seqlens: torch.Tensor,
    page_table: torch.Tensor,
    *,
    ops: Any,
    attention_plan: tk.AttentionPlan | None,
    buffers: DecodeBuffers | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`layer_decode` on the stream ``x + residual``, its residual add left to the caller (as
    :func:`_block_prefill`); with ``buffers``, the projection and the attention written into them."""
    if (positions is None) != (slots is None):
        missing = "positions" if positions is None else "slots"
        raise ValueError(f"{missing}: give positions and slots together, or neither (found from cache_seqlens)")
    h, x = _input_norm(cfg, layer, x, residual, ops)
    if buffers is None:
        q, k, v = _qkv(cfg, layer, h, ops)
    else:
        ops.mm(h, layer.qkv_weight, layer.qkv_bias, out=buffers.qkv)
        q, k, v = buffers.q, buffers.k, buffers.v
    k_cache, v_cache = cache.k[layer.index], cache.v[layer.index]
    kw = dict(window_left=cfg.window_left(layer.index), sinks=layer.sinks, plan=attention_plan)
    if buffers is not None:
        kw["out"] = buffers.attn
    if slots is None:
        # The rotation, the new K/V written at position cache_seqlens - 1 and the attention: one call.
        attn = ops.mha_decode_append_kvcache(
            q, k, v, k_cache, v_cache, page_table, cache_seqlens, cos_sin_cache=cos_sin, style="neox", **kw
        )
    else:
        # The rotated k and v go straight into the cache: attention reads them there.
        q = ops.apply_rotary_and_store(q, k, v, cos_sin, positions, k_cache, v_cache, slots, style="neox")
        attn = ops.mha_decode_with_kvcache(q, k_cache, v_cache, page_table, cache_seqlens, **kw)
    return _post_attention(cfg, layer, buffers.attn_rows if buffers is not None else attn, x, ops)


class GptOssModel:
    """GPT-OSS for inference: prefill of a packed batch, decode over a paged cache, logits out.

    Building it plans each layer's ``moe_apply`` kernel (any selection override
    active at that moment applies) and converts the expert weights once; dense
    weights are cast to ``dtype`` when it is not bf16. ``weights`` is left as it is,
    so several models (one per forced solution) can share it.

    Args:
        cfg: the config; ``weights.layers`` may hold fewer layers (the model then has that many).
        weights: :class:`GptOssWeights` on the device to run on.
        dtype: activation dtype (bf16 in production; fp32 for parity tests).
        max_positions: rows of the YaRN table (the longest sequence supported).
        ops: what the forward calls the ops through (see :func:`layer_prefill`); pass
            ``tokenspeed_kernel.compile.ops`` to compile :meth:`prefill` / :meth:`decode`.
        fp8_activations: the MoE layers allow kernels that round activations to fp8 e4m3 (W4A8,
            ``moe_apply(fp8_activations=True)``); off by default.
        prepared_decode: :meth:`decode` calls each op of a layer through a call prepared at its first
            decode of that batch shape (``Op.prepare``: validation and selection once, not per call; the
            kernels chosen then stay, whatever override is active later). Only with ``ops`` = ``tokenspeed_kernel``.
    """

    def __init__(
        self,
        cfg: GptOssConfig,
        weights: GptOssWeights,
        *,
        dtype: torch.dtype = torch.bfloat16,
        max_positions: int = 4096,
        ops: Any = tk,
        fp8_activations: bool = False,
        prepared_decode: bool = False,
    ) -> None:
        if prepared_decode and ops is not tk:
            raise ValueError("prepared_decode: prepared calls need ops=tokenspeed_kernel (not a compiled namespace)")
        self.ops = ops
        self.prepared_decode = prepared_decode
        self._decode_sites: dict[tuple, list[PreparedSites]] = {}
        self._decode_buffers: dict[int, DecodeBuffers] = {}
        self.device = weights.device
        self.dtype = dtype
        self.cfg = cfg if len(weights.layers) == cfg.num_hidden_layers else cfg.with_layers(len(weights.layers))
        self.max_positions = max_positions
        self.cos_sin = yarn_cos_sin_cache(self.cfg, max_positions, self.device)

        def cast(t: torch.Tensor) -> torch.Tensor:
            return t if t.dtype == dtype else t.to(dtype)

        layers = []
        for layer in weights.layers:
            dense = replace(
                layer,
                input_norm=cast(layer.input_norm),
                qkv_weight=cast(layer.qkv_weight),
                qkv_bias=cast(layer.qkv_bias),
                o_weight=cast(layer.o_weight),
                o_bias=cast(layer.o_bias),
                post_norm=cast(layer.post_norm),
                router_weight=cast(layer.router_weight),
                router_bias=cast(layer.router_bias),
            )
            layers.append(plan_layer(self.cfg, dense, dtype, self.device, fp8_activations=fp8_activations))
        self.layers = layers
        self.embed_tokens = cast(weights.embed_tokens)
        self.norm = cast(weights.norm)
        self.lm_head = cast(weights.lm_head)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def kernel_plans(self) -> list[str]:
        """The ``moe_apply`` kernel planned for each layer."""
        return [layer.moe_plan.kernel for layer in self.layers if layer.moe_plan is not None]

    def new_cache(self, max_batch: int, max_tokens_per_seq: int, *, page_size: int = 16) -> PagedKVCache:
        """An empty :class:`PagedKVCache` for this model (activation dtype, every layer)."""
        return PagedKVCache.for_batch(
            self.cfg,
            num_layers=self.num_layers,
            max_batch=max_batch,
            max_tokens_per_seq=max_tokens_per_seq,
            page_size=page_size,
            device=self.device,
            dtype=self.dtype,
        )

    def _logits(self, x: torch.Tensor, residual: torch.Tensor | None, ops: Any = None) -> torch.Tensor:
        """The unembedding of the final norm of the stream ``x + residual`` (``x`` alone without one: no layers)."""
        ops = self.ops if ops is None else ops
        if residual is None:
            h = ops.rmsnorm(x, self.norm, self.cfg.rms_norm_eps)
        else:
            h, _ = ops.rmsnorm(x, self.norm, self.cfg.rms_norm_eps, residual=residual)
        return ops.mm(h, self.lm_head)

    def prefill(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
        cache: PagedKVCache | None = None,
        slots: torch.Tensor | None = None,
        *,
        last_index: torch.Tensor | None = None,
        attention_plan: tk.AttentionPlan | None = None,
    ) -> torch.Tensor:
        """Forward over a packed batch of new sequences.

        Args:
            tokens: ``int64 [T]`` token ids, sequences packed by ``cu_seqlens int32 [B+1]``.
            positions: ``int64 [T]``; max_seqlen: host int.
            cache, slots: K/V are written to ``cache`` at ``slots int64 [T]`` when given.
            last_index: ``int64 [B]`` rows whose logits are wanted (usually each
                sequence's last token); None returns the logits of every token.
            attention_plan: as :func:`layer_prefill` (every layer shares it).

        Returns:
            logits ``[B, V]`` (or ``[T, V]``) in the model's dtype.
        """
        x, residual = self.embed_tokens[tokens], None
        for layer in self.layers:
            x, residual = _block_prefill(
                self.cfg,
                layer,
                x,
                residual,
                positions,
                cu_seqlens,
                max_seqlen,
                self.cos_sin,
                cache,
                slots,
                ops=self.ops,
                attention_plan=attention_plan,
            )
        if last_index is not None:
            x, residual = x[last_index], None if residual is None else residual[last_index]
        return self._logits(x, residual)

    def decode(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None,
        cache: PagedKVCache,
        slots: torch.Tensor | None,
        cache_seqlens: torch.Tensor,
        page_table: torch.Tensor,
        *,
        attention_plan: tk.AttentionPlan | None = None,
    ) -> torch.Tensor:
        """One new token per sequence over the paged cache.

        Args:
            tokens: ``int64 [B]``.
            positions, slots: ``int64 [B]``, the new token's position and cache slot; both None (what
                :class:`~.generate.DecodeRunner` passes): position ``cache_seqlens - 1`` and its slot in
                ``page_table``, and each layer's rotation, cache write and attention are one call
                (:func:`layer_decode`).
            cache_seqlens: ``int32 [B]`` (the new token included); page_table: ``int32 [B, max_pages]``.
            attention_plan: ``tk.mha_plan(cache_seqlens=...)`` of the same lengths from the host (every
                layer's attention shares it), or None.

        Returns:
            logits ``[B, V]`` in the model's dtype.
        """
        x, residual = self.embed_tokens[tokens], None
        sites = self._sites(tokens, page_table, attention_plan, slots is None) if self.prepared_decode else None
        buffers = self._buffers(tokens.shape[0])
        for i, layer in enumerate(self.layers):
            x, residual = _block_decode(
                self.cfg,
                layer,
                x,
                residual,
                positions,
                self.cos_sin,
                cache,
                slots,
                cache_seqlens,
                page_table,
                ops=self.ops if sites is None else sites[i].restart(),
                attention_plan=attention_plan,
                buffers=buffers,
            )
        return self._logits(x, residual, None if sites is None else sites[-1].restart())

    def _buffers(self, batch: int) -> DecodeBuffers | None:
        """The decode buffers of ``batch`` sequences (made at its first decode); None when the ops are a compiled
        namespace (its custom ops are functional: no ``out=``)."""
        if self.ops is not tk:
            return None
        buffers = self._decode_buffers.get(batch)
        if buffers is None:
            buffers = self._decode_buffers[batch] = DecodeBuffers(self.cfg, batch, self.dtype, self.device)
        return buffers

    def _sites(
        self, tokens: torch.Tensor, page_table: torch.Tensor, plan: tk.AttentionPlan | None, append: bool
    ) -> list:
        """The prepared call sites of a decode of this shape and call sequence (``append``: the attention writes
        the cache): one per layer, one for the logits."""
        key = (tokens.shape[0], page_table.shape[1], plan is None, append, tokens.device)
        sites = self._decode_sites.get(key)
        if sites is None:
            sites = self._decode_sites[key] = [PreparedSites(tk) for _ in range(len(self.layers) + 1)]
        return sites

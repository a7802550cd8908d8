"""``torch.compile`` support: the public ops as torch custom ops (opt-in).

Model code that is to be compiled calls the ops through :data:`ops` instead of
``tokenspeed_kernel`` itself; the signatures are the public ops' (without ``out=``)::

    from tokenspeed_kernel.compile import ops   # registers the custom ops (once)

    @torch.compile(fullgraph=True)
    def block(x, w, ...):
        h = ops.rmsnorm(x, w, 1e-5)
        return ops.mm(h, w_up)

Each wrapper calls one ``torch.ops.tokenspeed_kernel.<name>`` custom op (defined
with ``torch.library``, schema inferred from type hints) whose fake implementation
computes the output shapes and dtypes without running anything, so Dynamo records
the op as one opaque node: no graph break, no tracing into validation or
selection. The real implementation calls the public op, so validation, selection
and dispatch happen exactly as in eager mode. ``MoEWeights``, ``MoEActivation``
and ``MoEPlan`` cross the schema as their fields and are rebuilt inside.

When selection happens: at *execution* of the compiled graph, inside the custom
op, not at trace time. The first call with a given (signature, traits, device)
selects; later calls are a dictionary hit in the selection cache, the same cost as
an eager public op. So nothing about the kernel choice is baked into the compiled
artifact: an override (``kernel_override``, ``TOKENSPEED_KERNEL_OVERRIDE``)
active when the compiled function *runs* applies, and changing it needs no
recompile. Under a CUDA graph (``mode="reduce-overhead"``, or an engine capturing
the compiled step) the op runs while the graph is recorded and replays skip the
host: the kernel selected at recording is the one replayed. The cost is the custom-op layer itself, measured on a CPU against the
public op with a no-op kernel: about +5 us a call (rmsnorm, mm), +11 us for
attention (15 arguments), +23 us for ``moe_apply`` (the dataclasses are rebuilt);
on a GPU a CUDA graph of the compiled model removes it.

Nothing is registered when ``tokenspeed_kernel`` is imported: the eager hot path
never goes through this module. :func:`register_custom_ops` (idempotent; also run
on the first access to :data:`ops`) defines the ops in the ``tokenspeed_kernel``
library namespace.

Not covered: ``out=`` (the custom ops are functional; Inductor plans the buffers),
autograd (inference ops: no backward is registered, so compile under
``torch.no_grad()`` or with inputs that do not require grad),
``top_k_top_p_sample(generator=)`` (pass ``uniform=`` or let the wrapper draw with
``torch.rand``). ``kvcache_store`` is declared as mutating ``k_cache`` and
``v_cache``: Inductor calls it in place; the ``aot_eager`` backend functionalises
it (a copy of each cache, written back after), correct but not for production.
"""

import functools
import threading
from typing import Any

import torch

import tokenspeed_kernel as _tk

from .core.selection import Target
from .ops.moe import MoEActivation, MoEPlan, MoEWeights

__all__ = ["NAMESPACE", "OP_NAMES", "register_custom_ops", "ops", "CompileOps"]  # noqa: F822 (ops: module __getattr__)

#: The ``torch.library`` namespace: the ops are ``torch.ops.tokenspeed_kernel.<name>``.
NAMESPACE = "tokenspeed_kernel"

_Tensor = torch.Tensor
_OptTensor = torch.Tensor | None
# solution=/override= cross the schema as one string, alternatives joined by "|" (the
# override syntax of TOKENSPEED_KERNEL_OVERRIDE): schemas have no list-of-strings type.
_OptTarget = str | None


def _target(t: _OptTarget) -> Target | None:
    if t is None:
        return None
    parts = tuple(t.split("|"))
    return parts[0] if len(parts) == 1 else parts


def _schema_target(t: Target | None) -> _OptTarget:
    if t is None or isinstance(t, str):
        return t
    return "|".join(t)


def _dense(t: torch.Tensor) -> torch.Tensor:
    # The fake implementations promise contiguous outputs; Inductor plans the consumers'
    # indexing from those strides, so a kernel's strided result must not leak out.
    return t if t.is_contiguous() else t.contiguous()


# ----------------------------------------------------------------------------- real implementations
# Each takes the custom op's schema arguments and calls the public op.


def _rmsnorm(x: _Tensor, weight: _Tensor, eps: float, solution: _OptTarget, override: _OptTarget) -> _Tensor:
    return _dense(_tk.rmsnorm(x, weight, eps, solution=_target(solution), override=_target(override)))


def _rmsnorm_residual(
    x: _Tensor, weight: _Tensor, eps: float, residual: _Tensor, solution: _OptTarget, override: _OptTarget
) -> tuple[_Tensor, _Tensor]:
    y, s = _tk.rmsnorm(x, weight, eps, residual=residual, solution=_target(solution), override=_target(override))
    return _dense(y), _dense(s)


def _mm(
    a: _Tensor,
    b: _Tensor,
    bias: _OptTensor,
    a_scale: _OptTensor,
    b_scale: _OptTensor,
    out_dtype: torch.dtype | None,
    solution: _OptTarget,
    override: _OptTarget,
) -> _Tensor:
    out = _tk.mm(
        a, b, bias, a_scale=a_scale, b_scale=b_scale, out_dtype=out_dtype,
        solution=_target(solution), override=_target(override),
    )  # fmt: skip
    return _dense(out)


def _apply_rotary(
    q: _Tensor,
    k: _Tensor,
    cos_sin_cache: _Tensor,
    positions: _Tensor,
    style: str,
    solution: _OptTarget,
    override: _OptTarget,
) -> tuple[_Tensor, _Tensor]:
    q2, k2 = _tk.apply_rotary(
        q, k, cos_sin_cache, positions, style=style, solution=_target(solution), override=_target(override)
    )
    return _dense(q2), _dense(k2)


def _swiglu(
    x: _Tensor,
    alpha: float,
    limit: float | None,
    up_offset: float,
    interleaved: bool,
    solution: _OptTarget,
    override: _OptTarget,
) -> _Tensor:
    out = _tk.swiglu(
        x, alpha=alpha, limit=limit, up_offset=up_offset, interleaved=interleaved,
        solution=_target(solution), override=_target(override),
    )  # fmt: skip
    return _dense(out)


def _silu_and_mul(x: _Tensor, solution: _OptTarget, override: _OptTarget) -> _Tensor:
    return _dense(_tk.silu_and_mul(x, solution=_target(solution), override=_target(override)))


def _outputs(result: Any, return_lse: bool) -> list[_Tensor]:
    # Attention ops return ``out`` or ``(out, lse)``; the schema's ``Tensor[]`` holds one or two.
    return [_dense(t) for t in result] if return_lse else [_dense(result)]


def _mha_prefill(
    q: _Tensor,
    k: _Tensor,
    v: _Tensor,
    cu_seqlens_q: _Tensor,
    cu_seqlens_k: _Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    window_left: int,
    sinks: _OptTensor,
    softmax_scale: float | None,
    logit_cap: float,
    return_lse: bool,
    solution: _OptTarget,
    override: _OptTarget,
) -> list[_Tensor]:
    result = _tk.mha_prefill(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        causal=causal, window_left=window_left, sinks=sinks, softmax_scale=softmax_scale, logit_cap=logit_cap,
        return_lse=return_lse, solution=_target(solution), override=_target(override),
    )  # fmt: skip
    return _outputs(result, return_lse)


def _mha_extend(
    q: _Tensor,
    k_cache: _Tensor,
    v_cache: _Tensor,
    page_table: _Tensor,
    cache_seqlens: _Tensor,
    cu_seqlens_q: _Tensor,
    max_seqlen_q: int,
    causal: bool,
    window_left: int,
    sinks: _OptTensor,
    softmax_scale: float | None,
    logit_cap: float,
    return_lse: bool,
    solution: _OptTarget,
    override: _OptTarget,
) -> list[_Tensor]:
    result = _tk.mha_extend_with_kvcache(
        q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q,
        causal=causal, window_left=window_left, sinks=sinks, softmax_scale=softmax_scale, logit_cap=logit_cap,
        return_lse=return_lse, solution=_target(solution), override=_target(override),
    )  # fmt: skip
    return _outputs(result, return_lse)


def _mha_decode(
    q: _Tensor,
    k_cache: _Tensor,
    v_cache: _Tensor,
    page_table: _Tensor,
    cache_seqlens: _Tensor,
    window_left: int,
    sinks: _OptTensor,
    softmax_scale: float | None,
    logit_cap: float,
    return_lse: bool,
    solution: _OptTarget,
    override: _OptTarget,
) -> list[_Tensor]:
    result = _tk.mha_decode_with_kvcache(
        q, k_cache, v_cache, page_table, cache_seqlens,
        window_left=window_left, sinks=sinks, softmax_scale=softmax_scale, logit_cap=logit_cap,
        return_lse=return_lse, solution=_target(solution), override=_target(override),
    )  # fmt: skip
    return _outputs(result, return_lse)


def _kvcache_store(
    k: _Tensor,
    v: _Tensor,
    k_cache: _Tensor,
    v_cache: _Tensor,
    slot_mapping: _Tensor,
    solution: _OptTarget,
    override: _OptTarget,
) -> None:
    _tk.kvcache_store(k, v, k_cache, v_cache, slot_mapping, solution=_target(solution), override=_target(override))


def _moe_route(
    router_logits: _Tensor, top_k: int, renormalize: bool, solution: _OptTarget, override: _OptTarget
) -> tuple[_Tensor, _Tensor]:
    w, ids = _tk.moe_route(
        router_logits, top_k, renormalize=renormalize, solution=_target(solution), override=_target(override)
    )
    return _dense(w), _dense(ids)


# MoEWeights.extra is opaque kernel data (tensors and host numbers); the schema carries
# it as three typed lists plus one letter per item saying which list and type it came from.
_EXTRA_KINDS = {"t": "tensor", "i": "int", "b": "bool", "f": "float"}


def _flatten_extra(extra: tuple) -> tuple[list[torch.Tensor], list[int], list[float], str]:
    tensors: list[torch.Tensor] = []
    ints: list[int] = []
    floats: list[float] = []
    kinds = ""
    for item in extra:
        if isinstance(item, torch.Tensor):
            tensors.append(item)
            kinds += "t"
        elif isinstance(item, bool):
            ints.append(int(item))
            kinds += "b"
        elif isinstance(item, int):
            ints.append(item)
            kinds += "i"
        elif isinstance(item, float):
            floats.append(item)
            kinds += "f"
        else:
            raise TypeError(
                f"weights.extra: a {type(item).__name__} cannot cross the custom-op boundary "
                "(supported: tensors, ints, bools, floats)"
            )
    return tensors, ints, floats, kinds


@functools.lru_cache(maxsize=64)
def _activation(kind: str, alpha: float, limit: float | None, up_offset: float) -> MoEActivation:
    # A model has one or two activations: rebuilding (and re-validating) one per call costs ~2 us.
    return MoEActivation(kind=kind, alpha=alpha, limit=limit, up_offset=up_offset)


def _rebuild_extra(tensors: list[_Tensor], ints: list[int], floats: list[float], kinds: str) -> tuple:
    if not kinds:
        return ()
    its = {"t": iter(tensors), "i": iter(ints), "b": iter(ints), "f": iter(floats)}
    return tuple(bool(next(its[c])) if c == "b" else next(its[c]) for c in kinds)


def _moe_apply(
    x: _Tensor,
    topk_weights: _Tensor,
    topk_ids: _Tensor,
    w13: _Tensor,
    w2: _Tensor,
    w13_bias: _OptTensor,
    w2_bias: _OptTensor,
    w13_scale: _OptTensor,
    w2_scale: _OptTensor,
    extra_tensors: list[_Tensor],
    extra_ints: list[int],
    extra_floats: list[float],
    extra_kinds: str,
    weight_format: str,
    gate_up_interleaved: bool,
    layout: str,
    activation_kind: str,
    alpha: float,
    limit: float | None,
    up_offset: float,
    plan_kernel: str | None,
    plan_layout: str | None,
    plan_format: str | None,
    solution: _OptTarget,
    override: _OptTarget,
) -> _Tensor:
    weights = MoEWeights(
        w13=w13, w2=w2, format=weight_format, w13_bias=w13_bias, w2_bias=w2_bias, w13_scale=w13_scale,
        w2_scale=w2_scale, gate_up_interleaved=gate_up_interleaved, layout=layout,
        extra=_rebuild_extra(extra_tensors, extra_ints, extra_floats, extra_kinds),
    )  # fmt: skip
    activation = _activation(activation_kind, alpha, limit, up_offset)
    plan = None
    if plan_kernel is not None:
        plan = MoEPlan(kernel=plan_kernel, layout=plan_layout, format=plan_format, activation=activation)
    out = _tk.moe_apply(
        x, topk_weights, topk_ids, weights, activation, plan=plan,
        solution=_target(solution), override=_target(override),
    )  # fmt: skip
    return _dense(out)


def _argmax(logits: _Tensor, solution: _OptTarget, override: _OptTarget) -> _Tensor:
    return _dense(_tk.argmax(logits, solution=_target(solution), override=_target(override)))


def _top_k_top_p_sample(
    logits: _Tensor,
    top_k: _Tensor,
    top_p: _Tensor,
    temperature: _Tensor,
    uniform: _Tensor,
    solution: _OptTarget,
    override: _OptTarget,
) -> _Tensor:
    out = _tk.top_k_top_p_sample(
        logits, top_k, top_p, temperature=temperature, uniform=uniform,
        solution=_target(solution), override=_target(override),
    )  # fmt: skip
    return _dense(out)


# ----------------------------------------------------------------------------- fake implementations
# Shapes and dtypes only (the public ops' contracts); outputs are contiguous, like _dense makes the real ones.


def _fake_like(x: _Tensor, *_: Any) -> _Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _fake_rmsnorm_residual(x: _Tensor, *_: Any) -> tuple[_Tensor, _Tensor]:
    return _fake_like(x), _fake_like(x)


def _fake_mm(
    a: _Tensor, b: _Tensor, bias: _OptTensor, a_scale: _OptTensor, b_scale: _OptTensor, out_dtype: Any, *_: Any
) -> _Tensor:
    if out_dtype is None:
        out_dtype = torch.bfloat16 if a.dtype == torch.float8_e4m3fn else a.dtype
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


def _fake_apply_rotary(q: _Tensor, k: _Tensor, *_: Any) -> tuple[_Tensor, _Tensor]:
    return _fake_like(q), _fake_like(k)


def _fake_gated(x: _Tensor, *_: Any) -> _Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


def _fake_attention(return_lse_index: int) -> Any:
    def fake(q: _Tensor, *args: Any) -> list[_Tensor]:
        out = [_fake_like(q)]
        if args[return_lse_index - 1]:
            # lse is [total_q, Hq] for prefill/extend and [B, Hq] for decode: q's first two dims either way.
            out.append(q.new_empty((q.shape[0], q.shape[1]), dtype=torch.float32))
        return out

    return fake


def _fake_kvcache_store(*_: Any) -> None:
    return None


def _fake_moe_route(router_logits: _Tensor, top_k: int, *_: Any) -> tuple[_Tensor, _Tensor]:
    t = router_logits.shape[0]
    return (
        router_logits.new_empty((t, top_k), dtype=torch.float32),
        router_logits.new_empty((t, top_k), dtype=torch.int32),
    )


def _fake_per_row_token(logits: _Tensor, *_: Any) -> _Tensor:
    return logits.new_empty((logits.shape[0],), dtype=torch.int64)


#: (custom op name, real implementation, fake implementation, mutated arguments).
_DEFINITIONS: tuple[tuple[str, Any, Any, tuple[str, ...]], ...] = (
    ("rmsnorm", _rmsnorm, _fake_like, ()),
    ("rmsnorm_residual", _rmsnorm_residual, _fake_rmsnorm_residual, ()),
    ("mm", _mm, _fake_mm, ()),
    ("apply_rotary", _apply_rotary, _fake_apply_rotary, ()),
    ("swiglu", _swiglu, _fake_gated, ()),
    ("silu_and_mul", _silu_and_mul, _fake_gated, ()),
    # _fake_attention(i): i is the position of return_lse in that op's schema.
    ("mha_prefill", _mha_prefill, _fake_attention(12), ()),
    ("mha_extend_with_kvcache", _mha_extend, _fake_attention(12), ()),
    ("mha_decode_with_kvcache", _mha_decode, _fake_attention(9), ()),
    ("kvcache_store", _kvcache_store, _fake_kvcache_store, ("k_cache", "v_cache")),
    ("moe_route", _moe_route, _fake_moe_route, ()),
    ("moe_apply", _moe_apply, _fake_like, ()),
    ("argmax", _argmax, _fake_per_row_token, ()),
    ("top_k_top_p_sample", _top_k_top_p_sample, _fake_per_row_token, ()),
)

#: Names of the custom ops (``torch.ops.tokenspeed_kernel.<name>``).
OP_NAMES: tuple[str, ...] = tuple(d[0] for d in _DEFINITIONS)

_lock = threading.Lock()
_registered = False
#: Owns the registrations (a Library unregisters its ops when it is destroyed).
_library: torch.library.Library | None = None


def register_custom_ops() -> None:
    """Define every ``torch.ops.tokenspeed_kernel.*`` custom op with its fake implementation.

    Idempotent and thread-safe; an op already defined in this process (e.g. by a
    reloaded copy of this module) is left as it is.
    """
    global _registered, _library
    if _registered:
        return
    with _lock:
        if _registered:
            return
        namespace = getattr(torch.ops, NAMESPACE)
        library = torch.library.Library(NAMESPACE, "FRAGMENT")
        for name, impl, fake, mutates in _DEFINITIONS:
            if hasattr(namespace, name):
                continue
            # Library.define + a CompositeExplicitAutograd kernel rather than torch.library.custom_op:
            # custom_op adds a Python autograd layer, a Dynamo-disable wrapper and an aliasing check
            # to every call (rmsnorm on a CPU: +18 us over the public op, against +4 us here); these
            # ops have no backward anyway. The schema is still inferred from the type hints.
            library.define(name + torch.library.infer_schema(impl, mutates_args=mutates))
            library.impl(name, impl, "CompositeExplicitAutograd")
            torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=library)
        _library = library
        _registered = True


# ----------------------------------------------------------------------------- the model-facing namespace

_ns = torch.ops.tokenspeed_kernel  # resolved lazily by torch: no op is looked up until a wrapper runs


class CompileOps:
    """The public ops through the custom ops: same signatures as ``tokenspeed_kernel.<op>``, no ``out=``.

    Use the instance :data:`ops`. Arguments and returns are as documented on the
    public ops; each call runs the public op (validation, selection, dispatch) inside
    one custom op. Host-side helpers that are never traced (``moe_plan``,
    ``moe_process_weights``) are forwarded unchanged so the namespace can stand in
    for ``tokenspeed_kernel`` in model code.
    """

    moe_plan = staticmethod(_tk.moe_plan)
    moe_process_weights = staticmethod(_tk.moe_process_weights)

    @staticmethod
    def rmsnorm(
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float = 1e-5,
        *,
        residual: torch.Tensor | None = None,
        solution: Target | None = None,
        override: Target | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """:func:`tokenspeed_kernel.rmsnorm`."""
        sol, ovr = _schema_target(solution), _schema_target(override)
        if residual is None:
            return _ns.rmsnorm.default(x, weight, float(eps), sol, ovr)
        return _ns.rmsnorm_residual.default(x, weight, float(eps), residual, sol, ovr)

    @staticmethod
    def mm(
        a: torch.Tensor,
        b: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        a_scale: torch.Tensor | None = None,
        b_scale: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
        solution: Target | None = None,
        override: Target | None = None,
    ) -> torch.Tensor:
        """:func:`tokenspeed_kernel.mm`."""
        return _ns.mm.default(
            a, b, bias, a_scale, b_scale, out_dtype, _schema_target(solution), _schema_target(override)
        )

    @staticmethod
    def apply_rotary(
        q: torch.Tensor,
        k: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        positions: torch.Tensor,
        *,
        style: str = "neox",
        solution: Target | None = None,
        override: Target | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`tokenspeed_kernel.apply_rotary`."""
        return _ns.apply_rotary.default(
            q, k, cos_sin_cache, positions, style, _schema_target(solution), _schema_target(override)
        )

    @staticmethod
    def swiglu(
        x: torch.Tensor,
        *,
        alpha: float = 1.702,
        limit: float | None = 7.0,
        up_offset: float = 1.0,
        interleaved: bool = True,
        solution: Target | None = None,
        override: Target | None = None,
    ) -> torch.Tensor:
        """:func:`tokenspeed_kernel.swiglu`."""
        return _ns.swiglu.default(
            x, float(alpha), None if limit is None else float(limit), float(up_offset), bool(interleaved),
            _schema_target(solution), _schema_target(override),
        )  # fmt: skip

    @staticmethod
    def silu_and_mul(
        x: torch.Tensor, *, solution: Target | None = None, override: Target | None = None
    ) -> torch.Tensor:
        """:func:`tokenspeed_kernel.silu_and_mul`."""
        return _ns.silu_and_mul.default(x, _schema_target(solution), _schema_target(override))

    @staticmethod
    def mha_prefill(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        cu_seqlens_k: torch.Tensor,
        max_seqlen_q: int,
        max_seqlen_k: int,
        *,
        causal: bool = True,
        window_left: int = -1,
        sinks: torch.Tensor | None = None,
        softmax_scale: float | None = None,
        logit_cap: float = 0.0,
        return_lse: bool = False,
        solution: Target | None = None,
        override: Target | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """:func:`tokenspeed_kernel.mha_prefill`."""
        result = _ns.mha_prefill.default(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, bool(causal), window_left, sinks,
            softmax_scale, float(logit_cap), bool(return_lse), _schema_target(solution), _schema_target(override),
        )  # fmt: skip
        return (result[0], result[1]) if return_lse else result[0]

    @staticmethod
    def mha_extend_with_kvcache(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        page_table: torch.Tensor,
        cache_seqlens: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        max_seqlen_q: int,
        *,
        causal: bool = True,
        window_left: int = -1,
        sinks: torch.Tensor | None = None,
        softmax_scale: float | None = None,
        logit_cap: float = 0.0,
        return_lse: bool = False,
        solution: Target | None = None,
        override: Target | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """:func:`tokenspeed_kernel.mha_extend_with_kvcache`."""
        result = _ns.mha_extend_with_kvcache.default(
            q, k_cache, v_cache, page_table, cache_seqlens, cu_seqlens_q, max_seqlen_q, bool(causal), window_left,
            sinks, softmax_scale, float(logit_cap), bool(return_lse), _schema_target(solution),
            _schema_target(override),
        )  # fmt: skip
        return (result[0], result[1]) if return_lse else result[0]

    @staticmethod
    def mha_decode_with_kvcache(
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        page_table: torch.Tensor,
        cache_seqlens: torch.Tensor,
        *,
        window_left: int = -1,
        sinks: torch.Tensor | None = None,
        softmax_scale: float | None = None,
        logit_cap: float = 0.0,
        return_lse: bool = False,
        solution: Target | None = None,
        override: Target | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """:func:`tokenspeed_kernel.mha_decode_with_kvcache`."""
        result = _ns.mha_decode_with_kvcache.default(
            q, k_cache, v_cache, page_table, cache_seqlens, window_left, sinks, softmax_scale, float(logit_cap),
            bool(return_lse), _schema_target(solution), _schema_target(override),
        )  # fmt: skip
        return (result[0], result[1]) if return_lse else result[0]

    @staticmethod
    def kvcache_store(
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        *,
        solution: Target | None = None,
        override: Target | None = None,
    ) -> None:
        """:func:`tokenspeed_kernel.kvcache_store` (writes ``k_cache``/``v_cache`` in place)."""
        _ns.kvcache_store.default(
            k, v, k_cache, v_cache, slot_mapping, _schema_target(solution), _schema_target(override)
        )

    @staticmethod
    def moe_route(
        router_logits: torch.Tensor,
        top_k: int,
        *,
        renormalize: bool = True,
        solution: Target | None = None,
        override: Target | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`tokenspeed_kernel.moe_route`."""
        return _ns.moe_route.default(
            router_logits, top_k, bool(renormalize), _schema_target(solution), _schema_target(override)
        )

    @staticmethod
    def moe_apply(
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        weights: MoEWeights,
        activation: MoEActivation,
        *,
        plan: MoEPlan | None = None,
        solution: Target | None = None,
        override: Target | None = None,
    ) -> torch.Tensor:
        """:func:`tokenspeed_kernel.moe_apply`: ``weights``, ``activation`` and ``plan`` cross as their fields."""
        return _ns.moe_apply.default(
            *_moe_apply_schema_args(x, topk_weights, topk_ids, weights, activation, plan, solution, override)
        )

    @staticmethod
    def argmax(logits: torch.Tensor, *, solution: Target | None = None, override: Target | None = None) -> torch.Tensor:
        """:func:`tokenspeed_kernel.argmax`."""
        return _ns.argmax.default(logits, _schema_target(solution), _schema_target(override))

    @staticmethod
    def top_k_top_p_sample(
        logits: torch.Tensor,
        top_k: int | torch.Tensor = 0,
        top_p: float | torch.Tensor = 1.0,
        *,
        temperature: float | torch.Tensor = 1.0,
        uniform: torch.Tensor | None = None,
        solution: Target | None = None,
        override: Target | None = None,
    ) -> torch.Tensor:
        """:func:`tokenspeed_kernel.top_k_top_p_sample`; scalars become per-row tensors, no ``generator=``.

        Without ``uniform`` the per-row numbers are drawn here with ``torch.rand``
        (part of the compiled graph).
        """
        b, dev = logits.shape[0], logits.device
        top_k = _per_row(top_k, b, torch.int32, dev)
        top_p = _per_row(top_p, b, torch.float32, dev)
        temperature = _per_row(temperature, b, torch.float32, dev)
        if uniform is None:
            uniform = torch.rand(b, device=dev, dtype=torch.float32)
        return _ns.top_k_top_p_sample.default(
            logits, top_k, top_p, temperature, uniform, _schema_target(solution), _schema_target(override)
        )


def _moe_apply_schema_args(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: MoEWeights,
    activation: MoEActivation,
    plan: MoEPlan | None,
    solution: Target | None,
    override: Target | None,
) -> tuple[Any, ...]:
    """The ``tokenspeed_kernel::moe_apply`` arguments for a :func:`tokenspeed_kernel.moe_apply` call."""
    if not isinstance(weights, MoEWeights):
        raise TypeError(f"weights: expected MoEWeights, got {type(weights).__name__}")
    if not isinstance(activation, MoEActivation):
        raise TypeError(f"activation: expected MoEActivation, got {type(activation).__name__}")
    tensors, ints, floats, kinds = _flatten_extra(weights.extra)
    return (
        x, topk_weights, topk_ids, weights.w13, weights.w2, weights.w13_bias, weights.w2_bias,
        weights.w13_scale, weights.w2_scale, tensors, ints, floats, kinds, weights.format,
        weights.gate_up_interleaved, weights.layout, activation.kind, float(activation.alpha),
        None if activation.limit is None else float(activation.limit), float(activation.up_offset),
        None if plan is None else plan.kernel, None if plan is None else plan.layout,
        None if plan is None else plan.format, _schema_target(solution), _schema_target(override),
    )  # fmt: skip


def _per_row(value: Any, batch: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    # Range checks stay with the public op, which sees these tensors.
    if isinstance(value, torch.Tensor):
        return value
    return torch.full((batch,), value, dtype=dtype, device=device)


def _ops() -> CompileOps:
    register_custom_ops()
    namespace = CompileOps()
    # Cache it as a real module attribute: later lookups (and Dynamo's) skip __getattr__.
    globals()["ops"] = namespace
    return namespace


def __getattr__(name: str) -> Any:
    if name == "ops":
        return _ops()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

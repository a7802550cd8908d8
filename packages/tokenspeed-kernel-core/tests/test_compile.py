"""torch.compile support: the public ops as torch custom ops (``tokenspeed_kernel.compile``).

Every check compares against the eager public op on the same inputs: the custom
ops run the same kernels, so results must be bitwise equal (CPU, PyTorch
references pinned so TRITON_INTERPRET elsewhere cannot change the selection).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel import ANY, Priority, register_kernel, unregister_kernel
from tokenspeed_kernel.compile import OP_NAMES, ops, register_custom_ops, schema_args
from tokenspeed_kernel.models import gpt_oss as m
from tokenspeed_kernel.numerics.cases import standard_cases
from tokenspeed_kernel.numerics.inputs import make_generator

NS = torch.ops.tokenspeed_kernel


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # Tiny tensors: intra-op threads only add overhead (and the CI machine has 2 cores).
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def _reference(request):
    if request.node.get_closest_marker("gpu"):  # GPU tests run what selection picks
        yield
        return
    with tk.kernel_override("reference"):
        yield


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, g: torch.Generator, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=g).to(dtype)


def _moe_weights(g: torch.Generator, e: int = 4, h: int = 32, i: int = 32) -> tk.MoEWeights:
    w13, s13 = tk.quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g), solution="reference")
    w2, s2 = tk.quantize_mxfp4(torch.randn(e, h, i, generator=g), solution="reference")
    return tk.MoEWeights(
        w13=w13, w2=w2, format="mxfp4", w13_scale=s13, w2_scale=s2,
        w13_bias=0.1 * torch.randn(e, 2 * i, generator=g), w2_bias=0.1 * torch.randn(e, h, generator=g),
    )  # fmt: skip


def _paged(g: torch.Generator) -> dict[str, torch.Tensor]:
    """Two sequences of 5 and 9 tokens in a 6-page cache of 4-token pages (pages not in order)."""
    return {
        "k_cache": _randn(6, 4, 2, 16, g=g),
        "v_cache": _randn(6, 4, 2, 16, g=g),
        "page_table": torch.tensor([[4, 1, 0], [2, 5, 3]], dtype=torch.int32),
        "cache_seqlens": torch.tensor([5, 9], dtype=torch.int32),
    }


def _generic_calls() -> dict[str, dict]:
    """op -> the public op's keyword arguments for the op's first CPU verify case (every op)."""
    calls = {}
    for name in sorted(tk.all_contracts()):
        case = standard_cases(name, "cpu", device_type="cpu")[0]
        cpu = torch.device("cpu")
        calls[name] = tk.get_contract(name).cases.make(case, cpu, make_generator(cpu, case.seed(0)))
    return calls


def _cases() -> dict[str, tuple[str, dict]]:
    """case id -> (op, the public op's keyword arguments): every op, plus variants of the optional outputs."""
    g = _gen(0)
    x, w, res = _randn(6, 32, g=g, dtype=torch.bfloat16), _randn(32, g=g), _randn(6, 32, g=g, dtype=torch.bfloat16)
    q, k, v = _randn(7, 4, 16, g=g), _randn(7, 2, 16, g=g), _randn(7, 2, 16, g=g)
    cu, sinks = torch.tensor([0, 3, 7], dtype=torch.int32), _randn(4, g=g)
    p = _paged(g)
    q_dec = _randn(2, 4, 16, g=g)
    a, logits8 = _randn(6, 32, g=g), _randn(6, 4, g=g)
    mw, act = _moe_weights(g), tk.MoEActivation()
    tw, tid = tk.moe_route(logits8, 2)
    vocab = _randn(3, 50, g=g)
    out = {name: (name, call) for name, call in _generic_calls().items()}
    out.update({
        "rmsnorm[residual]": ("rmsnorm", {"x": x, "weight": w, "residual": res}),
        "mha_prefill[window,sinks,lse]": ("mha_prefill", {
            "q": q, "k": k, "v": v, "cu_seqlens_q": cu, "cu_seqlens_k": cu, "max_seqlen_q": 4, "max_seqlen_k": 4,
            "window_left": 2, "sinks": sinks, "return_lse": True}),
        "mha_decode_with_kvcache[cap,lse]": ("mha_decode_with_kvcache", {
            "q": q_dec, **p, "softmax_scale": 0.3, "logit_cap": 5.0, "return_lse": True}),
        "moe_apply[mxfp4,bias]": ("moe_apply", {
            "x": a, "topk_weights": tw, "topk_ids": tid, "weights": mw, "activation": act}),
        "top_k_top_p_sample[scalars]": ("top_k_top_p_sample", {
            "logits": vocab, "top_k": 5, "top_p": 0.8, "temperature": 0.7, "uniform": torch.tensor([0.1, 0.5, 0.9])}),
    })  # fmt: skip
    return out


CASE_IDS = sorted(_cases())


def _flat(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _assert_same(got, want) -> None:
    got, want = _flat(got), _flat(want)
    assert len(got) == len(want)
    for gt, wt in zip(got, want):
        assert gt.dtype == wt.dtype and gt.shape == wt.shape
        assert torch.equal(gt, wt), (gt - wt).abs().max() if gt.is_floating_point() else (gt, wt)


# ----------------------------------------------------------------------------- registration


def test_importing_the_package_registers_nothing():
    code = (
        "import sys, torch, tokenspeed_kernel\n"
        "assert 'tokenspeed_kernel.compile' not in sys.modules\n"
        "import tokenspeed_kernel.compile as c\n"
        "assert not hasattr(torch.ops.tokenspeed_kernel, 'rmsnorm')\n"
        "c.register_custom_ops(); c.register_custom_ops()\n"
        "assert all(hasattr(torch.ops.tokenspeed_kernel, n) for n in c.OP_NAMES)\n"
        "assert c.ops is c.ops\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_every_op_is_covered():
    """One custom op per op object, by construction: the registered ops are exactly the public ops."""
    register_custom_ops()
    assert set(OP_NAMES) == set(tk.all_contracts()) == {op for op, _ in _cases().values()}
    for name in OP_NAMES:
        assert name in tk.__all__ and callable(getattr(ops, name))
        assert hasattr(NS, name)
    schema = str(NS.kvcache_store.default._schema)
    assert "Tensor(a2!) k_cache" in schema and "Tensor(a3!) v_cache" in schema


def _fresh(op: str, call: dict) -> dict:
    """Copies of the tensors an op writes (so a check does not see the previous check's writes)."""
    mutated = tk.get_contract(op).mutates
    return {k: (v.clone() if k in mutated else v) for k, v in call.items()}


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_opcheck(case_id):
    """Schema, fake implementation (shapes, dtypes, strides) and AOT dispatch agree with the real op."""
    op, call = _cases()[case_id]
    torch.library.opcheck(getattr(NS, op).default, schema_args(op, **_fresh(op, call)))


@pytest.mark.parametrize("case_id", CASE_IDS)
def test_eager_call_through_ops_equals_public_op(case_id):
    op, call = _cases()[case_id]
    mutated = tk.get_contract(op).mutates
    if mutated:
        through, public = _fresh(op, call), _fresh(op, call)
        got, want = getattr(ops, op)(**through), getattr(tk, op)(**public)
        for name in mutated:
            assert not torch.equal(through[name], call[name])  # the op did write
            _assert_same(through[name], public[name])
        if got is not None or want is not None:
            _assert_same(got, want)
        return
    got, want = getattr(ops, op)(**call), getattr(tk, op)(**call)
    if op == "moe_dispatch":
        assert isinstance(got, tk.MoEDispatchResult)
        got, want = (
            (got.hidden, got.expert_offsets, got.permutation),
            (want.hidden, want.expert_offsets, want.permutation),
        )
    _assert_same(got, want)


def test_an_argument_that_cannot_cross_the_schema_is_named():
    logits = _randn(2, 10, g=_gen(9))
    with pytest.raises(TypeError, match="generator: cannot be passed through"):
        ops.top_k_top_p_sample(logits, generator=torch.Generator())
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        ops.rmsnorm(logits, torch.ones(10), out=torch.empty_like(logits))


def test_solution_and_override_cross_the_schema():
    x, w = _randn(4, 32, g=_gen(1)), torch.ones(32)
    want = tk.rmsnorm(x, w)
    register_kernel("rmsnorm", name="bf16only.rmsnorm", solution="bf16only", formats=[{"x": "bf16"}],
                    priority=Priority.SPECIALIZED, impl=lambda *a, **k: None)  # fmt: skip
    try:
        # Alternatives, first that fits: the bf16-only kernel cannot take fp32.
        _assert_same(ops.rmsnorm(x, w, override=("bf16only", "reference")), want)
        with pytest.raises(tk.OverrideError, match="bf16only"):
            ops.rmsnorm(x, w, override="bf16only")
    finally:
        unregister_kernel("bf16only.rmsnorm")
        tk.clear_selection_cache()
    _assert_same(ops.rmsnorm(x, w, solution="reference"), want)
    with pytest.raises(tk.OverrideError, match="no_such_kernel"):
        ops.rmsnorm(x, w, override="no_such_kernel")


def test_moe_apply_plan_and_opaque_extra_cross_the_schema():
    """A kernel with its own weight layout gets its ``extra`` (tensors and host numbers) back intact."""
    seen = []

    def packed_apply(x, topk_weights, topk_ids, weights, activation, *, out=None):
        seen.append(weights.extra)
        canonical = replace(weights, layout="canonical", extra=())
        return 2.0 * tk.moe_apply(x, topk_weights, topk_ids, canonical, activation, solution="reference")

    def pack(weights):
        return replace(weights, extra=(torch.arange(3), 7, True, 0.25))

    moe_traits = {"activation": ANY, "clamp": ANY, "bias": ANY, "gate_up_interleaved": ANY}
    register_kernel("moe_apply", name="packedtest.moe_apply", solution="packedtest", traits=moe_traits,
                    formats=[{"x": "fp32", "w": "mxfp4"}], priority=Priority.SPECIALIZED, impl=packed_apply,
                    weight_preprocessor=pack)  # fmt: skip
    try:
        g = _gen(2)
        weights, act = _moe_weights(g), tk.MoEActivation()
        with tk.kernel_override(moe_apply="packedtest"):
            plan = tk.moe_plan(weights, act, dtype=torch.float32, device="cpu")
        packed = tk.moe_process_weights(plan, weights)
        x = _randn(5, 32, g=g)
        tw, tid = tk.moe_route(_randn(5, 4, g=g), 2)
        # (the autouse fixture forces the references: this call needs the packed kernel)
        with tk.kernel_override(moe_apply="packedtest"):
            want = tk.moe_apply(x, tw, tid, packed, act, plan=plan)
            got = ops.moe_apply(x, tw, tid, packed, act, plan=plan)
        _assert_same(got, want)
        _assert_same(got, 2.0 * tk.moe_apply(x, tw, tid, weights, act))  # the planned kernel ran, not the reference
        extra = seen[-1]
        assert len(seen) == 2 and torch.equal(extra[0], torch.arange(3))
        assert type(extra[1]) is int and extra[1] == 7 and extra[2] is True and extra[3] == 0.25
        with pytest.raises(TypeError, match=r"weights\.extra: a str"):
            ops.moe_apply(x, tw, tid, replace(packed, extra=("no",)), act, plan=plan)
    finally:
        unregister_kernel("packedtest.moe_apply")


# ----------------------------------------------------------------------------- torch.compile


def _block(mod, x, w, w_up, w_down, q, k, v, cu, max_seqlen, sinks, cos_sin, positions):
    """rmsnorm (both variants) + mm + swiglu + rotary + windowed prefill attention with sinks and lse + argmax."""
    h = mod.rmsnorm(x, w, 1e-5)
    gu = mod.mm(h, w_up)
    y = mod.mm(mod.swiglu(gu, limit=7.0), w_down)
    y, s = mod.rmsnorm(y, w, 1e-5, residual=x)
    q, k = mod.apply_rotary(q, k, cos_sin, positions)
    o, lse = mod.mha_prefill(q, k, v, cu, cu, max_seqlen, max_seqlen, window_left=3, sinks=sinks, return_lse=True)
    return y, s, o, lse, mod.argmax(y)


def _block_inputs(tokens: int = 8, seed: int = 3) -> tuple:
    g = _gen(seed)
    return (
        _randn(tokens, 32, g=g), 1 + 0.1 * _randn(32, g=g), _randn(64, 32, g=g) / 6, _randn(32, 32, g=g) / 6,
        _randn(tokens, 4, 16, g=g), _randn(tokens, 2, 16, g=g), _randn(tokens, 2, 16, g=g),
        torch.tensor([0, 3, tokens], dtype=torch.int32), max(3, tokens - 3), _randn(4, g=g), _randn(16, 16, g=g),
        torch.arange(tokens) % 5,
    )  # fmt: skip


def _graph_recorder(graphs: list):
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    def backend(gm, example_inputs):
        graphs.append(gm)
        return aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g.forward))(gm, example_inputs)

    return backend


def test_compile_fullgraph_records_one_node_per_op():
    """Dynamo sees each op as one opaque node: nothing of validation, selection or the kernel is traced."""
    graphs = []
    fn = torch.compile(lambda *a: _block(ops, *a), fullgraph=True, backend=_graph_recorder(graphs))
    inputs = _block_inputs()
    _assert_same(fn(*inputs), _block(tk, *inputs))
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    ours = sorted(t for t in targets if t.startswith("tokenspeed_kernel."))
    assert ours == sorted(
        ["tokenspeed_kernel.rmsnorm.default"] * 2
        + ["tokenspeed_kernel.mm.default"] * 2
        + ["tokenspeed_kernel.swiglu.default", "tokenspeed_kernel.apply_rotary.default"]
        + ["tokenspeed_kernel.mha_prefill.default", "tokenspeed_kernel.argmax.default"]
    )
    assert not any("rsqrt" in t or "softmax" in t or "sigmoid" in t for t in targets)


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compiled_block_equals_eager_public_ops(backend):
    fn = torch.compile(lambda *a: _block(ops, *a), fullgraph=True, backend=backend)
    inputs = _block_inputs()
    _assert_same(fn(*inputs), _block(tk, *inputs))


def test_compiled_with_dynamic_shapes():
    """Fake implementations with symbolic sizes: one graph serves several token counts."""
    fn = torch.compile(lambda *a: _block(ops, *a), fullgraph=True, backend="aot_eager", dynamic=True)
    for tokens in (6, 11):
        inputs = _block_inputs(tokens, seed=tokens)
        _assert_same(fn(*inputs), _block(tk, *inputs))


def test_selection_happens_when_the_compiled_graph_runs():
    """An override active at execution reaches the kernel choice, with no recompilation."""
    from torch._dynamo.testing import CompileCounterWithBackend

    calls = []

    def doubled(x, weight, eps, *, residual=None, out=None):
        calls.append(x.shape)
        return 2 * tk.rmsnorm(x, weight, eps, solution="reference")

    register_kernel("rmsnorm", name="doubled.rmsnorm", solution="doubled", formats=[{"x": "fp32"}],
                    priority=Priority.PORTABLE, impl=doubled)  # fmt: skip
    try:
        counter = CompileCounterWithBackend("aot_eager")
        fn = torch.compile(lambda x, w: ops.mm(ops.rmsnorm(x, w), w[None, :]), fullgraph=True, backend=counter)
        x, w = _randn(3, 32, g=_gen(4)), _randn(32, g=_gen(5))
        first = fn(x, w)
        with tk.kernel_override(rmsnorm="doubled"):
            second = fn(x, w)
        assert counter.frame_count == 1 and calls == [(3, 32)]
        _assert_same(first, tk.mm(tk.rmsnorm(x, w), w[None, :]))
        _assert_same(second, tk.mm(2 * tk.rmsnorm(x, w), w[None, :]))
    finally:
        unregister_kernel("doubled.rmsnorm")
        tk.clear_selection_cache()


# ----------------------------------------------------------------------------- GPT-OSS


@pytest.fixture(scope="module")
def tiny_weights():
    cfg = m.GptOssConfig.tiny()
    return cfg, m.random_weights(cfg, num_layers=2, seed=1)


@pytest.fixture(scope="module")
def tiny_model(tiny_weights):
    with tk.kernel_override("reference"):
        return m.GptOssModel(*tiny_weights, dtype=torch.float32, max_positions=64)


def _prefill_inputs(cfg):
    g = _gen(6)
    return {
        "x": _randn(7, cfg.hidden_size, g=g),
        "positions": torch.tensor([0, 1, 2, 0, 1, 2, 3]),
        "cu_seqlens": torch.tensor([0, 3, 7], dtype=torch.int32),
        "max_seqlen": 4,
        "slots": torch.tensor([0, 1, 2, 16, 17, 18, 19]),
    }


def _decode_inputs(cfg):
    g = _gen(7)
    return {
        "x": _randn(2, cfg.hidden_size, g=g),
        "positions": torch.tensor([3, 4]),
        "slots": torch.tensor([3, 20]),
        "cache_seqlens": torch.tensor([4, 5], dtype=torch.int32),
        "page_table": torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32),
    }


def _run_layers(model, prefill, decode, cache, p, d, ops_ns):
    """Layer 0 (sliding window) prefill then one decode step, writing the paged cache."""
    cfg, layer = model.cfg, model.layers[0]
    y = prefill(cfg, layer, p["x"], p["positions"], p["cu_seqlens"], p["max_seqlen"], model.cos_sin, cache,
                p["slots"], ops=ops_ns)  # fmt: skip
    z = decode(cfg, layer, d["x"], d["positions"], model.cos_sin, cache, d["slots"], d["cache_seqlens"],
               d["page_table"], ops=ops_ns)  # fmt: skip
    return y, z


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_gpt_oss_decoder_layer_compiles(tiny_model, backend):
    """layer_prefill and layer_decode with ops=compile.ops: one graph each, same output and cache as eager."""
    cfg = tiny_model.cfg
    p, d = _prefill_inputs(cfg), _decode_inputs(cfg)
    cache_eager = tiny_model.new_cache(2, 16, page_size=4)
    cache_compiled = tiny_model.new_cache(2, 16, page_size=4)
    want = _run_layers(tiny_model, m.layer_prefill, m.layer_decode, cache_eager, p, d, tk)
    prefill = torch.compile(m.layer_prefill, fullgraph=True, backend=backend)
    decode = torch.compile(m.layer_decode, fullgraph=True, backend=backend)
    got = _run_layers(tiny_model, prefill, decode, cache_compiled, p, d, ops)
    _assert_same(got, want)
    assert cache_eager.k[0].abs().sum() > 0  # both steps wrote the cache ...
    _assert_same((cache_compiled.k[0], cache_compiled.v[0]), (cache_eager.k[0], cache_eager.v[0]))  # ... alike


@pytest.mark.parametrize("append", [False, True])
def test_gpt_oss_model_decode_compiles(tiny_weights, tiny_model, append):
    """GptOssModel(ops=compile.ops).decode compiled whole (embedding gather, both layers, logits), with the positions
    and slots given (rotary + store, then the decode) and without (mha_decode_append_kvcache, a custom op that
    writes the caches)."""
    cfg = tiny_model.cfg
    compiled_model = m.GptOssModel(*tiny_weights, dtype=torch.float32, max_positions=64, ops=ops)
    p = _prefill_inputs(cfg)
    tokens = torch.tensor([5, 9, 2, 7, 1, 3, 8])
    caches = [tiny_model.new_cache(2, 16, page_size=4) for _ in range(2)]
    for model, cache in zip((tiny_model, compiled_model), caches):
        model.prefill(tokens, p["positions"], p["cu_seqlens"], p["max_seqlen"], cache, p["slots"])
    d = _decode_inputs(cfg)
    if append:
        d["positions"] = d["slots"] = None
    args = (torch.tensor([4, 6]), d["positions"], d["slots"], d["cache_seqlens"], d["page_table"])
    want = tiny_model.decode(args[0], args[1], caches[0], *args[2:])
    decode = torch.compile(compiled_model.decode, fullgraph=True, backend="aot_eager")
    got = decode(args[0], args[1], caches[1], *args[2:])
    _assert_same(got, want)
    for layer in range(2):
        _assert_same((caches[1].k[layer], caches[1].v[layer]), (caches[0].k[layer], caches[0].v[layer]))


# ----------------------------------------------------------------------------- GPU


def _cuda(t: torch.Tensor) -> torch.Tensor:
    return (t.to(torch.bfloat16) if t.dtype == torch.float32 else t).cuda()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_gpu_compiled_block_equals_eager(mode):
    """Inductor on CUDA with the selected kernels; reduce-overhead replays a CUDA graph of the ops from call 3 on."""
    inputs = [_cuda(t) if isinstance(t, torch.Tensor) else t for t in _block_inputs(16)]
    inputs[9], inputs[10] = inputs[9].float(), inputs[10].float()  # sinks and the cos/sin table stay fp32
    fn = torch.compile(lambda *a: _block(ops, *a), fullgraph=True, mode=mode)
    want = _block(tk, *inputs)
    for _ in range(3):
        got = [t.clone() for t in fn(*inputs)]
    for g_, w_ in zip(got[:4], want[:4]):
        torch.testing.assert_close(g_.float(), w_.float(), atol=2e-2, rtol=2e-2)
    y, token = got[0], got[4]
    assert torch.equal(y.gather(-1, token[:, None])[:, 0], y.max(dim=-1).values)  # argmax of the compiled y


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_gpt_oss_decode_compiled_equals_eager():
    cfg = m.GptOssConfig.small()
    weights = m.random_weights(cfg, num_layers=2, seed=1, device="cuda")
    eager_model = m.GptOssModel(cfg, weights, max_positions=64)
    compiled_model = m.GptOssModel(cfg, weights, max_positions=64, ops=ops)
    p = _prefill_inputs(cfg)
    tokens = torch.tensor([5, 9, 2, 7, 1, 3, 8], device="cuda")
    caches = [eager_model.new_cache(2, 16, page_size=4) for _ in range(2)]
    for model, cache in zip((eager_model, compiled_model), caches):
        model.prefill(tokens, p["positions"].cuda(), p["cu_seqlens"].cuda(), p["max_seqlen"], cache, p["slots"].cuda())
    d = {k: v.cuda() for k, v in _decode_inputs(cfg).items()}
    tok = torch.tensor([4, 6], device="cuda")
    want = eager_model.decode(tok, d["positions"], caches[0], d["slots"], d["cache_seqlens"], d["page_table"])
    decode = torch.compile(compiled_model.decode, fullgraph=True)
    got = decode(tok, d["positions"], caches[1], d["slots"], d["cache_seqlens"], d["page_table"])
    # Kernels with atomics may round differently from run to run: compare as the model's GPU tests do.
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert eager_model.kernel_plans() == compiled_model.kernel_plans()

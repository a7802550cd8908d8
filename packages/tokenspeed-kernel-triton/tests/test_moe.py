"""Triton MoE kernels against the PyTorch reference (and an independent per-token loop).

On CPU the kernels run under ``TRITON_INTERPRET=1`` (conftest) at tiny shapes
(E=4, H=I=64, top-2). The ``gpu`` tests run GPT-OSS-120B shapes (E=128, top-4,
H=I=2880, MXFP4 + biases + clamped SwiGLU) on a CUDA device.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.core.selection import explain_selection, select_spec
from tokenspeed_kernel.ops.moe import MoEActivation, MoEWeights
from tokenspeed_kernel.reference import moe as ref
from tokenspeed_kernel_triton.moe import combine, configs, dispatch, experts, route
from tokenspeed_kernel_triton.moe.configs import GemmConfig

E, H, I, K = 4, 64, 64, 2
GPT_OSS = MoEActivation()  # alpha 1.702, limit 7, +1 on up
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _weights(
    fmt: str,
    *,
    bias: bool = True,
    interleaved: bool = True,
    seed: int = 0,
    e: int = E,
    h: int = H,
    i: int = I,
    device: str = "cpu",
) -> MoEWeights:
    """Random expert weights whose products stay O(1) at these sizes."""
    g = _gen(seed)

    def dense(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    if fmt == "mxfp4":
        # Every code occurs; scales 2**-8 .. 2**-4 put weights near GPT-OSS magnitudes.
        w13 = torch.randint(0, 256, (e, 2 * i, h // 2), generator=g, dtype=torch.uint8)
        w2 = torch.randint(0, 256, (e, h, i // 2), generator=g, dtype=torch.uint8)
        s13 = torch.randint(119, 124, (e, 2 * i, h // 32), generator=g, dtype=torch.uint8)
        s2 = torch.randint(119, 124, (e, h, i // 32), generator=g, dtype=torch.uint8)
    elif fmt.startswith("fp8"):
        w13 = dense(e, 2 * i, h, std=2.0).to(torch.float8_e4m3fn)
        w2 = dense(e, h, i, std=2.0).to(torch.float8_e4m3fn)
        shape13, shape2 = ((e,), (e,)) if fmt.endswith("per_tensor") else ((e, 2 * i), (e, h))
        s13 = torch.rand(shape13, generator=g) * 0.05 + 0.02
        s2 = torch.rand(shape2, generator=g) * 0.05 + 0.02
    else:
        dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[fmt]
        w13, w2 = dense(e, 2 * i, h, std=0.1).to(dt), dense(e, h, i, std=0.1).to(dt)
        s13 = s2 = None
    w = MoEWeights(
        w13=w13.to(device),
        w2=w2.to(device),
        format=fmt,
        w13_scale=None if s13 is None else s13.to(device),
        w2_scale=None if s2 is None else s2.to(device),
        w13_bias=dense(e, 2 * i, std=0.5).to(torch.bfloat16).to(device) if bias else None,
        w2_bias=dense(e, h, std=0.5).to(torch.bfloat16).to(device) if bias else None,
        gate_up_interleaved=interleaved,
    )
    w.validate()
    return w


def _routing(t: int, k: int = K, e: int = E, seed: int = 1, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(t, e, generator=_gen(seed)).to(device)
    return ref.moe_route(logits, k, renormalize=True)


def _x(
    t: int, seed: int = 2, scale: float = 1.0, dtype: torch.dtype = torch.bfloat16, device: str = "cpu", h: int = H
) -> torch.Tensor:
    return (torch.randn(t, h, generator=_gen(seed)) * scale).to(dtype).to(device)


def _assert_close_to(out: torch.Tensor, expected: torch.Tensor, rel: float = 1.5e-2) -> None:
    """Our intermediates are rounded to x's dtype (the reference keeps fp32): allow
    ``rel`` of the output's scale absolutely plus ``rel`` relatively. A wrong
    nibble, scale, slot or row breaks this by orders of magnitude."""
    exp = expected.float()
    scale = exp.abs().max().item()
    torch.testing.assert_close(out.float(), exp, atol=rel * scale, rtol=rel)


# --------------------------------------------------------------------------- route


@pytest.mark.parametrize("t", [1, 5, 17])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_matches_reference(t: int, k: int, renormalize: bool) -> None:
    g = _gen(t * 10 + k)
    # Few distinct values: many ties, which must go to the lower expert index.
    logits = (torch.randint(-3, 4, (t, 6), generator=g).float() * 0.5).to(torch.bfloat16)
    w, ids = route.moe_route(logits, k, renormalize=renormalize)
    rw, rids = ref.moe_route(logits, k, renormalize=renormalize)
    assert torch.equal(ids, rids)
    torch.testing.assert_close(w, rw, atol=1e-6, rtol=1e-5)


def test_route_all_equal_logits_pick_lowest_indices() -> None:
    w, ids = route.moe_route(torch.zeros(3, 8), 4, renormalize=False)
    assert ids.tolist() == [[0, 1, 2, 3]] * 3
    torch.testing.assert_close(w, torch.full((3, 4), 1 / 8))


def test_route_gpt_oss_router_shape() -> None:
    logits = torch.randn(5, 128, generator=_gen(3))
    w, ids = route.moe_route(logits, 4, renormalize=True)
    expect = torch.topk(logits, 4, dim=-1)
    assert torch.equal(ids.long(), expect.indices)
    torch.testing.assert_close(w, torch.softmax(expect.values, dim=-1))


def _gate_inputs(t: int, h: int, e: int, seed: int, device: str = "cpu", dtype=torch.bfloat16):
    """Small integers: every fp32 sum of their products is exact whatever the order, so the kernel's logits, rounded
    to ``dtype``, equal the reference's bit for bit (ties included: they go to the lower expert)."""
    g = _gen(seed)
    x = torch.randint(-2, 3, (t, h), generator=g).to(dtype).to(device)
    w = torch.randint(-2, 3, (e, h), generator=g).to(dtype).to(device)
    b = torch.randint(-3, 4, (e,), generator=g).to(dtype).to(device)
    return x, w, b


@pytest.mark.parametrize("t", [1, 3, 17])  # the interpreter's table: CUDA-core sums up to 4 tokens, tl.dot above
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("renormalize", [True, False])
def test_gate_equals_mm_then_route(t: int, bias: bool, renormalize: bool) -> None:
    x, w, b = _gate_inputs(t, 40, 12, t + 2 * bias)
    b = b if bias else None
    wts, ids = route.moe_gate(x, w, b, 3, renormalize=renormalize)
    logits = x.double() @ w.double().T + (b.double() if bias else 0.0)
    rw, rids = ref.moe_route(logits.to(x.dtype), 3, renormalize=renormalize)
    assert torch.equal(ids, rids)
    torch.testing.assert_close(wts, rw, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("e_block", [4, 0])  # the interpreter's table splits the experts 4 a program; 0: one program
@pytest.mark.parametrize("norm", [False, True])
def test_gate_split_experts_route_every_expert(monkeypatch, e_block: int, norm: bool) -> None:
    """Every expert chosen (top_k = E = 14: four splits of 4, the last holding two experts and two padding lanes):
    each split's logits reach the routing program at their place, with the experts split across programs and in
    one. Small integers: the logits are exact, so the routing equals the reference's bit for bit. With the norm, h
    (stored by one program) against a float64 norm, and the routing equal to the one-program kernel's bit for bit."""
    tiles = configs.GATE_TILES["interpret"]
    monkeypatch.setitem(configs.GATE_TILES, "interpret", ((4, (2, 32, False, e_block)), tiles[1]))
    x, w, b = _gate_inputs(3, 40, 14, seed=11)
    if not norm:
        got = route.moe_gate(x, w, b, 14, renormalize=False)
        logits = (x.double() @ w.double().T + b.double()).to(x.dtype)
        rw, rids = ref.moe_route(logits, 14, renormalize=False)
        assert torch.equal(got[1], rids)
        torch.testing.assert_close(got[0], rw, atol=1e-6, rtol=1e-5)
        return
    _, res, nw = _norm_inputs(3, 40, seed=12)
    got = route.moe_gate(x, w, b, 14, renormalize=False, norm_weight=nw, norm_eps=1e-5, residual=res)
    exact = x.double() + res.double()
    assert ((got[3].double() - exact).abs() <= exact.abs() * 2.0**-7 + 1e-30).all()
    want = _norm64(got[3], nw, 1e-5)
    assert ((got[2].double() - want).abs() <= want.abs().max() * 2 * 2.0**-7).all()
    monkeypatch.setitem(configs.GATE_TILES, "interpret", ((4, (2, 32, False, 0)), tiles[1]))
    one = route.moe_gate(x, w, b, 14, renormalize=False, norm_weight=nw, norm_eps=1e-5, residual=res)
    for a, b_ in zip(got, one, strict=True):
        assert torch.equal(a, b_)


def test_gate_public_op_selects_triton() -> None:
    x, w, b = _gate_inputs(5, 64, 32, 9)
    assert tk.moe_gate.selected_kernel(x, w, b, 4).spec.name == "triton.moe_gate"
    wts, ids = tk.moe_gate(x, w, b, 4)
    rw, rids = tk.moe_gate(x, w, b, 4, solution="reference")
    assert torch.equal(ids, rids)
    torch.testing.assert_close(wts, rw, atol=1e-6, rtol=1e-5)


def _norm_inputs(t: int, h: int, seed: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    x = torch.randn(t, h, generator=g).to(torch.bfloat16).to(device)
    res = torch.randn(t, h, generator=g).to(torch.bfloat16).to(device)
    nw = (1.0 + 0.5 * torch.randn(h, generator=g)).to(torch.bfloat16).to(device)
    return x, res, nw


def _norm64(s: torch.Tensor, nw: torch.Tensor, eps: float) -> torch.Tensor:
    s64 = s.double()
    return s64 / torch.sqrt(s64.pow(2).mean(-1, keepdim=True) + eps) * nw.double()


@pytest.mark.parametrize("t", [1, 3, 17])  # CUDA-core sums up to 4 tokens in the interpreter, tl.dot above
@pytest.mark.parametrize("residual", [True, False])
def test_gate_with_norm_equals_rmsnorm_then_gate(t: int, residual: bool) -> None:
    """The fused norm: the stream within one rounding of the exact sum (the interpreter truncates to bf16, so not
    bit for bit with torch's add here), h against a float64 norm of that stream, and the routing of the h it returns
    against the plain kernel and the reference router on that h (H = 40 leaves a masked tail of the 32-wide chunks)."""
    h_dim, e = 40, 12
    x, res, nw = _norm_inputs(t, h_dim, seed=t)
    _, w, b = _gate_inputs(t, h_dim, e, seed=t + 7)
    w = (w.float() * 0.25).to(torch.bfloat16)
    r = res if residual else None
    got = route.moe_gate(x, w, b, 3, norm_weight=nw, norm_eps=1e-5, residual=r)
    assert len(got) == (4 if residual else 3)
    base = x
    if residual:
        exact = x.double() + res.double()
        assert ((got[3].double() - exact).abs() <= exact.abs() * 2.0**-7 + 1e-30).all()
        base = got[3]
    want = _norm64(base, nw, 1e-5)
    assert ((got[2].double() - want).abs() <= want.abs().max() * 2 * 2.0**-7).all()
    # The routing of the h it returns: the plain kernel's on that h bit for bit, and the reference router's (ids
    # equal; weights within the logits' bf16 rounding, which the interpreter truncates).
    pw, pids = route.moe_gate(got[2].clone(), w, b, 3)
    assert torch.equal(got[1], pids) and torch.equal(got[0], pw)
    rw, rids = ref.moe_gate(got[2], w, b, 3, renormalize=True)
    assert torch.equal(got[1], rids)
    torch.testing.assert_close(got[0], rw, atol=1e-2, rtol=0)


def test_gate_with_norm_public_op_against_reference_and_checks() -> None:
    x, res, nw = _norm_inputs(5, 64, seed=3)
    _, w, b = _gate_inputs(5, 64, 32, seed=9)
    w = (w.float() * 0.25).to(torch.bfloat16)
    kw = dict(norm_weight=nw, norm_eps=1e-6, residual=res)
    assert tk.moe_gate.selected_kernel(x, w, b, 4, **kw).spec.name == "triton.moe_gate"
    got = tk.moe_gate(x, w, b, 4, **kw)
    want = tk.moe_gate(x, w, b, 4, solution="reference", **kw)
    assert len(got) == len(want) == 4
    assert torch.equal(got[1], want[1])  # (the logits of this draw are apart by more than the norm's roundings)
    torch.testing.assert_close(got[0], want[0], atol=2e-2, rtol=0)  # (the logits rounded to bf16: truncated here)
    for a, r in zip(got[2:], want[2:]):  # h and the stream: within two bf16 ulps (the interpreter truncates)
        assert ((a.double() - r.double()).abs() <= r.double().abs().max() * 2 * 2.0**-7).all()
    with pytest.raises(ValueError, match="norm_eps: required"):
        tk.moe_gate(x, w, b, 4, norm_weight=nw)
    with pytest.raises(ValueError, match="norm_eps: given without norm_weight"):
        tk.moe_gate(x, w, b, 4, norm_eps=1e-6)
    with pytest.raises(ValueError, match="residual: given without norm_weight"):
        tk.moe_gate(x, w, b, 4, residual=res)
    with pytest.raises(ValueError, match="residual"):
        tk.moe_gate(x, w, b, 4, norm_weight=nw, norm_eps=1e-6, residual=res[:, :32])
    with pytest.raises(ValueError, match="norm_weight"):
        tk.moe_gate(x, w, b, 4, norm_weight=nw[:32], norm_eps=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("t", [1, 8, 64, 2048])
def test_gate_gpt_oss_router_gpu(t: int) -> None:
    x, w, b = _gate_inputs(t, 2880, 32, t, device="cuda")
    wts, ids = tk.moe_gate(x, w, b, 4)
    rw, rids = tk.moe_route(tk.mm(x, w, b), 4)
    assert torch.equal(ids, rids)
    torch.testing.assert_close(wts, rw, atol=1e-6, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("t", [1, 8, 64, 2048])
def test_gate_with_norm_gpt_oss_gpu(t: int) -> None:
    """The post-attention norm inside the router's call at GPT-OSS-20B's router: the stream equals torch's add bit
    for bit, h the float64 norm of it within two bf16 ulps, and the routing equals the plain router's on that h;
    against the two calls it replaces (rmsnorm, then moe_gate), h within an ulp and the same experts."""
    x, res, nw = _norm_inputs(t, 2880, seed=t, device="cuda")
    _, w, b = _gate_inputs(t, 2880, 32, t, device="cuda")
    w = (w.float() * 0.02).to(torch.bfloat16)
    wts, ids, h, s = tk.moe_gate(x, w, b, 4, norm_weight=nw, norm_eps=1e-5, residual=res)
    assert torch.equal(s, x + res)
    want = _norm64(s, nw, 1e-5)
    assert ((h.double() - want).abs() <= want.abs().max() * 2 * 2.0**-7).all()
    pw, pids = tk.moe_gate(h.clone(), w, b, 4)
    assert torch.equal(ids, pids) and torch.equal(wts, pw)
    h2, s2 = tk.rmsnorm(x, nw, 1e-5, residual=res)
    assert torch.equal(s2, s)
    assert ((h.double() - h2.double()).abs() <= h2.double().abs() * 2.0**-7).all()
    _, ids2 = tk.moe_gate(h2, w, b, 4)
    assert (ids2 == ids).float().mean() >= 0.99  # (an ulp apart, a near tie may pick the other expert)


# --------------------------------------------------------------------------- dispatch / combine


def _check_dispatch(x: torch.Tensor, ids: torch.Tensor, e: int) -> None:
    d = dispatch.moe_dispatch(x, ids, e)
    r = ref.moe_dispatch(x, ids, e)
    assert torch.equal(d.expert_offsets, r.expert_offsets)
    assert torch.equal(d.permutation, r.permutation)
    assert torch.equal(d.hidden, r.hidden)


@pytest.mark.parametrize("t", [1, 5, 17, 40])  # 80 pairs > 64: the count / scan / place pipeline
def test_dispatch_matches_reference(t: int) -> None:
    _, ids = _routing(t, seed=t)
    _check_dispatch(_x(t), ids, E)


def test_dispatch_one_expert_takes_every_token_and_others_none() -> None:
    t = 40
    ids = torch.full((t, K), 3, dtype=torch.int32)
    ids[:, 1] = 1  # experts 0 and 2 receive nothing
    _check_dispatch(_x(t), ids, E)
    offsets, _ = dispatch.sort_pairs(ids, E)
    assert offsets.tolist() == [0, 0, t, t, 2 * t]


@pytest.mark.parametrize("t", [1, 17])
def test_combine_matches_reference(t: int) -> None:
    w, ids = _routing(t)
    d = ref.moe_dispatch(_x(t), ids, E)
    expert_out = torch.randn(t * K, H, generator=_gen(4)).to(torch.bfloat16)
    out = combine.moe_combine(expert_out, d.permutation, w)
    torch.testing.assert_close(out, ref.moe_combine(expert_out, d.permutation, w), atol=1e-2, rtol=1e-2)
    # Independent: each token's slots by a direct search of the permutation.
    perm = d.permutation.tolist()
    by_hand = torch.stack(
        [sum(w[tt, s] * expert_out[perm.index(tt * K + s)].float() for s in range(K)) for tt in range(t)]
    )
    torch.testing.assert_close(out.float(), by_hand, atol=2e-2, rtol=1e-2)


# --------------------------------------------------------------------------- experts / apply


@pytest.mark.parametrize("t", [1, 5, 17])
@pytest.mark.parametrize("path", ["tiny", "grouped"])
def test_apply_gpt_oss_mxfp4(t: int, path: str) -> None:
    """MXFP4 + biases + interleaved gate/up + clamped SwiGLU (GPT-OSS constants)."""
    weights = _weights("mxfp4")
    w, ids = _routing(t, seed=t)
    x = _x(t, scale=4.0)  # large enough that the clamp at 7 bites
    out = experts.moe_apply(x, w, ids, weights, GPT_OSS, path=path)
    expected = ref.moe_apply(x, w, ids, weights, GPT_OSS)
    _assert_close_to(out, expected)
    # The clamp is exercised: without it the layer differs.
    unclamped = ref.moe_apply(x, w, ids, weights, MoEActivation(limit=None))
    assert (unclamped.float() - expected.float()).abs().max() > 0.1 * expected.float().abs().max()


_FORMAT_CASES = [
    # (weight format, x dtype, activation, bias, interleaved)
    ("bf16", torch.bfloat16, MoEActivation.silu(), False, False),
    ("fp16", torch.float16, GPT_OSS, True, True),
    ("fp8_e4m3:per_channel", torch.bfloat16, GPT_OSS, True, False),
    ("fp8_e4m3:per_tensor", torch.bfloat16, MoEActivation(alpha=1.0, limit=None, up_offset=0.5), False, True),
]


@pytest.mark.parametrize("case", _FORMAT_CASES, ids=[c[0] for c in _FORMAT_CASES])
@pytest.mark.parametrize("path", ["tiny", "grouped"])
def test_apply_formats_and_traits(case: tuple, path: str) -> None:
    fmt, dtype, act, bias, interleaved = case
    weights = _weights(fmt, bias=bias, interleaved=interleaved, seed=5)
    w, ids = _routing(5, seed=6)
    x = _x(5, dtype=dtype)
    out = experts.moe_apply(x, w, ids, weights, act, path=path)
    assert out.dtype == dtype
    _assert_close_to(out, ref.moe_apply(x, w, ids, weights, act))


@pytest.mark.parametrize("fmt", ["mxfp4", "fp8_e4m3:per_channel"])
def test_staged_path_matches_reference_and_fused(fmt: str) -> None:
    weights = _weights(fmt, seed=7)
    t = 17
    w, ids = _routing(t, seed=8)
    x = _x(t)
    d = dispatch.moe_dispatch(x, ids, E)
    y = experts.moe_experts(d.hidden, d.expert_offsets, weights, GPT_OSS)
    _assert_close_to(y, ref.moe_experts(d.hidden, d.expert_offsets, weights, GPT_OSS))
    staged = combine.moe_combine(y, d.permutation, w)
    fused = experts.moe_apply(x, w, ids, weights, GPT_OSS, path="grouped")
    # Same products and sums; only the staged path rounds expert rows before weighting.
    _assert_close_to(staged, fused.float(), rel=1e-2)


@pytest.mark.parametrize("path", ["tiny", "grouped"])
def test_apply_one_expert_takes_every_token(path: str) -> None:
    """Expert 2 receives all 17 tokens (more than one 16-row tile); experts 0 and 1 nothing."""
    t = 17
    weights = _weights("mxfp4", seed=9)
    w, _ = _routing(t, seed=10)
    ids = torch.full((t, K), 2, dtype=torch.int32)
    ids[:, 1] = 3
    x = _x(t)
    _assert_close_to(
        experts.moe_apply(x, w, ids, weights, GPT_OSS, path=path), ref.moe_apply(x, w, ids, weights, GPT_OSS)
    )


def test_tiny_path_repeated_expert_within_tokens() -> None:
    """Both slots of 9 tokens name expert 1: 18 rows of one expert, two 16-row chunks."""
    t = 9
    weights = _weights("bf16", seed=11)
    w, _ = _routing(t, seed=12)
    ids = torch.ones((t, K), dtype=torch.int32)
    x = _x(t)
    out = experts.moe_apply(x, w, ids, weights, GPT_OSS, path="tiny")
    _assert_close_to(out, ref.moe_apply(x, w, ids, weights, GPT_OSS))


def test_mxfp4_decoders_agree_and_tiles_cover_every_shape() -> None:
    """Narrow tiles (several N tiles and K steps, swapped and not) give the table's
    result; the shared E2M1 decoder and the bit-pattern decoder agree exactly."""
    weights = _weights("mxfp4", seed=13)
    t = 5
    w, ids = _routing(t, seed=14)
    x = _x(t)
    expected = ref.moe_apply(x, w, ids, weights, GPT_OSS)
    narrow = GemmConfig(block_m=16, block_n=32, block_k=32, num_stages=1)
    bits = experts.moe_apply(x, w, ids, weights, GPT_OSS, path="grouped", configs=(narrow, narrow))
    _assert_close_to(bits, expected)
    shared = GemmConfig(block_m=16, block_n=32, block_k=32, num_stages=1, decode="shared")
    assert torch.equal(bits, experts.moe_apply(x, w, ids, weights, GPT_OSS, path="grouped", configs=(shared, shared)))
    swapped = GemmConfig(block_m=16, block_n=32, block_k=32, swap_ab=True, num_stages=1)
    _assert_close_to(experts.moe_apply(x, w, ids, weights, GPT_OSS, path="tiny", configs=(swapped, swapped)), expected)


#: Every MXFP4 decode path of the MoE GEMMs: (path, gate/up and down tile config).
_DECODE_PATHS = {
    "grouped-words": ("grouped", GemmConfig(block_m=16, block_n=32, block_k=32, num_stages=1)),
    "grouped-bytes": ("grouped", GemmConfig(block_m=16, block_n=32, block_k=32, num_stages=1, decode="shared")),
    "tiny-swapped": ("tiny", GemmConfig(block_n=32, block_k=32, swap_ab=True, num_stages=1)),
    "tiny-gemv": ("tiny", GemmConfig(block_n=32, block_k=32, use_dot=False, num_stages=1)),
}


def _w13_at_scale_byte(scale_byte: int, codes_mask: int, codes_set: int, seed: int) -> MoEWeights:
    w = _weights("mxfp4", bias=False, seed=seed)
    return dataclasses.replace(
        w, w13=(w.w13 & codes_mask) | codes_set, w13_scale=torch.full_like(w.w13_scale, scale_byte)
    )


# Byte 0 runs on the GEMV only: the MMA paths cast decoded weights to x's dtype, and
# 2**-127-scaled values are bf16 subnormals, which the interpreter flushes to zero.
_EXTREME_SCALES = [(v, s) for v in sorted(_DECODE_PATHS) for s in (250, 254)] + [("tiny-gemv", 0)]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # silu's exp of large gates
@pytest.mark.parametrize(("variant", "scale_byte"), _EXTREME_SCALES)
def test_mxfp4_extreme_scale_bytes(variant: str, scale_byte: int) -> None:
    """Every w13 group at E8M0 byte 250 or 254 (past 240, where a scale folded into one
    2**(s - 113) overflows) or 0 (the subnormal 2**-127). Codes are kept to magnitudes <= 1.5
    (so 1.5 * 2**127 stays finite) and x is scaled to keep the products near 1; the decoded
    weights are checked against ``mxfp4_to_float`` (through the reference layer)."""
    weights = _w13_at_scale_byte(scale_byte, 0xBB, 0, seed=26)  # nibble bit 2 cleared: 0, 0.5, 1, 1.5
    w, ids = _routing(5, seed=27)
    x = _x(5, seed=28, scale=2.0 ** max(-100, min(100, 124 - scale_byte)))
    act = MoEActivation(limit=None)  # no clamp: the gate/up products reach the output unsaturated
    path, cfg = _DECODE_PATHS[variant]
    out = experts.moe_apply(x, w, ids, weights, act, path=path, configs=(cfg, cfg))
    expected = ref.moe_apply(x, w, ids, weights, act)
    assert bool(expected.isfinite().all()) and expected.abs().max() > 0
    _assert_close_to(out, expected)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # inf products (and 0 * inf in padding rows)
@pytest.mark.parametrize("variant", sorted(_DECODE_PATHS))
def test_mxfp4_scale_byte_255_is_infinite(variant: str) -> None:
    """E8M0 byte 255 decodes to infinity (``exp2(128)``, as the reference): with positive codes
    and x every gate/up output is +inf, which GPT-OSS's clamp turns into the finite limit."""
    weights = _w13_at_scale_byte(255, 0x33, 0x11, seed=29)  # codes 1 and 3: +0.5, +1.5
    w, ids = _routing(5, seed=30)
    x = _x(5, seed=31).abs() + 0.5
    path, cfg = _DECODE_PATHS[variant]
    out = experts.moe_apply(x, w, ids, weights, GPT_OSS, path=path, configs=(cfg, cfg))
    expected = ref.moe_apply(x, w, ids, weights, GPT_OSS)
    assert bool(expected.isfinite().all())
    _assert_close_to(out, expected)


@pytest.mark.parametrize("fmt", ["mxfp4", "fp8_e4m3:per_channel"])
def test_tiny_path_gemv_variant(fmt: str) -> None:
    """use_dot=False: one token row at a time on the vector units (decode at batch 1);
    tokens 0 and 1 share expert 3, so the row loop runs more than once."""
    weights = _weights(fmt, seed=20)
    t = 3
    w, ids = _routing(t, seed=21)
    ids[:2, 0] = 3
    ids[:2, 1] = torch.tensor([0, 1], dtype=torch.int32)
    x = _x(t, scale=3.0)
    gemv = GemmConfig(block_n=32, block_k=32, use_dot=False, num_stages=1)
    out = experts.moe_apply(x, w, ids, weights, GPT_OSS, path="tiny", configs=(gemv, gemv))
    _assert_close_to(out, ref.moe_apply(x, w, ids, weights, GPT_OSS))
    with pytest.raises(ValueError, match="tiny path"):
        experts.moe_apply(x, w, ids, weights, GPT_OSS, path="grouped", configs=(gemv, gemv))


@pytest.mark.parametrize(("fmt", "path"), [("mxfp4", "grouped"), ("fp8_e4m3:per_tensor", "tiny")])
def test_reduction_not_a_multiple_of_block_k(fmt: str, path: str) -> None:
    """H = 96 and I = 160 leave a masked tail after 64-wide K steps in both GEMMs."""
    weights = _weights(fmt, seed=22, h=96, i=160)
    t = 5
    w, ids = _routing(t, seed=23)
    x = _x(t, h=96)
    _assert_close_to(
        experts.moe_apply(x, w, ids, weights, GPT_OSS, path=path), ref.moe_apply(x, w, ids, weights, GPT_OSS)
    )


def _per_token_loop(
    x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, weights: MoEWeights, act: MoEActivation
) -> torch.Tensor:
    """Independent float64 formulation: one token and one slot at a time, MXFP4 decoded
    by table lookup, gate/up taken by row parity."""
    table = torch.tensor(_E2M1, dtype=torch.float64)

    def decode(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        codes = torch.stack([blocks & 15, blocks >> 4], dim=-1).flatten(-2).long()
        return table[codes] * torch.pow(2.0, scales.double() - 127).repeat_interleave(32, dim=-1)

    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for s in range(ids.shape[1]):
            e = int(ids[t, s])
            h = decode(weights.w13[e], weights.w13_scale[e]) @ x[t].double() + weights.w13_bias[e].double()
            gate, up = h[0::2].clamp(max=act.limit), h[1::2].clamp(-act.limit, act.limit)
            y = (up + act.up_offset) * gate / (1 + torch.exp(-act.alpha * gate))
            o = decode(weights.w2[e], weights.w2_scale[e]) @ y + weights.w2_bias[e].double()
            out[t] += float(w[t, s]) * o
    return out


def test_apply_matches_independent_per_token_loop() -> None:
    weights = _weights("mxfp4", seed=15)
    t = 5
    w, ids = _routing(t, seed=16)
    x = _x(t, scale=3.0)
    _assert_close_to(experts.moe_apply(x, w, ids, weights, GPT_OSS), _per_token_loop(x, w, ids, weights, GPT_OSS))


def test_out_buffers_are_filled_and_returned() -> None:
    weights = _weights("bf16", seed=24)
    t = 2
    w, ids = _routing(t, seed=25)
    x = _x(t)
    expected = ref.moe_apply(x, w, ids, weights, GPT_OSS)
    out = torch.full_like(x, float("nan"))
    assert experts.moe_apply(x, w, ids, weights, GPT_OSS, out=out) is out
    _assert_close_to(out, expected)
    d = ref.moe_dispatch(x, ids, E)
    rows = torch.full_like(d.hidden, float("nan"))
    assert experts.moe_experts(d.hidden, d.expert_offsets, weights, GPT_OSS, out=rows) is rows
    combined = torch.full_like(x, float("nan"))
    assert combine.moe_combine(rows, d.permutation, w, out=combined) is combined
    _assert_close_to(combined, expected)


def test_apply_path_comes_from_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    weights = _weights("bf16", seed=17)
    sorted_calls = []
    real_sort = experts.sort_pairs

    def spy(*args, **kwargs):
        sorted_calls.append(args[0].shape[0])
        return real_sort(*args, **kwargs)

    monkeypatch.setattr(experts, "sort_pairs", spy)
    monkeypatch.setitem(configs.APPLY_PATH, "interpret", ((2, "tiny"), (None, "grouped")))
    for t in (2, 3):
        w, ids = _routing(t)
        x = _x(t)
        _assert_close_to(experts.moe_apply(x, w, ids, weights, GPT_OSS), ref.moe_apply(x, w, ids, weights, GPT_OSS))
    assert sorted_calls == [3]  # 2 tokens: tiny (no sort); 3 tokens: grouped


# --------------------------------------------------------------------------- public API


def test_public_api_selects_triton_and_matches_reference() -> None:
    weights = _weights("mxfp4", seed=18)
    t = 5
    logits = torch.randn(t, E, generator=_gen(19))
    x = _x(t)
    traits = {"activation": "swiglu", "clamp": True, "bias": True, "gate_up_interleaved": True}
    for op, sig, tr in (
        ("moe_route", ("fp32",), {"renormalize": True}),
        ("moe_dispatch", ("bf16",), {}),
        ("moe_experts", ("bf16", "mxfp4"), traits),
        ("moe_combine", ("bf16",), {}),
        ("moe_apply", ("bf16", "mxfp4"), traits),
    ):
        assert select_spec(op, sig, tr).spec.name == f"triton.{op}"
        chosen = [c.name for c in explain_selection(op, sig, tr) if c.selected]
        assert chosen == [f"triton.{op}"]

    w, ids = tk.moe_route(logits, K)
    rw, rids = ref.moe_route(logits, K, renormalize=True)
    assert torch.equal(ids, rids)
    plan = tk.moe_plan(weights, GPT_OSS, dtype=torch.bfloat16, device="cpu")
    assert plan.kernel == "triton.moe_apply" and plan.layout == "canonical"
    assert tk.moe_process_weights(plan, weights) is weights
    out = tk.moe_apply(x, w, ids, weights, GPT_OSS, plan=plan)
    _assert_close_to(out, ref.moe_apply(x, rw, rids, weights, GPT_OSS))
    d = tk.moe_dispatch(x, ids, E)
    y = tk.moe_experts(d.hidden, d.expert_offsets, weights, GPT_OSS)
    staged = tk.moe_combine(y, d.permutation, w)
    _assert_close_to(staged, ref.moe_apply(x, rw, rids, weights, GPT_OSS))


def test_fp32_activations_are_left_to_the_reference() -> None:
    traits = {"activation": "swiglu", "clamp": True, "bias": True, "gate_up_interleaved": True}
    assert select_spec("moe_apply", ("fp32", "mxfp4"), traits).spec.name == "reference.moe_apply"


# --------------------------------------------------------------------------- GPU (GPT-OSS-120B shapes)

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _gpt_oss_layer(t: int, seed: int = 0):
    weights = _weights("mxfp4", seed=seed, e=128, h=2880, i=2880, device="cuda")
    g = _gen(seed + 1)
    logits = torch.randn(t, 128, generator=g).cuda()
    x = (torch.randn(t, 2880, generator=g) * 2).to(torch.bfloat16).cuda()
    return weights, logits, x


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(
    ("path", "t"),
    # The tiny path's row tile holds every token of an expert (up to T): moe_apply takes it up to
    # 32 tokens (APPLY_PATH); at 512 its tile needs more shared memory than sm90 has (seen on the H200).
    [("tiny", 1), ("tiny", 8), ("tiny", 64), ("grouped", 1), ("grouped", 8), ("grouped", 64), ("grouped", 512)],
)
def test_gpu_gpt_oss_120b_mxfp4(t: int, path: str) -> None:
    weights, logits, x = _gpt_oss_layer(t)
    w, ids = route.moe_route(logits, 4)
    rw, rids = ref.moe_route(logits, 4, renormalize=True)
    assert torch.equal(ids, rids)
    torch.testing.assert_close(w, rw)
    out = experts.moe_apply(x, w, ids, weights, GPT_OSS, path=path)
    _assert_close_to(out, ref.moe_apply(x, rw, rids, weights, GPT_OSS))


_GPU_VARIANTS = {
    "tiny": [
        GemmConfig(block_n=64, block_k=64),
        GemmConfig(block_n=64, block_k=64, swap_ab=True),
        GemmConfig(block_n=64, block_k=64, decode="shared"),
        GemmConfig(block_n=64, block_k=64, swap_ab=True, decode="dot_scaled"),
        GemmConfig(block_n=32, block_k=64, decode="dot_scaled"),
        GemmConfig(block_n=32, block_k=64, use_dot=False),
    ],
    "grouped": [
        GemmConfig(block_m=16, block_n=64, block_k=64, swap_ab=True),
        GemmConfig(block_m=64, block_n=128, block_k=64, decode="shared"),
        GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8, decode="dot_scaled"),
        GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3),
    ],
}


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("path", ["tiny", "grouped"])
def test_gpu_mxfp4_tile_and_decoder_variants(path: str) -> None:
    """Every variant the bench sweep may put in the tables, at GPT-OSS-120B shapes."""
    t = 8 if path == "tiny" else 300
    weights, logits, x = _gpt_oss_layer(t, seed=3)
    w, ids = route.moe_route(logits, 4)
    expected = ref.moe_apply(x, w, ids, weights, GPT_OSS)
    for cfg in _GPU_VARIANTS[path]:
        out = experts.moe_apply(x, w, ids, weights, GPT_OSS, path=path, configs=(cfg, cfg))
        _assert_close_to(out, expected)


@pytest.mark.gpu
@gpu
def test_gpu_dispatch_and_staged_path_at_prefill_size() -> None:
    weights, logits, x = _gpt_oss_layer(4096, seed=5)
    w, ids = route.moe_route(logits, 4)
    d = dispatch.moe_dispatch(x, ids, 128)
    r = ref.moe_dispatch(x, ids, 128)
    assert torch.equal(d.expert_offsets, r.expert_offsets)
    assert torch.equal(d.permutation, r.permutation)
    assert torch.equal(d.hidden, r.hidden)
    y = experts.moe_experts(d.hidden, d.expert_offsets, weights, GPT_OSS)
    _assert_close_to(combine.moe_combine(y, d.permutation, w), ref.moe_apply(x, w, ids, weights, GPT_OSS))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3:per_channel", "fp8_e4m3:per_tensor"])
@pytest.mark.parametrize("t", [4, 300])
def test_gpu_dense_and_fp8_formats(fmt: str, t: int) -> None:
    # 544 = 8.5 * 64 and 736 = 11.5 * 64: both GEMMs run their masked K tail.
    weights = _weights(fmt, seed=6, e=16, h=544, i=736, device="cuda")
    g = _gen(7)
    w, ids = route.moe_route(torch.randn(t, 16, generator=g).cuda(), 4)
    x = torch.randn(t, 544, generator=g).to(torch.bfloat16).cuda()
    _assert_close_to(experts.moe_apply(x, w, ids, weights, GPT_OSS), ref.moe_apply(x, w, ids, weights, GPT_OSS))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("t", [1, 64])
def test_gpu_cuda_graph_capture(t: int) -> None:
    """The full layer (route + experts) replays from a CUDA graph with new inputs."""
    weights, logits, x = _gpt_oss_layer(t, seed=8)
    out = torch.empty_like(x)

    def layer() -> None:
        w, ids = route.moe_route(logits, 4)
        experts.moe_apply(x, w, ids, weights, GPT_OSS, out=out)

    layer()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layer()
    logits.copy_(torch.randn_like(logits))
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    w, ids = ref.moe_route(logits, 4, renormalize=True)
    _assert_close_to(out, ref.moe_apply(x, w, ids, weights, GPT_OSS))

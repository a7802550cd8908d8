"""The packed MXFP4 layout of ``hopper.moe_apply_packed`` (:mod:`tokenspeed_kernel_nvidia.hopper.moe.packed`).

On a CPU: the bit placement is a permutation; the kernels' four decode sequences, emulated on packed
words with Python integers, give every code's E2M1 value (the table of the OCP MX spec, written out here,
not taken from the code); the prefill K permutation of the packed layout matches where those
sequences put each value; the preprocessor's contract and the layer's errors; the Gluon kernels with
``PACKED`` cross-compiled for sm_90 (fewer K-loop instructions than the canonical decode, no spills).
The GPU numerics of the packed layout run in ``test_hopper_moe.py`` / ``test_hopper_moe_prefill.py``
(their ``layout`` parameter).
"""

from __future__ import annotations

import os
import re
import struct
import sys

import pytest
import torch

import tokenspeed_kernel as tk

sys.path.insert(0, os.path.dirname(__file__))
from test_hopper_moe import GPT_OSS, _innermost_loop, _launches, _ptx_ops, _weights

PACKED = "hopper.moe_apply_packed"

# E2M1 (OCP Microscaling Formats v1.0, table 5): code bits s e1 e0 m.
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# bf16: sign at 15, exponent 7..14, mantissa 0..6. The decode puts E2M1's m, e0, e1 at bf16 bits 6, 7, 8
# and s at 15 of each half: the value E2M1 * 2**-126.
MAGNITUDE_AND_SIGN = (0b111 << 6 | 1 << 15) * 0x10001
M32 = 0xFFFFFFFF


def e2m1(code: int) -> float:
    return (-1.0 if code & 8 else 1.0) * E2M1[code & 7]


def bf16(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", (bits & 0xFFFF) << 16))[0]


def rotr(w: int, n: int) -> int:
    return ((w >> n) | (w << (32 - n))) & M32


def decode_packed_word(p: int) -> list[float]:
    """The kernels' packed decode (``_decode_a`` with ``PACKED``) on one 32-bit word: 4 bf16x2 pairs ->
    8 values, pair ``q`` low half then high half, each times ``2**126``."""
    from tokenspeed_kernel_nvidia.hopper.moe import packed

    pairs = [
        p & MAGNITUDE_AND_SIGN,
        rotr(p, 3) & MAGNITUDE_AND_SIGN,
        rotr(p, 6) & MAGNITUDE_AND_SIGN,
        (((p & packed.PAIR_MASK) * packed.PAIR_MULTIPLIER) & M32) & MAGNITUDE_AND_SIGN,
    ]
    return [bf16(r >> s) * 2.0**126 for r in pairs for s in (0, 16)]


def pack_word(w: int) -> int:
    """One canonical word through :func:`packed.pack_codes` (the tensor function under test)."""
    from tokenspeed_kernel_nvidia.hopper.moe import packed

    t = torch.tensor(list(w.to_bytes(4, "little")), dtype=torch.uint8)
    return int.from_bytes(bytes(packed.pack_codes(t).tolist()), "little")


def test_the_placement_uses_every_bit_of_every_code_once():
    from tokenspeed_kernel_nvidia.hopper.moe import decode, packed

    assert sorted(packed.BIT_SOURCE) == [(j, b) for j in range(8) for b in range(4)]
    assert decode._BITS.value == MAGNITUDE_AND_SIGN


def test_the_decode_of_packed_words_gives_each_code_in_k_order():
    """Code ``j`` of a canonical word decodes to pair ``j // 2``, half ``j % 2``: K order inside the word."""
    g = torch.Generator().manual_seed(0)
    words = torch.randint(0, 1 << 32, (400,), dtype=torch.int64, generator=g).tolist()
    # every value of every code position, the other codes random
    words += [(w & ~(0xF << 4 * j)) | (c << 4 * j) for j in range(8) for c in range(16) for w in words[:3]]
    words += [0, M32, 0x88888888, 0x77777777]
    for w in words:
        want = [e2m1((w >> 4 * j) & 0xF) for j in range(8)]
        assert decode_packed_word(pack_word(w)) == want, hex(w)


def test_pack_codes_keeps_shapes_and_moves_bits_within_words():
    from tokenspeed_kernel_nvidia.hopper.moe import packed

    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 256, (3, 5, 24), dtype=torch.uint8, generator=g)
    out = packed.pack_codes(codes)
    assert out.shape == codes.shape and out.dtype == torch.uint8
    words = codes.reshape(-1, 4).tolist()
    got = out.reshape(-1, 4).tolist()
    for a, b in zip(words, got, strict=True):
        assert pack_word(int.from_bytes(bytes(a), "little")) == int.from_bytes(bytes(b), "little")
    # bit counts per word are kept (a permutation of bits), and zero stays zero
    pop = lambda t: sum(bin(v).count("1") for v in t)
    assert all(pop(a) == pop(b) for a, b in zip(words, got, strict=True))
    with pytest.raises(TypeError, match="codes: expected uint8"):
        packed.pack_codes(codes.to(torch.int16))
    with pytest.raises(ValueError, match="codes: expected a last dimension divisible by 4"):
        packed.pack_codes(codes[..., :6])


def _mma_k_of_packed(b: int) -> int:
    """Where the packed decode puts canonical column ``b`` of a 64-value step (the prefill's two words a
    lane, ``W = 2``): lane ``q`` word ``w`` holds ``16 q + 8 w + j``; code ``j = 2 p + i`` (pair ``p = p0 +
    2 p1``, half ``i``) and the MMA fragment (m16n8k16: pair register ``2 w + p1``'s K block, ``p0`` its
    upper 8, lane ``q`` at ``2 q``) gives K ``16 (2 w + p1) + 8 p0 + 2 q + i``."""
    q, w, j = b // 16, (b // 8) % 2, b % 8
    p, i = j // 2, j % 2
    p0, p1 = p % 2, p // 2
    return 16 * (2 * w + p1) + 8 * p0 + 2 * q + i


def test_prefill_k_permutation_of_the_packed_layout():
    from tokenspeed_kernel_nvidia.hopper.moe.prefill import kperm, kperm_inverse

    cols = range(2880)
    assert sorted(kperm(c, True) for c in cols) == list(cols)
    assert all(kperm(c, True) == c - c % 64 + _mma_k_of_packed(c % 64) for c in cols)
    assert all(kperm_inverse(kperm(c, True), True) == c for c in cols)
    assert any(kperm(c, True) != kperm(c) for c in cols)  # the layouts differ: the flag is not ignored


def test_preprocess_weights_converts_once_and_leaves_the_input_alone():
    from tokenspeed_kernel_nvidia.hopper.moe import packed

    w = _weights(4, 128, 64)
    before = w.w13.clone(), w.w2.clone()
    p = packed.preprocess_weights(w)
    assert p.layout == packed.LAYOUT == PACKED
    assert torch.equal(w.w13, before[0]) and torch.equal(w.w2, before[1]) and w.layout == "canonical"
    assert torch.equal(p.w13, packed.pack_codes(w.w13)) and torch.equal(p.w2, packed.pack_codes(w.w2))
    assert p.w13_scale is w.w13_scale and p.w2_bias is w.w2_bias
    with pytest.raises(ValueError, match="weights: expected the canonical layout"):
        packed.preprocess_weights(p)
    fp8 = _weights(4, 128, 64)
    object.__setattr__(fp8, "format", "bf16")
    with pytest.raises(ValueError, match="weights: hopper.moe_apply_packed takes mxfp4"):
        packed.preprocess_weights(fp8)


def test_registered_with_its_layout_and_converted_by_moe_process_weights():
    from tokenspeed_kernel.core.registry import registry

    tk.load_plugins()
    spec = registry.get(PACKED)
    assert spec is not None and spec.weight_layout == PACKED
    w = _weights(4, 128, 64)
    # On a CPU no sm90 kernel is eligible: build the plan the way moe_plan would for an H200.
    plan = tk.MoEPlan(kernel=PACKED, layout=spec.weight_layout, format="mxfp4", activation=GPT_OSS)
    p = tk.moe_process_weights(plan, w)
    assert p.layout == PACKED and tk.moe_process_weights(plan, p) is p
    # the canonical kernel does not take packed weights, the packed one not canonical ones
    traits = {"activation": "swiglu", "clamp": True, "bias": True, "gate_up_interleaved": True, "up_offset": 1.0}
    sm90 = tk.make_platform("sm90", device_name="NVIDIA H200")
    for layout, ok, no in (("canonical", "hopper.moe_apply", PACKED), (PACKED, PACKED, "hopper.moe_apply")):
        rows = {c.name: c for c in tk.explain_selection("moe_apply", ("bf16", "mxfp4"),
                                                         {**traits, "layout": layout}, platform=sm90)}  # fmt: skip
        assert rows[ok].eligible and not rows[no].eligible, (layout, rows[no])


def test_the_layer_names_the_argument_for_layouts_it_cannot_read():
    from tokenspeed_kernel_nvidia.hopper.moe import layer, packed

    w = _weights(4, 128, 64)
    p = packed.preprocess_weights(w)
    x = torch.randn(2, 128).to(torch.bfloat16)
    tw, ids = tk.moe_route(torch.randn(2, 4), 2, solution="reference")
    with pytest.raises(ValueError, match="weights: hopper.moe_apply_packed reads the layout"):
        layer.moe_apply_packed(x, tw, ids, w, GPT_OSS)
    with pytest.raises(ValueError, match=r"weights: the W4A8 path \(fp8=True\) reads the canonical layout"):
        layer.moe_apply_w4a8(x, tw, ids, p, GPT_OSS)
    import dataclasses

    other = dataclasses.replace(w, layout="amd.cdna.mxfp4")
    with pytest.raises(ValueError, match="weights: hopper.moe_apply reads the canonical layout or"):
        layer.moe_apply(x, tw, ids, other, GPT_OSS)
    bad = dataclasses.replace(p, w2=p.w2[:, :, :-4].contiguous())
    with pytest.raises(ValueError, match=r"^weights\.w2"):
        layer.moe_apply(x, tw, ids, bad, GPT_OSS)
    with pytest.raises(ValueError, match="x: expected hidden size 128"):
        layer.moe_apply(torch.randn(2, 64).to(torch.bfloat16), tw, ids, p, GPT_OSS)


# -- cross-compiled for sm_90 ---------------------------------------------------------------


def _loop_ops(monkeypatch, tokens, **wkw):
    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel_nvidia.hopper.moe import decode

    out = []
    for fn, _grid, args, kwargs in _launches(monkeypatch, tokens, **wkw):
        if fn is decode.moe_decode_gemm:
            ck = compile_launch(fn, args, dict(kwargs), "sm90")
            out.append((kwargs, ck))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("tokens,wkw", [(1, {}), (3, {"bias": False, "interleaved": False, "scale_hi": 140})])
def test_packed_decode_gemms_cross_compile_with_fewer_k_loop_instructions(monkeypatch, tokens, wkw):
    from tokenspeed_kernel.testing import sass as sm90_sass

    canonical = _loop_ops(monkeypatch, tokens, **wkw)
    packed = _loop_ops(monkeypatch, tokens, packed=True, **wkw)
    assert [k["PACKED"] for k, _ in canonical] == [False, False] and [k["PACKED"] for k, _ in packed] == [True, True]
    for (_, c), (_, p) in zip(canonical, packed, strict=True):
        c_loop, p_loop = (_ptx_ops(_innermost_loop(k.asm["ptx"])) for k in (c, p))
        assert p_loop.get("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 0) >= 8
        # the same MMAs and scale multiplies, fewer decode instructions
        for op in ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "mul.rn.bf16x2"):
            assert p_loop.get(op, 0) == c_loop.get(op, 0), op
        assert sum(p_loop.values()) < sum(c_loop.values()), (sum(p_loop.values()), sum(c_loop.values()))
        sass = sm90_sass(p.asm["cubin"])
        assert "HMMA" in sass and not re.findall(r"\b(STL|LDL)(\.[A-Z0-9]+)*\b", sass)
        assert "SHF.R" in sass  # the funnel shifts (rotations) of pairs 1 and 2


@pytest.mark.slow
@pytest.mark.parametrize("tokens,tile", [(300, (128, 32, 8, 4, 2))])
def test_packed_prefill_gemms_cross_compile_with_wgmma_and_no_hazards(monkeypatch, tokens, tile):
    from test_hopper_moe_prefill import assert_no_spills_or_hazards, compiled_gemms

    from tokenspeed_kernel_nvidia.hopper.moe import prefill

    tiles = None if tile is None else (prefill.PrefillTile(*tile),) * 2
    for kwargs, _ck, ptx, sass in compiled_gemms(monkeypatch, tokens, tiles, packed=True):
        assert kwargs["PACKED"] is True
        assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{kwargs['BLOCK_T']}k16\.f32\.bf16\.bf16", ptx)
        assert "mul.rn.bf16x2" in ptx and "HGMMA.64x" in sass
        assert_no_spills_or_hazards(sass)


@pytest.mark.slow
def test_the_prefill_gemm_refuses_fp8_on_packed_codes_at_compile_time(monkeypatch):
    """The e4m3 decode reads canonical nibbles: ``FP8`` with ``PACKED`` is a compile-time error, not a
    silently ignored flag (the host refuses it earlier, with an error naming ``weights``)."""
    from test_hopper_moe_prefill import _prefill_launches
    from triton.compiler.errors import CompilationError

    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel_nvidia.hopper.moe import prefill

    calls, _ = _prefill_launches(monkeypatch, 1200, fp8=True)
    fn, _grid, args, kwargs = next(c for c in calls if c[0] is prefill.moe_prefill_gemm)
    assert kwargs["FP8"] is True and kwargs["PACKED"] is False
    with pytest.raises(CompilationError) as info:
        compile_launch(fn, args, {**kwargs, "PACKED": True}, "sm90")
    chain, err = [], info.value
    while err is not None:  # the assertion's message, wherever in the chain the compiler put it
        chain.append(repr(err))
        err = err.__cause__ or err.__context__
    assert "packed layout" in " ".join(chain)
    with pytest.raises(ValueError, match="weights: the W4A8 decode reads canonical codes"):
        w = _weights(4, 128, 64)
        x = torch.randn(2, 128).to(torch.bfloat16)
        tw, ids = tk.moe_route(torch.randn(2, 4), 2, solution="reference")
        prefill.run_prefill(x, tw, ids, w, GPT_OSS, torch.empty_like(x), tiles=None, two_step=False, fp8=True,
                            packed=True)  # fmt: skip

"""The GEMV path of ``hopper.moe_apply`` (:mod:`tokenspeed_kernel_nvidia.hopper.moe.gemv`): which calls take it,
its tile's argument checks, the e4m3 placement its decode relies on, and its launches cross-compiled for sm_90.
Its numerics, determinism and graph replay run on the GPU in ``test_hopper_moe.py`` (the table's 1-2 token cases on
canonical weights, and a forced ``GemvTile`` case) and ``test_hopper_moe_pdl.py`` (programmatic launch on and off).
"""

from __future__ import annotations

import os
import re
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from test_hopper_moe import _launches, _weights


def _kernels(calls):
    return [(getattr(fn, "__name__", repr(fn)), kwargs.get("GATE_UP")) for fn, _grid, _args, kwargs in calls]


def test_calls_of_few_tokens_on_canonical_weights_take_the_gemv_kernel(monkeypatch):
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    gu_tile, dn_tile = layer.GEMV_TILES
    names = tuple("moe_gemv_tc" if isinstance(t, layer.TcTile) else "moe_gemv" for t in layer.GEMV_TILES)
    for tokens in range(1, layer.GEMV_MAX_TOKENS + 1):
        calls = _launches(monkeypatch, tokens, e=32, gemv=True)
        pairs = isinstance(dn_tile, layer.GemvTile) and dn_tile.pairs  # a down program a pair, then combine_slots
        combine = [("combine_slots", None)] * (pairs and not layer.GEMV_FUSED_COMBINE)
        assert _kernels(calls) == [(names[0], True), (names[1], False)] + combine, tokens
        gate_up, down = calls[:2]
        if isinstance(gu_tile, layer.TcTile):
            assert gate_up[1] == (4 * tokens, -(-2880 // (8 * gu_tile.groups * gu_tile.warps)))
        else:
            assert gate_up[1] == (4 * tokens, -(-2880 // (gu_tile.feats * gu_tile.warps * gu_tile.sub)))
        if isinstance(dn_tile, layer.TcTile):
            assert down[1] == (tokens, -(-2880 // (16 * dn_tile.groups)))
            assert down[3]["num_warps"] == 4 * dn_tile.ksplit  # a warp a slot (top-4) and chunk range
        elif pairs:
            assert down[1] == (4 * tokens, -(-1440 // (dn_tile.feats * dn_tile.warps)))
            assert down[3]["SUB"] == 1 and down[3]["PAIRS"] and down[3]["num_warps"] == dn_tile.warps
            assert down[3].get("FUSED", False) is layer.GEMV_FUSED_COMBINE
        else:
            assert down[1] == (tokens, -(-1440 // (dn_tile.feats * dn_tile.warps)))
            assert down[3]["SUB"] == 4 and down[3]["num_warps"] == dn_tile.warps
    # More tokens: the MMA decode path.
    calls = _launches(monkeypatch, layer.GEMV_MAX_TOKENS + 1, e=32, gemv=True)
    assert {name for name, _ in _kernels(calls)} >= {"moe_decode_gemm"}
    assert not {"moe_gemv", "moe_gemv_tc"} & {name for name, _ in _kernels(calls)}


def test_packed_weights_and_wide_routing_keep_the_mma_path_and_forced_tiles_refuse_them(monkeypatch):
    from tokenspeed_kernel_nvidia.hopper.moe import gemv, layer

    gemv_kernels = {"moe_gemv", "moe_gemv_tc"}
    calls = _launches(monkeypatch, 1, e=32, gemv=True, packed=True)
    assert not gemv_kernels & {name for name, _ in _kernels(calls)}
    calls = _launches(monkeypatch, 1, e=32, gemv=True, k=gemv.MAX_SLOTS + 1)
    assert not gemv_kernels & {name for name, _ in _kernels(calls)}
    tiles = (layer.GemvTile(1, 8), layer.GemvTile(1, 4))
    with pytest.raises(ValueError, match="tiles: the GEMV kernel reads the canonical layout"):
        _launches(monkeypatch, 1, e=32, gemv=True, packed=True, tiles=tiles)
    with pytest.raises(ValueError, match=f"topk_ids: the GEMV kernel takes at most {gemv.MAX_SLOTS} slots"):
        _launches(monkeypatch, 1, e=32, gemv=True, k=gemv.MAX_SLOTS + 1, tiles=tiles)
    with pytest.raises(ValueError, match="tiles: the down GemvTile's program walks the token's slots"):
        _launches(monkeypatch, 1, e=32, gemv=True, tiles=(layer.GemvTile(1, 8), layer.GemvTile(1, 4, 2)))
    # Forced tiles also serve more tokens than the table (each token reads its experts again).
    calls = _launches(monkeypatch, 5, e=32, gemv=True, tiles=tiles)
    assert _kernels(calls) == [("moe_gemv", True), ("moe_gemv", False)]


def test_experts_too_wide_to_stage_refuse_staged_tiles_naming_the_weights(monkeypatch):
    from tokenspeed_kernel_nvidia.hopper.moe import gemv, layer

    # 8 slots of 8192 intermediate values: 8 x 8 passes x 4 KB of fp32 rows, above MAX_STAGED_BYTES.
    assert gemv.staged_bytes(8, 8192) > gemv.MAX_STAGED_BYTES >= gemv.staged_bytes(4, 2880)
    staged = (layer.GemvTile(1), layer.GemvTile(1))
    w = _weights(8, 64, 8192)
    assert not layer._gemv_fits(8, w, staged)
    # A down that reads its rows from global memory stages nothing, and one a program a pair stages one row: such
    # experts take the GEMV path with either.
    for down in (layer.GemvTile(1, 4, 1, 3, 128, staged=False), layer.GemvTile(1, 8, dot="f16i", pairs=True)):
        assert layer._gemv_fits(8, w, (layer.GemvTile(1), down))
    dn = layer.GEMV_TILES[1]
    assert not dn.staged or dn.pairs  # the default is one of those
    calls = _launches(monkeypatch, 1, e=8, h=64, i=8192, gemv=True, k=8)
    assert _kernels(calls) == [("moe_gemv", True), ("moe_gemv", False)] + [("combine_slots", None)] * dn.pairs
    with pytest.raises(ValueError, match="^weights: the GEMV kernel stages 8 activation rows of 8192 values"):
        _launches(monkeypatch, 1, e=8, h=64, i=8192, gemv=True, k=8, tiles=staged)


def test_gemv_tile_rejects_what_the_kernel_cannot_lay_out_naming_the_argument():
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile

    assert (
        GemvTile(2, 4, 3) == (2, 4, 3, 1, None, True, "f32", False) and GemvTile(1).warps == 8 and GemvTile(1).sub == 1
    )
    assert GemvTile(1, 4, 1, 3, 128).ahead == 3 and GemvTile(1, 4, 1, 3, 128).maxnreg == 128
    assert GemvTile(1) == (1, 8, 1, 1, None, True, "f32", False) and GemvTile(1, staged=False).staged is False
    assert GemvTile(1, dot="f16i").dot == "f16i" and GemvTile(1, pairs=True).pairs is True
    for args, name in (((3,), "feats"), ((8,), "feats"), ((1, 3), "warps"), ((1, 32), "warps"), ((1, 8, 0), "sub"),
                       ((1, 8, 9), "sub"), ((True,), "feats"), ((1, 8, 1, 0), "ahead"), ((1, 8, 1, 5), "ahead"),
                       ((1, 8, 1, 1, 16), "maxnreg"), ((1, 8, 1, 1, 256), "maxnreg"),
                       ((1, 8, 1, 1, None, 0), "staged"), ((1, 8, 1, 1, None, True, "f64"), "dot"),
                       ((1, 8, 1, 1, None, False, "f16"), "dot"), ((1, 8, 1, 1, None, True, "f32", 1), "pairs")):  # fmt: skip
        with pytest.raises(ValueError, match=f"^{name}: "):
            GemvTile(*args)


def test_the_e4m3_placement_of_every_e2m1_code_is_its_value_times_2_to_the_minus_6():
    """The decode's bit placement (:data:`.gemv._DOT8`): even codes (low nibble of a byte) ``(b & 7) << 2 | (b & 8)
    << 4``, odd codes (high nibble) ``(b >> 2) & 0x1C | b & 0x80``, read as e4m3, equal ``E2M1 * 2**-6`` for all 256
    bytes; the E2M1 values are the reference's table."""
    from tokenspeed_kernel.numerics.inputs import E2M1_VALUES

    b = torch.arange(256, dtype=torch.int32)
    even = ((b & 7) << 2) | ((b & 8) << 4)
    odd = ((b >> 2) & 0x1C) | (b & 0x80)
    as_e4m3 = lambda v: v.to(torch.uint8).view(torch.float8_e4m3fn).float()
    table = torch.tensor(E2M1_VALUES)
    assert torch.equal(as_e4m3(even) * 64, table[b & 15])
    assert torch.equal(as_e4m3(odd) * 64, table[b >> 4])
    # The placement the kernel's asm spells (shifts and masks on a whole word) is the one checked above.
    from tokenspeed_kernel_nvidia.hopper.moe import gemv

    asm = gemv._DOT8.value
    for line in ("shl.b32 t, $1, 2;", "and.b32 e, t, 0x1C1C1C1C;", "shl.b32 t, $1, 4;", "and.b32 t, t, 0x80808080;",
                 "shr.u32 t, $1, 2;", "and.b32 o, t, 0x1C1C1C1C;", "and.b32 t, $1, 0x80808080;"):  # fmt: skip
        assert line in asm


def test_f16_default_tiles_apply_up_to_scale_byte_220_and_the_fp32_pair_above(monkeypatch):
    """An f16 pair as :data:`.layer.GEMV_TILES` (a tuning choice; session 34's measured pair) serves weights whose
    scale bytes are at most :data:`.gemv.HALF_ONE_STEP_MAX_SCALE`; :data:`.layer.GEMV_TILES_BIG_SCALES` (fp32) the
    others."""
    from tokenspeed_kernel_nvidia.hopper.moe import gemv, layer

    assert {t.dot for t in layer.GEMV_TILES} == {"f32"}  # the default multiplies in fp32
    f16 = (layer.GemvTile(1, 8, dot="f16i"), layer.GemvTile(1, 8, dot="f16i", pairs=True))
    monkeypatch.setattr(layer, "GEMV_TILES", f16)
    assert gemv.HALF_ONE_STEP_MAX_SCALE == 220
    calls = _launches(monkeypatch, 1, e=8, h=64, i=64, gemv=True, scale_hi=221)  # bytes 118..220
    assert _kernels(calls) == [("moe_gemv", True), ("moe_gemv", False), ("combine_slots", None)]
    assert [c[3].get("HALF") for c in calls[:2]] == [2, 2] and calls[1][3]["PAIRS"]
    assert not any(c[3]["BIG_SCALES"] for c in calls[:2])
    calls = _launches(monkeypatch, 1, e=8, h=64, i=64, gemv=True, scale_hi=222)  # a byte of 221
    assert _kernels(calls) == [("moe_gemv", True), ("moe_gemv", False)]
    assert [c[3].get("HALF", 0) for c in calls] == [0, 0] and not calls[1][3].get("PAIRS", False)
    assert not any(c[3]["BIG_SCALES"] for c in calls)  # the fp32 kernel's one-step limit is 248


def test_a_gate_up_tile_a_program_a_pair_is_refused_naming_the_tiles(monkeypatch):
    """``pairs`` is a down tile's option (the gate/up runs a program a pair anyway): a gate/up tile with it is an
    error, not ignored."""
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile

    with pytest.raises(ValueError, match="^tiles: pairs is a down tile's option"):
        _launches(monkeypatch, 1, e=8, h=64, i=64, gemv=True, tiles=(GemvTile(1, 8, pairs=True), GemvTile(1, 4)))


def test_the_kernel_refuses_pairs_for_a_gate_up_or_more_than_one_sub_tile(monkeypatch):
    """``PAIRS`` (a down program a pair) is refused when the kernel compiles with ``GATE_UP`` or ``SUB > 1`` (its
    store takes one row tile), not run as something else."""
    import traceback

    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile

    calls = _launches(monkeypatch, 1, e=8, h=64, i=64, gemv=True, tiles=(GemvTile(1, 8), GemvTile(1, 8, pairs=True)))
    fn, _grid, args, kwargs = calls[1]
    assert kwargs["PAIRS"] and kwargs["SUB"] == 1 and not kwargs["GATE_UP"]
    for change, message in (({"GATE_UP": True}, "PAIRS is a mode of the down GEMM"),
                            ({"SUB": 2}, "a PAIRS program takes one row tile")):  # fmt: skip
        with pytest.raises(Exception) as refused:  # (Triton nests the assertion's message in the error's causes)
            compile_launch(fn, args, {**kwargs, **change}, "sm90")
        assert message in "".join(traceback.format_exception(refused.value)), change


def test_both_gemv_kernels_refuse_the_down_weight_prefetch_in_a_down_launch(monkeypatch):
    """``PF_DOWN`` (the gate/up's prefetch of the down weights) compiled into a down launch is refused, not ignored."""
    import traceback

    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile, TcTile

    for tiles in ((GemvTile(1, 8), GemvTile(1, 4)), (TcTile(1, 4), TcTile(1, None))):
        calls = _launches(monkeypatch, 1, e=8, h=64, i=64, gemv=True, tiles=tiles)
        fn, _grid, args, kwargs = calls[1]
        assert not kwargs["GATE_UP"] and "PF_DOWN" not in kwargs
        with pytest.raises(Exception) as refused:  # (Triton nests the assertion's message in the error's causes)
            compile_launch(fn, args, {**kwargs, "PF_DOWN": True, "PF_SROW": 2}, "sm90")
        assert "PF_DOWN is the gate/up's prefetch" in "".join(traceback.format_exception(refused.value)), tiles


@pytest.mark.parametrize("half", [1, 2], ids=["e4m3_decode", "integer_decode"])
def test_the_f16_block_asm_decodes_every_code_in_the_staged_order_and_sums_in_f16(half):
    """:func:`.gemv._half_block_asm` interpreted (the PTX subset of ``test_hopper_moe_gemv_tc``): a lane's four code
    words and its activation pairs in the staged order (pair ``p`` of word ``q`` in ``$8 + 4 p + q``; pairs (0, 2),
    (4, 6), (1, 3), (5, 7) of a word's values). One activation of 1 at each of the 32 places and every code there: the
    four outputs sum to exactly ``E2M1 * 2**-B`` (B 6 for the e4m3 decode, 14 for the integer one; the reference's
    E2M1 table). Random codes and activations: within the f16 sums' rounding of the exact dot product."""
    import numpy as np
    from test_hopper_moe_gemv_tc import _f16x2, _run_warp

    from tokenspeed_kernel.numerics.inputs import E2M1_VALUES
    from tokenspeed_kernel_nvidia.hopper.moe import gemv

    asm = gemv._half_block_asm(gemv._decode if half == 1 else gemv._decode_int)
    bias = 2.0 ** (-6 if half == 1 else -14)
    table = np.array(E2M1_VALUES, dtype=np.float64)
    order = [0, 2, 4, 6, 1, 3, 5, 7]  # a word's values as its four pairs hold them

    def lane_operands(codes, x):  # codes: 32 nibbles (value i in nibble i); x: 32 activations
        ops = {}
        for q in range(4):
            ops[f"${4 + q}"] = sum(int(codes[8 * q + i]) << (4 * i) for i in range(8))
            vals = x[8 * q : 8 * q + 8][order]
            for p in range(4):
                ops[f"${8 + 4 * p + q}"] = _f16x2(vals[2 * p], vals[2 * p + 1])
        return ops

    operands, want = [], []
    for place in range(32):
        for code in range(16):
            codes = np.zeros(32, dtype=np.int64)
            codes[place] = code
            x = np.zeros(32)
            x[place] = 1.0
            operands.append(lane_operands(codes, x))
            want.append(table[code] * bias)
    got = []
    for start in range(0, len(operands), 32):
        got += [sum(v) for v in _run_warp(asm, operands[start : start + 32])]
    assert got == want
    rng = np.random.default_rng(half)
    codes = rng.integers(0, 16, size=(32, 32))
    scale = 2.0 ** (9 if half == 1 else 14)  # the kernel's activations: below 2**(T0 + 1)
    x = (rng.standard_normal((32, 32)) * scale / 4).astype(np.float16).astype(np.float64)
    out = _run_warp(asm, [lane_operands(codes[n], x[n]) for n in range(32)])
    terms = table[codes] * bias * x
    for n in range(32):
        # four f16 sums of 8 products (two f16x2 chains), each rounded (by 2**-11 of its partial sum) 8 times
        assert abs(sum(out[n]) - terms[n].sum()) <= 8 * 2.0**-11 * np.abs(terms[n]).sum(), n


CC_CASES = [
    ("20b_T1", 1, 4, {}),  # the default tiles (GEMV_TILES)
    ("staged_one_step_T1", 1, 4, {"tiles": ((1, 8), (1, 4))}),
    ("no_bias_not_interleaved_top3_T2", 2, 3, {"bias": False, "interleaved": False}),
    ("scales_above_248_T1", 1, 4, {"scale_hi": 252}),
    # steps requested ahead under a register cap (a ring of 3 across two gate/up sub-tiles, 4 across the slots)
    ("ahead_maxnreg_T1", 1, 4, {"tiles": ((1, 8, 2, 3, 128), (1, 4, 1, 4, 128))}),
    ("ahead_top3_scales_above_248_T2", 2, 3, {"tiles": ((2, 4, 1, 2), (1, 4, 1, 4, 128)), "scale_hi": 252}),
    # the activations not staged: each lane loads its own with the codes
    ("unstaged_T1", 1, 4, {"tiles": ((1, 8, 1, 2, None, False), (1, 4, 1, 3, 128, False))}),
    (
        "unstaged_top3_big_scales_T2",
        2,
        3,
        {"tiles": ((2, 4, 1, 2, 128, False), (1, 4, 1, 1, None, False)), "scale_hi": 252},
    ),
    # f16 pairs: the integer decode (no conversions; a down program a pair), and the e4m3 one with scale bytes above
    # 220 (two-step scale)
    ("f16i_pairs_T1", 1, 4, {"tiles": ((1, 8, 1, 1, None, True, "f16i"), (1, 8, 1, 1, None, True, "f16i", True))}),
    # the fp32 pairs down, not staged, every request up front, its slots summed by the token's last program (FUSED)
    (
        "fp32_pairs_fused_T2",
        2,
        4,
        {"tiles": ((1, 8, 1, 1, None, True), (1, 8, 1, 3, 128, False, "f32", True)), "fused": True},
    ),
    # L2 prefetches of a program's own rows and of the gate/up's share of the down weights, evict_first loads
    ("prefetch_own_down_evict_T1", 1, 4, {"prefetch": ("own", "down"), "evict": True}),
    (
        "prefetch_own_pairs_f16i_not_interleaved_top3_T2",
        2,
        3,
        {"tiles": ((1, 8), (1, 8, 1, 1, None, True, "f16i", True)), "prefetch": ("own",), "interleaved": False},
    ),
    (
        "f16_top3_scales_above_220_T2",
        2,
        3,
        {"tiles": ((2, 8, 1, 1, None, True, "f16"), (1, 4, 1, 1, None, True, "f16")), "scale_hi": 230},
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("label,tokens,k,wkw", CC_CASES, ids=[c[0] for c in CC_CASES])
def test_gemv_launches_cross_compile_for_sm90_with_their_decode_and_no_spills(monkeypatch, label, tokens, k, wkw):
    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel.testing import sass as sm90_sass
    from tokenspeed_kernel_nvidia.hopper.moe import gemv, layer
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile

    wkw = dict(wkw)
    big = wkw.get("scale_hi", 128) - 1 > gemv.HALF_ONE_STEP_MAX_SCALE  # the default pair for such weights
    tiles = tuple(GemvTile(*t) for t in wkw.pop("tiles", ())) or (
        layer.GEMV_TILES_BIG_SCALES if big else layer.GEMV_TILES
    )
    fused = wkw.pop("fused", False)  # a pairs down summing its slots in its last program
    monkeypatch.setattr(layer, "GEMV_FUSED_COMBINE", fused)
    prefetch, evict = wkw.pop("prefetch", ()), wkw.pop("evict", False)
    monkeypatch.setattr(layer, "GEMV_PREFETCH", prefetch)
    monkeypatch.setattr(layer, "GEMV_EVICT_FIRST", evict)
    calls = _launches(monkeypatch, tokens, e=32, gemv=True, k=k, tiles=tiles, **wkw)
    combine = [("combine_slots", None)] * (tiles[1].pairs and not fused)
    assert _kernels(calls) == [("moe_gemv", True), ("moe_gemv", False)] + combine
    for fn, _grid, args, kwargs in calls[:2]:
        assert kwargs["BIG_SCALES"] is ("scale_hi" in wkw)  # chosen from the largest scale byte
        ck = compile_launch(fn, args, dict(kwargs), "sm90")
        ptx, sass = ck.asm["ptx"], sm90_sass(ck.asm["cubin"])
        tile = tiles[0] if kwargs["GATE_UP"] else tiles[1]
        assert kwargs.get("HALF", 0) == ("f32", "f16", "f16i").index(tile.dot)
        # the e4m3 decode converts; the integer one does not
        assert ("cvt.rn.f16x2.e4m3x2" in ptx) is ("F2FP.F16.E4M3.UNPACK_B" in sass) is (tile.dot != "f16i"), label
        # fp32 FMAs of each value, or f16 pairs: 16 a block (some issued to the tensor pipe as HFMA2.MMA; the fp32
        # kernels have a few too, moving constants)
        pairs = len(re.findall(r"\b(HFMA2(\.MMA)?|HMUL2)\b", sass))
        assert (pairs >= 64) is (tile.dot != "f32"), (label, pairs)
        assert not re.search(r"\b(HMMA|LDL|STL)\b", sass), label  # no MMA, no local memory (spills)
        assert re.search(r"\bLDG\.E\.128\b", sass), label  # 16 bytes of codes a lane and row
        assert kwargs.get("AHEAD", 1) == tile.ahead and kwargs.get("maxnreg") == tile.maxnreg
        assert kwargs.get("STAGED", True) is tile.staged
        assert kwargs.get("PAIRS", False) is (tile.pairs and not kwargs["GATE_UP"])
        assert kwargs.get("FUSED", False) is (fused and tile.pairs and not kwargs["GATE_UP"])
        fused_here = kwargs.get("FUSED", False)
        # the activations from shared memory when staged; else no shared memory, and no barrier unless fused
        assert bool(re.search(r"\bLDS\.128\b", sass)) is tile.staged, label
        assert bool(re.search(r"\bBAR\.SYNC", sass)) is (tile.staged or fused_here), label
        atoms = re.findall(r"\b(?:atom|red)\.[\w.]+", ptx)
        if fused_here:
            # one counter a program, acquire-release at GPU scope; the last arrival reads the slots' rows from L2
            assert atoms == ["atom.global.gpu.acq_rel.add.u32"] or (
                len(atoms) == 1 and "acq_rel" in atoms[0] and "gpu" in atoms[0] and "add" in atoms[0]
            ), (label, atoms)
            assert "ld.global.cg" in ptx, label
        else:
            assert not atoms, label  # gate/up, and a down summing the slots in registers
        # L2 prefetches: codes and scales of the program's own rows (the gate and up ranges apart when not
        # interleaved; each slot's for a down walking its slots), the gate/up's share of the down weights
        gate_up = kwargs["GATE_UP"]
        own = 2 * ((1 if wkw.get("interleaved", True) else 2) if gate_up else (1 if tile.pairs else k))
        want = own * ("own" in prefetch) + 2 * (gate_up and "down" in prefetch)
        assert kwargs.get("PF_OWN", False) is ("own" in prefetch) and kwargs.get("PF_DOWN", False) is (
            gate_up and "down" in prefetch
        ), label
        assert ptx.count("prefetch.global.L2 ") == want == len(re.findall(r"\bCCTL\.E\.PF2\b", sass)), label
        # the codes' and scales' loads evict first (the activations' and biases' do not)
        assert (len(re.findall(r"L2::evict_first", ptx)) > 0) is evict, label


@pytest.mark.slow
def test_the_sass_helper_reads_a_listing_past_4096_instructions(monkeypatch):
    """``tokenspeed_kernel.testing.sass`` reads every instruction of a launch longer than 4096 instructions (a gate/up
    walking six sub-tiles: about 5000), where Triton's ``get_sass`` stops at the 4096th (its 4-digit offsets), so the
    compile cases' spill and instruction checks see whole kernels."""
    from triton.tools import disasm

    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel.testing import sass as sm90_sass
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile

    calls = _launches(monkeypatch, 1, e=32, gemv=True, k=4, tiles=(GemvTile(1, 4, 6), GemvTile(1, 4)))
    fn, _grid, args, kwargs = calls[0]
    cubin = compile_launch(fn, args, dict(kwargs), "sm90").asm["cubin"]
    whole = [ln for ln in sm90_sass(cubin).splitlines() if "\t" in ln]
    cut = [ln for ln in disasm.get_sass.__wrapped__(cubin).splitlines() if "\t" in ln]
    assert len(cut) == 4096 and len(whole) > 4096
    assert whole[:4096] == cut  # the same reading, continued
    assert re.search(r"\bEXIT\b", "\n".join(whole[4096:])) and not re.search(r"\bEXIT\b", "\n".join(cut))
    assert sum(1 for ln in whole if re.search(r"\bFFMA\b", ln)) > sum(1 for ln in cut if re.search(r"\bFFMA\b", ln))


def test_an_unknown_gemv_prefetch_is_refused_naming_it(monkeypatch):
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    monkeypatch.setattr(layer, "GEMV_PREFETCH", ("own", "everything"))
    with pytest.raises(ValueError, match=r"GEMV_PREFETCH: expected a subset of \('own', 'down'\)"):
        layer._prefetch_options(True, _weights(4, 64, 64))


def test_the_largest_scale_byte_is_read_once_per_weights_object(monkeypatch):
    """The scale bytes' maximum (which picks ``BIG_SCALES``) is read once per weights object."""
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    w = _weights(4, 64, 64)
    reads = []
    real = torch.Tensor.max

    def counting(t, *a, **kw):
        if t.dtype == torch.uint8:
            reads.append(t.shape)
        return real(t, *a, **kw)

    monkeypatch.setattr(torch.Tensor, "max", counting)
    largest = layer._max_scale(w)
    assert largest == max(int(real(w.w13_scale)), int(real(w.w2_scale))) and len(reads) == 2
    assert layer._max_scale(w) == largest and len(reads) == 2
    assert layer._two_step(w) is (largest > layer.ONE_STEP_MAX_SCALE)

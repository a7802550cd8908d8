"""The tensor-core GEMV of ``hopper.moe_apply`` (:mod:`tokenspeed_kernel_nvidia.hopper.moe.gemv_tc`) on the CPU: its
chunk's PTX (decode + eight ``mma.m16n8k16``) interpreted lane by lane against the PTX ISA's fragment layouts, its
tile's argument checks, and its launches cross-compiled for sm_90. Numerics, determinism and graph replay run on the
GPU in ``test_hopper_moe.py``.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from test_hopper_moe import _launches


def _e4m3(b):
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 15, b & 7
    return sign * (m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


def _f16x2(lo, hi):
    return int(np.float16(lo).view(np.uint16)) | (int(np.float16(hi).view(np.uint16)) << 16)


def _halves(v):
    return float(np.uint16(v & 0xFFFF).view(np.float16)), float(np.uint16(v >> 16).view(np.float16))


def _run_warp(asm, operands):
    """Interpret ``asm`` (the subset of PTX the chunk block uses) for 32 lanes in lockstep. ``operands[lane]``: the
    ``$i`` input values (``$0..$3`` outputs). Returns each lane's ``$0..$3`` (fp32 as float)."""
    regs = [dict(ops) for ops in operands]

    def val(r, tok):
        return int(tok, 16) if tok.startswith("0x") else (int(tok) if tok.isdigit() else r[tok])

    for line in (s.strip().rstrip(";") for s in asm.splitlines()):
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, rest = line.split(None, 1)
        if op.startswith("mma.sync"):
            groups = [g.split(", ") for g in re.findall(r"\{([^}]*)\}", rest)]
            d, a, b, c = groups
            A, B = np.zeros((16, 16)), np.zeros((16, 8))
            for lane, r in enumerate(regs):
                g, t = lane // 4, lane % 4
                for i, (row, col) in enumerate(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8))):
                    A[row, col : col + 2] = _halves(r[a[i]])
                for i, row in enumerate((2 * t, 2 * t + 8)):
                    B[row : row + 2, g] = _halves(r[b[i]])
            C = np.zeros((16, 8))
            for lane, r in enumerate(regs):
                g, t = lane // 4, lane % 4
                for i, (row, col) in enumerate(((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1))):
                    C[row, col] = r[c[i]]
            D = (A @ B + C).astype(np.float32)
            for lane, r in enumerate(regs):
                g, t = lane // 4, lane % 4
                for i, (row, col) in enumerate(((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1))):
                    r[d[i]] = float(D[row, col])
            continue
        args = [s.strip() for s in re.split(r",\s*(?![^{]*\})", rest)]
        for r in regs:
            if op == "mov.b32" and args[0].startswith("{"):
                lo, hi = (s.strip() for s in args[0].strip("{}").split(","))
                r[lo], r[hi] = r[args[1]] & 0xFFFF, r[args[1]] >> 16
            elif op == "mov.b32":
                r[args[0]] = 0.0 if args[0] in ("$0", "$1", "$2", "$3") else val(r, args[1])
            elif op == "shl.b32":
                r[args[0]] = (val(r, args[1]) << val(r, args[2])) & 0xFFFFFFFF
            elif op == "shr.u32":
                r[args[0]] = val(r, args[1]) >> val(r, args[2])
            elif op == "and.b32":
                r[args[0]] = val(r, args[1]) & val(r, args[2])
            elif op == "or.b32":
                r[args[0]] = val(r, args[1]) | val(r, args[2])
            elif op == "cvt.rn.f16x2.e4m3x2":
                h = val(r, args[1])
                r[args[0]] = _f16x2(_e4m3(h & 255), _e4m3(h >> 8))
            elif op == "prmt.b32":  # default mode: byte i of the result is byte (c >> 4 i) & 7 of {b, a}
                src = val(r, args[1]) | (val(r, args[2]) << 32)
                sel = val(r, args[3])
                out = 0
                for i in range(4):
                    s = (sel >> (4 * i)) & 15
                    byte = (src >> (8 * (s & 7))) & 255
                    out |= ((255 if byte & 128 else 0) if s & 8 else byte) << (8 * i)
                r[args[0]] = out
            elif op in ("mul.rn.f16x2", "fma.rn.f16x2"):  # each half rounded once (the products are exact in fp64)
                a, b = _halves(r[args[1]]), _halves(r[args[2]])
                c = _halves(r[args[3]]) if op.startswith("fma") else (0.0, 0.0)
                r[args[0]] = _f16x2(a[0] * b[0] + c[0], a[1] * b[1] + c[1])
            elif op == "cvt.f32.f16":
                r[args[0]] = float(np.uint16(r[args[1]]).view(np.float16))
            else:
                raise AssertionError(f"unexpected instruction {line!r}")
    return [[r[f"${i}"] for i in range(4)] for r in regs]


@pytest.mark.parametrize("decode,b", [("e4m3", 6), ("int", 14)])
def test_chunk_asm_gives_each_rows_dot_product_with_each_block_of_its_column(decode, b):
    """Lane ``(r, c)`` holds the 16 code bytes of block ``c`` of rows ``r`` and ``r + 8`` and, where ``r == c``, that
    block's activations as f16 pairs in the staged order; the interpreted block must return, in accumulator ``i``,
    the dot product of row ``r`` (``i < 2``) or ``r + 8`` with block ``2 c + i % 2`` (zero for blocks 4..7), the
    values ``E2M1 * 2**-6`` (e4m3 decode) or ``E2M1 * 2**-14`` (integer decode; the reference's E2M1 table)."""
    from tokenspeed_kernel.numerics.inputs import E2M1_VALUES
    from tokenspeed_kernel_nvidia.hopper.moe import gemv_tc

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, size=(16, 64), dtype=np.uint8)  # 16 rows x 4 blocks of 16 bytes
    x = rng.standard_normal(128).astype(np.float16).astype(np.float64)
    vals = np.empty((16, 128))
    table = np.array(E2M1_VALUES, dtype=np.float64)
    vals[:, 0::2], vals[:, 1::2] = table[codes & 15], table[codes >> 4]
    want = (vals * x).reshape(16, 4, 32).sum(-1) * 2.0**-b  # [row, block]
    order = [4 * (p % 2) + 2 * h + p // 2 for p in range(4) for h in range(2)]  # the staged order of a word
    operands = []
    for lane in range(32):
        r, c = lane // 4, lane % 4
        ops = {}
        for q in range(4):
            ops[f"${4 + q}"] = int.from_bytes(codes[r, 16 * c + 4 * q : 16 * c + 4 * q + 4].tobytes(), "little")
            ops[f"${8 + q}"] = int.from_bytes(codes[r + 8, 16 * c + 4 * q : 16 * c + 4 * q + 4].tobytes(), "little")
            word = x[32 * c + 8 * q : 32 * c + 8 * q + 8][order] if r == c else np.zeros(8)
            for p in range(4):
                ops[f"${12 + 4 * q + p}"] = _f16x2(word[2 * p], word[2 * p + 1])
        operands.append(ops)
    out = _run_warp(gemv_tc._mma_chunk_asm(gemv_tc._decode_int if decode == "int" else gemv_tc._decode), operands)
    for lane in range(32):
        r, c = lane // 4, lane % 4
        for i, (row, blk) in enumerate(((r, 2 * c), (r, 2 * c + 1), (r + 8, 2 * c), (r + 8, 2 * c + 1))):
            expect = want[row, blk] if blk < 4 else 0.0
            assert out[lane][i] == pytest.approx(expect, rel=1e-6, abs=1e-6 * 2.0 ** (6 - b)), (lane, i)


def test_tc_tile_rejects_what_the_kernel_cannot_lay_out_naming_the_argument():
    from tokenspeed_kernel_nvidia.hopper.moe.layer import TcTile

    assert TcTile(2, 4) == (2, 4, 1, None, "e4m3") and TcTile(1, None, 2).ksplit == 2 and TcTile(1).warps is None
    assert TcTile(1, 4, 4) == (1, 4, 4, None, "e4m3")  # 16 warps: a gate/up tile's K split too
    assert TcTile(1, 4, decode="int").decode == "int"
    assert TcTile(1, 4, 1, 168).maxnreg == 168
    for args, name in (((3,), "groups"), ((True,), "groups"), ((1, 3), "warps"), ((1, 32), "warps"),
                       ((1, None, 3), "ksplit"), ((1, 8, 4), "ksplit"), ((1, 16, 2), "ksplit"),
                       ((1, 4, 1, 300), "maxnreg"), ((1, 4, 1, 16), "maxnreg"), ((1, 4, 1, None, "f16"), "decode")):  # fmt: skip
        with pytest.raises(ValueError, match=f"^{name}: "):
            TcTile(*args)


TC_TILES = None  # the forced tiles of the tests below (the layer's default when it takes this kernel)


def _tc_tiles():
    from tokenspeed_kernel_nvidia.hopper.moe.layer import TcTile

    return TC_TILES or (TcTile(1, 4), TcTile(1, None, 2))


def test_forced_tc_tiles_launch_two_kernels_with_their_grids_and_refuse_what_they_cannot_run(monkeypatch):
    from tokenspeed_kernel_nvidia.hopper.moe import gemv, layer

    gu, dn = _tc_tiles()
    for tiles in ((gu, dn), (layer.TcTile(2, 2, 4), layer.TcTile(1, None, 2))):
        for tokens, k in ((1, 4), (2, 4), (5, 3), (1, 8)):
            g_t, d_t = tiles
            calls = _launches(monkeypatch, tokens, e=32, gemv=True, k=k, tiles=tiles)
            assert [(getattr(c[0], "__name__", ""), c[3]["GATE_UP"]) for c in calls] == [
                ("moe_gemv_tc", True), ("moe_gemv_tc", False)]  # fmt: skip
            (_, g_grid, _, g_kw), (_, d_grid, _, d_kw) = calls
            # a gate/up program: `warps` tiles of 8 * groups features, each over `ksplit` ranges of K
            assert g_grid == (tokens * k, -(-2880 // (8 * g_t.groups * g_t.warps)))
            assert g_kw["WARPS"] == g_kw["num_warps"] == g_t.warps * g_t.ksplit and g_kw["KSPLIT"] == g_t.ksplit
            warps = (1 << (k - 1).bit_length()) * d_t.ksplit
            assert d_grid == (tokens, -(-2880 // (16 * d_t.groups))) and d_kw["WARPS"] == d_kw["num_warps"] == warps
    with pytest.raises(ValueError, match="tiles: the GEMV kernel reads the canonical layout"):
        _launches(monkeypatch, 1, e=32, gemv=True, packed=True, tiles=(gu, dn))
    with pytest.raises(ValueError, match=f"topk_ids: the GEMV kernel takes at most {gemv.MAX_SLOTS} slots"):
        _launches(monkeypatch, 1, e=32, gemv=True, k=gemv.MAX_SLOTS + 1, tiles=(gu, dn))
    with pytest.raises(ValueError, match="tiles: the down TcTile runs a warp a slot"):
        _launches(monkeypatch, 1, e=32, gemv=True, tiles=(gu, layer.TcTile(1, 4)))
    with pytest.raises(ValueError, match="tiles: the gate/up TcTile needs warps"):
        _launches(monkeypatch, 1, e=32, gemv=True, tiles=(dn, dn))
    # A GemvTile and a TcTile mix (either GEMV kernel a GEMM); a GEMV tile with an MMA tile does not.
    calls = _launches(monkeypatch, 1, e=32, gemv=True, tiles=(layer.GemvTile(1, 8), dn))
    assert [getattr(c[0], "__name__", "") for c in calls] == ["moe_gemv", "moe_gemv_tc"]
    decode_tile = layer.DECODE_TILES[0][1][1]
    for tiles in ((gu, decode_tile), (decode_tile, dn), (gu,)):
        with pytest.raises(TypeError, match="^tiles: expected two DecodeTile"):
            _launches(monkeypatch, 1, e=32, gemv=True, tiles=tiles)


def _sass_loops(sass: str) -> str:
    """The SASS of every loop: from a label to a later branch back to it."""
    lines = sass.splitlines()
    labels = {line.rstrip(":"): n for n, line in enumerate(lines) if re.match(r"^\.?L?\w+:$", line.strip())}
    out = []
    for n, line in enumerate(lines):
        m = re.search(r"\bBRA\s+`?\(?\.?(\w+)", line)
        if m and labels.get(m.group(1), n) < n:
            out += lines[labels[m.group(1)] : n]
    assert out, "no loop in the SASS"
    return "\n".join(out)


CC_CASES = [
    ("20b_T1", 1, 4, {}),
    ("no_bias_not_interleaved_top3_T2", 2, 3, {"bias": False, "interleaved": False}),
    ("scales_above_220_T1", 1, 4, {"scale_hi": 230}),
    ("ksplit_T1", 1, 4, {"tiles": ((1, 2, 2), (1, None, 4))}),
    ("ksplit_scales_above_220_T1", 1, 4, {"tiles": ((1, 1, 4), (1, None, 2)), "scale_hi": 230}),
    ("maxnreg_168_T1", 1, 4, {"tiles": ((1, 4, 1, 168), (1, None, 1))}),
    ("int_decode_T1", 1, 4, {"tiles": ((1, 4, 1, 168, "int"), (1, None, 1, None, "int"))}),
    # L2 prefetches (a program's own rows, the gate/up's share of the down weights) and evict_first loads
    (
        "int_decode_prefetch_evict_T1",
        1,
        4,
        {"tiles": ((1, 4, 1, 168, "int"), (1, None, 1, None, "int")), "prefetch": ("own", "down"), "evict": True},
    ),
    ("prefetch_own_not_interleaved_top3_T2", 2, 3, {"interleaved": False, "prefetch": ("own",)}),
    (
        "int_decode_scales_above_220_T1",
        1,
        4,
        {"tiles": ((1, 4, 1, None, "int"), (1, None, 2, None, "int")), "scale_hi": 230},
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("label,tokens,k,wkw", CC_CASES, ids=[c[0] for c in CC_CASES])
def test_tc_launches_cross_compile_for_sm90_with_eight_mmas_a_chunk_and_no_spills_in_the_loop(
    monkeypatch, label, tokens, k, wkw
):
    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel.testing import sass as sm90_sass
    from tokenspeed_kernel_nvidia.hopper.moe import layer
    from tokenspeed_kernel_nvidia.hopper.moe.layer import TcTile

    wkw = dict(wkw)
    tiles = tuple(TcTile(*t) for t in wkw.pop("tiles")) if "tiles" in wkw else _tc_tiles()
    prefetch, evict = wkw.pop("prefetch", ()), wkw.pop("evict", False)
    monkeypatch.setattr(layer, "GEMV_PREFETCH", prefetch)
    monkeypatch.setattr(layer, "GEMV_EVICT_FIRST", evict)
    calls = _launches(monkeypatch, tokens, e=32, gemv=True, k=k, tiles=tiles, **wkw)
    assert len(calls) == 2
    for fn, _grid, args, kwargs in calls:
        assert kwargs["BIG_SCALES"] is ("scale_hi" in wkw)  # chosen from the largest scale byte
        ck = compile_launch(fn, args, dict(kwargs), "sm90")
        ptx, sass = ck.asm["ptx"], sm90_sass(ck.asm["cubin"])
        # The loop runs four chunks a trip: 8 MMAs and 32 e4m3 conversions a chunk and row group (none with the
        # integer decode, whose 4 byte permutations a word place the codes).
        int_decode = kwargs.get("INT_DECODE", False)
        assert int_decode is (tiles[0 if kwargs["GATE_UP"] else 1].decode == "int"), label
        assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 32 * kwargs["G"], label
        assert len(re.findall(r"\bHMMA\.16816\.F32\b", sass)) == 32 * kwargs["G"], label
        cvts = len(re.findall(r"\bF2FP\.F16\.E4M3\.UNPACK_B\b", sass))
        assert cvts == (0 if int_decode else 128 * kwargs["G"]), (label, cvts)
        assert (ptx.count("prmt.b32") >= 128 * kwargs["G"]) is int_decode, label
        spills = len(re.findall(r"\b(LDL|STL)\b", _sass_loops(sass)))
        if kwargs["BIG_SCALES"] and kwargs["GATE_UP"]:
            # Weights with a scale byte above ONE_STEP_MAX_SCALE: the gate/up variant's loop spills a few registers
            # (14 local accesses a trip of 4 chunks in Triton 3.6's sm90 build; module doc). Bounded, not zero.
            assert spills <= 16, (label, spills)
        else:
            assert spills == 0, (label, spills)  # no spills in the K loop
        assert re.search(r"\bLDG\.E\.128\b", sass), label  # 16 bytes of codes a lane and row
        if kwargs.get("maxnreg") and kwargs["GATE_UP"]:
            # With the register cap, ptxas requests most of the next trip's codes before this trip's first MMA
            # (without it, after the last: the module doc).
            loop = _sass_loops(sass).splitlines()
            first_mma = next(n for n, line in enumerate(loop) if re.search(r"\bHMMA\b", line))
            early = sum(1 for line in loop[:first_mma] if re.search(r"\bLDG\.E(\.EF)?\.128\b", line))  # EF: evict first
            assert early >= 6, (label, early)
        assert not re.search(r"\b(atom|red)\.", ptx), label  # no atomics: one fixed reduction order
        # L2 prefetches: codes and scales of the program's rows (gate and up apart when not interleaved; each slot's
        # for the down), and the gate/up's share of the down weights; the codes' and scales' loads evict first
        n_pf = len(re.findall(r"\bCCTL\.E\.PF2\b", sass))
        assert ptx.count("prefetch.global.L2 ") == n_pf, label
        if "own" in prefetch:
            assert n_pf >= (2 * (1 if wkw.get("interleaved", True) else 2) if kwargs["GATE_UP"] else 2 * k), label
        else:
            assert n_pf == 0, label
        assert kwargs.get("PF_DOWN", False) is (kwargs["GATE_UP"] and "down" in prefetch), label
        assert (ptx.count("L2::evict_first") > 0) is evict, label

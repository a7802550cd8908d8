"""``moe_apply`` on Hopper: the Gluon decode kernels (:mod:`.decode`) for a few tokens, the
prefill kernels (:mod:`.prefill`, wgmma grouped GEMMs) from ``PREFILL_MIN_TOKENS`` on. Both read
the canonical MXFP4 layout (``hopper.moe_apply``: no weight preprocessing) or the bit-placed layout of
:mod:`.packed` (``hopper.moe_apply_packed``: the same tensors with the bits of each word permuted, fewer
decode instructions); one weights object serves every call of either.

Up to ``GEMV_MAX_TOKENS`` tokens on canonical weights: the GEMV kernel (:mod:`.gemv`), two launches, fp32 FMAs
instead of MMAs (forced :class:`TcTile` tiles put either GEMM on the tensor-core GEMV, :mod:`.gemv_tc`).
Otherwise the decode path: three or four launches, no host sync (each launched with programmatic dependent
launch: :mod:`.decode`):

1. gate/up GEMM + bias + SwiGLU into ``inter [T*k, I]`` (bf16), one program per
   (pair, N tile, K split), working for the first pair of each touched expert; with K
   splits it writes fp32 partial sums and :func:`.decode.swiglu_splits` adds them in split
   order and applies the SwiGLU;
2. down GEMM + bias, times the routing weight, into fp32 ``y [splits, T*k, H]``;
3. :func:`.decode.combine_slots`: ``out[t] = sum_splits sum_s y[.., t*k + s]`` in order
   (deterministic: no atomics).

A tile marked ``fused`` (:class:`DecodeTile`) does those sums in its GEMM's last programs instead (two
launches fewer, the same bits; found by counters, :mod:`.decode`); measured slower on the H200, the
table marks none.

Tile configurations (:data:`DECODE_TILES`) are data; see where they were measured there.
The kernels take up to :data:`.decode.MAX_PAIRS` (token, slot) pairs a launch (larger calls
run as token slices); selection offers the layer up to 255 tokens
(``tokenspeed_kernel_nvidia._register``).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from tokenspeed_kernel.graphs import GraphCache, in_place_key
from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2, stream_counters
from tokenspeed_kernel.ops.moe import MoEActivation, MoEWeights

from . import decode, gemv, gemv_tc, packed
from .decode import MAX_PAIRS, combine_slots, moe_decode_gemm, pdl_kwargs, swiglu_splits
from .gemv import moe_gemv
from .gemv_tc import moe_gemv_tc
from .prefill import PrefillTile, run_prefill

__all__ = [
    "moe_apply",
    "moe_apply_w4a8",
    "moe_apply_packed",
    "FP8_MIN_TOKENS",
    "FP8_TILES",
    "DecodeTile",
    "DECODE_TILES",
    "GemvTile",
    "TC_DECODES",
    "TcTile",
    "GEMV_MAX_TOKENS",
    "GEMV_FUSED_COMBINE",
    "GEMV_TILES",
    "GEMV_TILES_BIG_SCALES",
    "GEMV_PREFETCH",
    "GEMV_PREFETCH_KINDS",
    "GEMV_EVICT_FIRST",
    "PrefillTile",
    "PREFILL_TILES",
    "check_shapes",
]

#: E8M0 scale bytes up to this value have a bf16 ``2**(s - 1)``: one multiply decodes a block.
ONE_STEP_MAX_SCALE = 128


def _check_maxnreg(maxnreg) -> None:
    """A tile's ``maxnreg``: None or Triton's register cap of a launch (32 to 255 registers a thread)."""
    if maxnreg is not None and (type(maxnreg) is not int or not 32 <= maxnreg <= 255):
        raise ValueError(f"maxnreg: expected None or an int from 32 to 255 (registers a thread), got {maxnreg!r}")


class DecodeTile(tuple):
    """``(block_m, tokens, warps, stages, ksplit, fused, maxnreg, scales_ahead)``: weight rows per program,
    token columns per MMA tile, warps, K blocks of codes in flight (the cp.async ring's depth), K splits (programs
    sharing one tile's K range; their fp32 partial sums are added in split order afterwards), and whether
    the GEMM's last programs do the sums after it (``fused``, :mod:`.decode`: the split sums' SwiGLU of a
    gate/up GEMM with splits, the combine of a down GEMM) instead of a launch of their own. A gate/up tile
    without splits writes its SwiGLU directly, so it has no sums to fuse either way.

    ``maxnreg`` (None: ptxas's choice) caps the registers a thread of the GEMM may use (Triton's ``maxnreg``
    launch option). Uncapped, a one-warp decode program uses about 250 registers, which lets 8 of them share an
    SM; a cap lets more share it (16 at 128) to hide more latency, at the price of the spills ptxas adds.

    ``scales_ahead`` (3 or 6): how many K blocks ahead of their use a program requests its scale bytes (one register
    a stage and row; the codes come through the cp.async ring, ``stages`` deep). Six hide more of DRAM's latency
    where the registers allow it without spills (session 22 of the host-cost report)."""

    __slots__ = ()

    def __new__(
        cls, block_m: int, tokens: int, warps: int, stages: int = 6, ksplit: int = 1, fused: bool = False,
        maxnreg: int | None = None, scales_ahead: int = 3,
    ):  # fmt: skip
        if fused not in (False, True):  # 0 and 1 too (the benches' tile lists)
            raise TypeError(f"fused: expected a bool, got {fused!r}")
        fused = bool(fused)
        _check_maxnreg(maxnreg)
        if scales_ahead not in (3, 6) or type(scales_ahead) is not int:
            raise ValueError(f"scales_ahead: expected 3 or 6 (K blocks), got {scales_ahead!r}")
        if stages < 2:
            raise ValueError(f"stages: expected at least 2, got {stages}")
        if ksplit < 1:
            raise ValueError(f"ksplit: expected at least 1, got {ksplit}")
        if tokens not in (8, 16):
            raise ValueError(f"tokens: expected 8 or 16 (MMA N tiles), got {tokens}")
        if warps not in (1, 2, 4, 8):
            raise ValueError(f"warps: expected 1, 2, 4 or 8, got {warps}")
        if block_m % (16 * warps):
            raise ValueError(f"block_m: expected a multiple of 16 * warps = {16 * warps}, got {block_m}")
        return super().__new__(cls, (block_m, tokens, warps, stages, ksplit, fused, maxnreg, scales_ahead))

    @property
    def fused(self) -> bool:
        return self[5]

    @property
    def maxnreg(self) -> int | None:
        return self[6]

    @property
    def scales_ahead(self) -> int:
        return self[7]


#: (gate/up tile, down tile) by tokens per call: ``((max_tokens, (gate_up, down)), ...)``.
#: Measured on an H200 (docs/benchmarks/h200-2026-12-01/hopper-moe, call 5 sweep, GPT-OSS-120B
#: layer): at 1 and 4 tokens one-warp programs with 4 K splits were fastest for both GEMMs
#: (54.2 / 136.3 us layer vs 61.1 / 142.5 us for the default tile); above, the sweeps of calls
#: 2-4 found no tile more than ~3 % faster than (64, 8, 4 warps, 6 stages, no split). Since calls of
#: ``PREFILL_MIN_TOKENS`` tokens or more take the prefill path, that last entry serves only decode
#: tiles forced with ``tiles=`` (and ``layer._tiles`` in tests and the harness).
#: Session 7 (hopper-moe/session7/call3, with programmatic dependent launch; ``moe_apply`` alone, us): at 4 tokens a gate/up
#: GEMM without K splits and an 8-deep ring, which also drops the split sums' SwiGLU launch, took 120.0
#: against 131.4 for the 4-split tile (the 8 other pairs measured 124.0-137.8); at 1 and 2 tokens no pair
#: measured was more than 1.5 % faster than the 4-split tiles (47.4 / 74.1 us).
#: Session 14 (hopper-moe/session14, calls 1-2): the fused epilogues (``DecodeTile(..., fused=True)``) measured
#: slower than the best separate tiles at every count. Call 2's sweep, ``moe_apply`` alone, two passes, us (gate/up
#: tile / down tile, ``+f`` fused): at 1 token (32, 8, 1, 8, 1) / (32, 8, 1, 4, 4) 47.3 / 47.2, the same with the down
#: GEMM fused 48.4 / 48.2, the 4-split tiles 47.8 / 53.0, gate/up fused 48.1 / 48.7, both fused 48.8 / 48.6, down
#: fused 54.2 / 54.2; at 2 tokens the 4-split tiles 73.8 / 73.9 and every fused pair 75.7-79.4; at 4 tokens the
#: table's pair 119.8 / 115.2, its down GEMM fused 124.2 / 119.3. A program that counts waits about a microsecond for
#: its counter's old value, and at 2-4 tokens the split GEMMs run several waves of programs, which costs more than the
#: launch saved; so the one-token entry takes the 4-token pair (no gate/up split, separate combine).
#: Session 22 (host-cost/s22-call3, H100, GPT-OSS-20B layer, route + apply, us): scale bytes requested six K blocks
#: ahead (``scales_ahead=6``) with a 4-deep gate/up ring (8 deep, six scale stages spill) took 48.8-49.1 / 78.7 /
#: 114.9 at 1 / 2 / 4 tokens against 52.6-52.8 / 81.9 / 121.2 for the previous entries (8-deep gate/up ring at 1 and
#: 4 tokens, three scale stages), the same bits.
DECODE_TILES: tuple[tuple[int | None, tuple[DecodeTile, DecodeTile]], ...] = (
    (1, (DecodeTile(32, 8, 1, 4, 1, scales_ahead=6), DecodeTile(32, 8, 1, 4, 4, scales_ahead=6))),
    (2, (DecodeTile(32, 8, 1, 4, 4, scales_ahead=6), DecodeTile(32, 8, 1, 4, 4, scales_ahead=6))),
    (4, (DecodeTile(32, 8, 1, 4, 1, scales_ahead=6), DecodeTile(32, 8, 1, 4, 4, scales_ahead=6))),
    (None, (DecodeTile(64, 8, 4, 6), DecodeTile(64, 8, 4, 6))),
)


#: How the GEMV kernel multiplies (:class:`GemvTile`'s ``dot``; its ``HALF``): ``"f32"`` fp32 FMAs of each decoded
#: value; ``"f16"`` f16 pairs (``fma.rn.f16x2``) of the e4m3 decode and the staged activations times ``2**t``,
#: summed in f16 within a block; ``"f16i"`` the same with the integer decode (no conversion instructions).
GEMV_DOTS = ("f32", "f16", "f16i")


class GemvTile(tuple):
    """``(feats, warps, sub, ahead, maxnreg, staged, dot, pairs)``: a tile of the GEMV kernel (:mod:`.gemv`):
    ``feats`` row pairs a thread (a gate/up feature's two rows; two output rows of the down GEMM), ``warps`` warps a
    program, (gate/up)
    ``sub`` consecutive tiles a program walks (the down GEMM's program walks the token's slots), ``ahead`` steps
    (passes of 32 MX blocks) whose codes a thread requests before it decodes the current one (at most the program's
    steps are ever in flight), ``maxnreg`` (None: ptxas's choice) Triton's register cap of the launch, and ``staged``
    whether a program stages its activation rows in shared memory first (else each lane requests its own with the
    codes: no staging, no barrier; the down's inter is then stored as bf16), and ``dot`` how it multiplies
    (:data:`GEMV_DOTS`; the f16 forms need ``staged``). ``pairs`` (a down tile): a program a (token, slot) pair and
    row tile, like the gate/up's, writing fp32 rows that a second launch sums a token (:func:`.decode.combine_slots`),
    instead of a program walking its token's slots."""

    __slots__ = ()

    def __new__(
        cls,
        feats: int,
        warps: int = 8,
        sub: int = 1,
        ahead: int = 1,
        maxnreg: int | None = None,
        staged: bool = True,
        dot: str = "f32",
        pairs: bool = False,
    ):
        if type(feats) is not int or feats not in (1, 2, 4):
            raise ValueError(f"feats: expected 1, 2 or 4 (row pairs a thread holds), got {feats!r}")
        if type(warps) is not int or warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"warps: expected 1, 2, 4, 8 or 16, got {warps!r}")
        if type(sub) is not int or not 1 <= sub <= 8:
            raise ValueError(f"sub: expected an int from 1 to 8 (tiles a program walks), got {sub!r}")
        if type(ahead) is not int or not 1 <= ahead <= 4:
            raise ValueError(f"ahead: expected an int from 1 to 4 (steps requested ahead), got {ahead!r}")
        _check_maxnreg(maxnreg)
        if type(staged) is not bool:
            raise ValueError(f"staged: expected a bool, got {staged!r}")
        if dot not in GEMV_DOTS:
            raise ValueError(f"dot: expected one of {', '.join(map(repr, GEMV_DOTS))}, got {dot!r}")
        if dot != "f32" and not staged:
            raise ValueError(f"dot: {dot!r} multiplies staged f16 activations, so it needs staged=True")
        if type(pairs) is not bool:
            raise ValueError(f"pairs: expected a bool, got {pairs!r}")
        return super().__new__(cls, (feats, warps, sub, ahead, maxnreg, staged, dot, pairs))

    @property
    def feats(self) -> int:
        return self[0]

    @property
    def warps(self) -> int:
        return self[1]

    @property
    def sub(self) -> int:
        return self[2]

    @property
    def ahead(self) -> int:
        return self[3]

    @property
    def maxnreg(self) -> int | None:
        return self[4]

    @property
    def staged(self) -> bool:
        return self[5]

    @property
    def dot(self) -> str:
        return self[6]

    @property
    def pairs(self) -> bool:
        return self[7]


#: :class:`TcTile`'s decodes: through the e4m3 conversion (``E2M1 * 2**-6``), or integer instructions only (``E2M1 *
#: 2**-14``, the E2M1 subnormal 0.5 an f16 subnormal).
TC_DECODES = ("e4m3", "int")


class TcTile(tuple):
    """``(groups, warps, ksplit, maxnreg, decode)``: a tile of the tensor-core GEMV kernel (:mod:`.gemv_tc`): ``groups``
    groups of 16 rows a warp, K in ``ksplit`` chunk ranges, a warp each. Gate/up: ``warps`` feature tiles a program,
    so ``warps * ksplit`` warps (at most 16); down: a warp a slot and range, so ``next_power_of_2(top_k) * ksplit``
    warps (``warps`` None). ``maxnreg`` (None: ptxas's choice) is Triton's register cap of the launch: with more
    registers than it needs by default, ptxas issues the next chunks' loads before the current chunks' MMAs.
    ``decode``: one of :data:`TC_DECODES`, the codes to f16 through the e4m3 conversion or with integer instructions
    only (the kernel's ``INT_DECODE``)."""

    __slots__ = ()

    def __new__(cls, groups: int, warps: int | None = None, ksplit: int = 1, maxnreg: int | None = None,
                decode: str = "e4m3"):  # fmt: skip
        if type(groups) is not int or groups not in (1, 2, 4):
            raise ValueError(f"groups: expected 1, 2 or 4 (groups of 16 rows a warp), got {groups!r}")
        if warps is not None and (type(warps) is not int or warps not in (1, 2, 4, 8, 16)):
            raise ValueError(f"warps: expected 1, 2, 4, 8 or 16 (or None for a down tile), got {warps!r}")
        if type(ksplit) is not int or ksplit not in (1, 2, 4):
            raise ValueError(f"ksplit: expected 1, 2 or 4, got {ksplit!r}")
        if warps is not None and warps * ksplit > 16:
            raise ValueError(f"ksplit: a gate/up tile runs warps * ksplit <= 16 warps, got {warps} * {ksplit!r}")
        _check_maxnreg(maxnreg)
        if decode not in TC_DECODES:
            raise ValueError(f"decode: expected one of {TC_DECODES}, got {decode!r}")
        return super().__new__(cls, (groups, warps, ksplit, maxnreg, decode))

    @property
    def groups(self) -> int:
        return self[0]

    @property
    def warps(self) -> int | None:
        return self[1]

    @property
    def ksplit(self) -> int:
        return self[2]

    @property
    def maxnreg(self) -> int | None:
        return self[3]

    @property
    def decode(self) -> str:
        return self[4]


#: Calls of at most this many tokens take the GEMV kernel (:mod:`.gemv`) on canonical weights with at most
#: :data:`.gemv.MAX_SLOTS` slots a token. Measured on an H100 (host-cost report, session 30, call 5; GPT-OSS
#: layers, ``moe_apply`` alone, one CUDA graph, L2 flushed / not, us): 20B at 1 token 39.7 / 33.1 against the MMA
#: path's 47.6 / 39.6, at 2 tokens 64.2 / 58.0 against 76.7 / 69.1; 120B 39.6 / 32.8 against 47.4 / 39.5 and 64.5
#: / 58.1 against 76.6 / 69.5. Above 2 tokens (each token reads its experts again) not measured.
GEMV_MAX_TOKENS = 2
#: (gate/up tile, down tile) of the GEMV path. Gate/up: the fastest of session 30's sweeps (calls 4-5; 1 row pair a
#: thread, 8 warps, one tile a program, staged). Down: 1 row pair a thread, 4 warps, its activations not staged and
#: three steps requested ahead under a 128-register cap. Host-cost report, session 33, H100: the down alone 16.8-17.0
#: us with the L2 flushed against the staged one-step tile's 20.5-20.6 (calls 2-3); ``moe_apply`` alone (call 3,
#: flushed / hot) 37.8 / 31.7 against 40.6 / 33.8 at one token, 59.6 / 53.7 against 66.2 / 60.5 at two (20B; 120B
#: alike); the public call eager at one token 30.2-32.4 on quiet hosts against 32.0-34.0 (calls 1-2, warm 2).
#:
#: Not the default yet: the f16 pair ``(GemvTile(1, 8, dot="f16i"), GemvTile(1, 8, dot="f16i", pairs=True))``
#: (session 34, call 2, H100, same call: the public call eager 25.89 us against this pair's 29.82, ``moe_apply``
#: alone 34.85 / 27.81 against 37.44 / 31.55; six of the probe's nine numerics cases at 2.2e-3). Its f16 sums round
#: at about ``2**-12`` of their terms, and SwiGLU's clamp turns that into a sign error wherever the terms are so large
#: that the error passes the clamp: the probe's case of activations times ``2**20`` measured 2.12e-2 (call 4; a
#: float64 emulation put the inter rows at 3.9e-2, 1.6e-3 at unit scale), and the GPU test with scale bytes up to 229
#: 2.4e-2. It needs a guard on the term sizes before it can be the default.
GEMV_TILES: tuple[GemvTile, GemvTile] = (GemvTile(1, 8), GemvTile(1, 4, 1, 3, 128, staged=False))
#: Whether a pairs down tile (:class:`GemvTile`'s ``pairs``) sums a token's slots in the last of its programs to arrive
#: (the kernel's ``FUSED``: a barrier and a GPU-scope acquire-release counter a program) instead of a third launch
#: (:func:`.decode.combine_slots`); the same sums in the same order, so the same bits (GPU test). Off: measured on an
#: H100 (host-cost report, session 35, call 6) the public call eager at one token is about 3 us slower with it (the
#: f16 pair ``i1,8 / pi1,8``: 29.81 and 29.00 us against 26.27 and 26.23, in turns).
GEMV_FUSED_COMBINE = False
#: The GEMV path's L2 prefetches (the kernel's ``PF_OWN``, ``PF_DOWN``; ``prefetch.global.L2``, nothing waits on
#: them): ``"own"``, each program requests all of its rows' codes and scales as soon as it knows its experts, so its
#: ring of loads finds them on chip; ``"down"``, each gate/up program also requests its share of its expert's down
#: weights, which the down launch then reads from L2. A subset of :data:`GEMV_PREFETCH_KINDS`.
GEMV_PREFETCH: tuple[str, ...] = ()
GEMV_PREFETCH_KINDS = ("own", "down")
#: Whether the GEMV kernels load the weights' codes and scales with the ``evict_first`` L2 policy (read once a call).
GEMV_EVICT_FIRST = False
#: The GEMV tiles for weights with a scale byte above :data:`.gemv.HALF_ONE_STEP_MAX_SCALE` (or unknown) when
#: :data:`GEMV_TILES` multiplies in f16 (a tuning choice): session 33's fp32 pair. With scale bytes that large one
#: block's sum can decide a row, and the f16 sums' rounding then reaches the output undiluted (session 34: 2.4e-2
#: on random bytes 118-229, where SwiGLU's clamp saturates every feature and keeps only the sums' signs).
GEMV_TILES_BIG_SCALES: tuple[GemvTile, GemvTile] = (GemvTile(1, 8), GemvTile(1, 4, 1, 3, 128, staged=False))


#: Weights with scale bytes above 128 decode with two multiplies a value pair; these tiles keep
#: that variant free of register spills (sm90 cross-compile, Triton 3.6).
TWO_STEP_TILES = (DecodeTile(64, 8, 4, 6), DecodeTile(64, 8, 4, 6))


#: Calls of at least this many tokens take the prefill path. Measured on an H200 (GPT-OSS-120B layer,
#: docs/benchmarks/h200-2026-12-01/hopper-moe/session4, us): in call 4 the decode path (with the
#: route) took 55.2 / 79.8 / 129.4 / 195.1 at 1 / 2 / 4 / 6 tokens, the prefill path (``moe_apply``
#: alone, its best tile) 70.4 / 86.4 / 127.6 / 170.7; in call 3 at 8 tokens 227.1 against 199.8.
PREFILL_MIN_TOKENS = 5

#: (gate/up tile, down tile) of the prefill path by the mean load of an expert, ``pairs / experts``
#: (``pairs = tokens * top_k``): ``((max_load, tiles), ...)``. A tile's cost follows the pairs an expert
#: gets (how many M tiles re-decode its weights, how much of the last one is padding), not the token
#: count: GPT-OSS-20B (32 experts) at 2048 tokens loads an expert as the 120B layer (128 experts) at
#: 8192 does. (Keyed by tokens, the 20B prefill at 2048 tokens took the 120B layer's 2048-token tile;
#: session 13 did not measure the two keyings apart: its end-to-end prefill runs spread by 10 %.)
#:
#: Measured on an H200 with the GPT-OSS-120B layer (128 experts, top 4: a load of ``tokens / 32``;
#: docs/benchmarks/h200-2026-12-01/hopper-moe/session4, calls 1-4 and 7, the ``moe_apply`` alone, us; the
#: raw sweeps are there):
#:
#: - 16 pairs, 4 warps, 4 stages, four K steps a round, at 8 / 64 / 256 tokens (call 7): 197.5 /
#:   614.0 / 701.0, against 217.1 / 629.8 / 730.6 with two steps and 2 stages (call 3, 8-256
#:   tokens: two steps within 3 % of the fastest tile measured at each size, one step 8-13 % slower);
#: - 32 pairs, 4 warps, two steps, at 512 tokens: 769 (8 warps: 797-833; one step: 884-913; four
#:   steps: 852 against 807 in call 7);
#: - 64 pairs, 4 warps, two steps, at 1024 and 2048: 996 and 1548 (8 warps: 1070-1129, 1600-1625;
#:   four steps: 1174 and 1695 against 1003 and 1492 in call 7);
#: - 128 pairs, 8 warps, 2 stages, two steps a round from 4096 tokens (session 6, calls 4-5): 2212 /
#:   3606 / 6341 at 4096 / 8192 / 16384, against 2490 / 3919 / 7000 with one step (the table's tile
#:   before) and 2205 / 3896 / 8028 for 64 pairs with 4 warps. Session 4 had the two-step tile with 4
#:   stages at 2355 / 6963 (4096 / 16384).
#: - Two chunks a program (session 13, calls 1-2; packed weights unless said): 32-pair chunks with 4
#:   warps at 2048 tokens (1412, against 1469 for the 64-pair tile), 64-pair chunks with 8 warps at 4096
#:   (2175 and 2067 in two processes, against 2314 and 2086 for the 128-pair tile; canonical weights
#:   2088 against 2108). At 16384 the two processes disagree (7248 against 7784; 6824 against 6594,
#:   canonical 7040 against 6652), so the 128-pair tile stays from 8192 tokens. At 256 - 1024 tokens the
#:   chunks were slower or even (1024: 957 against 944 for the 64-pair tile).
#:
#: - 32 weight rows a warp (session 15, call 1, packed weights; each activation tile feeds two MMAs, so the
#:   activations are read from L2 half as often as with 16): slower or even at every size measured, us at
#:   64 / 256 / 512 / 1024 / 2048 / 4096 tokens: 128 x 16 with 4 warps, four stages, two steps a round: 559 / 667 /
#:   826 / 1299 / 2390 / 4502 (64 x 16, four steps a round: 553 / 668 / 902 / 1402 / 2642 / 4850); 128 x 32: 621 /
#:   726 / 752 / 984 / 1616 / 2914 (64 x 32: 617 / 707 / 747 / 988 / 1660 / 2741); 128 x 64: 914 / 1043 /
#:   1032 / 1056 / 1513 / 2433 (64 x 64: 910 / 916 / 895 / 900 / 1331 / 2274). Cross-compiled for sm90 they
#:   take 128 / 165-167 / 183-197 registers (4 / 3 / 2 programs an SM) where 64 x 64 takes 96 (5).
#:
#: The bounds lie between measured sizes: loads 8 / 16 (256 / 512 tokens of the 120B layer), 16 / 32,
#: 32 / 64, 64 / 128 and 128 / 512.
PREFILL_TILES: tuple[tuple[int | None, tuple[PrefillTile, PrefillTile]], ...] = (
    (12, (PrefillTile(64, 16, 4, 4, 4), PrefillTile(64, 16, 4, 4, 4))),
    (24, (PrefillTile(64, 32, 4, 2, 2), PrefillTile(64, 32, 4, 2, 2))),
    (48, (PrefillTile(64, 64, 4, 2, 2), PrefillTile(64, 64, 4, 2, 2))),
    (96, (PrefillTile(64, 32, 4, 2, 2, 2), PrefillTile(64, 32, 4, 2, 2, 2))),
    (255, (PrefillTile(128, 64, 8, 2, 2, 2), PrefillTile(128, 64, 8, 2, 2, 2))),
    (None, (PrefillTile(128, 128, 8, 2, 2), PrefillTile(128, 128, 8, 2, 2))),
)


#: W4A8 (``fp8=True``): calls of at least this many tokens run fp8 MMAs; fewer keep the bf16 path
#: (H200, docs/benchmarks/h200-2026-12-01/hopper-moe/session5, call 3: at 1024 tokens 978 us
#: against 1054 for the bf16 path; call 2: 968 against 972).
FP8_MIN_TOKENS = 1024

#: The W4A8 prefill tiles by the mean load of an expert (as :data:`PREFILL_TILES`). Measured on an H200
#: with the 120B layer (session5, calls 2 and 3, ``moe_apply`` alone, us): 64 pairs, 4 warps, two steps a
#: round at 1024 / 2048 tokens: 978 / 1392 (128 pairs, 8 warps: 2038 / 2116); 128 pairs with 4 warps, one step at
#: 4096 / 8192 / 16384: 2251 / 3501 / 6189 (64 pairs: 2244 / 3839 / 7282; 128 x 128 with 8 warps and
#: two steps: 2272 / 3589 / 6295).
FP8_TILES: tuple[tuple[int | None, tuple[PrefillTile, PrefillTile]], ...] = (
    (96, (PrefillTile(64, 64, 4, 2, 2), PrefillTile(64, 64, 4, 2, 2))),
    (None, (PrefillTile(64, 128, 4, 2), PrefillTile(64, 128, 4, 2))),
)


def _by_load(table, pairs: int, experts: int):
    """The entry of a prefill table for ``pairs`` (token, slot) pairs over ``experts`` experts: the first
    whose bound on the mean load ``pairs / experts`` holds (compared as ``pairs <= bound * experts``)."""
    for bound, tiles in table:
        if bound is None or pairs <= bound * experts:
            return tiles
    return table[-1][1]


def _fp8_tiles(pairs: int, experts: int) -> tuple[PrefillTile, PrefillTile]:
    return _by_load(FP8_TILES, pairs, experts)


def _pick(table, tokens: int):
    for bound, tiles in table:
        if bound is None or tokens <= bound:
            return tiles
    return table[-1][1]


def _prefill_tiles(pairs: int, experts: int) -> tuple[PrefillTile, PrefillTile]:
    return _by_load(PREFILL_TILES, pairs, experts)


def _tiles(tokens: int, two_step: bool = False) -> tuple[DecodeTile, DecodeTile]:
    return TWO_STEP_TILES if two_step else _pick(DECODE_TILES, tokens)


def check_shapes(weights: MoEWeights) -> None:
    """The shapes the kernels take: hidden and intermediate multiples of 64 (a 64-value K tail), and
    code rows / scale bytes contiguous within an expert (the kernels address rows as ``K / 2`` bytes;
    the expert and scale-row strides are arguments)."""
    if weights.__dict__.get("_hopper_shapes_ok"):  # checked once per (frozen) weights object
        return
    h, i = weights.hidden, weights.intermediate
    if h % 64 or i % 64:
        raise ValueError(f"weights: hopper.moe_apply needs hidden ({h}) and intermediate ({i}) divisible by 64")
    for name in ("w13", "w2", "w13_scale", "w2_scale"):
        v = getattr(weights, name)
        if v.stride(-1) != 1 or (not name.endswith("scale") and v.stride(-2) != v.shape[-1]):
            raise ValueError(
                f"{name}: hopper.moe_apply needs rows contiguous within an expert (call .contiguous() once)"
            )
    object.__setattr__(weights, "_hopper_shapes_ok", True)


def _is_packed(weights: MoEWeights) -> bool:
    """Whether the weights are in the packed layout (:mod:`.packed`); ``ValueError`` for any other layout
    than that and the canonical one. Packed weights are checked as canonical ones once (same shapes)."""
    if weights.layout == "canonical":
        return False
    if weights.layout != packed.LAYOUT:
        raise ValueError(
            f"weights: hopper.moe_apply reads the canonical layout or {packed.LAYOUT!r}, got layout {weights.layout!r}"
        )
    if not weights.__dict__.get("_hopper_checked"):
        if weights.format != "mxfp4":
            raise ValueError(f"weights: the packed layout holds mxfp4 codes, got format {weights.format!r}")
        try:
            dataclasses.replace(weights, layout="canonical").validate()
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"weights.{exc}") from None
        object.__setattr__(weights, "_hopper_checked", True)
    return True


def _max_scale(weights: MoEWeights) -> int | None:
    """The largest E8M0 scale byte of the weights (read once, cached on the weights object).

    Reading the scales syncs with the host; a first call inside a CUDA-graph capture cannot: None there (the
    callers then take the variants exact for every scale byte)."""
    cached = getattr(weights, "_hopper_max_scale", None)
    if cached is None:
        if weights.w13_scale.is_cuda and torch.cuda.is_current_stream_capturing():
            return None
        cached = max(int(weights.w13_scale.max()), int(weights.w2_scale.max()))
        object.__setattr__(weights, "_hopper_max_scale", cached)
    return cached


def _two_step(weights: MoEWeights) -> bool:
    """Whether some scale byte exceeds ONE_STEP_MAX_SCALE (:func:`_max_scale`; True when unknown)."""
    largest = _max_scale(weights)
    return largest is None or largest > ONE_STEP_MAX_SCALE


def _grid(n: int, gate_up: bool, tile: DecodeTile, pairs: int) -> tuple[int, int, int]:
    """A GEMM's grid: (pair, N tile, K split); gate/up tiles hold ``block_m / 2`` features."""
    block_m, ksplit = tile[0], tile[4]
    return pairs, cdiv(n // 2 if gate_up else n, block_m // 2 if gate_up else block_m), ksplit


def _launch(a, ids, w, s, bias, tw, y, *, pairs, k, gate_up, interleaved, activation, tile, two_step, packed,
            counters=None, o=None):  # fmt: skip
    """One GEMM. ``y``: ``inter [pairs, I]`` (gate/up, one split) or fp32 ``[ksplit, pairs, N]``; with
    ``counters`` (the fused epilogues, :mod:`.decode`) the last programs write ``o`` (``inter`` or the output)."""
    block_m, tokens, warps, stages, ksplit = tile[:5]
    n = w.shape[1]
    k_dim = a.shape[1]
    limit = activation.limit
    fused = counters is not None
    cached(moe_decode_gemm)[_grid(n, gate_up, tile, pairs)](
        a, a.stride(0), ids, w, w.stride(0), s, s.stride(0), bias if bias is not None else y,
        bias.stride(0) if bias is not None else 0, tw, y, y.stride(-2), y.stride(0) if y.dim() == 3 else 0,
        counters if fused else ids, o if fused else y, o.stride(0) if fused else 0, pairs,
        float(activation.alpha), float(limit if limit is not None else 0.0), float(activation.up_offset),
        K=k_dim, N=n, SROW=s.stride(1), TOP_K=k, PAIRS_P2=next_power_of_2(pairs), GATE_UP=gate_up,
        INTERLEAVED=interleaved, HAS_BIAS=bias is not None, HAS_LIMIT=limit is not None,
        BLOCK_M=block_m, TOKENS=tokens, WARPS=warps, STAGES=stages, KSPLIT=ksplit, TWO_STEP=two_step,
        PACKED=packed, FUSED=fused, SCALES_AHEAD=tile.scales_ahead, num_warps=warps, **pdl_kwargs(), **_reg_cap(tile),
    )  # fmt: skip


def _reg_cap(tile) -> dict[str, int]:
    """The ``maxnreg`` launch option of a tile that caps its registers (none otherwise: the launch key is unchanged)."""
    return {} if tile.maxnreg is None else {"maxnreg": tile.maxnreg}


#: eager calls of at most this many tokens replay a captured graph (host cost; a few MB a graph at 64 tokens).
GRAPH_MAX_TOKENS = 64
_GRAPHS = GraphCache("hopper.moe_apply", max_graphs=128)
#: what an eager graph's key holds of a weights object or an activation, by value, as one int (a key is hashed per
#: call: nested tuples of shapes and a dataclass cost microseconds each time).
_TOKENS: dict = {}


def _graph_token(obj: MoEWeights | MoEActivation) -> int:
    """An int per value of what a graph bakes in about ``obj``, cached on the (frozen) object: for weights, the decode
    choice, layout, gate/up order and the tensors' addresses, shapes, strides and dtypes (:func:`in_place_key`); for an
    activation, its fields. Equal values share the int."""
    token = obj.__dict__.get("_hopper_graph_token")
    if token is None:
        if isinstance(obj, MoEWeights):  # (called outside any capture: _two_step may read the scales)
            value = (
                "weights", _two_step(obj), obj.gate_up_interleaved, obj.layout,
                in_place_key(obj.w13, obj.w13_scale, obj.w2, obj.w2_scale, obj.w13_bias, obj.w2_bias),
            )  # fmt: skip
        else:
            value = ("activation", obj)
        token = _TOKENS.setdefault(value, len(_TOKENS))
        object.__setattr__(obj, "_hopper_graph_token", token)
    return token


def moe_apply(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: MoEWeights,
    activation: MoEActivation,
    *,
    out: torch.Tensor | None = None,
    tiles: tuple[DecodeTile, DecodeTile] | tuple[PrefillTile, PrefillTile] | None = None,
    graphs: bool = True,
    fp8: bool = False,
) -> torch.Tensor:
    """``out[t] = sum_s topk_weights[t, s] * expert_{topk_ids[t, s]}(x[t])`` (bf16 x, MXFP4 weights).

    ``tiles`` overrides :data:`DECODE_TILES` with two :class:`DecodeTile`, :data:`PREFILL_TILES` with two
    :class:`PrefillTile`, or :data:`GEMV_TILES` with two :class:`GemvTile` (and so picks the path; tuning only).
    Without it, calls of at least :data:`PREFILL_MIN_TOKENS` tokens take the prefill path. An
    eager call of at most ``GRAPH_MAX_TOKENS`` tokens replays a CUDA graph of its launches captured once per
    shape and weights, at the shape's second call, and one that reads the inputs without copying them once
    their addresses recur (a decode loop's do; ``tokenspeed_kernel.graphs``, ``in_place``;
    ``graphs=False``: launch directly).

    ``fp8`` (W4A8, :func:`moe_apply_w4a8`): from :data:`FP8_MIN_TOKENS` tokens on (or with prefill
    ``tiles``), the prefill GEMMs quantize the activations to e4m3 and run fp8 MMAs
    (:mod:`.prefill`); fewer tokens keep bf16 activations (their calls are bound by the weight bytes,
    not by the MMAs). Needs a clamped SwiGLU (``activation.limit``), which bounds ``inter``, and the
    canonical layout (the e4m3 decode reads canonical nibbles).

    ``weights``: the canonical layout or the packed one (:mod:`.packed`, :func:`moe_apply_packed`).
    """
    if x.dtype != torch.bfloat16:
        raise TypeError(f"x: hopper.moe_apply takes bf16 activations (its MMAs are bf16), got {x.dtype}")
    if fp8 and activation.limit is None:
        raise ValueError("activation: the W4A8 path needs a clamped SwiGLU (limit): it bounds inter's fp8 range")
    if topk_ids.dtype != torch.int32:
        raise TypeError(f"topk_ids: expected int32, got {topk_ids.dtype}")
    t, h = x.shape
    if h != weights.hidden:
        raise ValueError(f"x: expected hidden size {weights.hidden} (the weights'), got {h}")
    k = topk_ids.shape[1]
    pairs = t * k
    if k > MAX_PAIRS:
        raise ValueError(f"topk_ids: hopper.moe_apply takes at most {MAX_PAIRS} slots a token, got {k}")
    gemv_types = (GemvTile, TcTile)  # either GEMV kernel for either GEMM
    if tiles is not None and (
        len(tiles) != 2
        or not (len({type(v) for v in tiles}) == 1 or all(isinstance(v, gemv_types) for v in tiles))
        or not isinstance(tiles[0], (DecodeTile, PrefillTile, *gemv_types))
    ):
        raise TypeError(
            "tiles: expected two DecodeTile, two PrefillTile, or a GemvTile or TcTile each (gate/up, down), "
            f"got {tiles!r}"
        )
    is_packed = _is_packed(weights)
    if fp8 and is_packed:
        raise ValueError(
            f"weights: the W4A8 path (fp8=True) reads the canonical layout, got {weights.layout!r} "
            "(keep canonical weights for hopper.moe_apply_w4a8)"
        )
    check_shapes(weights)
    if (
        graphs
        and tiles is None
        and out is None
        and 0 < t <= GRAPH_MAX_TOKENS
        and _GRAPHS.usable(x, topk_weights, topk_ids)
    ):
        # The graph bakes in the decode chosen from the scale values (read once per weights object, here,
        # outside any capture): it is part of the key, as the weights' addresses and shapes are (one int per
        # weights object and activation: _graph_token).
        key = (
            _graph_token(weights), _graph_token(activation), fp8, decode.PDL_ENABLED,
            x.shape, x.stride(), x.dtype, x.device, topk_weights.shape, topk_weights.stride(), topk_weights.dtype,
            topk_ids.shape, topk_ids.stride(),
        )  # fmt: skip
        return _GRAPHS.run(
            key,
            (x, topk_weights, topk_ids),
            lambda a, w, i, out=None: moe_apply(a, w, i, weights, activation, out=out, graphs=False, fp8=fp8),
            in_place=True,
            new_output=lambda: torch.empty_like(x),
        )
    result = out if out is not None and out.is_contiguous() else torch.empty_like(x)
    if t == 0 or h == 0:
        return out if out is not None else result
    prefill = isinstance(tiles[0], PrefillTile) if tiles else t >= PREFILL_MIN_TOKENS
    if (
        isinstance(tiles[0], (GemvTile, TcTile))
        if tiles
        else (t <= GEMV_MAX_TOKENS and not is_packed and _gemv_fits(k, weights))
    ):
        if is_packed:
            raise ValueError("tiles: the GEMV kernel reads the canonical layout (hopper.moe_apply), got packed weights")
        _run_gemv(x if x.stride(-1) == 1 else x.contiguous(), topk_weights, topk_ids, weights, activation, result,
                  tiles or _default_gemv_tiles(weights))  # fmt: skip
        if out is not None and result is not out:
            out.copy_(result)
            return out
        return result
    if prefill:
        x = x if x.stride(-1) == 1 else x.contiguous()
        w4a8 = fp8 and (tiles is not None or t >= FP8_MIN_TOKENS)
        run_prefill(x, topk_weights, topk_ids, weights, activation, result,
                    tiles=tiles or (_fp8_tiles if w4a8 else _prefill_tiles)(pairs, weights.num_experts),
                    two_step=_two_step(weights),
                    fp8=w4a8, packed=is_packed)  # fmt: skip
        if out is not None and result is not out:
            out.copy_(result)
            return out
        return result
    if pairs > MAX_PAIRS:
        # The expert scan holds every pair's id in registers: larger calls run as consecutive token slices.
        step = MAX_PAIRS // k
        for t0 in range(0, t, step):
            sl = slice(t0, t0 + step)
            moe_apply(x[sl], topk_weights[sl], topk_ids[sl], weights, activation, out=result[sl], tiles=tiles)
        if out is not None and result is not out:
            out.copy_(result)
            return out
        return result
    i = weights.intermediate
    x = x if x.stride(-1) == 1 else x.contiguous()
    ids = topk_ids.reshape(-1).contiguous()
    tw = topk_weights.reshape(-1).contiguous()
    two_step = _two_step(weights)
    gu_tile, down_tile = tiles or _tiles(t, two_step)
    w13, s13, w2, s2 = weights.w13, weights.w13_scale, weights.w2, weights.w2_scale
    inter = torch.empty((pairs, i), dtype=x.dtype, device=x.device)
    common = dict(pairs=pairs, k=k, activation=activation, two_step=two_step, packed=is_packed)
    gu_split = gu_tile[4]
    fuse_gu, fuse_down = gu_split > 1 and gu_tile.fused, down_tile.fused
    if fuse_gu or fuse_down:
        # Gate/up counters by (chunk's first pair, N tile), then down counters by (token, N tile).
        gu_counters = pairs * _grid(w13.shape[1], True, gu_tile, pairs)[1] if fuse_gu else 0
        counters = stream_counters(x.device, gu_counters + t * _grid(w2.shape[1], False, down_tile, pairs)[1])
    if gu_split == 1:
        _launch(x, ids, w13, s13, weights.w13_bias, tw, inter, gate_up=True, interleaved=weights.gate_up_interleaved,
                tile=gu_tile, **common)  # fmt: skip
    else:
        ws = torch.empty((gu_split, pairs, 2 * i), dtype=torch.float32, device=x.device)
        _launch(x, ids, w13, s13, weights.w13_bias, tw, ws, gate_up=True, interleaved=weights.gate_up_interleaved,
                tile=gu_tile, counters=counters if fuse_gu else None, o=inter, **common)  # fmt: skip
        if not fuse_gu:
            limit = activation.limit
            cached(swiglu_splits)[(pairs, cdiv(i, 1024))](
                ws, inter, ws.stride(0), i, float(activation.alpha), float(limit if limit is not None else 0.0),
                float(activation.up_offset), KSPLIT=gu_split, INTERLEAVED=weights.gate_up_interleaved,
                HAS_LIMIT=limit is not None, BLOCK=1024, **pdl_kwargs(),
            )  # fmt: skip
    y = torch.empty((down_tile[4], pairs, h), dtype=torch.float32, device=x.device)
    if fuse_down:
        _launch(inter, ids, w2, s2, weights.w2_bias, tw, y, gate_up=False, interleaved=True, tile=down_tile,
                counters=counters[gu_counters:], o=result, **common)  # fmt: skip
    else:
        _launch(inter, ids, w2, s2, weights.w2_bias, tw, y, gate_up=False, interleaved=True, tile=down_tile, **common)
        block = 1024
        cached(combine_slots)[(t, cdiv(h, block))](y, result, result.stride(0), y.stride(0), h, TOP_K=k,
                                                  KSPLIT=down_tile[4], BLOCK=block, **pdl_kwargs())  # fmt: skip
    if out is not None and result is not out:
        out.copy_(result)
        return out
    return result


def _default_gemv_tiles(weights: MoEWeights) -> tuple:
    """:data:`GEMV_TILES`, or :data:`GEMV_TILES_BIG_SCALES` when one of them multiplies in f16 and some scale byte of
    the weights exceeds :data:`.gemv.HALF_ONE_STEP_MAX_SCALE` (or is unknown; :func:`_max_scale`, read once)."""
    if all(t.dot == "f32" for t in GEMV_TILES if isinstance(t, GemvTile)):
        return GEMV_TILES
    largest = _max_scale(weights)
    return GEMV_TILES if largest is not None and largest <= gemv.HALF_ONE_STEP_MAX_SCALE else GEMV_TILES_BIG_SCALES


def _gemv_fits(k: int, weights: MoEWeights, tiles=None) -> bool:
    """Whether the GEMV kernels of ``tiles`` (default :func:`_default_gemv_tiles`) take ``k`` slots a token of these
    weights: at most :data:`.gemv.MAX_SLOTS`, and every program's staged activation rows within
    :data:`.gemv.MAX_STAGED_BYTES` (fp32 or f16 rows for a :class:`GemvTile`, one a program for the gate/up and a
    down of ``pairs``; f16 ranges for a :class:`TcTile`)."""
    gu, dn = tiles or _default_gemv_tiles(weights)
    if k > gemv.MAX_SLOTS:
        return False
    if isinstance(gu, TcTile):  # one row, or a copy of its range a warp when K is split
        gate_up = gemv_tc.staged_bytes(gu.warps if gu.ksplit > 1 else 1, weights.hidden, gu.ksplit)
    else:
        gate_up = gemv.staged_bytes(1, weights.hidden, gu.dot != "f32") if gu.staged else 0
    if isinstance(dn, TcTile):
        down = gemv_tc.staged_bytes(next_power_of_2(k), weights.intermediate, dn.ksplit)
    else:
        rows = 1 if dn.pairs else k
        down = gemv.staged_bytes(rows, weights.intermediate, dn.dot != "f32") if dn.staged else 0
    return max(gate_up, down) <= gemv.MAX_STAGED_BYTES


def _run_gemv(x, topk_weights, topk_ids, weights, activation, out, tiles) -> None:
    """The GEMV path: gate/up + SwiGLU into ``inter`` (bf16 values), then down + bias + the slots' sum, each GEMM on the
    kernel of its tile (:class:`GemvTile`: fp32 FMAs, :mod:`.gemv`; :class:`TcTile`: tensor cores, :mod:`.gemv_tc`)."""
    gu, dn = tiles
    k = topk_ids.shape[1]
    if k > gemv.MAX_SLOTS:
        raise ValueError(f"topk_ids: the GEMV kernel takes at most {gemv.MAX_SLOTS} slots a token, got {k}")
    if isinstance(gu, TcTile) and gu.warps is None:
        raise ValueError(f"tiles: the gate/up TcTile needs warps, got {gu!r}")
    if isinstance(dn, TcTile) and dn.warps is not None:
        raise ValueError(f"tiles: the down TcTile runs a warp a slot and range (warps None), got {dn!r}")
    if isinstance(dn, TcTile) and next_power_of_2(k) * dn.ksplit > 16:
        raise ValueError(f"tiles: {next_power_of_2(k)} slot warps times ksplit {dn.ksplit} is more than 16 warps")
    if isinstance(gu, GemvTile) and gu.pairs:
        raise ValueError(f"tiles: pairs is a down tile's option (the gate/up runs a program a pair), got {gu!r}")
    if isinstance(dn, GemvTile) and dn.sub != 1:
        raise ValueError(
            f"tiles: the down GemvTile's program walks the token's slots, so its sub must be 1, got {dn!r}"
        )
    if not _gemv_fits(k, weights, tiles):
        raise ValueError(
            f"weights: the GEMV kernel stages {k} activation rows of {weights.intermediate} values a program, more "
            f"than {gemv.MAX_STAGED_BYTES} bytes of shared memory (hidden {weights.hidden})"
        )
    ids = topk_ids.reshape(-1).contiguous()
    # inter holds bf16 values: stored as bf16 for the TC down (validated so on the GPU, session 31) and the unstaged
    # fp32 down (read once a lane), as fp32 for the staged fp32 down (session 30's validated default).
    dtype = torch.float32 if isinstance(dn, GemvTile) and dn.staged and dn.dot == "f32" else torch.bfloat16
    inter = torch.empty((x.shape[0] * k, weights.intermediate), dtype=dtype, device=x.device)
    (_tc_gate_up if isinstance(gu, TcTile) else _gemv_gate_up)(x, ids, weights, activation, inter, gu, k)
    tw = topk_weights.reshape(-1).contiguous()
    if isinstance(dn, TcTile):
        _tc_down(inter, ids, tw, weights, out, dn, k)
    else:
        _gemv_down(inter, ids, tw, weights, out, dn, k, fused=GEMV_FUSED_COMBINE)


def _gemv_launch_options(weights: MoEWeights, one_step_max: int = gemv.ONE_STEP_MAX_SCALE) -> dict:
    """PDL, and ``BIG_SCALES`` when some scale byte exceeds the kernel's one-step limit (or is unknown)."""
    largest = _max_scale(weights)
    return {**pdl_kwargs(), "BIG_SCALES": largest is None or largest > one_step_max}


def _one_step_max(tile: GemvTile) -> int:
    """The largest scale byte the tile's kernel takes in one step (f16 pairs keep their sums times ``2**t``)."""
    return gemv.ONE_STEP_MAX_SCALE if tile.dot == "f32" else gemv.HALF_ONE_STEP_MAX_SCALE


@functools.lru_cache(maxsize=64)
def _gemv_tile_options(tile: GemvTile) -> dict:
    """The kernel's ``AHEAD`` and ``STAGED`` where a tile departs from the kernel's defaults (one step ahead, staged),
    and its ``maxnreg``: none for session 30's tiles, whose launch keys are then unchanged. Read-only (cached a tile)."""
    return {**({} if tile.ahead == 1 else {"AHEAD": tile.ahead}), **({} if tile.staged else {"STAGED": False}),
            **({} if tile.dot == "f32" else {"HALF": GEMV_DOTS.index(tile.dot)}),
            **({"PAIRS": True} if tile.pairs else {}), **_reg_cap(tile)}  # fmt: skip


def _prefetch_options(gate_up: bool, weights: MoEWeights) -> dict:
    """The kernel's ``PF_OWN`` / ``PF_DOWN`` / ``PF_SROW`` / ``EVICT`` for :data:`GEMV_PREFETCH` and
    :data:`GEMV_EVICT_FIRST` (none when they are off). Read-only."""
    if not GEMV_PREFETCH and not GEMV_EVICT_FIRST:
        return _NO_OPTIONS
    return _prefetch_options_of(tuple(GEMV_PREFETCH), GEMV_EVICT_FIRST, gate_up, weights.w2_scale.stride(1))


_NO_OPTIONS: dict = {}


@functools.lru_cache(maxsize=64)
def _prefetch_options_of(prefetch: tuple, evict_first: bool, gate_up: bool, srow: int) -> dict:
    unknown = set(prefetch) - set(GEMV_PREFETCH_KINDS)
    if unknown:
        raise ValueError(f"GEMV_PREFETCH: expected a subset of {GEMV_PREFETCH_KINDS}, got {prefetch!r}")
    opts = {"PF_OWN": True} if "own" in prefetch else {}
    if gate_up and "down" in prefetch:
        opts.update(PF_DOWN=True, PF_SROW=srow)
    if evict_first:
        opts["EVICT"] = "evict_first"
    return opts


def _gemv_gate_up(x, ids, weights, activation, inter, tile, k) -> None:
    """:func:`.gemv.moe_gemv` (gate/up) over the ``len(ids)`` pairs of ``x`` (``k`` a token) into ``inter``; with
    ``"down"`` in :data:`GEMV_PREFETCH` its programs also request the down weights of their experts into L2."""
    w13, s13, b13 = weights.w13, weights.w13_scale, weights.w13_bias
    w2, s2 = weights.w2, weights.w2_scale
    i = weights.intermediate
    limit = activation.limit
    cached(moe_gemv)[(ids.shape[0], cdiv(i, tile.feats * tile.warps * tile.sub))](
        x, x.stride(0), ids, ids, w13, w13.stride(0), s13, s13.stride(0), b13 if b13 is not None else inter,
        b13.stride(0) if b13 is not None else 0, inter, inter.stride(0), float(activation.alpha),
        float(limit if limit is not None else 0.0), float(activation.up_offset), ids, inter, 0,
        w2, w2.stride(0), s2, s2.stride(0),
        K=x.shape[1], I=i, SROW=s13.stride(1), TOP_K=k, GATE_UP=True, INTERLEAVED=weights.gate_up_interleaved,
        HAS_BIAS=b13 is not None, HAS_LIMIT=limit is not None, FEATS=tile.feats, WARPS=tile.warps, SUB=tile.sub,
        num_warps=tile.warps, **_gemv_launch_options(weights, _one_step_max(tile)), **_gemv_tile_options(tile),
        **_prefetch_options(True, weights),
    )  # fmt: skip


def _gemv_down(inter, ids, tw, weights, out, tile, k, fused: bool = False) -> None:
    """:func:`.gemv.moe_gemv` (down): ``out[t] = sum_s tw * (inter @ W2.T + b2)`` over the ``k`` slots of each
    token, in slot order: a program a token and row tile, or (``tile.pairs``) a program a pair and row tile into fp32
    rows, which :func:`.decode.combine_slots` sums in a third launch, or with ``fused`` the last of a token's programs
    of a tile to arrive (the kernel's ``FUSED``): the same sums in the same order (:data:`GEMV_FUSED_COMBINE`)."""
    w2, s2, b2 = weights.w2, weights.w2_scale, weights.w2_bias
    h = out.shape[1]
    pairs = tile.pairs
    tiles = cdiv(h // 2, tile.feats * tile.warps)
    y = torch.empty((ids.shape[0], h), dtype=torch.float32, device=out.device) if pairs else out
    fuse = pairs and fused
    counters = stream_counters(out.device, out.shape[0] * tiles) if fuse else ids
    cached(moe_gemv)[(y.shape[0], tiles)](
        inter, inter.stride(0), ids, tw, w2, w2.stride(0), s2, s2.stride(0), b2 if b2 is not None else out,
        b2.stride(0) if b2 is not None else 0, y, y.stride(0), 0.0, 0.0, 0.0, counters, out, out.stride(0),
        w2, 0, s2, 0,
        K=inter.shape[1], I=h // 2, SROW=s2.stride(1), TOP_K=k, GATE_UP=False, INTERLEAVED=True,
        HAS_BIAS=b2 is not None, HAS_LIMIT=False, FEATS=tile.feats, WARPS=tile.warps, SUB=1 if pairs else k,
        num_warps=tile.warps, **_gemv_launch_options(weights, _one_step_max(tile)), **_gemv_tile_options(tile),
        **({"FUSED": True} if fuse else {}), **_prefetch_options(False, weights),
    )  # fmt: skip
    if pairs and not fused:
        block = 1024
        cached(combine_slots)[(out.shape[0], cdiv(h, block))](y, out, out.stride(0), 0, h, TOP_K=k, KSPLIT=1,
                                                              BLOCK=block, **pdl_kwargs())  # fmt: skip


def _tc_gate_up(x, ids, weights, activation, inter, tile, k) -> None:
    """:func:`.gemv_tc.moe_gemv_tc` (gate/up) over the ``len(ids)`` pairs of ``x`` (``k`` a token) into ``inter``."""
    w13, s13, b13 = weights.w13, weights.w13_scale, weights.w13_bias
    i = weights.intermediate
    limit = activation.limit
    warps = tile.warps * tile.ksplit
    cached(moe_gemv_tc)[(ids.shape[0], cdiv(i, 8 * tile.groups * tile.warps))](
        x, x.stride(0), ids, ids, w13, w13.stride(0), s13, s13.stride(0), b13 if b13 is not None else inter,
        b13.stride(0) if b13 is not None else 0, inter, inter.stride(0), float(activation.alpha),
        float(limit if limit is not None else 0.0), float(activation.up_offset), weights.w2, weights.w2.stride(0),
        weights.w2_scale, weights.w2_scale.stride(0),
        K=x.shape[1], N=i, SROW=s13.stride(1), TOP_K=k, GATE_UP=True, INTERLEAVED=weights.gate_up_interleaved,
        HAS_BIAS=b13 is not None, HAS_LIMIT=limit is not None, G=tile.groups, WARPS=warps, KSPLIT=tile.ksplit,
        num_warps=warps, **_gemv_launch_options(weights, gemv_tc.ONE_STEP_MAX_SCALE), **_reg_cap(tile),
        **({"INT_DECODE": True} if tile.decode == "int" else {}), **_prefetch_options(True, weights),
    )  # fmt: skip


def _tc_down(inter, ids, tw, weights, out, tile, k) -> None:
    """:func:`.gemv_tc.moe_gemv_tc` (down): ``out[t] = sum_s tw * (inter @ W2.T + b2)`` over the ``k`` slots of each
    token, a program a token and 16 ``groups`` rows."""
    w2, s2, b2 = weights.w2, weights.w2_scale, weights.w2_bias
    h = out.shape[1]
    warps = next_power_of_2(k) * tile.ksplit
    cached(moe_gemv_tc)[(out.shape[0], cdiv(h, 16 * tile.groups))](
        inter, inter.stride(0), ids, tw, w2, w2.stride(0), s2, s2.stride(0), b2 if b2 is not None else out,
        b2.stride(0) if b2 is not None else 0, out, out.stride(0), 0.0, 0.0, 0.0, w2, 0, s2, 0,
        K=inter.shape[1], N=h, SROW=s2.stride(1), TOP_K=k, GATE_UP=False, INTERLEAVED=True, HAS_BIAS=b2 is not None,
        HAS_LIMIT=False, G=tile.groups, WARPS=warps, KSPLIT=tile.ksplit, num_warps=warps,
        **_gemv_launch_options(weights, gemv_tc.ONE_STEP_MAX_SCALE), **_reg_cap(tile),
        **({"INT_DECODE": True} if tile.decode == "int" else {}), **_prefetch_options(False, weights),
    )  # fmt: skip


def moe_apply_w4a8(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: MoEWeights,
    activation: MoEActivation,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``hopper.moe_apply_w4a8``: :func:`moe_apply` with ``fp8=True`` (W4A8 from
    :data:`FP8_MIN_TOKENS` tokens on; selection offers it there, to callers allowing fp8 activations)."""
    return moe_apply(x, topk_weights, topk_ids, weights, activation, out=out, fp8=True)


def moe_apply_packed(
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: MoEWeights,
    activation: MoEActivation,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``hopper.moe_apply_packed``: :func:`moe_apply` on weights in the packed layout (converted once by
    :func:`.packed.preprocess_weights`, which ``moe_process_weights`` calls for a plan of this kernel)."""
    if weights.layout != packed.LAYOUT:
        raise ValueError(
            f"weights: hopper.moe_apply_packed reads the layout {packed.LAYOUT!r}, got {weights.layout!r} "
            "(convert once with moe_process_weights or hopper.moe.packed.preprocess_weights)"
        )
    return moe_apply(x, topk_weights, topk_ids, weights, activation, out=out)

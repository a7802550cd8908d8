"""Gluon prefill kernels of the MXFP4 MoE for Hopper (sm90): a ragged grouped GEMM on wgmma.

``layer.moe_apply`` takes this path from ``PREFILL_MIN_TOKENS`` (5) tokens on: a sort and a ragged
grouped GEMM beat the decode kernels' per-pair expert scan there (measured: ``layer``). These
kernels keep the decode kernels' register-only weight decode (:mod:`.decode`) and feed it to the
warpgroup MMA:

- **Pairs sorted by expert** (a stable sort on the device, no host sync; one launch up to
  ``SORT_MAX_PAIRS`` pairs, :func:`sort_pairs`, a two-launch counting sort above:
  :func:`sort_by_expert`): expert ``e`` owns
  sorted rows ``offsets[e] .. offsets[e + 1]``. One program computes one (N tile, M tile) of one
  expert: ``BLOCK_M`` weight rows (the wgmma's M side, 16 a warp) by ``BLOCK_T`` sorted pairs
  (its N side: 16 to 256 tokens, so a small expert does not pay for a 64-row token tile).
  With ``CHUNKS = 2`` a program's M tile is two chunks of ``BLOCK_T`` pairs: each K step's weights
  are decoded once for both chunks, and a program whose second chunk holds no pair of its expert
  runs the one-chunk loop (no MMA, no TMA for it). So an expert pays the MMA of its pairs rounded up
  to ``BLOCK_T``, and decodes its weights once for up to ``2 BLOCK_T`` of them (session 13: 1-6 %
  faster from 2048 tokens of the 120B layer; slower or even below).
  Program ``(n, m)`` finds its expert from the per-expert tile counts (an in-register scan of
  ``offsets``); programs past the last tile return at once. So the grid follows the real
  expert distribution; N tiles are the fastest axis, so the programs that run together read one
  activation tile and neighbouring weight tiles of one expert (L2 reuse).
- **Weights: the A operand, decoded in registers** (canonical layout, no preprocessing; or the
  bit-placed layout of :mod:`.packed`, ``hopper.moe_apply_packed``): a lane
  loads 8 bytes of a weight row per 64-value K step, decodes them with the decode kernels'
  bit placement (:func:`.decode._decode_a`, two values a 32-bit operation) straight into the
  wgmma's register operand layout. The codes and scales of the next steps are prefetched into
  registers (a handful of registers a stage).
- **Activations: the B operand, by TMA** into a ``STAGES``-deep shared-memory ring with one
  mbarrier a slot. The decode's K order is not the canonical one (a bf16x2 register holds
  canonical K ``k`` and ``k + 4``), so the activations are stored K-permuted to match
  (:func:`kperm`): the gate/up GEMM reads ``xs [pairs, H]``, the rows of ``x`` gathered in sorted
  order and permuted by :func:`gather_rows`; the down GEMM reads ``inter [pairs, I]``, which the
  gate/up epilogue writes permuted. Every 64-value K step is a power-of-two bit permutation of
  its columns, so both GEMMs need only ``K % 64 == 0`` (GPT-OSS: 2880 = 45 * 64).
- **Each step's MMA retires before the next step is decoded.** The MMA reads its A operand from
  registers while it runs, and the loop's single MMA has fixed A registers: keeping it in flight
  while the next step is decoded let that decode overwrite them (a first version did, and computed
  NaNs on the H200; ``test_hopper_moe_prefill.wgmma_register_hazards`` finds such writes in the
  SASS). The tensor cores instead overlap the other programs on the SM. Two ways of overlapping
  within a program (three steps an iteration; the decoded weights through shared memory so that
  an MMA can stay in flight) measured slower at every size and were removed (docs/benchmarks/
  h200-2026-12-01/hopper-moe, session 3). A ring slot is refilled with the step ``STAGES``
  ahead as soon as its MMA retired. With two steps a round (``UNROLL = 2``), both steps are
  decoded into their own registers before either MMA starts, and both retire at one wait: the
  waits, CTA barriers and refills are paid once per two steps (session 4: 4-14 % faster where the
  kernel is bound by instruction issue, 8-2048 tokens). ``UNROLL = 4`` does the same for four
  steps (faster with 16-pair tiles, slower with 32 and 64: more registers, fewer programs an SM).
- Epilogues: gate/up adds the bias and applies the SwiGLU (gate and up rows of a feature sit in
  one thread, as in the decode kernels) and stores ``inter`` in sorted order; down adds the bias,
  multiplies by the pair's routing weight and stores fp32 ``y [pairs, H]`` at the pair's original
  index, and :func:`.decode.combine_slots` sums the k slots in order (deterministic: no atomics).
  The down epilogue first moves the accumulator through shared memory into a layout where a lane
  stores 16 contiguous bytes: in the MMA layout the 64-bit pointers of every value took the kernel
  to 178 registers at 128 pairs (one program an SM); now 125 (two). The selection bench, same
  tile at both: 4096 tokens 2.70 -> 2.57 ms, 16384 tokens 7.97 -> 7.28 ms (sessions 3 and 4).
- **W4A8** (``FP8``, ``hopper.moe_apply_w4a8``): the activations are e4m3 with a scale a pair
  (:func:`gather_rows_fp8`, K-permuted by :func:`kperm8`), the codes are decoded to e4m3 by a
  per-block byte table (:func:`_e4m3_words`, relative to each row's largest scale), the MMAs are fp8
  (k32), the epilogues apply the row factors and the pair scales, and ``inter`` is e4m3 times
  ``w4a8_inter_scale`` (session 5: 6.18 ms at 16384 tokens, against 7.11 for bf16).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2
from tokenspeed_kernel.ops.moe import w4a8_inter_scale

from .decode import (
    _add,
    _decode_a,
    _grid_release,
    _grid_wait,
    _tl_grid_sync,
    _weight_rows,
    combine_slots,
    gate_up_swiglu,
    pdl_kwargs,
)

__all__ = [
    "moe_prefill_gemm",
    "sort_pairs",
    "block_histograms",
    "scatter_sorted",
    "gather_rows",
    "gather_rows_fp8",
    "kperm",
    "kperm_inverse",
    "kperm8",
]

#: Values a K step of the prefill kernels (one TMA box of activations, 8 code bytes a lane).
BLOCK_K = 64

#: Calls of at most this many (token, slot) pairs sort them by expert in one launch (:func:`sort_pairs`);
#: larger ones in two (:func:`block_histograms`, :func:`scatter_sorted`: a counting sort over blocks of
#: ``SORT_BLOCK`` pairs). Measured on an H200, each alone in a CUDA graph (docs/benchmarks/h200-2026-12-01/
#: hopper-moe/session13, call 5), us: ``sort_pairs`` 12.3 / 20.8 / 46.3 at 1024 / 2048 / 4096 pairs, the two
#: launches 14.5 / 14.5 / 14.9 (15.6 at 16384, 17.2 at 65536), and the torch sort they replaced
#: (``torch.sort`` + ``searchsorted``, eight launches) 33.6 / 33.4 / 35.3 (57.6 at 16384).
SORT_MAX_PAIRS = 1024
#: Pairs a program of the two-launch sort takes (sorted in registers, as :func:`sort_pairs` does).
SORT_BLOCK = 1024


@triton.jit
def _expert_of(ids_ptr, i, n, E):
    """The expert of pair ``i``: ``E`` past ``n`` and for an id outside ``[0, E)``."""
    e = tl.load(ids_ptr + i, mask=i < n, other=E)
    return tl.where((e >= 0) & (e < E), e, E)


@triton.jit
def sort_pairs(ids_ptr, n, order_ptr, off_ptr, E, BLOCK: tl.constexpr, E_P2: tl.constexpr, PDL: tl.constexpr = False):
    """The (token, slot) pairs sorted by expert, stably, in one program: ``order[i]`` the pair of sorted
    row ``i`` and ``off[e]`` the first sorted row of expert ``e`` (``off[E]``: the pairs with an expert in
    ``[0, E)``, ``n`` when every id is one). ``BLOCK`` is a power
    of two >= ``n``, ``E_P2`` one > ``E``. The sort key ``expert * BLOCK + pair`` keeps equal experts in
    pair order; the padding sorts last (expert ``E``) and lands in bin ``E`` of the histogram, past the
    offsets' prefix sums. An id outside ``[0, E)`` is counted as ``E`` too (no histogram bin out of
    range): it then belongs to no expert's rows."""
    _tl_grid_sync(PDL)
    i = tl.arange(0, BLOCK)
    e = _expert_of(ids_ptr, i, n, E)
    s = tl.sort(e * BLOCK + i)
    tl.store(order_ptr + i, s % BLOCK, mask=i < n)
    counts = tl.histogram(e, E_P2)
    ex = tl.arange(0, E_P2)
    tl.store(off_ptr + ex, tl.cumsum(counts, 0) - counts, mask=ex <= E)


@triton.jit
def block_histograms(ids_ptr, n, hist_ptr, E, BLOCK: tl.constexpr, E_P2: tl.constexpr, PDL: tl.constexpr = False):
    """The two-launch sort's first launch: ``hist[b, e]``, the pairs of expert ``e`` (bin ``E``: none) among
    pairs ``b * BLOCK .. (b + 1) * BLOCK``. No atomics: each program writes its own row."""
    _tl_grid_sync(PDL)
    b = tl.program_id(0)
    e = _expert_of(ids_ptr, b * BLOCK + tl.arange(0, BLOCK), n, E)
    ex = tl.arange(0, E_P2)
    tl.store(hist_ptr + b * E_P2 + ex, tl.histogram(e, E_P2))


@triton.jit
def scatter_sorted(ids_ptr, n, hist_ptr, nblocks, order_ptr, off_ptr, E, BLOCK: tl.constexpr, E_P2: tl.constexpr,
                   NB_P2: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """The two-launch sort's second launch: block ``b``'s pairs at their sorted rows. Expert ``e``'s rows
    start at ``off[e]`` (the pairs of lower experts, from every block's histogram); its pairs of block ``b``
    follow those of the blocks before ``b``; within the block a register sort by ``expert * BLOCK + pair``
    gives each pair its rank. So the order is that of a stable sort, as :func:`sort_pairs`'. Program 0
    also writes ``off`` (``off[E]``: the pairs with an expert in ``[0, E)``). ``NB_P2``: a power of two >=
    ``nblocks`` (the histogram rows are read ``ROWS`` at a time)."""
    _tl_grid_sync(PDL)
    b = tl.program_id(0)
    ex = tl.arange(0, E_P2)
    total = tl.zeros([E_P2], dtype=tl.int32)
    before = tl.zeros([E_P2], dtype=tl.int32)
    for r0 in tl.static_range(0, NB_P2, ROWS):
        r = r0 + tl.arange(0, ROWS)
        h = tl.load(hist_ptr + r[:, None] * E_P2 + ex[None, :], mask=(r < nblocks)[:, None], other=0)
        total += tl.sum(h, axis=0)
        before += tl.sum(tl.where((r < b)[:, None], h, 0), axis=0)
    start = tl.cumsum(total, 0) - total
    tl.store(off_ptr + ex, start, mask=(ex <= E) & (b == 0))
    own = tl.load(hist_ptr + b * E_P2 + ex)
    # Sorted position p in the block, expert e: row start[e] + before[e] + (p - first position of e here).
    base = start + before - (tl.cumsum(own, 0) - own)
    local = tl.sort(_expert_of(ids_ptr, b * BLOCK + tl.arange(0, BLOCK), n, E) * BLOCK + tl.arange(0, BLOCK))
    se = local // BLOCK
    pair = b * BLOCK + local % BLOCK
    row = tl.gather(base, se, 0) + tl.arange(0, BLOCK)
    tl.store(order_ptr + row, pair, mask=pair < n)


def sort_by_expert(ids: torch.Tensor, experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, offsets)`` of the flat expert ids ``ids [pairs]`` (int32): the pairs in expert order (a
    stable sort) and each expert's first sorted row, ``offsets [experts + 1]``; no host sync."""
    pairs = ids.numel()
    order = torch.empty(pairs, dtype=torch.int32, device=ids.device)
    offsets = torch.empty(experts + 1, dtype=torch.int32, device=ids.device)
    e_p2 = next_power_of_2(experts + 1)
    if pairs <= SORT_MAX_PAIRS:
        block = max(16, next_power_of_2(pairs))
        cached(sort_pairs)[(1,)](ids, pairs, order, offsets, experts, BLOCK=block, E_P2=e_p2,
                                 num_warps=max(1, min(16, block // 256)), **pdl_kwargs())  # fmt: skip
        return order, offsets
    nblocks = cdiv(pairs, SORT_BLOCK)
    hist = torch.empty((nblocks, e_p2), dtype=torch.int32, device=ids.device)
    cached(block_histograms)[(nblocks,)](ids, pairs, hist, experts, BLOCK=SORT_BLOCK, E_P2=e_p2, num_warps=4,
                                         **pdl_kwargs())  # fmt: skip
    cached(scatter_sorted)[(nblocks,)](ids, pairs, hist, nblocks, order, offsets, experts, BLOCK=SORT_BLOCK,
                                       E_P2=e_p2, NB_P2=max(16, next_power_of_2(nblocks)), ROWS=16, num_warps=4,
                                       **pdl_kwargs())  # fmt: skip
    return order, offsets


@triton.jit
def _kperm(c, PACKED: tl.constexpr = False):
    """Canonical column ``c`` of a 64-value K step -> its MMA K position in the prefill kernels.

    Lane ``q`` of a weight row's 4 lanes holds canonical ``16 q + 8 w + p + 4 i`` (word ``w``,
    plane ``p = p0 + 2 p1``, half ``i``; ``PACKED``, :mod:`.packed`: ``16 q + 8 w + 2 p + i``);
    :func:`.decode._decode_a` places it at ``16 (2 w + p1) + 8 p0 + 2 q + i``: the 6 index bits
    permuted."""
    base = c & ~63
    b = c & 63
    if PACKED:
        i = b & 1
        p0 = (b >> 1) & 1
        p1 = (b >> 2) & 1
    else:
        p0 = b & 1
        p1 = (b >> 1) & 1
        i = (b >> 2) & 1
    w = (b >> 3) & 1
    q = b >> 4
    return base + (((w * 2 + p1) * 2 + p0) * 8 + q * 2 + i)


@triton.jit
def _kperm_inverse(k, PACKED: tl.constexpr = False):
    """The inverse of :func:`_kperm`: MMA K position -> canonical column."""
    base = k & ~63
    b = k & 63
    i = b & 1
    q = (b >> 1) & 3
    p0 = (b >> 3) & 1
    p1 = (b >> 4) & 1
    w = b >> 5
    if PACKED:
        return base + (q * 16 + w * 8 + 4 * p1 + 2 * p0 + i)
    else:
        return base + (q * 16 + w * 8 + p0 + 2 * p1 + 4 * i)


def kperm(c: int, packed: bool = False) -> int:
    """Host twin of :func:`_kperm` (tests and docs): the same function body, on Python ints."""
    return _kperm.fn(c, packed)


def kperm_inverse(k: int, packed: bool = False) -> int:
    """Host twin of :func:`_kperm_inverse`."""
    return _kperm_inverse.fn(k, packed)


@triton.jit
def gather_rows(x_ptr, stride_x, order_ptr, xs_ptr, K, TOP_K: tl.constexpr, BLOCK: tl.constexpr,
                PDL: tl.constexpr = False, PACKED: tl.constexpr = False):  # fmt: skip
    """``xs[i, kperm(c)] = x[order[i] // TOP_K, c]``: the activations of sorted pair ``i``,
    K-permuted for the gate/up GEMM (``BLOCK`` a multiple of 64; ``PACKED``: for the packed layout)."""
    _tl_grid_sync(PDL)
    i = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < K
    src = tl.load(order_ptr + i) // TOP_K
    v = tl.load(x_ptr + src.to(tl.int64) * stride_x + _kperm_inverse(cols, PACKED), mask=ok, other=0.0)
    tl.store(xs_ptr + i.to(tl.int64) * K + cols, v, mask=ok)


@triton.jit
def _kperm8(c):
    """W4A8: canonical column ``c`` of a 64-value K step -> its fp8 MMA K position. Lane ``q`` holds
    canonical ``16 q + 4 j + i`` in byte ``i`` of its register ``j`` (:func:`_decode_a_fp8`); the
    wgmma's k32 fragment puts that register at K ``16 j + 4 q + i``: ``q`` and ``j`` swap, so the
    permutation is its own inverse."""
    base = c & ~63
    b = c & 63
    return base + ((b >> 2) & 3) * 16 + (b >> 4) * 4 + (b & 3)


def kperm8(c: int) -> int:
    """Host twin of :func:`_kperm8`."""
    return _kperm8.fn(c)


@triton.jit
def gather_rows_fp8(x_ptr, stride_x, order_ptr, xs_ptr, xscale_ptr, K, TOP_K: tl.constexpr, BLOCK: tl.constexpr,
                    PDL: tl.constexpr = False):  # fmt: skip
    """W4A8: ``xs[i, kperm8(c)] = e4m3(x[t, c] / xscale[i])`` with ``t = order[i] // TOP_K`` and
    ``xscale[i] = max_c |x[t, c]| / 448`` (one scale a pair; ``BLOCK >= K``)."""
    _tl_grid_sync(PDL)
    i = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < K
    src = tl.load(order_ptr + i) // TOP_K
    v = tl.load(x_ptr + src.to(tl.int64) * stride_x + _kperm8(cols), mask=ok, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(v), axis=0), 1e-30)
    scale = amax / 448.0
    q = tl.minimum(tl.maximum(v * (448.0 / amax), -448.0), 448.0)
    tl.store(xs_ptr + i.to(tl.int64) * K + cols, q.to(xs_ptr.dtype.element_ty), mask=ok)
    tl.store(xscale_ptr + i, scale)


@gluon.jit
def _tile_of(off_ptr, pid_m, E: gl.constexpr, E_P2: gl.constexpr, BLOCK_T: gl.constexpr, WARPS: gl.constexpr):
    """M tile ``pid_m`` of the ragged grid -> (expert, first sorted row, end of the expert's rows);
    expert ``E`` past the last tile."""
    LE: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    ei = gl.arange(0, E_P2, layout=LE)
    lo = gl.load(off_ptr + ei, mask=ei < E, other=0)
    hi = gl.load(off_ptr + ei + 1, mask=ei < E, other=0)
    tiles = (hi - lo + BLOCK_T - 1) // BLOCK_T
    cum = gl.associative_scan(tiles, 0, _add)
    # Experts whose tiles all lie before pid_m (an empty expert's count adds nothing).
    e = gl.sum((cum <= pid_m).to(gl.int32), axis=0)
    before = gl.sum(gl.where(ei < e, tiles, 0), axis=0)
    start = gl.sum(gl.where(ei == e, lo, 0), axis=0) + (pid_m - before) * BLOCK_T
    end = gl.sum(gl.where(ei == e, hi, 0), axis=0)
    return e, start, end


@gluon.jit
def _load_codes(w_base, s_base, w_rows, w_ok, kb, live, K: gl.constexpr, SROW: gl.constexpr, LW: gl.constexpr):
    """K step ``kb``'s code words ``uint32 [BLOCK_M, 4, 2]`` (lane q: canonical ``16 q .. 16 q + 15``)
    and scale bytes ``[BLOCK_M, 4]`` (lane q's MX block ``2 kb + q // 2``); masked off unless ``live``."""
    q = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, LW)))
    wi = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, LW)))
    off = w_rows[:, None, None] * (K // 8) + (kb * 8 + q * 2)[None, :, None] + wi[None, None, :]
    words = gl.load(w_base + off, mask=w_ok[:, None, None] & live, other=0)
    SL: gl.constexpr = gl.SliceLayout(2, LW)
    qs = gl.arange(0, 4, layout=gl.SliceLayout(0, SL))
    rows_s = gl.convert_layout(w_rows, gl.SliceLayout(1, SL))
    ok_s = gl.convert_layout(w_ok, gl.SliceLayout(1, SL))
    sc = gl.load(s_base + rows_s[:, None] * SROW + (kb * 2 + qs // 2)[None, :], mask=ok_s[:, None] & live, other=127)
    return words, sc


#: The body of :func:`_e4m3_words` (PTX; ``$0``/``$1`` out, ``$2`` the codes, ``$3``/``$4`` the table).
#: A module constant so that the CPU tests can run it through a PTX emulator.
E4M3_WORDS_ASM: gl.constexpr = gl.constexpr("""{
    .reg .b32 m, mh, w4, p, s;
    and.b32 m, $2, 0x77777777;
    shr.u32 mh, m, 16;
    shl.b32 w4, $2, 4;
    prmt.b32 p, $3, $4, m;
    prmt.b32 s, w4, $2, 0xD9C8;
    lop3.b32 $0, p, s, 0x80808080, 0xF8;
    prmt.b32 p, $3, $4, mh;
    prmt.b32 s, w4, $2, 0xFBEA;
    lop3.b32 $1, p, s, 0x80808080, 0xF8;
}""")
#: :func:`_e4m3_table`: E4M3 bits of magnitudes 0, 0.5, 1, 1.5 (``l0``) and 2, 3, 4, 6 (``l1``), the
#: per-unit-of-``d`` step of their exponent fields, and the smallest ``d`` keeping them all normal.
E4M3_TABLE: gl.constexpr = gl.constexpr((0x3C383000, 0x4C484440))
E4M3_STEP: gl.constexpr = gl.constexpr((0x08080800, 0x08080808))
E4M3_MIN_D: gl.constexpr = gl.constexpr(-5)


@gluon.jit
def _e4m3_words(words, l0, l1):
    """E2M1 codes -> E4M3 bytes through a per-block table: ``uint32`` words of 8 codes -> two words of
    4 E4M3 bytes (codes 0-3, codes 4-7). ``l0``/``l1``: the table, byte ``c`` = E4M3 of magnitude ``c``;
    ``prmt`` picks a byte per code by its 3 magnitude bits. The signs: a code's sign is bit 7 of its
    byte (odd codes) or of its byte in ``words << 4`` (even codes), and a ``prmt`` in sign mode
    replicates a picked byte's bit 7 over a whole byte, so one ``prmt`` of (``words << 4``,
    ``words``) gathers 4 signs as ``0xFF`` / ``0x00`` bytes and one ``lop3`` ORs their bit 7 in. Nine
    instructions for 8 values."""
    return gl.inline_asm_elementwise(E4M3_WORDS_ASM, "=r,=r,r,r,r", [words, l0, l1], dtype=(gl.uint32, gl.uint32),
                                     is_pure=True, pack=1)  # fmt: skip


@gluon.jit
def _e4m3_table(sc, rmax):
    """The per-block E4M3 table of :func:`_e4m3_words` for E8M0 scale bytes ``sc`` in rows whose
    largest scale byte is ``rmax``: magnitudes ``m * 2**d``, ``d = sc - rmax + 6 <= 6`` (so ``6 * 2**6
    = 384 <= 448``); exact while ``d >= -5`` (every nonzero entry a normal E4M3: the exponent field
    is ``d`` plus the entry's own). Blocks below that (scales under ``2**-11`` of the row's largest)
    read as zero. Returns ``(l0, l1)``; :func:`_w4a8_row_factor` restores ``2**(rmax - 133)``."""
    d = sc.to(gl.int32) - rmax + 6
    keep = d >= E4M3_MIN_D
    l0 = gl.where(keep, E4M3_TABLE[0] + d * E4M3_STEP[0], 0).to(gl.uint32, bitcast=True)
    l1 = gl.where(keep, E4M3_TABLE[1] + d * E4M3_STEP[1], 0).to(gl.uint32, bitcast=True)
    return l0, l1


@gluon.jit
def _w4a8_row_factor(rmax):
    """fp32 ``2**(rmax - 133)``: the E8M0 bias (127) and the table's offset (6) of :func:`_e4m3_table`."""
    return gl.exp2((rmax - 133).to(gl.float32))


@gluon.jit
def _row_scale_max(s_base, rows, ok, K: gl.constexpr, SROW: gl.constexpr, WARPS: gl.constexpr, OUT: gl.constexpr):
    """The largest E8M0 scale byte of each weight row ``rows`` (0 for masked rows), in ``OUT``."""
    G: gl.constexpr = K // 32
    GP2: gl.constexpr = triton.next_power_of_2(G)
    RL: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [WARPS, 1], [1, 0])
    r = gl.convert_layout(rows, gl.SliceLayout(1, RL))
    r_ok = gl.convert_layout(ok, gl.SliceLayout(1, RL))
    g = gl.arange(0, GP2, layout=gl.SliceLayout(0, RL))
    sc = gl.load(s_base + r[:, None] * SROW + g[None, :], mask=r_ok[:, None] & (g < G)[None, :], other=0)
    return gl.convert_layout(gl.max(sc.to(gl.int32), axis=1), OUT)


@gluon.jit
def _decode_a_fp8(words, sc, rmax, BLOCK_M: gl.constexpr, WARPS: gl.constexpr, AL: gl.constexpr):
    """W4A8: code words ``uint32 [BLOCK_M, 4, 2]`` (as :func:`_load_codes`), scale bytes ``[BLOCK_M, 4]``
    and the rows' largest scale bytes ``[BLOCK_M, 1]`` -> the fp8 MMA's A operand ``e4m3 [BLOCK_M, 64]``
    in ``AL``: canonical ``16 q + 4 j + i`` (lane q, register j = 2 w + h, byte i) at MMA K
    ``16 j + 4 q + i`` (:func:`_kperm8`); the values are ``E2M1 * 2**(s - rmax + 6)``."""
    l0, l1 = _e4m3_table(sc, rmax)
    l0 = gl.broadcast(l0[:, :, None], words)[0]
    l1 = gl.broadcast(l1[:, :, None], words)[0]
    lo, hi = _e4m3_words(words, l0, l1)
    r = gl.join(lo, hi)  # [M, q, w, h]
    b0 = r.to(gl.uint8).to(gl.float8e4nv, bitcast=True)
    b1 = (r >> 8).to(gl.uint8).to(gl.float8e4nv, bitcast=True)
    b2 = (r >> 16).to(gl.uint8).to(gl.float8e4nv, bitcast=True)
    b3 = (r >> 24).to(gl.uint8).to(gl.float8e4nv, bitcast=True)
    # join stacks on a new last axis: [.., i1, i0] holds byte 2 i1 + i0 (the register's own order).
    v = gl.reshape(gl.join(gl.join(b0, b2), gl.join(b1, b3)), [BLOCK_M, 4, 2, 2, 4])  # [M, q, w, h, i]
    v = gl.reshape(gl.permute(v, [0, 2, 3, 1, 4]), [BLOCK_M, 64])
    # Rows from the load order to the MMA's (as :func:`.decode._decode_a`).
    v = gl.reshape(v, [BLOCK_M // (16 * WARPS), 2, WARPS, 8, 64])
    v = gl.reshape(gl.permute(v, [0, 2, 1, 3, 4]), [BLOCK_M, 64])
    return gl.convert_layout(v, AL)


@gluon.jit
def _decode(words, sc, rmax, BLOCK_M: gl.constexpr, WARPS: gl.constexpr, AL: gl.constexpr, TWO_STEP: gl.constexpr,
            FP8: gl.constexpr, PACKED: gl.constexpr):  # fmt: skip
    """One K step's A operand: bf16 (:func:`.decode._decode_a`; ``PACKED``: the layout of
    :mod:`.packed`) or, with ``FP8`` (canonical codes only), e4m3."""
    gl.static_assert(not (FP8 and PACKED), "the e4m3 decode reads canonical codes, not the packed layout")
    if FP8:
        return _decode_a_fp8(words, sc, rmax, BLOCK_M, WARPS, AL)
    else:
        return _decode_a(words, sc, BLOCK_M, 2, WARPS, AL, TWO_STEP, PACKED)


@gluon.jit
def _issue(a_desc, ring, bars, start, step, NK: gl.constexpr, STAGES: gl.constexpr, BLOCK_T: gl.constexpr,
           CHUNKS: gl.constexpr, NCH: gl.constexpr):  # fmt: skip
    """TMA of K step ``step``'s activation tiles (one a live chunk) into its ring slot (nothing past the
    last step)."""
    slot = step % STAGES
    mbarrier.expect(bars.index(slot), NCH * a_desc.block_type.nbytes, pred=step < NK)
    if CHUNKS == 1:
        tma.async_copy_global_to_shared(a_desc, [start, step * 64], bars.index(slot), ring.index(slot), pred=step < NK)
    else:
        for c in gl.static_range(NCH):
            tma.async_copy_global_to_shared(a_desc, [start + c * BLOCK_T, step * 64], bars.index(slot),
                                            ring.index(slot).slice(c * BLOCK_T, BLOCK_T), pred=step < NK)  # fmt: skip


@gluon.jit
def _mma(a, acc0, acc1, ring, bars, step, STAGES: gl.constexpr, BLOCK_T: gl.constexpr, CHUNKS: gl.constexpr,
         NCH: gl.constexpr):  # fmt: skip
    """Start step ``step``'s MMAs (one a live chunk, all on the one decoded ``a``) once its activation
    tiles landed."""
    slot = step % STAGES
    mbarrier.wait(bars.index(slot), (step // STAGES) & 1)
    if CHUNKS == 1:
        acc0 = warpgroup_mma(a, ring.index(slot).permute((1, 0)), acc0, is_async=True)
    else:
        acc0 = warpgroup_mma(a, ring.index(slot).slice(0, BLOCK_T).permute((1, 0)), acc0, is_async=True)
        if NCH == 2:
            acc1 = warpgroup_mma(a, ring.index(slot).slice(BLOCK_T, BLOCK_T).permute((1, 0)), acc1, is_async=True)
    return acc0, acc1


@gluon.jit
def _wait(acc0, acc1, a0, a1, a2, a3, NA: gl.constexpr, NCH: gl.constexpr):
    """Wait for the MMAs in flight: ``NA`` steps' (``a0`` .. ``a3``, the first ``NA`` of them real) on
    ``NCH`` accumulators. Their bf16 A operands are the wait's dependencies (live until then).
    Triton 3.6 takes no 8-bit dependencies, so for fp8 operands the accumulators alone are; the loops
    decode nothing between an MMA and its wait, and the sm90 cross-compile tests check every W4A8
    tile's SASS for a write to an in-flight MMA's registers."""
    if a0.dtype.primitive_bitwidth == 8:
        if NCH == 2:
            acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
        else:
            acc0 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0,))
    elif NCH == 2:
        if NA == 1:
            acc0, acc1, a0 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, a0))
        elif NA == 2:
            acc0, acc1, a0, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, a0, a1))
        else:
            acc0, acc1, a0, a1, a2, a3 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1, a0, a1, a2, a3))
    else:
        if NA == 1:
            acc0, a0 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, a0))
        elif NA == 2:
            acc0, a0, a1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, a0, a1))
        else:
            acc0, a0, a1, a2, a3 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, a0, a1, a2, a3))
    return acc0, acc1


@gluon.jit
def _one_step(acc0, acc1, words, sc, rmax, a_desc, ring, bars, start, kb, NK: gl.constexpr, STAGES: gl.constexpr,
              BLOCK_M: gl.constexpr, BLOCK_T: gl.constexpr, WARPS: gl.constexpr, AL: gl.constexpr,
              TWO_STEP: gl.constexpr, FP8: gl.constexpr, PACKED: gl.constexpr, CHUNKS: gl.constexpr,
              NCH: gl.constexpr):  # fmt: skip
    """K step ``kb`` alone (the tail of the unrolled loops): decode, MMAs, retire (its slot then takes
    step ``kb + STAGES``)."""
    a = _decode(words, sc, rmax, BLOCK_M, WARPS, AL, TWO_STEP, FP8, PACKED)
    acc0, acc1 = _mma(a, acc0, acc1, ring, bars, kb, STAGES, BLOCK_T, CHUNKS, NCH)
    acc0, acc1 = _wait(acc0, acc1, a, a, a, a, 1, NCH)
    _issue(a_desc, ring, bars, start, kb + STAGES, NK, STAGES, BLOCK_T, CHUNKS, NCH)
    return acc0, acc1


@gluon.jit
def _epilogue(acc, e, start, end, pid_n, order_ptr, b_ptr, stride_be, tw_ptr, y_ptr, stride_y, alpha, limit,
              up_offset, cs_ptr, out_scale, s_base, K: gl.constexpr, N: gl.constexpr, SROW: gl.constexpr,
              GATE_UP: gl.constexpr, INTERLEAVED: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_LIMIT: gl.constexpr,
              BLOCK_M: gl.constexpr, BLOCK_T: gl.constexpr, WARPS: gl.constexpr, FP8: gl.constexpr,
              PACKED: gl.constexpr, MMA: gl.constexpr):  # fmt: skip
    """The stores of one chunk's accumulator (sorted rows ``start .. start + BLOCK_T``, those under
    ``end`` live): bias and SwiGLU into ``inter`` (gate/up), or routing weight into ``y`` (down)."""
    rows_t = start + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, MMA))
    live = rows_t < end
    m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, MMA))
    n_rows, n_ok = _weight_rows(m, pid_n, N, BLOCK_M, GATE_UP, INTERLEAVED)
    if FP8:
        # The weights' row factors (the table's offsets) and the activations' scales.
        rf = _w4a8_row_factor(_row_scale_max(s_base, n_rows, n_ok, K, SROW, WARPS, gl.SliceLayout(1, MMA)))
        if GATE_UP:
            cs = gl.load(cs_ptr + rows_t, mask=live, other=0.0)
            acc = acc * rf[:, None] * cs[None, :]
        else:
            acc = acc * (rf * out_scale)[:, None]
    if HAS_BIAS:
        bias = gl.load(b_ptr + e.to(gl.int64) * stride_be + n_rows, mask=n_ok, other=0.0)
        acc = acc + bias.to(gl.float32)[:, None]
    if GATE_UP:
        hv = gate_up_swiglu(acc, BLOCK_M, BLOCK_T, alpha, limit, up_offset, HAS_LIMIT)
        HL: gl.constexpr = hv.type.layout
        jj = pid_n * (BLOCK_M // 2) + gl.arange(0, BLOCK_M // 2, layout=gl.SliceLayout(1, HL))
        rows = gl.convert_layout(rows_t, gl.SliceLayout(0, HL))
        ok = gl.convert_layout(live, gl.SliceLayout(0, HL))
        # The down GEMM's B operand: stored with its K (the intermediate features) permuted.
        if FP8:
            ptrs = y_ptr + rows[None, :].to(gl.int64) * stride_y + _kperm8(jj)[:, None]
            hv = hv * out_scale
        else:
            ptrs = y_ptr + rows[None, :].to(gl.int64) * stride_y + _kperm(jj, PACKED)[:, None]
        gl.store(ptrs, hv.to(y_ptr.dtype.element_ty), mask=(jj < N // 2)[:, None] & ok[None, :])
    else:
        # Through shared memory into a layout whose lanes store 16 contiguous bytes of a pair's
        # row: a quarter of the pointers the MMA layout needs (those set the register peak).
        OUT: gl.constexpr = gl.BlockedLayout([4, 1], [8, 4], [1, WARPS], [0, 1])
        acc = gl.convert_layout(acc, OUT)
        rows_o = start + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, OUT))
        live_o = rows_o < end
        pair = gl.load(order_ptr + rows_o, mask=live_o, other=0)
        acc = acc * gl.load(tw_ptr + pair, mask=live_o, other=0.0)[None, :]
        o_rows = pid_n * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, OUT))
        ptrs = y_ptr + pair[None, :].to(gl.int64) * stride_y + o_rows[:, None]
        gl.store(ptrs, acc, mask=(o_rows < N)[:, None] & live_o[None, :])


@gluon.jit
def _gemm_tile(
    a_desc, ring, bars, e, start, end, pid_n, wa, sa, wb, sb, rmax, w_base, s_base, w_rows, w_ok,
    order_ptr, b_ptr, stride_be, tw_ptr, y_ptr, stride_y, alpha, limit, up_offset, cs_ptr, out_scale,
    K: gl.constexpr, N: gl.constexpr, SROW: gl.constexpr,
    GATE_UP: gl.constexpr, INTERLEAVED: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_LIMIT: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_T: gl.constexpr, WARPS: gl.constexpr, STAGES: gl.constexpr,
    UNROLL: gl.constexpr, TWO_STEP: gl.constexpr, FP8: gl.constexpr, PACKED: gl.constexpr,
    CHUNKS: gl.constexpr, NCH: gl.constexpr, MMA: gl.constexpr, AL: gl.constexpr, LW: gl.constexpr,
):  # fmt: skip
    """The K loop and the epilogues of one program whose first ``NCH`` chunks of ``BLOCK_T`` sorted
    pairs hold pairs of expert ``e``: each K step's weights are decoded once and feed one MMA a live
    chunk."""
    NK: gl.constexpr = K // 64
    for j in gl.static_range(STAGES):
        _issue(a_desc, ring, bars, start, j, NK, STAGES, BLOCK_T, CHUNKS, NCH)
    acc0 = gl.zeros([BLOCK_M, BLOCK_T], gl.float32, MMA)
    acc1 = gl.zeros([BLOCK_M, BLOCK_T], gl.float32, MMA)
    if UNROLL == 1:
        for kb in range(NK):
            a = _decode(wa, sa, rmax, BLOCK_M, WARPS, AL, TWO_STEP, FP8, PACKED)
            wa, sa = wb, sb
            wb, sb = _load_codes(w_base, s_base, w_rows, w_ok, kb + 2, kb + 2 < NK, K, SROW, LW)
            acc0, acc1 = _mma(a, acc0, acc1, ring, bars, kb, STAGES, BLOCK_T, CHUNKS, NCH)
            acc0, acc1 = _wait(acc0, acc1, a, a, a, a, 1, NCH)
            _issue(a_desc, ring, bars, start, kb + STAGES, NK, STAGES, BLOCK_T, CHUNKS, NCH)
    elif UNROLL == 2:
        # Two steps a round: both decoded into their own registers, both steps' MMAs in flight, one
        # wait and one round of barriers for the two (the per-step overhead halves).
        for r in range(NK // 2):
            kb = 2 * r
            a0 = _decode(wa, sa, rmax, BLOCK_M, WARPS, AL, TWO_STEP, FP8, PACKED)
            a1 = _decode(wb, sb, rmax, BLOCK_M, WARPS, AL, TWO_STEP, FP8, PACKED)
            wa, sa = _load_codes(w_base, s_base, w_rows, w_ok, kb + 2, kb + 2 < NK, K, SROW, LW)
            wb, sb = _load_codes(w_base, s_base, w_rows, w_ok, kb + 3, kb + 3 < NK, K, SROW, LW)
            acc0, acc1 = _mma(a0, acc0, acc1, ring, bars, kb, STAGES, BLOCK_T, CHUNKS, NCH)
            acc0, acc1 = _mma(a1, acc0, acc1, ring, bars, kb + 1, STAGES, BLOCK_T, CHUNKS, NCH)
            acc0, acc1 = _wait(acc0, acc1, a0, a1, a1, a1, 2, NCH)
            _issue(a_desc, ring, bars, start, kb + STAGES, NK, STAGES, BLOCK_T, CHUNKS, NCH)
            _issue(a_desc, ring, bars, start, kb + 1 + STAGES, NK, STAGES, BLOCK_T, CHUNKS, NCH)
        if NK % 2 == 1:
            acc0, acc1 = _one_step(acc0, acc1, wa, sa, rmax, a_desc, ring, bars, start, NK - 1, NK, STAGES, BLOCK_M,
                                   BLOCK_T, WARPS, AL, TWO_STEP, FP8, PACKED, CHUNKS, NCH)  # fmt: skip
    else:
        # Four steps a round, as two (STAGES >= 4: the round's four activation tiles are in the
        # ring together); the last NK % 4 steps one at a time.
        wc, sc = _load_codes(w_base, s_base, w_rows, w_ok, 2, 2 < NK, K, SROW, LW)
        wd, sd = _load_codes(w_base, s_base, w_rows, w_ok, 3, 3 < NK, K, SROW, LW)
        for r in range(NK // 4):
            kb = 4 * r
            a0 = _decode(wa, sa, rmax, BLOCK_M, WARPS, AL, TWO_STEP, FP8, PACKED)
            a1 = _decode(wb, sb, rmax, BLOCK_M, WARPS, AL, TWO_STEP, FP8, PACKED)
            a2 = _decode(wc, sc, rmax, BLOCK_M, WARPS, AL, TWO_STEP, FP8, PACKED)
            a3 = _decode(wd, sd, rmax, BLOCK_M, WARPS, AL, TWO_STEP, FP8, PACKED)
            wa, sa = _load_codes(w_base, s_base, w_rows, w_ok, kb + 4, kb + 4 < NK, K, SROW, LW)
            wb, sb = _load_codes(w_base, s_base, w_rows, w_ok, kb + 5, kb + 5 < NK, K, SROW, LW)
            wc, sc = _load_codes(w_base, s_base, w_rows, w_ok, kb + 6, kb + 6 < NK, K, SROW, LW)
            wd, sd = _load_codes(w_base, s_base, w_rows, w_ok, kb + 7, kb + 7 < NK, K, SROW, LW)
            acc0, acc1 = _mma(a0, acc0, acc1, ring, bars, kb, STAGES, BLOCK_T, CHUNKS, NCH)
            acc0, acc1 = _mma(a1, acc0, acc1, ring, bars, kb + 1, STAGES, BLOCK_T, CHUNKS, NCH)
            acc0, acc1 = _mma(a2, acc0, acc1, ring, bars, kb + 2, STAGES, BLOCK_T, CHUNKS, NCH)
            acc0, acc1 = _mma(a3, acc0, acc1, ring, bars, kb + 3, STAGES, BLOCK_T, CHUNKS, NCH)
            acc0, acc1 = _wait(acc0, acc1, a0, a1, a2, a3, 4, NCH)
            for j in gl.static_range(4):
                _issue(a_desc, ring, bars, start, kb + j + STAGES, NK, STAGES, BLOCK_T, CHUNKS, NCH)
        T0: gl.constexpr = NK - NK % 4
        if NK % 4 >= 1:
            acc0, acc1 = _one_step(acc0, acc1, wa, sa, rmax, a_desc, ring, bars, start, T0, NK, STAGES, BLOCK_M,
                                   BLOCK_T, WARPS, AL, TWO_STEP, FP8, PACKED, CHUNKS, NCH)  # fmt: skip
        if NK % 4 >= 2:
            acc0, acc1 = _one_step(acc0, acc1, wb, sb, rmax, a_desc, ring, bars, start, T0 + 1, NK, STAGES, BLOCK_M,
                                   BLOCK_T, WARPS, AL, TWO_STEP, FP8, PACKED, CHUNKS, NCH)  # fmt: skip
        if NK % 4 >= 3:
            acc0, acc1 = _one_step(acc0, acc1, wc, sc, rmax, a_desc, ring, bars, start, T0 + 2, NK, STAGES, BLOCK_M,
                                   BLOCK_T, WARPS, AL, TWO_STEP, FP8, PACKED, CHUNKS, NCH)  # fmt: skip
    for j in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(j))
    _epilogue(acc0, e, start, end, pid_n, order_ptr, b_ptr, stride_be, tw_ptr, y_ptr, stride_y, alpha, limit,
              up_offset, cs_ptr, out_scale, s_base, K, N, SROW, GATE_UP, INTERLEAVED, HAS_BIAS, HAS_LIMIT, BLOCK_M,
              BLOCK_T, WARPS, FP8, PACKED, MMA)  # fmt: skip
    if NCH == 2:
        _epilogue(acc1, e, start + BLOCK_T, end, pid_n, order_ptr, b_ptr, stride_be, tw_ptr, y_ptr, stride_y, alpha,
                  limit, up_offset, cs_ptr, out_scale, s_base, K, N, SROW, GATE_UP, INTERLEAVED, HAS_BIAS, HAS_LIMIT,
                  BLOCK_M, BLOCK_T, WARPS, FP8, PACKED, MMA)  # fmt: skip


@gluon.jit
def moe_prefill_gemm(
    a_desc, off_ptr, order_ptr, w_ptr, stride_we, s_ptr, stride_se, b_ptr, stride_be, tw_ptr, y_ptr, stride_y,
    alpha, limit, up_offset, cs_ptr, out_scale,
    K: gl.constexpr, N: gl.constexpr, SROW: gl.constexpr, E: gl.constexpr, E_P2: gl.constexpr,
    GATE_UP: gl.constexpr, INTERLEAVED: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_LIMIT: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_T: gl.constexpr, WARPS: gl.constexpr, STAGES: gl.constexpr,
    UNROLL: gl.constexpr, TWO_STEP: gl.constexpr, FP8: gl.constexpr, PDL: gl.constexpr,
    PACKED: gl.constexpr = False, CHUNKS: gl.constexpr = 1,
):  # fmt: skip
    """One GEMM of the prefill path; see the module docstring.

    ``a_desc``: TMA descriptor of the K-permuted activations in sorted order, ``[pairs, K]`` bf16
    (``FP8``: e4m3), block ``[BLOCK_T, 64]`` (gate/up: ``xs`` from :func:`gather_rows`; down: ``inter``). ``off``:
    int32 ``[E + 1]`` expert offsets into the sorted pairs; ``order``: int32 ``[pairs]`` the original
    pair of each sorted row. ``w``/``s``/``b``: canonical MXFP4 codes, scales and bias of every
    expert. ``y``: gate/up: ``inter [pairs, N / 2]`` bf16 in sorted order, K-permuted; down: fp32
    ``[pairs, N]`` at the original pair index, times ``tw[pair]``.

    ``CHUNKS`` (1 or 2): a program's M tile is ``CHUNKS`` chunks of ``BLOCK_T`` pairs. Each K step's
    weights are decoded once for all of them, and a chunk holding no pair of the tile's expert gets no
    MMA and no TMA (the program takes the one-chunk loop): an expert with up to ``BLOCK_T`` pairs pays
    for ``BLOCK_T`` columns of MMA, one with up to ``2 BLOCK_T`` decodes its weights once.

    ``FP8`` (W4A8): the activations are e4m3 (``kperm8`` order), the weights are decoded to e4m3 and
    the MMAs are fp8. ``PACKED``: bf16 only, the codes are in the layout of :mod:`.packed` (``xs`` and
    ``inter`` in its ``kperm``). ``cs``: gate/up: fp32 ``[pairs]`` the sorted pairs' activation scales
    (:func:`gather_rows_fp8`); ``out_scale``: gate/up: the multiplier of ``inter`` before its e4m3
    store; down: the inverse, applied to the accumulator.

    ``PDL`` (:mod:`.decode`): the expert offsets (the sort's, two launches back) and the first two steps'
    weight codes are read before the grid wait; the activations (the previous launch's output) after it.
    (Issuing the activations' TMA first, the order before PDL, measured no different: session 7, call 5.)
    """
    gl.static_assert(CHUNKS == 1 or CHUNKS == 2, "CHUNKS: 1 or 2")
    gl.static_assert(not (FP8 and PACKED), "the e4m3 decode reads canonical codes, not the packed layout")
    pid_n = gl.program_id(0)
    pid_m = gl.program_id(1)
    e, start, end = _tile_of(off_ptr, pid_m, E, E_P2, BLOCK_T * CHUNKS, WARPS)
    if e < E:
        MMA_K: gl.constexpr = 32 if FP8 else 16
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1],
                                                      instr_shape=[16, BLOCK_T, MMA_K])  # fmt: skip
        AL: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=4 if FP8 else 2)
        LW: gl.constexpr = gl.BlockedLayout([1, 1, 2], [8, 4, 1], [WARPS, 1, 1], [2, 1, 0])
        w_base = (w_ptr + e.to(gl.int64) * stride_we).to(gl.pointer_type(gl.uint32))
        s_base = s_ptr + e.to(gl.int64) * stride_se
        # Weight rows as loaded (row t at lane t % 8 of warp (t // 8) % WARPS) in the MMA's row order.
        t = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, gl.SliceLayout(2, LW)))
        m_of_t = ((t // (16 * WARPS) * WARPS + (t // 8) % WARPS) * 2 + (t // (8 * WARPS)) % 2) * 8 + t % 8
        w_rows, w_ok = _weight_rows(m_of_t, pid_n, N, BLOCK_M, GATE_UP, INTERLEAVED)

        if FP8:
            rmax = _row_scale_max(s_base, w_rows, w_ok, K, SROW, WARPS, gl.SliceLayout(1, gl.SliceLayout(2, LW)))
            rmax = rmax[:, None]
        else:
            rmax = 0
        ring = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_T * CHUNKS, 64], a_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for j in gl.static_range(STAGES):
            mbarrier.init(bars.index(j), count=1)
        NK: gl.constexpr = K // 64
        # The first two steps' codes before the grid wait (the weights are never written).
        wa, sa = _load_codes(w_base, s_base, w_rows, w_ok, 0, True, K, SROW, LW)
        wb, sb = _load_codes(w_base, s_base, w_rows, w_ok, 1, 1 < NK, K, SROW, LW)
        _grid_wait(PDL)
        _grid_release(PDL)
        if CHUNKS == 1:
            _gemm_tile(a_desc, ring, bars, e, start, end, pid_n, wa, sa, wb, sb, rmax, w_base, s_base, w_rows,
                       w_ok, order_ptr, b_ptr, stride_be, tw_ptr, y_ptr, stride_y, alpha, limit, up_offset, cs_ptr,
                       out_scale, K, N, SROW, GATE_UP, INTERLEAVED, HAS_BIAS, HAS_LIMIT, BLOCK_M, BLOCK_T, WARPS,
                       STAGES, UNROLL, TWO_STEP, FP8, PACKED, CHUNKS, 1, MMA, AL, LW)  # fmt: skip
        elif end - start > BLOCK_T:
            _gemm_tile(a_desc, ring, bars, e, start, end, pid_n, wa, sa, wb, sb, rmax, w_base, s_base, w_rows,
                       w_ok, order_ptr, b_ptr, stride_be, tw_ptr, y_ptr, stride_y, alpha, limit, up_offset, cs_ptr,
                       out_scale, K, N, SROW, GATE_UP, INTERLEAVED, HAS_BIAS, HAS_LIMIT, BLOCK_M, BLOCK_T, WARPS,
                       STAGES, UNROLL, TWO_STEP, FP8, PACKED, CHUNKS, 2, MMA, AL, LW)  # fmt: skip
        else:
            _gemm_tile(a_desc, ring, bars, e, start, end, pid_n, wa, sa, wb, sb, rmax, w_base, s_base, w_rows,
                       w_ok, order_ptr, b_ptr, stride_be, tw_ptr, y_ptr, stride_y, alpha, limit, up_offset, cs_ptr,
                       out_scale, K, N, SROW, GATE_UP, INTERLEAVED, HAS_BIAS, HAS_LIMIT, BLOCK_M, BLOCK_T, WARPS,
                       STAGES, UNROLL, TWO_STEP, FP8, PACKED, CHUNKS, 1, MMA, AL, LW)  # fmt: skip


class PrefillTile(tuple):
    """``(block_m, block_t, warps, stages, unroll, chunks)``: weight rows per program (16 or 32 a warp:
    the wgmma's M side, 64 rows a warpgroup and MMA; with 32 a warp each activation tile feeds two
    MMAs, half the activation reads of 16 for the same weights, and measured slower: see
    ``layer.PREFILL_TILES``), sorted pairs per MMA (its N side), warps, activation tiles in flight (the TMA
    ring), K steps a round (1, 2 or 4: the round's steps decoded, in flight and retired together), and
    chunks of ``block_t`` pairs per program (1 or 2: the weights decoded once for both, the MMA and TMA
    of a chunk without pairs skipped; :func:`moe_prefill_gemm`)."""

    __slots__ = ()

    def __new__(cls, block_m: int, block_t: int, warps: int, stages: int = 4, unroll: int = 1, chunks: int = 1):
        if warps not in (4, 8):
            raise ValueError(f"warps: expected 4 or 8 (one or two warpgroups), got {warps}")
        if block_m not in (16 * warps, 32 * warps):
            raise ValueError(f"block_m: expected 16 * warps = {16 * warps} or 32 * warps = {32 * warps}, got {block_m}")
        if block_t not in (16, 32, 64, 128, 256):
            raise ValueError(f"block_t: expected 16, 32, 64, 128 or 256 (wgmma N), got {block_t}")
        if stages < 2:
            raise ValueError(f"stages: expected at least 2, got {stages}")
        if unroll not in (1, 2, 4):
            raise ValueError(f"unroll: expected 1, 2 or 4, got {unroll}")
        if stages < unroll:
            raise ValueError(
                f"stages: expected at least unroll = {unroll} (a round's tiles share the ring), got {stages}"
            )
        if chunks not in (1, 2):
            raise ValueError(f"chunks: expected 1 or 2, got {chunks}")
        return super().__new__(cls, (block_m, block_t, warps, stages, unroll, chunks))


@functools.cache
def _smem_layout(block_t: int, fp8: bool = False):
    return gl.NVMMASharedLayout.get_default_for([block_t, BLOCK_K], gl.float8e4nv if fp8 else gl.bfloat16)


def _descriptor(t, block_t: int) -> TensorDescriptor:
    return TensorDescriptor.from_tensor(t, [block_t, BLOCK_K], _smem_layout(block_t, t.dtype == torch.float8_e4m3fn))


def _launch(desc, offsets, order, w, s, bias, tw, y, *, pairs, experts, gate_up, interleaved, activation, tile,
            two_step, cs=None, out_scale=1.0, packed=False):  # fmt: skip
    block_m, block_t, warps, stages, unroll, chunks = tile
    fp8 = desc.base.dtype == torch.float8_e4m3fn
    n = w.shape[1]
    k_dim = w.shape[2] * 2
    n_tiles = cdiv(n // 2, block_m // 2) if gate_up else cdiv(n, block_m)
    # Every non-empty expert adds at most one partial tile.
    m_tiles = cdiv(pairs, block_t * chunks) + min(experts, pairs)
    limit = activation.limit
    cached(moe_prefill_gemm)[(n_tiles, m_tiles)](
        desc, offsets, order, w, w.stride(0), s, s.stride(0), bias if bias is not None else y,
        bias.stride(0) if bias is not None else 0, tw, y, y.stride(0),
        float(activation.alpha), float(limit if limit is not None else 0.0), float(activation.up_offset),
        cs if cs is not None else tw, float(out_scale),
        K=k_dim, N=n, SROW=s.stride(1), E=experts, E_P2=max(32 * warps, next_power_of_2(experts)),
        GATE_UP=gate_up, INTERLEAVED=interleaved, HAS_BIAS=bias is not None, HAS_LIMIT=limit is not None,
        # The W4A8 table decodes every scale byte: TWO_STEP (the bf16 decode's variant) would only
        # add a specialization there.
        BLOCK_M=block_m, BLOCK_T=block_t, WARPS=warps, STAGES=stages, UNROLL=unroll, TWO_STEP=two_step and not fp8,
        FP8=fp8, PACKED=packed, CHUNKS=chunks, num_warps=warps, **pdl_kwargs(),
    )  # fmt: skip


def run_prefill(x, topk_weights, topk_ids, weights, activation, result, *, tiles, two_step,
                scratch=None, fp8=False, packed=False):  # fmt: skip
    """The prefill path of ``hopper.moe_apply`` into ``result``: sort and offsets (:func:`sort_by_expert`),
    gather, two grouped GEMMs, combine (no host sync). ``scratch`` (a dict; debugging) receives the
    intermediates: ``order``, ``offsets``, ``xs``, ``inter``, ``y``. ``fp8``: W4A8 (e4m3 activations
    with a scale a pair for the gate/up GEMM; ``w4a8_inter_scale`` for the down GEMM's). ``packed``: the
    codes are in the layout of :mod:`.packed` (bf16 only)."""
    if fp8 and packed:
        raise ValueError("weights: the W4A8 decode reads canonical codes, not the packed layout")
    t, h = x.shape
    k = topk_ids.shape[1]
    pairs = t * k
    experts, i = weights.num_experts, weights.intermediate
    gu_tile, down_tile = tiles
    order, offsets = sort_by_expert(topk_ids.reshape(-1).contiguous(), experts)
    tw = topk_weights.reshape(-1).contiguous()
    block = 1024
    act = torch.float8_e4m3fn if fp8 else x.dtype
    xs = torch.empty((pairs, h), dtype=act, device=x.device)
    if fp8:
        xscale = torch.empty(pairs, dtype=torch.float32, device=x.device)
        cached(gather_rows_fp8)[(pairs,)](x, x.stride(0), order, xs, xscale, h, TOP_K=k,
                                          BLOCK=next_power_of_2(h), **pdl_kwargs())  # fmt: skip
        q = w4a8_inter_scale(activation)
    else:
        xscale, q = None, 1.0
        cached(gather_rows)[(pairs, cdiv(h, block))](x, x.stride(0), order, xs, h, TOP_K=k, BLOCK=block,
                                                             PACKED=packed, **pdl_kwargs())  # fmt: skip
    inter = torch.empty((pairs, i), dtype=act, device=x.device)
    common = dict(pairs=pairs, experts=experts, activation=activation, two_step=two_step, packed=packed)
    _launch(_descriptor(xs, gu_tile[1]), offsets, order, weights.w13, weights.w13_scale, weights.w13_bias, tw, inter,
            gate_up=True, interleaved=weights.gate_up_interleaved, tile=gu_tile, cs=xscale, out_scale=q,
            **common)  # fmt: skip
    y = torch.empty((1, pairs, h), dtype=torch.float32, device=x.device)
    _launch(_descriptor(inter, down_tile[1]), offsets, order, weights.w2, weights.w2_scale, weights.w2_bias, tw,
            y[0], gate_up=False, interleaved=True, tile=down_tile, out_scale=1.0 / q, **common)  # fmt: skip
    cached(combine_slots)[(t, cdiv(h, block))](y, result, result.stride(0), y.stride(0), h, TOP_K=k, KSPLIT=1,
                                                      BLOCK=block, **pdl_kwargs())  # fmt: skip
    if scratch is not None:
        scratch.update(order=order, offsets=offsets, xs=xs, inter=inter, y=y[0], xscale=xscale)
    return result

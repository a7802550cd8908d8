"""Portable Triton sampling: greedy argmax and the index-order top-k / top-p sampler.

``argmax`` spreads one row of a large vocabulary (GPT-OSS: 201088) over many
programs in one launch: each reduces a fixed chunk to a (value, first index) pair
in the stream's scratch and counts its arrival on the row's counter of the stream
(``tokenspeed_kernel.launch.stream_counters``); the row's last chunk to arrive
reduces the row's pairs (as decode attention merges its splits). NaN counts as the
largest value (the first NaN wins), as in ``torch.argmax``.

``top_k_top_p_sample`` follows ``tokenspeed_kernel.ops.sampling``'s definition exactly,
without sorting the vocabulary. It works on the unnormalised weights
``e_i = exp(x_i - max x)``, ``x = logits / temperature`` (the softmax's normalisation
cancels out of every comparison); for e >= 0 the fp32 bit pattern ("key") orders like
the value. Every pass spreads a row over chunks of ``block * steps`` entries, one
program each, and passes hand results on through small per-row scratch (histograms
summed with integer atomics, fp64 partial masses written per chunk and added in chunk
order), so the result is the same on every run and nothing syncs with the host:

1. top-k: the k-th largest logit is found by an exact radix select on the logit's
   order-preserving key, 8 bits a pass (256-bucket count histograms: 2 passes for bf16,
   3 for fp16, 4 for fp32; the first also writes each chunk's max). Its weight
   ``T_k = exp(L_k / t - x_max)`` is the top-k threshold: ``e_i >= T_k`` are kept (ties
   included), exactly the k largest weights (exp is monotone).
2. candidates: one pass computes ``e``, compacts the top-k set into a per-row list
   (rows with top-k), builds the first top-p histogram and each chunk's kept mass. A row
   whose top-k set fits the list (``cap`` entries) is finished by one program (of the
   next pass's launch): it sorts the list for the top-p threshold (as the reference
   does) and walks it in index order.
3. top-p, other rows: the threshold is the largest kept weight t with
   ``M(t) = sum(e_i >= t) >= need = top_p * kept mass``. Passes narrow a key interval
   [lo, hi) that holds it (``M(hi) < need``): each counts the interval's entries in 256
   sub-intervals and adds the exact masses M(lo) and M(hi). A sub-interval's mass lies
   between its count times its lowest and its highest weight, which bounds M at every
   sub-interval start from both ends; the next interval is the run of sub-intervals
   where those bounds straddle ``need`` (in a simulation over 80 GPT-OSS-sized rows,
   flat to peaked, at most 6 entries were left after three passes with fp32 logits,
   331 with bf16 logits, whose many exact ties share one key). The first
   interval is the top 32 binades of weights (1/8-binade sub-intervals); if M(lo) falls
   short there, the search moves below it. The entries left are compacted and sorted by
   one program, which finds the exact threshold; if more than ``cap`` remain (massive
   ties), that program runs an exact multi-probe search over its row instead (slow, rare).
4. sample: each chunk's kept mass (fp64), then the chunk where the running mass passes
   ``u * kept mass`` walks its entries in index order.

Masses accumulate in fp64 (as the reference's do), so the sampled token matches the
reference's for the same uniform except where fp rounding ties two choices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tokenspeed_kernel.graphs import GraphCache, in_place_key, tensor_key
from tokenspeed_kernel.launch import cached, cdiv, next_power_of_2, stream_counters, stream_scratch

from ._host import RowConfig, arch_family, row_config

__all__ = [
    "ARGMAX_CONFIGS",
    "SAMPLE_CONFIGS",
    "SampleConfig",
    "argmax",
    "sample_config",
    "top_k_top_p_sample",
    "TRITON_KERNELS",
]

#: argmax, per family: ``block`` elements per step, ``rows`` steps per chunk (a chunk is
#: block * rows logits; 201088 / 4096 -> 50 chunks per row). Not tuned on hardware; the
#: interpreter's small chunks send test rows through the split path.
ARGMAX_CONFIGS: dict[str, RowConfig] = {
    "nvidia": RowConfig(block=1024, rows=4, num_warps=4),
    "amd": RowConfig(block=1024, rows=4, num_warps=4),
    "interpret": RowConfig(block=128, rows=2),
}


@dataclass(frozen=True)
class SampleConfig:
    """Sampler: each program of a full pass owns ``block * steps`` vocabulary entries of
    one row; ``cap``: candidates a single program sorts to finish a row (the top-k set, or
    the entries left around the top-p threshold); ``probes``: thresholds per pass of the
    exact per-row search used when more than ``cap`` entries tie around the threshold."""

    block: int
    steps: int
    cap: int
    probes: int = 16
    num_warps: int = 8


# Sampler: 8192 entries per program puts a 64 x 201088 batch on 1600 programs (~12 per
# H200 SM) with 16-byte loads (8 bf16 per thread per step at 8 warps); 1024 candidates
# cover top-k up to ~1000 and the entries left in the top-p interval after three
# 256-bucket narrowing passes. Reasoned, not yet measured (the previous one-program-per-row
# search took 5.3 ms at 64 x 201088 on the H200). The interpreter's tiny chunks and cap
# send test rows through every path (several chunks, overflowing candidate sets).
SAMPLE_CONFIGS: dict[str, SampleConfig] = {
    "nvidia": SampleConfig(block=2048, steps=4, cap=1024, probes=16, num_warps=8),
    "amd": SampleConfig(block=2048, steps=4, cap=1024, probes=16, num_warps=8),
    "interpret": SampleConfig(block=256, steps=2, cap=16, probes=8, num_warps=4),
}


def sample_config(device: torch.device) -> SampleConfig:
    return SAMPLE_CONFIGS[arch_family(device)]


_INT_MAX = tl.constexpr(2147483647)
#: Buckets of every histogram pass (8 key bits).
_BUCKETS = tl.constexpr(256)
#: One past 1.0's fp32 bits: no weight reaches it.
_KEY_TOP = tl.constexpr(0x3F800001)

# Per-row int32 scratch: these slots, then the top-k histograms (one per key level),
# then the three top-p histograms. Zeroed per call (counters, histograms, flags).
_SLOT_TOPK_PREFIX = tl.constexpr(0)  # + level: top-k key prefix after that many levels (levels 1..3)
_SLOT_TOPK_LEFT = tl.constexpr(4)  # + level: entries still to pass at that level
_SLOT_TOPK_KEY = tl.constexpr(8)  # key of T_k (0: no top-k)
_SLOT_TOPP_LO = tl.constexpr(9)  # + g - 1: top-p interval after selection g (g = 1, 2, 3)
_SLOT_TOPP_HI = tl.constexpr(12)  # + g - 1
_SLOT_LIST_COUNT = tl.constexpr(15)  # + list: entries appended to a candidate list (0: top-k set, 1: top-p interval)
_SLOT_DONE = tl.constexpr(17)  # the row is sampled
_SLOT_FINAL_KEY = tl.constexpr(18)  # key of the final threshold (rows not finished from the top-k list)
_INT_SLOTS = tl.constexpr(20)
# Per-row fp64 scratch: x_max, need, then per-chunk partials (kept mass, M(lo) of the
# interval of passes 0..3, M(hi) of passes 1..3, final kept mass): partial j of chunk c at
# 2 + j * n_chunks + c.
_F64_X_MAX, _F64_NEED, _F64_PARTIALS = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
_PART_KEPT, _PART_MASS_LO, _PART_MASS_HI, _PART_FINAL, _N_PARTS = (
    tl.constexpr(0),  # kept mass
    tl.constexpr(1),  # + pass (0..3): M(lo) of that pass's interval
    tl.constexpr(5),  # + pass - 1 (passes 1..3): M(hi) of that pass's interval
    tl.constexpr(8),  # final kept mass
    tl.constexpr(9),
)
#: The first top-p interval spans the top 32 binades of weights (keys within 2**28 of
#: 1.0), in 1/8-binade buckets; lighter weights are one lump below it.
_FIRST_SPAN = tl.constexpr(1 << 28)


@triton.jit
def _argmax_kernel(
    x_ptr, out_ptr, part_ptr, counter_ptr, V, stride_x, n_chunks,
    BLOCK: tl.constexpr, STEPS: tl.constexpr, BLOCK_C: tl.constexpr, SPLIT: tl.constexpr,
):  # fmt: skip
    """The max (NaN if the chunk has one) and its first index over ``BLOCK * STEPS`` logits; without ``SPLIT`` (one
    chunk a row) that index is the row's answer, else the row's last chunk to arrive reduces the row's pairs
    (``part_ptr``: per row, ``n_chunks`` values then ``n_chunks`` indices as fp32 bits)."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    start = chunk * (BLOCK * STEPS)
    best = tl.full((), float("-inf"), tl.float32)
    best_idx = start
    nan_idx = tl.full((), _INT_MAX, tl.int32)
    for step in tl.static_range(STEPS):
        cols = start + step * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * stride_x + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        is_nan = x != x
        nan_idx = tl.minimum(nan_idx, tl.min(tl.where(is_nan, cols, _INT_MAX), axis=0))
        x = tl.where(is_nan, float("-inf"), x)
        m = tl.max(x, axis=0)
        # First index of the block max; a later block must be strictly larger to win.
        i = tl.min(tl.where(x == m, cols, _INT_MAX), axis=0)
        take = m > best
        best_idx = tl.where(take, i, best_idx)
        best = tl.where(take, m, best)
    has_nan = nan_idx < _INT_MAX
    idx = tl.where(has_nan, nan_idx, best_idx).to(tl.int32)
    if not SPLIT:
        tl.store(out_ptr + row, idx.to(tl.int64))
    else:
        base = part_ptr + row * (2 * n_chunks)
        tl.store(base + chunk, tl.where(has_nan, float("nan"), best))
        tl.store(base + n_chunks + chunk, idx.to(tl.float32, bitcast=True))
        # Publish the pair (a CTA barrier, then a release at GPU scope) and count it: the chunk that brings the
        # row's counter to n_chunks zeroes it and reduces the row (no program ever waits).
        tl.debug_barrier()
        counter = counter_ptr + row
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == n_chunks - 1:
            tl.store(counter, 0)  # every chunk of this row has arrived: zero for the next launch
            tl.debug_barrier()
            c = tl.arange(0, BLOCK_C)
            ok = c < n_chunks
            # (names of their own: a variable the branch shares with the code above must keep its type)
            pv = tl.load(base + c, mask=ok, other=float("-inf"), cache_modifier=".cg")
            pi = tl.load(base + n_chunks + c, mask=ok, other=0.0, cache_modifier=".cg").to(tl.int32, bitcast=True)
            pi = tl.where(ok, pi, _INT_MAX)
            p_nan = pv != pv
            nan_i = tl.min(tl.where(p_nan & ok, pi, _INT_MAX), axis=0)
            pv = tl.where(p_nan, float("-inf"), pv)
            pm = tl.max(pv, axis=0)
            # Chunks are in index order, so the smallest index among the tied maxima is the first.
            first = tl.min(tl.where((pv == pm) & ok, pi, _INT_MAX), axis=0)
            tl.store(out_ptr + row, tl.where(nan_i < _INT_MAX, nan_i, first).to(tl.int64))


# --------------------------------------------------------------------------- top-k / top-p


@triton.jit
def _logit_key(x):
    """fp32 -> uint32 key ordered like the values (-0 folded into +0; NaN is out of contract)."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)
    u = bits.to(tl.uint32, bitcast=True)
    return tl.where(bits >= 0, u | 0x80000000, u ^ 0xFFFFFFFF)


@triton.jit
def _key_logit(key):
    """uint32 key -> the fp32 logit (inverse of :func:`_logit_key`)."""
    bits = tl.where(key >= 0x80000000, key ^ 0x80000000, key ^ 0xFFFFFFFF)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _row_scratch(scratch_i32_ptr, scratch_f64_ptr, b, n_chunks, LEVELS: tl.constexpr):
    """Row ``b``'s int32 scratch (slots, then LEVELS + 3 histograms) and fp64 scratch
    (slots, then the per-chunk partials)."""
    row_i32 = scratch_i32_ptr + b * (_INT_SLOTS + (LEVELS + 3) * _BUCKETS)
    row_f64 = scratch_f64_ptr + b * (_F64_PARTIALS + _N_PARTS * n_chunks)
    return row_i32, row_f64


@triton.jit
def _weights(x_row, cols, V, t, x_max):
    """The unnormalised weights ``e = exp(x / t - x_max)`` of logits ``cols`` (0 past V)."""
    x = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    return tl.exp(tl.div_rn(x, t) - x_max)


@triton.jit
def _kth_digit(h, k_left):
    """One radix-select level over the digit histogram ``h``: the digit d of the k_left-th
    largest entry (the largest d with count(digit >= d) >= k_left) and k_left minus the entries
    with a larger digit."""
    j = tl.arange(0, _BUCKETS)
    above = tl.sum(h, axis=0) - tl.cumsum(h, axis=0)
    d = tl.max(tl.where(above + h >= k_left, j, -1), axis=0)
    return d, k_left - tl.sum(tl.where(j == d, above, 0), axis=0)


@triton.jit
def _shift_for(width):
    """The smallest s with (width - 1) >> s < 256: key k of a width-key interval from lo
    falls in bucket (k - lo) >> s."""
    s = tl.full((), 0, tl.int32)
    while ((width - 1) >> s) >= _BUCKETS:
        s += 1
    return s


@triton.jit
def _sum_parts(ptr, n):
    """Sum of n fp64 per-chunk partials, in chunk order (every kernel gets the same bits)."""
    acc = tl.zeros((), dtype=tl.float64)
    for i in range(n):
        acc += tl.load(ptr + i)
    return acc


@triton.jit
def _topp_select(h, lo, hi, mass_lo, mass_hi, need, topk_key):
    """The next top-p interval from [lo, hi): ``h`` counts its entries in 256
    sub-intervals, ``mass_lo`` / ``mass_hi`` are the exact M(lo) / M(hi) (M(t) = kept mass of
    weights >= t; M(hi) < need always holds). If M(lo) < need the threshold lies below:
    [topk_key, lo). Else a sub-interval's mass lies between its count times its lowest and
    its highest weight, which bounds M at every sub-interval start from above (M(hi) +
    the sub-intervals up to hi) and from below (M(lo) - those down to lo); the new
    interval runs from the highest start whose M is surely >= need to the first start
    above the highest whose M may be >= need."""
    s = _shift_for(hi - lo)
    j = tl.arange(0, _BUCKETS)
    start = lo + (j << s)
    valid = start < hi
    end = tl.minimum(start + (1 << s), hi)
    count = h.to(tl.float64)
    w_lo = tl.where(valid, start, 0).to(tl.float32, bitcast=True).to(tl.float64)
    w_hi = tl.where(valid, end - 1, 0).to(tl.float32, bitcast=True).to(tl.float64)
    # A hair wider than exact: the masses compared later are fp64 sums of fp32 weights.
    upper = tl.where(valid, count * w_hi, 0.0) * (1.0 + 2.0**-40)
    lower = tl.where(valid, count * w_lo, 0.0) * (1.0 - 2.0**-40)
    upper_below = tl.cumsum(upper, axis=0) - upper  # sub-intervals under start j
    lower_below = tl.cumsum(lower, axis=0) - lower
    m_upper = tl.minimum(mass_hi + (tl.sum(upper, axis=0) - upper_below), mass_lo - lower_below)
    m_lower = tl.maximum(mass_hi + (tl.sum(lower, axis=0) - lower_below), mass_lo - upper_below)
    j_hi = tl.max(tl.where(valid & (m_upper >= need), j, 0), axis=0)
    j_lo = tl.minimum(tl.max(tl.where(valid & (m_lower >= need), j, 0), axis=0), j_hi)
    new_lo = tl.where(mass_lo >= need, lo + (j_lo << s), topk_key)
    new_hi = tl.where(mass_lo >= need, tl.minimum(lo + ((j_hi + 1) << s), hi), lo)
    return new_lo, new_hi


@triton.jit
def _append(count_ptr, cand_i_ptr, cand_e_ptr, take, cols, e, CAP: tl.constexpr):
    """Append the entries ``take`` of one block to a row's candidate list (slot order is
    the atomics' order; every reader sorts, so results do not depend on it)."""
    n = tl.sum(take.to(tl.int32), axis=0)
    if n > 0:  # most blocks of a top-k row hold none: no atomic, no scan
        base = tl.atomic_add(count_ptr, n)
        pos = base + tl.cumsum(take.to(tl.int32), axis=0) - 1
        ok = take & (pos < CAP)
        tl.store(cand_i_ptr + pos, cols, mask=ok)
        tl.store(cand_e_ptr + pos, e, mask=ok)


@triton.jit
def _topk_pass_kernel(
    logits_ptr,
    top_k_ptr,
    pmax_ptr,
    scratch_i32_ptr,
    V,
    stride_row,
    n_chunks,
    LEVEL: tl.constexpr,
    LEVELS: tl.constexpr,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
):
    """Radix-select level LEVEL of the k-th largest logit: count the digit (key bits
    24 - 8 LEVEL .. 31 - 8 LEVEL) of the entries whose higher digits match the levels
    chosen so far. Level 0 also writes each chunk's max logit."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    x_row = logits_ptr + b.to(tl.int64) * stride_row
    row_i32 = scratch_i32_ptr + b * (_INT_SLOTS + (LEVELS + 3) * _BUCKETS)
    k = tl.load(top_k_ptr + b)
    has_topk = (k > 0) & (k < V)
    start = c * (BLOCK * STEPS)
    if LEVEL == 0:
        l_max = tl.full((), float("-inf"), tl.float32)
        hist = tl.zeros((_BUCKETS,), dtype=tl.int32)
        for step in tl.static_range(STEPS):
            cols = start + step * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            l_max = tl.maximum(l_max, tl.max(x, axis=0))
            digit = (_logit_key(x) >> 24).to(tl.int32)
            hist += tl.histogram(digit, _BUCKETS, mask=tl.where(has_topk, cols < V, False))
        tl.store(pmax_ptr + b * n_chunks + c, l_max)
        if has_topk:
            tl.atomic_add(row_i32 + _INT_SLOTS + tl.arange(0, _BUCKETS), hist)
    elif has_topk:
        if LEVEL == 1:
            d, k_left = _kth_digit(tl.load(row_i32 + _INT_SLOTS + tl.arange(0, _BUCKETS)), k)
            prefix = d.to(tl.uint32)
        else:
            h = tl.load(row_i32 + _INT_SLOTS + (LEVEL - 1) * _BUCKETS + tl.arange(0, _BUCKETS))
            d, k_left = _kth_digit(h, tl.load(row_i32 + _SLOT_TOPK_LEFT + LEVEL - 1))
            prefix = (tl.load(row_i32 + _SLOT_TOPK_PREFIX + LEVEL - 1).to(tl.uint32, bitcast=True) << 8) | d.to(
                tl.uint32
            )
        if c == 0:  # for the next level (this launch's programs all computed the same)
            tl.store(row_i32 + _SLOT_TOPK_PREFIX + LEVEL, prefix.to(tl.int32, bitcast=True))
            tl.store(row_i32 + _SLOT_TOPK_LEFT + LEVEL, k_left)
        hist = tl.zeros((_BUCKETS,), dtype=tl.int32)
        for step in tl.static_range(STEPS):
            cols = start + step * BLOCK + tl.arange(0, BLOCK)
            x = tl.load(x_row + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            key = _logit_key(x)
            match = (cols < V) & ((key >> (32 - 8 * LEVEL)) == prefix)
            hist += tl.histogram(((key >> (24 - 8 * LEVEL)) & 0xFF).to(tl.int32), _BUCKETS, mask=match)
        tl.atomic_add(row_i32 + _INT_SLOTS + LEVEL * _BUCKETS + tl.arange(0, _BUCKETS), hist)


@triton.jit
def _candidates_kernel(
    logits_ptr,
    top_k_ptr,
    top_p_ptr,
    temperature_ptr,
    pmax_ptr,
    scratch_i32_ptr,
    scratch_f64_ptr,
    cand_i_ptr,
    cand_e_ptr,
    V,
    stride_row,
    n_chunks,
    LEVELS: tl.constexpr,
    CAP: tl.constexpr,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """The weights e: the top-k threshold, the top-k candidate list, the first top-p
    histogram (over [T_k, 1]) and each chunk's kept mass."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    x_row = logits_ptr + b.to(tl.int64) * stride_row
    row_i32, row_f64 = _row_scratch(scratch_i32_ptr, scratch_f64_ptr, b, n_chunks, LEVELS)
    k = tl.load(top_k_ptr + b)
    has_topk = (k > 0) & (k < V)
    has_topp = tl.load(top_p_ptr + b) < 1.0
    t = tl.load(temperature_ptr + b)
    # Division by t > 0 is monotone: max(x) = max(logits) / t (IEEE division, as the reference's).
    chunk_ids = tl.arange(0, BLOCK_C)
    l_max = tl.max(tl.load(pmax_ptr + b * n_chunks + chunk_ids, mask=chunk_ids < n_chunks, other=float("-inf")), axis=0)
    x_max = tl.div_rn(l_max, t)
    topk_key = tl.full((), 0, tl.int32)
    if has_topk:
        h = tl.load(row_i32 + _INT_SLOTS + (LEVELS - 1) * _BUCKETS + tl.arange(0, _BUCKETS))
        d, _ = _kth_digit(h, tl.load(row_i32 + _SLOT_TOPK_LEFT + LEVELS - 1))
        key = (tl.load(row_i32 + _SLOT_TOPK_PREFIX + LEVELS - 1).to(tl.uint32, bitcast=True) << 8) | d.to(tl.uint32)
        l_k = _key_logit(key << (32 - 8 * LEVELS))  # the lower key bits are zero in this dtype
        topk_key = tl.exp(tl.div_rn(l_k, t) - x_max).to(tl.int32, bitcast=True)
    if c == 0:
        tl.store(row_f64 + _F64_X_MAX, x_max.to(tl.float64))
        tl.store(row_i32 + _SLOT_TOPK_KEY, topk_key)
    lo = tl.maximum(topk_key, _KEY_TOP - _FIRST_SPAN)
    shift = _shift_for(_KEY_TOP - lo)
    hist = tl.zeros((_BUCKETS,), dtype=tl.int32)
    kept_mass = tl.zeros((), dtype=tl.float64)
    mass_lo = tl.zeros((), dtype=tl.float64)
    start = c * (BLOCK * STEPS)
    for step in tl.static_range(STEPS):
        cols = start + step * BLOCK + tl.arange(0, BLOCK)
        e = _weights(x_row, cols, V, t, x_max)
        e_key = e.to(tl.int32, bitcast=True)
        kept = (cols < V) & (e_key >= topk_key)
        kept_mass += tl.sum(tl.where(kept, e, 0.0).to(tl.float64), axis=0)
        inside = (cols < V) & (e_key >= lo)
        mass_lo += tl.sum(tl.where(inside, e, 0.0).to(tl.float64), axis=0)
        hist += tl.histogram(
            tl.where(inside, (e_key - lo) >> shift, 0), _BUCKETS, mask=tl.where(has_topp, inside, False)
        )
        if has_topk:
            _append(row_i32 + _SLOT_LIST_COUNT, cand_i_ptr + b * CAP, cand_e_ptr + b * CAP, kept, cols, e, CAP)
    tl.store(row_f64 + _F64_PARTIALS + _PART_KEPT * n_chunks + c, kept_mass)
    tl.store(row_f64 + _F64_PARTIALS + _PART_MASS_LO * n_chunks + c, mass_lo)
    if has_topp:
        tl.atomic_add(row_i32 + _INT_SLOTS + LEVELS * _BUCKETS + tl.arange(0, _BUCKETS), hist)


@triton.jit
def _sorted_weights(e, valid):
    """Keys of the valid weights sorted descending (invalid slots -1, last) and their
    weights in fp64 (0 for invalid slots)."""
    keys = tl.sort(tl.where(valid, e.to(tl.int32, bitcast=True), -1), descending=True)
    return keys, tl.where(keys >= 0, keys, 0).to(tl.float32, bitcast=True).to(tl.float64)


@triton.jit
def _sample_list(idx, e, valid, thr_key, u, V):
    """The sample among list entries (index, weight) with weight key >= thr_key: the first
    index, in index order, whose running weight exceeds u times the total."""
    pack = tl.where(valid, (idx.to(tl.int64) << 32) | e.to(tl.int32, bitcast=True).to(tl.int64), _INT_MAX << 32)
    pack = tl.sort(pack)
    sidx = (pack >> 32).to(tl.int32)
    skey = (pack & 0xFFFFFFFF).to(tl.int32)
    w = tl.where((sidx < V) & (skey >= thr_key), skey.to(tl.float32, bitcast=True), 0.0).to(tl.float64)
    cdf = tl.cumsum(w, axis=0)
    target = u.to(tl.float64) * tl.max(cdf, axis=0)
    found = tl.min(tl.where(cdf > target, sidx, _INT_MAX), axis=0)
    # rounding can leave the whole mass at or below the target: the last weighted entry
    last = tl.max(tl.where(w > 0, sidx, -1), axis=0)
    return tl.where(found < _INT_MAX, found, last)


@triton.jit
def _finish_topk(row_i32, cand_i_ptr, cand_e_ptr, out_ptr, b, n, top_p, u, V, CAP: tl.constexpr):
    """A row whose top-k set fits the list: top-p over the list sorted by weight (the
    reference's own procedure), then the sample in index order."""
    i = tl.arange(0, CAP)
    valid = i < n
    idx = tl.load(cand_i_ptr + b * CAP + i, mask=valid, other=0)
    e = tl.load(cand_e_ptr + b * CAP + i, mask=valid, other=0.0)
    thr_key = tl.full((), 0, tl.int32)
    if top_p < 1.0:
        keys, w = _sorted_weights(e, valid)
        running = tl.cumsum(w, axis=0)
        need = top_p.to(tl.float64) * tl.max(running, axis=0)
        first = tl.minimum(tl.sum((running < need).to(tl.int32), axis=0), n - 1)
        thr_key = tl.sum(tl.where(i == first, keys, 0), axis=0)
    token = _sample_list(idx, e, valid, thr_key, u, V)
    tl.store(out_ptr + b, token.to(tl.int64))
    tl.store(row_i32 + _SLOT_DONE, 1)


@triton.jit
def _topp_pass_kernel(
    logits_ptr,
    top_k_ptr,
    top_p_ptr,
    temperature_ptr,
    uniform_ptr,
    scratch_i32_ptr,
    scratch_f64_ptr,
    cand_i_ptr,
    cand_e_ptr,
    out_ptr,
    V,
    stride_row,
    n_chunks,
    PASS: tl.constexpr,
    LEVELS: tl.constexpr,
    CAP: tl.constexpr,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
):
    """Pass 1 first finishes the rows whose top-k set fits the candidate list (chunk 0's
    program; no extra launch). Then top-p narrowing pass PASS (1, 2, 3) of the other
    rows: select the interval from the previous histogram, count its entries in 256
    sub-intervals (passes 1, 2) or append them to the candidate list (pass 3), and add
    the exact masses from its ends."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    row_i32, row_f64 = _row_scratch(scratch_i32_ptr, scratch_f64_ptr, b, n_chunks, LEVELS)
    top_p = tl.load(top_p_ptr + b)
    if PASS == 1:
        # every program of the row sees the same count, so none waits for chunk 0's flag
        k = tl.load(top_k_ptr + b)
        n = tl.load(row_i32 + _SLOT_LIST_COUNT)
        listed = (k > 0) & (k < V) & (n <= CAP)
        if listed & (c == 0):
            _finish_topk(row_i32, cand_i_ptr, cand_e_ptr, out_ptr, b, n, top_p, tl.load(uniform_ptr + b), V, CAP)
        pending = listed == 0
    else:
        pending = tl.load(row_i32 + _SLOT_DONE) == 0
    if pending & (top_p < 1.0):
        x_row = logits_ptr + b.to(tl.int64) * stride_row
        t = tl.load(temperature_ptr + b)
        x_max = tl.load(row_f64 + _F64_X_MAX).to(tl.float32)
        topk_key = tl.load(row_i32 + _SLOT_TOPK_KEY)
        mass_lo = _sum_parts(row_f64 + _F64_PARTIALS + (_PART_MASS_LO + PASS - 1) * n_chunks, n_chunks)
        if PASS == 1:
            lo = tl.maximum(topk_key, _KEY_TOP - _FIRST_SPAN)
            hi = tl.full((), _KEY_TOP, tl.int32)
            mass_hi = tl.zeros((), dtype=tl.float64)
            need = top_p.to(tl.float64) * _sum_parts(row_f64 + _F64_PARTIALS + _PART_KEPT * n_chunks, n_chunks)
            if c == 0:
                tl.store(row_f64 + _F64_NEED, need)
        else:
            lo = tl.load(row_i32 + _SLOT_TOPP_LO + PASS - 2)
            hi = tl.load(row_i32 + _SLOT_TOPP_HI + PASS - 2)
            mass_hi = _sum_parts(row_f64 + _F64_PARTIALS + (_PART_MASS_HI + PASS - 2) * n_chunks, n_chunks)
            need = tl.load(row_f64 + _F64_NEED)
        h = tl.load(row_i32 + _INT_SLOTS + (LEVELS + PASS - 1) * _BUCKETS + tl.arange(0, _BUCKETS))
        lo, hi = _topp_select(h, lo, hi, mass_lo, mass_hi, need, topk_key)
        if c == 0:
            tl.store(row_i32 + _SLOT_TOPP_LO + PASS - 1, lo)
            tl.store(row_i32 + _SLOT_TOPP_HI + PASS - 1, hi)
        shift = _shift_for(hi - lo)
        hist = tl.zeros((_BUCKETS,), dtype=tl.int32)
        above = tl.zeros((), dtype=tl.float64)
        from_lo = tl.zeros((), dtype=tl.float64)
        start = c * (BLOCK * STEPS)
        for step in tl.static_range(STEPS):
            cols = start + step * BLOCK + tl.arange(0, BLOCK)
            e = _weights(x_row, cols, V, t, x_max)
            e_key = e.to(tl.int32, bitcast=True)
            above += tl.sum(tl.where((cols < V) & (e_key >= hi), e, 0.0).to(tl.float64), axis=0)
            from_lo += tl.sum(tl.where((cols < V) & (e_key >= lo), e, 0.0).to(tl.float64), axis=0)
            inside = (cols < V) & (e_key >= lo) & (e_key < hi)
            if PASS == 3:
                _append(
                    row_i32 + _SLOT_LIST_COUNT + 1, cand_i_ptr + b * CAP, cand_e_ptr + b * CAP, inside, cols, e, CAP
                )
            else:
                hist += tl.histogram(tl.where(inside, (e_key - lo) >> shift, 0), _BUCKETS, mask=inside)
        tl.store(row_f64 + _F64_PARTIALS + (_PART_MASS_HI + PASS - 1) * n_chunks + c, above)
        tl.store(row_f64 + _F64_PARTIALS + (_PART_MASS_LO + PASS) * n_chunks + c, from_lo)
        if PASS < 3:
            tl.atomic_add(row_i32 + _INT_SLOTS + (LEVELS + PASS) * _BUCKETS + tl.arange(0, _BUCKETS), hist)


@triton.jit
def _topp_threshold_kernel(
    logits_ptr,
    top_p_ptr,
    temperature_ptr,
    scratch_i32_ptr,
    scratch_f64_ptr,
    cand_e_ptr,
    V,
    stride_row,
    n_chunks,
    LEVELS: tl.constexpr,
    CAP: tl.constexpr,
    BLOCK: tl.constexpr,
    PROBES: tl.constexpr,
):
    """The final threshold key of rows not finished: T_k without top-p; with top-p, the
    exact threshold from the entries left in the last interval (sorted, with the exact
    mass above it), or, past ``CAP`` of them, from an exact search over the row."""
    b = tl.program_id(0)
    row_i32, row_f64 = _row_scratch(scratch_i32_ptr, scratch_f64_ptr, b, n_chunks, LEVELS)
    if tl.load(row_i32 + _SLOT_DONE) == 0:
        thr = tl.load(row_i32 + _SLOT_TOPK_KEY)
        if tl.load(top_p_ptr + b) < 1.0:
            lo = tl.load(row_i32 + _SLOT_TOPP_LO + 2)
            hi = tl.load(row_i32 + _SLOT_TOPP_HI + 2)
            need = tl.load(row_f64 + _F64_NEED)
            n = tl.load(row_i32 + _SLOT_LIST_COUNT + 1)
            if n <= CAP:
                i = tl.arange(0, CAP)
                keys, w = _sorted_weights(tl.load(cand_e_ptr + b * CAP + i, mask=i < n, other=0.0), i < n)
                # as the reference: the first position (in descending order) whose running
                # mass reaches need; everything above the interval comes first
                running = _sum_parts(row_f64 + _F64_PARTIALS + (_PART_MASS_HI + 2) * n_chunks, n_chunks) + tl.cumsum(
                    w, axis=0
                )
                first = tl.minimum(tl.sum(((i < n) & (running < need)).to(tl.int32), axis=0), n - 1)
                thr = tl.where(n > 0, tl.sum(tl.where(i == first, keys, 0), axis=0), lo)
            else:
                thr = _exact_threshold(
                    logits_ptr + b.to(tl.int64) * stride_row,
                    V,
                    tl.load(temperature_ptr + b),
                    tl.load(row_f64 + _F64_X_MAX).to(tl.float32),
                    lo,
                    hi,
                    need,
                    BLOCK,
                    PROBES,
                )
        tl.store(row_i32 + _SLOT_FINAL_KEY, thr)


@triton.jit
def _exact_threshold(x_row, V, t, x_max, lo, hi, need, BLOCK: tl.constexpr, PROBES: tl.constexpr):
    """Largest key in [lo, hi) with M(key) >= need, by multi-probe search over the whole
    row (each pass tests PROBES keys; M(lo) >= need > M(hi) holds throughout)."""
    probe = tl.arange(0, PROBES) + 1
    while hi - lo > 1:
        step = tl.maximum((hi - lo) // (PROBES + 1), 1)
        cand = lo + step * probe
        mass = tl.zeros((PROBES,), dtype=tl.float64)
        for start in range(0, V, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            e = _weights(x_row, cols, V, t, x_max)
            e_key = e.to(tl.int32, bitcast=True)
            mass += tl.sum(tl.where(e_key[None, :] >= cand[:, None], e[None, :], 0.0).to(tl.float64), axis=1)
        ok = mass >= need
        lo = tl.maximum(lo, tl.max(tl.where(ok, cand, lo), axis=0))
        hi = tl.minimum(hi, tl.min(tl.where(ok, hi, cand), axis=0))
    return lo


@triton.jit
def _final_mass_kernel(
    logits_ptr,
    temperature_ptr,
    scratch_i32_ptr,
    scratch_f64_ptr,
    V,
    stride_row,
    n_chunks,
    LEVELS: tl.constexpr,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
):
    """Each chunk's kept mass (weights with key >= the final threshold), fp64."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    row_i32, row_f64 = _row_scratch(scratch_i32_ptr, scratch_f64_ptr, b, n_chunks, LEVELS)
    if tl.load(row_i32 + _SLOT_DONE) == 0:
        x_row = logits_ptr + b.to(tl.int64) * stride_row
        t = tl.load(temperature_ptr + b)
        x_max = tl.load(row_f64 + _F64_X_MAX).to(tl.float32)
        thr = tl.load(row_i32 + _SLOT_FINAL_KEY)
        mass = tl.zeros((), dtype=tl.float64)
        start = c * (BLOCK * STEPS)
        for step in tl.static_range(STEPS):
            cols = start + step * BLOCK + tl.arange(0, BLOCK)
            e = _weights(x_row, cols, V, t, x_max)
            mass += tl.sum(tl.where((cols < V) & (e.to(tl.int32, bitcast=True) >= thr), e, 0.0).to(tl.float64), 0)
        tl.store(row_f64 + _F64_PARTIALS + _PART_FINAL * n_chunks + c, mass)


@triton.jit
def _final_pick_kernel(
    logits_ptr,
    temperature_ptr,
    uniform_ptr,
    scratch_i32_ptr,
    scratch_f64_ptr,
    out_ptr,
    V,
    stride_row,
    n_chunks,
    LEVELS: tl.constexpr,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
):
    """The chunk where the running kept mass (chunk order) passes u times the total walks
    its entries in index order and writes the sample."""
    b = tl.program_id(0)
    c = tl.program_id(1)
    row_i32, row_f64 = _row_scratch(scratch_i32_ptr, scratch_f64_ptr, b, n_chunks, LEVELS)
    if tl.load(row_i32 + _SLOT_DONE) == 0:
        parts = row_f64 + _F64_PARTIALS + _PART_FINAL * n_chunks
        # mass before this chunk, the total and the last chunk with mass, in chunk order:
        # every program computes the same fp64 sums, so exactly one owns the target
        before = tl.zeros((), dtype=tl.float64)
        total = tl.zeros((), dtype=tl.float64)
        last_c = tl.full((), -1, tl.int32)
        for i in range(n_chunks):
            m = tl.load(parts + i)
            before = tl.where(i == c, total, before)
            total += m
            last_c = tl.where(m > 0, i, last_c)
        mine = tl.load(parts + c)
        target = tl.load(uniform_ptr + b).to(tl.float64) * total
        in_mine = (before <= target) & (target < before + mine) & (mine > 0)
        # rounding can leave the target at or past the total: the last kept entry
        if in_mine | ((target >= total) & (c == last_c)):
            x_row = logits_ptr + b.to(tl.int64) * stride_row
            t = tl.load(temperature_ptr + b)
            x_max = tl.load(row_f64 + _F64_X_MAX).to(tl.float32)
            thr = tl.load(row_i32 + _SLOT_FINAL_KEY)
            running = before
            found = tl.full((), _INT_MAX, tl.int32)
            last = tl.full((), -1, tl.int32)
            start = c * (BLOCK * STEPS)
            for step in tl.static_range(STEPS):
                cols = start + step * BLOCK + tl.arange(0, BLOCK)
                e = _weights(x_row, cols, V, t, x_max)
                w = tl.where((cols < V) & (e.to(tl.int32, bitcast=True) >= thr), e, 0.0).to(tl.float64)
                cdf = running + tl.cumsum(w, axis=0)
                found = tl.minimum(found, tl.min(tl.where(cdf > target, cols, _INT_MAX), axis=0))
                last = tl.maximum(last, tl.max(tl.where(w > 0, cols, -1), axis=0))
                running = tl.max(cdf, axis=0)
            tl.store(out_ptr + b, tl.where(found < _INT_MAX, found, last).to(tl.int64))


TRITON_KERNELS = {
    "argmax": _argmax_kernel,
    "sample_topk_pass": _topk_pass_kernel,
    "sample_candidates": _candidates_kernel,
    "sample_topp_pass": _topp_pass_kernel,
    "sample_topp_threshold": _topp_threshold_kernel,
    "sample_final_mass": _final_mass_kernel,
    "sample_final_pick": _final_pick_kernel,
}

#: Radix-select levels (8 key bits each) by logits dtype: the fp32 bits of a bf16 / fp16
#: value end in 16 / 13 zero bits.
_KEY_LEVELS = {torch.bfloat16: 2, torch.float16: 3, torch.float32: 4}


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """Index of the largest logit per row (first on ties; the first NaN if a row has one).

    Args:
        logits: ``[B, V]`` bf16/fp16/fp32, last dim contiguous.

    Returns:
        ``int64 [B]``.
    """
    b, v = logits.shape
    out = torch.empty((b,), dtype=torch.int64, device=logits.device)
    if b == 0:
        return out
    if v == 0:
        raise ValueError("logits: argmax needs at least one column")
    cfg = row_config(ARGMAX_CONFIGS, logits.device)
    block = min(cfg.block, next_power_of_2(v))
    steps = min(cfg.rows, cdiv(v, block))
    n_chunks = cdiv(v, block * steps)
    if n_chunks == 1:  # one chunk a row: its index is the answer (out stands in for the unused buffers)
        parts = counters = out
    else:  # written and reduced by this launch: the stream's scratch and counters (nothing allocated but out)
        parts, counters = stream_scratch(logits.device, 2 * b * n_chunks), stream_counters(logits.device, b)
    cached(_argmax_kernel)[(b, n_chunks)](
        logits, out, parts, counters, v, logits.stride(0), n_chunks,
        BLOCK=block, STEPS=steps, BLOCK_C=next_power_of_2(n_chunks), SPLIT=n_chunks > 1, num_warps=cfg.num_warps,
    )  # fmt: skip
    return out


#: Eager calls replay a CUDA graph of the sampler's launches (ten or more a call), captured per shape at its
#: second call (``tokenspeed_kernel.graphs``), for logits of at most this many bytes: each graph keeps a copy of
#: its logits (4 MiB: 10 rows of GPT-OSS's 201088 bf16 logits), so the graphs hold at most 64 MiB of copies.
#: Larger batches launch directly; there the device time (``bench --host``'s graph column) is the larger cost.
GRAPH_MAX_LOGIT_BYTES = 4 << 20
_GRAPHS = GraphCache("triton.top_k_top_p_sample", max_graphs=16)


def top_k_top_p_sample(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    temperature: torch.Tensor,
    uniform: torch.Tensor,
    *,
    graphs: bool = True,
) -> torch.Tensor:
    """One token per row of ``logits [B, V]`` (definition in :mod:`tokenspeed_kernel.ops.sampling`).

    An eager CUDA call with logits of at most :data:`GRAPH_MAX_LOGIT_BYTES` replays a graph of the launches
    captured for its shape (``graphs=False``: launch directly). ``logits`` and ``uniform`` are copied into the
    graph's buffers; ``top_k``, ``top_p`` and ``temperature`` are read where they are, so their addresses are
    part of the graph's key (the op's scalar parameters are tensors built once: ``tokenspeed_kernel.ops.sampling``).

    Args:
        logits: ``[B, V]`` bf16/fp16/fp32, last dim contiguous.
        top_k: ``int32 [B]``; 0 (or >= V) keeps every token.
        top_p: ``float32 [B]`` in (0, 1]; 1 keeps what top-k kept.
        temperature: ``float32 [B]``, > 0.
        uniform: ``float32 [B]`` in [0, 1), each row's random number.

    Returns:
        ``int64 [B]``.
    """
    b, v = logits.shape
    if (
        graphs
        and b
        and v
        and b * v * logits.element_size() <= GRAPH_MAX_LOGIT_BYTES
        and _GRAPHS.usable(logits, top_k, top_p, temperature, uniform)
    ):
        key = (tensor_key(logits), tensor_key(uniform), in_place_key(top_k, top_p, temperature))
        return _GRAPHS.run(
            key, (logits, uniform), lambda x, u: top_k_top_p_sample(x, top_k, top_p, temperature, u, graphs=False)
        )
    out = torch.empty((b,), dtype=torch.int64, device=logits.device)
    if b == 0:
        return out
    if v == 0:
        raise ValueError("logits: sampling needs at least one column")
    cfg = sample_config(logits.device)
    dev = logits.device
    levels = _KEY_LEVELS[logits.dtype]
    block = min(cfg.block, next_power_of_2(v))
    n_chunks = cdiv(v, block * cfg.steps)
    # per-row scratch: int32 slots + histograms (zeroed: counters and atomics start at 0),
    # fp64 slots + per-chunk partials, chunk maxima, the candidate list
    scratch_i32 = torch.zeros((b, _INT_SLOTS.value + (levels + 3) * _BUCKETS.value), dtype=torch.int32, device=dev)
    scratch_f64 = torch.empty((b, _F64_PARTIALS.value + _N_PARTS.value * n_chunks), dtype=torch.float64, device=dev)
    pmax = torch.empty((b, n_chunks), dtype=torch.float32, device=dev)
    cand_i = torch.empty((b, cfg.cap), dtype=torch.int32, device=dev)
    cand_e = torch.empty((b, cfg.cap), dtype=torch.float32, device=dev)
    grid = (b, n_chunks)
    common = dict(BLOCK=block, STEPS=cfg.steps, num_warps=cfg.num_warps)
    stride = logits.stride(0)
    for level in range(levels):
        cached(_topk_pass_kernel)[grid](
            logits, top_k, pmax, scratch_i32, v, stride, n_chunks, LEVEL=level, LEVELS=levels, **common
        )
    cached(_candidates_kernel)[grid](
        logits, top_k, top_p, temperature, pmax, scratch_i32, scratch_f64, cand_i, cand_e, v, stride, n_chunks,
        LEVELS=levels, CAP=cfg.cap, BLOCK_C=next_power_of_2(n_chunks), **common,
    )  # fmt: skip
    for p in (1, 2, 3):
        cached(_topp_pass_kernel)[grid](
            logits, top_k, top_p, temperature, uniform, scratch_i32, scratch_f64, cand_i, cand_e, out, v, stride, n_chunks,
            PASS=p, LEVELS=levels, CAP=cfg.cap, **common,
        )  # fmt: skip
    cached(_topp_threshold_kernel)[(b,)](
        logits, top_p, temperature, scratch_i32, scratch_f64, cand_e, v, stride, n_chunks,
        LEVELS=levels, CAP=cfg.cap, BLOCK=block, PROBES=cfg.probes, num_warps=cfg.num_warps,
    )  # fmt: skip
    cached(_final_mass_kernel)[grid](
        logits, temperature, scratch_i32, scratch_f64, v, stride, n_chunks, LEVELS=levels, **common
    )
    cached(_final_pick_kernel)[grid](
        logits, temperature, uniform, scratch_i32, scratch_f64, out, v, stride, n_chunks, LEVELS=levels, **common
    )
    return out

"""The tensor-core GEMV of the MXFP4 MoE for Hopper (sm90): one or two tokens a call, ``mma.m16n8k16`` f16 with the
MX blocks on the N axis.

:mod:`.gemv` decodes every weight to fp32 and multiplies on the CUDA cores: about five instructions a value, and its
gate/up kernel is issue-bound. Here a warp decodes codes to f16 pairs with the same e4m3 conversion
(``cvt.rn.f16x2.e4m3x2``, exact) and hands them to the tensor cores, which multiply and sum in fp32:

- **The MMA's N axis holds MX blocks, not tokens.** In a chunk of 4 MX blocks (128 values) of 16 rows, lane
  ``(r, c)`` (``r = lane // 4``, ``c = lane % 4``) loads 16 bytes (32 codes, ``LDG.128``) of block ``c`` of rows
  ``r`` and ``r + 8`` and decodes them into its A fragments: every ``k`` a lane supplies belongs to block ``c``. The
  B fragment of lane ``(n, c)`` holds the activations of block ``c`` where ``n == c`` and zeros elsewhere, so column
  ``n`` of the product is the row's dot product with block ``n`` alone (columns 4..7 stay zero). Eight MMAs cover a
  chunk; each lane then applies the E8M0 scales of its (row, block) accumulators, one FMA each. ``k`` is a sum index,
  so the order in which a lane's codes meet the fragments is free: the activations are staged in the decode's order.
- **Activations as f16 with a power-of-two row scale.** Each program stages its activation rows in shared memory as
  f16 pairs (each 8-value word in the decode's order 0, 2, 4, 6, 1, 3, 5, 7), multiplied by ``2**t`` with ``t``
  from the row's largest magnitude (``2**14 <= amax * 2**t < 2**15``), and multiplies the sums by ``2**-t``. A bf16
  value within ``2**-28`` of the row's largest converts exactly; products of f16 and E2M1 are exact in fp32, and
  so the fp32 sums see the same terms as :mod:`.gemv`'s except for activations below that.
- **Scale bytes up to** :data:`ONE_STEP_MAX_SCALE` keep the sums in the scaled domain (``|acc| < 2**127`` for K up
  to ``2**16``); weights with a larger byte take ``BIG_SCALES``: each chunk's sums are unscaled before the scale.
  That gate/up variant spills a few registers in its loop (sm90, Triton 3.6: 14 local accesses a trip of four
  chunks), a cost only such weights pay.
- **Codes in flight**: a warp holds four chunks' codes and scales in registers, and each trip of the loop (unrolled by
  four: four independent MMA chains) first requests the next trip's four chunks into fresh registers. With its
  default register budget ptxas moves those loads to the end of the trip, after the MMAs (sm90, Triton 3.6; then
  ncu found a warp waiting for them at the top of every trip: 38 % of the gate/up's stall samples, session 32); a
  ``maxnreg`` cap above that budget (:class:`.layer.TcTile`) keeps most of them at the top.

A program runs ``WARPS = FW * KSPLIT`` warps: warp ``w`` takes row warp ``w % FW`` and the ``w // FW``-th of
``KSPLIT`` chunk ranges of K, and the program sums its ranges' partial rows in one fixed order: deterministic, no
atomics. Gate/up, program ``(pair, tile)``: row warp ``f`` holds ``G`` groups of 8 features (MMA row ``r`` the gate
row of a feature, ``r + 8`` its up row); after the sum, bias and SwiGLU: ``inter[pair, j] = bf16(swiglu(x[token] @
W13[e].T + b13[e]))``. Down, program ``(token, tile)`` of ``16 G`` output rows: row warp ``f`` is slot ``f``, and the
sum takes each slot's rows times its routing weight (biases in the first range).

Each warp stages its own chunk range of activations (the gate/up's one row is staged once when K is not split).

Measured on an H100 (host-cost report, sessions 31-32): numerically right, but not faster where it counts. With the
L2 flushed its gate/up took 27.9 us against :mod:`.gemv`'s 24.4 (ncu: 1.74 TB/s, 10 warps an SM waiting on loads);
splitting its K across warps made it slower still (30.3-33.0 us), and the public call took 35.9 us against the fp32
pair's 31.8. So the layer takes it only for forced :class:`.layer.TcTile` tiles.

``INT_DECODE`` (:class:`.layer.TcTile`'s ``decode="int"``) decodes with :func:`.gemv._decode_int` instead: integer
instructions only, ``E2M1 * 2**-14`` with the E2M1 0.5 an f16 subnormal, which the tensor cores take exactly (GPU
tests, session 35). Its gate/up was no faster on an H100 (``ti1,4@168`` 27.4 / 17.8 us flushed / hot against the
fp32 GEMV's 23.7 / 17.3).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.runtime.jit import constexpr_function

from .decode import _grid_release, _grid_wait, _swiglu
from .gemv import (  # gemv's decodes; block scale 2**(s - 121), bytes above 248 in two steps; L2 prefetches
    _decode,
    _decode_int,
    _prefetch_down_share,
    _prefetch_gate_up,
    _prefetch_rows,
    _scaled_add,
)

__all__ = ["moe_gemv_tc", "ONE_STEP_MAX_SCALE", "staged_bytes"]

#: Scale bytes up to this keep the scaled sums within fp32 for K up to 2**16; weights with a larger byte take the
#: kernel's ``BIG_SCALES`` variant (chosen from the largest byte, read once per weights object).
ONE_STEP_MAX_SCALE = 220


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def staged_bytes(rows: int, k: int, ksplit: int = 1) -> int:
    """The shared memory a program stages ``rows`` activation rows of ``k`` values in (f16, chunks of 128 values a
    row, each row's ``ksplit`` ranges padded to whole fours then a power of two chunks)."""
    chunks = -(-k // 128)
    ncp = -(-chunks // ksplit)
    return rows * ksplit * _pow2(-(-ncp // 4) * 4) * 256


def _mma_chunk_asm(decode=_decode) -> str:
    """PTX of one chunk a lane (pack 4): ``$0..$3`` the m16n8 fp32 accumulators (from zero), ``$4..$7`` the 4 code
    words of row ``r``, ``$8..$11`` those of row ``r + 8``, ``$12 + 4 q + p`` the B pair ``p`` of word ``q``. The codes
    decode to f16 ``E2M1 * 2**-6`` through e4m3 (:func:`.gemv._decode`) or to ``E2M1 * 2**-14`` with integer
    instructions (:func:`.gemv._decode_int`; the E2M1 subnormal 0.5 is then the f16 subnormal ``2**-15``)."""
    mma = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {$0, $1, $2, $3}, "
    body = ["{", ".reg .b32 t, e, o, a0, a1, a2, a3, b0, b1, b2, b3;", ".reg .b16 l, h;"]
    body += [f"mov.b32 ${i}, 0;" for i in range(4)]
    for q in range(4):
        body.append(decode(f"${4 + q}", ("a0", "a1", "a2", "a3")))
        body.append(decode(f"${8 + q}", ("b0", "b1", "b2", "b3")))
        x = 12 + 4 * q
        body.append(mma + f"{{a0, b0, a1, b1}}, {{${x}, ${x + 1}}}, {{$0, $1, $2, $3}};")
        body.append(mma + f"{{a2, b2, a3, b3}}, {{${x + 2}, ${x + 3}}}, {{$0, $1, $2, $3}};")
    body.append("}")
    return "\n".join(body)


_MMA_CHUNK: gl.constexpr = gl.constexpr(_mma_chunk_asm())
_MMA_CHUNK_INT: gl.constexpr = gl.constexpr(_mma_chunk_asm(_decode_int))


@constexpr_function
def _next_pow2(n):
    n = int(n)
    return 1 << max(0, (n - 1).bit_length())


@gluon.jit
def _iota(N: gl.constexpr, D: gl.constexpr, L: gl.constexpr):
    """``arange(N)`` along dim ``D`` of the 5-D layout ``L``, size 1 elsewhere."""
    if D == 0:
        v = gl.arange(0, N, layout=gl.SliceLayout(1, gl.SliceLayout(1, gl.SliceLayout(1, gl.SliceLayout(1, L)))))
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(v, 1), 1), 1), 1)
    elif D == 1:
        v = gl.arange(0, N, layout=gl.SliceLayout(1, gl.SliceLayout(1, gl.SliceLayout(1, gl.SliceLayout(0, L)))))
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(v, 1), 1), 1), 0)
    elif D == 2:
        v = gl.arange(0, N, layout=gl.SliceLayout(1, gl.SliceLayout(1, gl.SliceLayout(0, gl.SliceLayout(0, L)))))
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(v, 1), 1), 0), 0)
    elif D == 3:
        v = gl.arange(0, N, layout=gl.SliceLayout(1, gl.SliceLayout(0, gl.SliceLayout(0, gl.SliceLayout(0, L)))))
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(v, 1), 0), 0), 0)
    else:
        v = gl.arange(0, N, layout=gl.SliceLayout(0, gl.SliceLayout(0, gl.SliceLayout(0, gl.SliceLayout(0, L)))))
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(v, 0), 0), 0), 0)


@gluon.jit
def _iota4(N: gl.constexpr, D: gl.constexpr, L: gl.constexpr):
    """``arange(N)`` along dim ``D`` of the 4-D layout ``L``, size 1 elsewhere."""
    if D == 0:
        v = gl.arange(0, N, layout=gl.SliceLayout(1, gl.SliceLayout(1, gl.SliceLayout(1, L))))
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(v, 1), 1), 1)
    elif D == 1:
        v = gl.arange(0, N, layout=gl.SliceLayout(1, gl.SliceLayout(1, gl.SliceLayout(0, L))))
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(v, 1), 1), 0)
    elif D == 2:
        v = gl.arange(0, N, layout=gl.SliceLayout(1, gl.SliceLayout(0, gl.SliceLayout(0, L))))
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(v, 1), 0), 0)
    else:
        v = gl.arange(0, N, layout=gl.SliceLayout(0, gl.SliceLayout(0, gl.SliceLayout(0, L))))
        return gl.expand_dims(gl.expand_dims(gl.expand_dims(v, 0), 0), 0)


@gluon.jit
def _load_chunk(w_ptr, s_ptr, e, stride_we, stride_se, row_a, row_b, ok, ch, c, j, K: gl.constexpr,
                SROW: gl.constexpr, EVICT: gl.constexpr = ""):  # fmt: skip
    """Chunk ``ch``'s code words (rows ``row_a``, ``row_b``: ``uint32 [W, G, 8, 4 blocks, 4 words]``) and the scale
    bytes of the lane's accumulators (``[.., 4]``: row a blocks ``2 c``, ``2 c + 1``, then row b)."""
    NCH: gl.constexpr = K // 32
    blk = ch * 4 + c
    base = (w_ptr + e.to(gl.int64) * stride_we).to(gl.pointer_type(gl.uint32))
    wok = ok & (blk < NCH)
    wa = gl.load(base + (row_a * (K // 8) + blk * 4 + j), mask=wok, other=0, eviction_policy=EVICT)
    wb = gl.load(base + (row_b * (K // 8) + blk * 4 + j), mask=wok, other=0, eviction_policy=EVICT)
    sblk = ch * 4 + 2 * c + (j % 2)
    srow = gl.where(j < 2, row_a, row_b)
    sc = gl.load(s_ptr + e.to(gl.int64) * stride_se + (srow * SROW + sblk), mask=ok & (c < 2) & (sblk < NCH), other=0,
                 eviction_policy=EVICT)  # fmt: skip
    return wa, wb, sc


@gluon.jit
def _chunk(acc, wa, wb, sc, x_sm, i, diag, down5, LX: gl.constexpr, BIG_SCALES: gl.constexpr,
           INT_DECODE: gl.constexpr):  # fmt: skip
    """``acc`` plus chunk ``i``'s scaled block sums: the B fragments from ``x_sm`` (activations where ``diag``),
    eight MMAs a row group (:data:`_MMA_CHUNK`, or :data:`_MMA_CHUNK_INT`), then each accumulator times its E8M0
    scale."""
    b0 = gl.where(diag, gl.expand_dims(gl.expand_dims(x_sm.index(4 * i).load(LX), 1), 1), 0)
    b1 = gl.where(diag, gl.expand_dims(gl.expand_dims(x_sm.index(4 * i + 1).load(LX), 1), 1), 0)
    b2 = gl.where(diag, gl.expand_dims(gl.expand_dims(x_sm.index(4 * i + 2).load(LX), 1), 1), 0)
    b3 = gl.where(diag, gl.expand_dims(gl.expand_dims(x_sm.index(4 * i + 3).load(LX), 1), 1), 0)
    d = gl.inline_asm_elementwise(
        _MMA_CHUNK_INT if INT_DECODE else _MMA_CHUNK, "=f,=f,=f,=f" + ",r" * 24,
        [wa, wb, gl.broadcast(wa, b0)[1], gl.broadcast(wa, b1)[1], gl.broadcast(wa, b2)[1], gl.broadcast(wa, b3)[1]],
        dtype=gl.float32, is_pure=True, pack=4,
    )  # fmt: skip
    if BIG_SCALES:
        return _scaled_add(acc, d * down5, sc, True)
    return _scaled_add(acc, d, sc, False)


@gluon.jit
def moe_gemv_tc(
    x_ptr, stride_x, ids_ptr, tw_ptr, w_ptr, stride_we, s_ptr, stride_se, b_ptr, stride_be, y_ptr, stride_y,
    alpha, limit, up_offset, pw_ptr, pstride_we, ps_ptr, pstride_se,
    K: gl.constexpr, N: gl.constexpr, SROW: gl.constexpr, TOP_K: gl.constexpr, GATE_UP: gl.constexpr,
    INTERLEAVED: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_LIMIT: gl.constexpr, G: gl.constexpr,
    WARPS: gl.constexpr, KSPLIT: gl.constexpr, PDL: gl.constexpr, BIG_SCALES: gl.constexpr = True,
    INT_DECODE: gl.constexpr = False, PF_OWN: gl.constexpr = False, PF_DOWN: gl.constexpr = False,
    PF_SROW: gl.constexpr = 0, EVICT: gl.constexpr = "",
):  # fmt: skip
    """One GEMM (module doc). ``w``: uint8 ``[E, rows, K / 2]`` codes (``stride_we`` bytes an expert), ``s``: uint8
    ``[E, rows, K / 32]`` scales (row stride ``SROW``), ``b``: ``[E, rows]`` bias. ``N``: gate/up features (``I``;
    ``INTERLEAVED``: feature ``j``'s rows ``2 j``, ``2 j + 1``, else ``j``, ``I + j``) or down output rows.
    ``WARPS = FW * KSPLIT``: warp ``w`` takes row warp ``w % FW`` (gate/up: a feature tile; down: a slot, ``FW`` a
    power of two at least ``TOP_K``) and chunk range ``w // FW``. ``PF_OWN``, ``PF_DOWN`` (``pw``, ``ps``,
    ``PF_SROW``): :func:`.gemv.moe_gemv`'s L2 prefetches (a program's own rows; the gate/up's share of the down
    weights); ``EVICT``: the codes' and scales' loads' L2 eviction policy."""
    pid = gl.program_id(0)
    tile = gl.program_id(1)
    NCH: gl.constexpr = K // 32  # MX blocks a row
    NC: gl.constexpr = (NCH + 3) // 4  # chunks of 4 blocks
    NCP: gl.constexpr = (NC + KSPLIT - 1) // KSPLIT  # chunks a warp
    NCP2: gl.constexpr = _next_pow2((NCP + 3) // 4 * 4)  # staged chunks (the loop runs whole fours)
    # staged activation ranges: one a warp, except the gate/up's one row when it is not split
    XW: gl.constexpr = 1 if GATE_UP and KSPLIT == 1 else WARPS
    FW: gl.constexpr = WARPS // KSPLIT  # row warps (gate/up: feature tiles; down: slots)
    # [warp, row group, r (lane // 4), c (lane % 4), 4 per thread (code words / B pairs / accumulators)]
    LW: gl.constexpr = gl.BlockedLayout([1, G, 1, 1, 4], [1, 1, 8, 4, 1], [WARPS, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    w5 = _iota(WARPS, 0, LW)
    g5 = _iota(G, 1, LW)
    r5 = _iota(8, 2, LW)
    c5 = _iota(4, 3, LW)
    j5 = _iota(4, 4, LW)
    if GATE_UP:
        # The ids are the previous launch's output (the route): wait before reading them.
        _grid_wait(PDL)
        _grid_release(PDL)
        e = gl.load(ids_ptr + pid)
        if KSPLIT == 1:
            feat = ((tile * WARPS + w5) * G + g5) * 8 + r5  # [W, G, 8, 1, 1]
        else:
            feat = ((tile * FW + w5 % FW) * G + g5) * 8 + r5
        row_ok = feat < N
        if INTERLEAVED:
            row_a = 2 * feat
            row_b = 2 * feat + 1
        else:
            row_a = feat
            row_b = N + feat
        ok = row_ok
        x_row0 = pid // TOP_K
    else:
        # The ids and the routing weights were written two launches or more before this one (.decode's module doc):
        # the first codes are requested before the grid wait.
        slot = w5 % FW
        slot_ok = slot < TOP_K
        e = gl.load(ids_ptr + pid * TOP_K + slot, mask=slot_ok, other=0)  # [W, 1, 1, 1, 1]
        row_a = (tile * G + g5) * 16 + 2 * r5  # [1, G, 8, 1, 1]
        row_b = row_a + 1
        row_ok = row_a < N
        ok = row_ok & slot_ok
        x_row0 = pid * TOP_K
    if KSPLIT == 1:
        ch0 = 0
    else:
        ch0 = (w5 // FW) * NCP  # the warp's first chunk
    # Four chunks in flight: buffer u holds chunk i0 + u, refilled with chunk i0 + u + 4 once decoded.
    wa0, wb0, sc0 = _load_chunk(w_ptr, s_ptr, e, stride_we, stride_se, row_a, row_b, ok, ch0, c5, j5, K, SROW, EVICT)
    wa1, wb1, sc1 = _load_chunk(w_ptr, s_ptr, e, stride_we, stride_se, row_a, row_b, ok & (NCP > 1), ch0 + 1, c5, j5,
                                K, SROW, EVICT)  # fmt: skip
    wa2, wb2, sc2 = _load_chunk(w_ptr, s_ptr, e, stride_we, stride_se, row_a, row_b, ok & (NCP > 2), ch0 + 2, c5, j5,
                                K, SROW, EVICT)  # fmt: skip
    wa3, wb3, sc3 = _load_chunk(w_ptr, s_ptr, e, stride_we, stride_se, row_a, row_b, ok & (NCP > 3), ch0 + 3, c5, j5,
                                K, SROW, EVICT)  # fmt: skip
    # L2 prefetches once the first chunks are requested (.gemv.moe_gemv's; the down's before its grid wait)
    gl.static_assert(GATE_UP or not PF_DOWN, "PF_DOWN is the gate/up's prefetch of the down weights")
    FT: gl.constexpr = (WARPS // KSPLIT) * G * 8  # gate/up features of a program
    if GATE_UP:
        if PF_OWN:
            _prefetch_gate_up(w_ptr, s_ptr, e, stride_we, stride_se, tile * FT, FT, N, K, SROW, INTERLEAVED, WARPS)
        if PF_DOWN:
            _prefetch_down_share(pw_ptr, ps_ptr, e, pstride_we, pstride_se, tile, (N + FT - 1) // FT, K, N, PF_SROW,
                                 WARPS)  # fmt: skip
    else:
        if PF_OWN:
            n_own = gl.minimum(N - tile * G * 16, G * 16)
            for u in gl.static_range(TOP_K):
                e_u = gl.load(ids_ptr + pid * TOP_K + u)
                _prefetch_rows(w_ptr, s_ptr, e_u, stride_we, stride_se, tile * G * 16, n_own, G * 16, K, SROW, WARPS)
        _grid_wait(PDL)  # inter is the previous launch's output
        _grid_release(PDL)

    # Stage the activations: [range, chunk, block, word, 8 values] in K order, times 2**t, as f16 pairs in the decode's
    # order, into x_sm [chunk * 4 + word, range, block, pair]. All of a range's loads are issued at once: staging in
    # pieces (one latency each) made every launch 3-5 us slower (session 32, call 1).
    LS: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, 8], [1, 2, 4, 4, 1], [XW, WARPS // XW, 1, 1, 1], [4, 3, 2, 1, 0])
    sw = _iota(XW, 0, LS)
    si = _iota(NCP2, 1, LS)
    if XW == 1:
        sch = si
    else:
        sch = (sw // FW) * NCP + si
    if GATE_UP:
        s_row = x_row0 + sw * 0
        s_ok = si < NCP
    else:
        s_row = x_row0 + sw % FW
        s_ok = (sw % FW < TOP_K) & (si < NCP)
    sk = ((sch * 4 + _iota(4, 2, LS)) * 32 + _iota(4, 3, LS) * 8) + _iota(8, 4, LS)
    s_ok = s_ok & (sk < K)
    xv = gl.load(x_ptr + s_row.to(gl.int64) * stride_x + sk, mask=s_ok, other=0.0).to(gl.float32)
    amax = gl.max(gl.max(gl.max(gl.max(gl.abs(xv), 4), 3), 2), 1)  # [XW]
    t = gl.minimum(gl.maximum(141 - (amax.to(gl.int32, bitcast=True) >> 23), -126), 126)
    up = ((t + 127) << 23).to(gl.float32, bitcast=True)
    xh = (xv * up[:, None, None, None, None]).to(gl.float16)
    # value i = 4 a + 2 b + p1 of a word -> pair p = 2 p1 + a, half b
    xh = gl.permute(gl.reshape(xh, [XW, NCP2, 4, 4, 2, 2, 2]), [0, 1, 2, 3, 6, 4, 5])
    lo, hi = gl.split(gl.reshape(xh, [XW, NCP2, 4, 4, 4, 2]))
    pairs = lo.to(gl.uint16, bitcast=True).to(gl.uint32) | (hi.to(gl.uint16, bitcast=True).to(gl.uint32) << 16)
    x_st = gl.allocate_shared_memory(gl.uint32, [NCP2 * 4, XW, 4, 4], gl.SwizzledSharedLayout(1, 1, 1, [3, 2, 1, 0]))
    x_st.store(gl.reshape(gl.permute(pairs, [1, 3, 0, 2, 4]), [NCP2 * 4, XW, 4, 4]))
    # the same (unswizzled, row-major) bytes as a buffer of [range, block, pair] tiles
    x_sm = x_st._reinterpret(gl.uint32, [NCP2 * 4, XW, 4, 4], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    gl.thread_barrier()
    LX: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(1, LW))  # [range, block, pair]
    # 2**-t undoes the row scale; the integer decode's values are 2**8 smaller than the e4m3 one's (2**-14, 2**-6)
    EXP: gl.constexpr = 135 if INT_DECODE else 127
    down = gl.convert_layout(((EXP - t) << 23).to(gl.float32, bitcast=True), gl.SliceLayout(1, gl.SliceLayout(1, LX)))
    down5 = gl.expand_dims(gl.expand_dims(gl.expand_dims(gl.expand_dims(down, 1), 1), 1), 1)  # [XW, 1, 1, 1, 1]
    diag = r5 == c5  # the lanes whose B fragment holds activations

    acc = gl.zeros([WARPS, G, 8, 4, 4], gl.float32, LW)
    for i0 in range(0, NCP, 4):
        na0, nb0, ns0 = _load_chunk(w_ptr, s_ptr, e, stride_we, stride_se, row_a, row_b, ok & (i0 + 4 < NCP),
                                    ch0 + i0 + 4, c5, j5, K, SROW, EVICT)  # fmt: skip
        na1, nb1, ns1 = _load_chunk(w_ptr, s_ptr, e, stride_we, stride_se, row_a, row_b, ok & (i0 + 5 < NCP),
                                    ch0 + i0 + 5, c5, j5, K, SROW, EVICT)  # fmt: skip
        na2, nb2, ns2 = _load_chunk(w_ptr, s_ptr, e, stride_we, stride_se, row_a, row_b, ok & (i0 + 6 < NCP),
                                    ch0 + i0 + 6, c5, j5, K, SROW, EVICT)  # fmt: skip
        na3, nb3, ns3 = _load_chunk(w_ptr, s_ptr, e, stride_we, stride_se, row_a, row_b, ok & (i0 + 7 < NCP),
                                    ch0 + i0 + 7, c5, j5, K, SROW, EVICT)  # fmt: skip
        acc = _chunk(acc, wa0, wb0, sc0, x_sm, i0, diag, down5, LX, BIG_SCALES, INT_DECODE)
        acc = _chunk(acc, wa1, wb1, sc1, x_sm, i0 + 1, diag, down5, LX, BIG_SCALES, INT_DECODE)
        acc = _chunk(acc, wa2, wb2, sc2, x_sm, i0 + 2, diag, down5, LX, BIG_SCALES, INT_DECODE)
        acc = _chunk(acc, wa3, wb3, sc3, x_sm, i0 + 3, diag, down5, LX, BIG_SCALES, INT_DECODE)
        wa0, wb0, sc0 = na0, nb0, ns0
        wa1, wb1, sc1 = na1, nb1, ns1
        wa2, wb2, sc2 = na2, nb2, ns2
        wa3, wb3, sc3 = na3, nb3, ns3
    if not BIG_SCALES:
        acc = acc * down5
    # [W, G, 8, 4, (row, block col)] -> row sums [W, G, 8, 2 (row a, row b)], all four lanes of a quad
    LE: gl.constexpr = gl.BlockedLayout([1, G, 1, 2], [1, 1, 8, 4], [WARPS, 1, 1, 1], [3, 2, 1, 0])
    ab = gl.convert_layout(gl.sum(gl.sum(gl.reshape(acc, [WARPS, G, 8, 4, 2, 2]), 5), 3), LE)
    ew = _iota4(WARPS, 0, LE)
    eg = _iota4(G, 1, LE)
    er = _iota4(8, 2, LE)
    eh = _iota4(2, 3, LE)
    if GATE_UP:
        if KSPLIT > 1:
            # the ranges' partial rows, summed in range order: [FW, G, 8, 2]
            LE5: gl.constexpr = gl.BlockedLayout([1, 1, G, 1, 2], [1, 1, 1, 8, 4], [KSPLIT, FW, 1, 1, 1],
                                                 [4, 3, 2, 1, 0])  # fmt: skip
            ab = gl.sum(gl.convert_layout(gl.reshape(ab, [KSPLIT, FW, G, 8, 2]), LE5), 0)
            LF: gl.constexpr = gl.SliceLayout(0, LE5)
            ew = _iota4(FW, 0, LF)
            eg = _iota4(G, 1, LF)
            er = _iota4(8, 2, LF)
            eh = _iota4(2, 3, LF)
        feat = ((tile * FW + ew) * G + eg) * 8 + er  # [FW, G, 8, 1]
        if INTERLEAVED:
            rows = 2 * feat + eh
        else:
            rows = eh * N + feat
        if HAS_BIAS:
            ab += gl.load(b_ptr + e.to(gl.int64) * stride_be + rows, mask=feat < N, other=0.0).to(gl.float32)
        gate, upv = gl.split(ab)
        hv = _swiglu(gate, upv, alpha, limit, up_offset, HAS_LIMIT).to(gl.bfloat16)
        fo, _ = gl.split(gl.broadcast(feat, rows)[0])
        gl.store(y_ptr + pid.to(gl.int64) * stride_y + fo, hv.to(y_ptr.dtype.element_ty), mask=fo < N)
    else:
        slot = ew % FW
        s_ok = slot < TOP_K
        tw = gl.load(tw_ptr + pid * TOP_K + slot, mask=s_ok, other=0.0).to(gl.float32)  # [W, 1, 1, 1]
        rows = (tile * G + eg) * 16 + 2 * er + eh  # [1, G, 8, 2]
        if HAS_BIAS:
            ee = gl.load(ids_ptr + pid * TOP_K + slot, mask=s_ok, other=0)
            ab += gl.load(b_ptr + ee.to(gl.int64) * stride_be + rows, mask=s_ok & (ew < FW) & (rows < N),
                          other=0.0).to(gl.float32)  # fmt: skip
        out = gl.sum(tw * ab, 0)  # [G, 8, 2]: the warps' (slots', ranges') partial rows, one fixed order
        ro = gl.sum(rows, 0)
        gl.store(y_ptr + pid.to(gl.int64) * stride_y + ro, out.to(y_ptr.dtype.element_ty), mask=ro < N)

"""Gluon GEMV kernels of the MXFP4 MoE for Hopper (sm90): one token a program, fp32 FMAs, no MMA.

At one token a call (a decode step at batch 1) each of the ``TOP_K`` touched experts multiplies one activation
row. The MMA decode kernels (:mod:`.decode`) then spend an ``m16n8k16`` on 1 useful column of 8, and their
one-warp programs (about 250 registers, 8 an SM) wait on their own dependent chains: at one token their two
GEMMs took 39 us with the weights already in L2 (host-cost report, sessions 21-22). These kernels are built for
that case instead:

- **A lane owns one MX block of a row at a time**: 16 bytes of codes (32 values, one ``LDG.128``) and its scale
  byte. Lane ``c`` of a warp takes block ``32 p + c`` of each of its rows in pass ``p``
  (``cdiv(K / 32, 32)`` passes; GPT-OSS's K = 2880 is 90 blocks, 3 passes, the last one 26 lanes wide).
- **The activations of a pass sit in registers as fp32** (32 values a lane) and serve every row the thread owns
  (the two rows of a gate/up feature, ``FEATS`` features a warp; ``FEATS`` output rows of a slot's expert in the
  down GEMM): reading them costs nothing per weight value.
- **Decode through the hardware's e4m3 conversion**: a code's three magnitude bits, shifted to bits 2..4 of a byte,
  and its sign at bit 7 make the e4m3 byte of ``E2M1 * 2**-6`` (exactly, the E2M1 subnormal 0.5 included: e4m3's
  subnormals have the same step), and ``cvt.rn.f16x2.e4m3x2`` turns two such bytes into two f16. A 32-bit word
  (8 codes) costs about seven shifts and masks, four conversions, eight f16-to-f32 conversions and eight FMAs
  (:data:`_DOT8`, one inline-asm block a word).
- **The scale is applied once a block**: the block's fp32 dot product times ``2**(s - 121)`` (``2**6`` undoes
  the decode's ``2**-6``), one FMA into the row's accumulator. Products of bf16 activations and E2M1 values are
  exact in fp32, as in the MMA path; only the fp32 summation order differs from it.
- **Each program holds few registers** (no operand tiles, no ring), so many warps share an SM and hide each
  other's loads; the next pass's codes are requested before the current pass is decoded.

:func:`moe_gemv_gate_up`: program (pair, feature tile) writes ``inter[pair, j] = swiglu(x[token] @ W13[e].T +
b13[e])`` for ``FEATS * WARPS`` features ``j`` (fp32 values rounded to bf16, as the MMA path's bf16 ``inter``).
:func:`moe_gemv_down`: program (token, row tile) sums the token's ``TOP_K`` slots itself, one warp a slot:
``out[token, n] = sum_s w_s * (inter[pair_s] @ W2[e_s][n].T + b2[e_s][n])`` (the slots summed across warps in a
fixed order: deterministic). Two launches a call, no atomics, no split sums.

Every weight byte is read once a token: the kernels serve any token count, and pay for it above one token
(:data:`.layer.GEMV_MAX_TOKENS`). Both read the canonical layout (``hopper.moe_apply``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .decode import _grid_release, _grid_wait

__all__ = ["moe_gemv", "moe_gemv_down", "MAX_SLOTS", "ONE_STEP_MAX_SCALE"]

#: The down GEMM runs one warp a slot: ``TOP_K`` up to this many.
MAX_SLOTS = 8

#: ``$0 = sum_i decode(code i of word $1) * $(2 + i)``: the 8 E2M1 codes of a word (code i in bits 4 i .. 4 i + 3,
#: K order) as ``E2M1 * 2**-6`` through e4m3 bytes (even codes: nibble << 2 for the magnitude, the sign bit << 4;
#: odd codes: >> 2 and the sign in place), two bytes a ``cvt.rn.f16x2.e4m3x2`` (low byte -> low half), then fp32.
_DOT8: gl.constexpr = gl.constexpr("""{
.reg .b32 t, e, o, h0, h1, h2, h3;
.reg .b16 el, eh, ol, oh, v0, v1, v2, v3, v4, v5, v6, v7;
.reg .f32 f, a;
shl.b32 t, $1, 2;
and.b32 e, t, 0x1C1C1C1C;
shl.b32 t, $1, 4;
and.b32 t, t, 0x80808080;
or.b32 e, e, t;
shr.u32 t, $1, 2;
and.b32 o, t, 0x1C1C1C1C;
and.b32 t, $1, 0x80808080;
or.b32 o, o, t;
mov.b32 {el, eh}, e;
mov.b32 {ol, oh}, o;
cvt.rn.f16x2.e4m3x2 h0, el;
cvt.rn.f16x2.e4m3x2 h1, eh;
cvt.rn.f16x2.e4m3x2 h2, ol;
cvt.rn.f16x2.e4m3x2 h3, oh;
mov.b32 {v0, v2}, h0;
mov.b32 {v4, v6}, h1;
mov.b32 {v1, v3}, h2;
mov.b32 {v5, v7}, h3;
cvt.f32.f16 f, v0;
mul.rn.f32 a, f, $2;
cvt.f32.f16 f, v1;
fma.rn.f32 a, f, $3, a;
cvt.f32.f16 f, v2;
fma.rn.f32 a, f, $4, a;
cvt.f32.f16 f, v3;
fma.rn.f32 a, f, $5, a;
cvt.f32.f16 f, v4;
fma.rn.f32 a, f, $6, a;
cvt.f32.f16 f, v5;
fma.rn.f32 a, f, $7, a;
cvt.f32.f16 f, v6;
fma.rn.f32 a, f, $8, a;
cvt.f32.f16 f, v7;
fma.rn.f32 $0, f, $9, a;
}""")

#: E8M0 scale bytes above this take the block's ``2**6`` as a separate multiply (``2**(s - 121)`` is no fp32 then):
#: weights holding one take the kernels' ``BIG_SCALES`` variant (chosen from the largest byte, read once).
ONE_STEP_MAX_SCALE = 248
_ONE_STEP_MAX: gl.constexpr = gl.constexpr(ONE_STEP_MAX_SCALE)


@gluon.jit
def _nibble_columns(v, LD: gl.constexpr):
    """fp32 activations ``[..., 2, 2, 2]`` (the last three dims: code ``i = 4 a + 2 b + c`` of a word) -> the 8
    tensors ``[...]`` of codes 0..7 in layout ``LD`` (register relabelings: a thread holds its values either way)."""
    v0, v1 = gl.split(v)  # c
    v00, v01 = gl.split(v0)  # b
    v10, v11 = gl.split(v1)
    x0, x4 = gl.split(v00)  # a
    x2, x6 = gl.split(v01)
    x1, x5 = gl.split(v10)
    x3, x7 = gl.split(v11)
    return (gl.convert_layout(x0, LD), gl.convert_layout(x1, LD), gl.convert_layout(x2, LD),
            gl.convert_layout(x3, LD), gl.convert_layout(x4, LD), gl.convert_layout(x5, LD),
            gl.convert_layout(x6, LD), gl.convert_layout(x7, LD))  # fmt: skip


@gluon.jit
def _block_dots(words, x0, x1, x2, x3, x4, x5, x6, x7):
    """Code words ``uint32 [A, B, 32, 4]`` and the activations of codes 0..7 of each word (broadcastable to it)
    -> each MX block's dot product ``fp32 [A, B, 32]`` (of the values ``E2M1 * 2**-6``)."""
    part = gl.inline_asm_elementwise(
        _DOT8, "=f,r,f,f,f,f,f,f,f,f",
        [words, gl.broadcast(words, x0)[1], gl.broadcast(words, x1)[1], gl.broadcast(words, x2)[1],
         gl.broadcast(words, x3)[1], gl.broadcast(words, x4)[1], gl.broadcast(words, x5)[1],
         gl.broadcast(words, x6)[1], gl.broadcast(words, x7)[1]],
        dtype=gl.float32, is_pure=True, pack=1,
    )  # fmt: skip
    return gl.sum(part, axis=3)


@gluon.jit
def _scaled_add(acc, dots, sc, BIG_SCALES: gl.constexpr):
    """``acc + dots * 2**(sc - 121)`` for E8M0 bytes ``sc``. ``BIG_SCALES`` (some byte above
    :data:`ONE_STEP_MAX_SCALE`, whose ``2**(sc - 121)`` is no fp32): those take ``(dots * 64) * 2**(sc - 127)``."""
    s = sc.to(gl.uint32)
    if BIG_SCALES:
        big = s > _ONE_STEP_MAX
        factor = (gl.where(big, s, s + 6) << 23).to(gl.float32, bitcast=True)
        return gl.fma(gl.where(big, dots * 64.0, dots), factor, acc)
    return gl.fma(dots, ((s + 6) << 23).to(gl.float32, bitcast=True), acc)


@gluon.jit
def _swiglu(gate, up, alpha, limit, up_offset, HAS_LIMIT: gl.constexpr):
    if HAS_LIMIT:
        gate = gl.minimum(gate, limit)
        up = gl.minimum(gl.maximum(up, -limit), limit)
    return (up + up_offset) * gate * (1.0 / (1.0 + gl.exp(-(alpha * gate))))


@gluon.jit
def moe_gemv(
    x_ptr, stride_x, ids_ptr, tw_ptr, w_ptr, stride_we, s_ptr, stride_se, b_ptr, stride_be, y_ptr, stride_y,
    c_ptr, o_ptr, stride_o, alpha, limit, up_offset,
    K: gl.constexpr, I: gl.constexpr, SROW: gl.constexpr, TOP_K: gl.constexpr, GATE_UP: gl.constexpr,
    INTERLEAVED: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_LIMIT: gl.constexpr, FEATS: gl.constexpr,
    WARPS: gl.constexpr, PDL: gl.constexpr, BIG_SCALES: gl.constexpr = True, X_SMEM: gl.constexpr = True,
):  # fmt: skip
    """Program (pair, tile) of one GEMM over the ``2 FEATS WARPS`` weight rows of its tile (``FEATS * WARPS`` row
    pairs ``j``; ``I`` of them a row set), ``e = ids[pair]``. ``w``: uint8 ``[E, 2I, K / 2]`` codes (``stride_we``
    bytes an expert), ``s``: uint8 ``[E, 2I, K / 32]`` scales (row stride ``SROW``), ``b``: ``[E, 2I]`` bias.

    - ``GATE_UP``: ``y[pair, j] = bf16(swiglu(x[pair // TOP_K] @ W13[e].T + b13[e]))`` in ``y``'s dtype
      (``INTERLEAVED``: the gate/up rows of feature ``j`` are ``2 j``, ``2 j + 1``, else ``j``, ``I + j``);
    - down (``x`` = inter ``[pairs, K]``): ``y[pair, n] = tw[pair] * (x[pair] @ W2[e][n].T + b2[e][n])`` (fp32)
      for rows ``n = 2 j, 2 j + 1``; the last of a token's ``TOP_K`` programs of a tile to count itself on
      ``c[token, tile]`` (int32, zero before and left zero) sums the ``TOP_K`` rows in slot order into
      ``o[token, n]`` (deterministic).
    """
    pair = gl.program_id(0)
    tile = gl.program_id(1)
    if GATE_UP:
        # The ids are the previous launch's output (the route): wait before reading them.
        _grid_wait(PDL)
        _grid_release(PDL)
    FW: gl.constexpr = FEATS * WARPS
    NCH: gl.constexpr = K // 32  # MX blocks a row
    NP: gl.constexpr = (NCH + 31) // 32  # passes of 32 lanes
    # [feature, gate/up, lane (block), word]: a thread holds its features' two rows, one block of each (4 words).
    L4: gl.constexpr = gl.BlockedLayout([FEATS, 2, 1, 4], [1, 1, 32, 1], [WARPS, 1, 1, 1], [3, 2, 1, 0])
    L3: gl.constexpr = gl.SliceLayout(3, L4)
    LR: gl.constexpr = gl.SliceLayout(2, L3)  # [feature, gate/up]
    # A pass's activations: [lane (block), word, code], 32 values a lane; every warp loads its copy (from L1).
    LX: gl.constexpr = gl.BlockedLayout([1, 4, 8], [32, 1, 1], [WARPS, 1, 1], [2, 1, 0])
    LD: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, L4))  # [lane, word] of L4
    # Down: the ids and the routing weights were written two launches or more before this one, so they are complete
    # (.decode's module doc): the weights are requested before the grid wait.
    e = gl.load(ids_ptr + pair)
    tok = pair // TOP_K
    j = tile * FW + gl.arange(0, FW, layout=gl.SliceLayout(1, LR))
    h = gl.arange(0, 2, layout=gl.SliceLayout(0, LR))
    if INTERLEAVED or not GATE_UP:
        rows = 2 * j[:, None] + h[None, :]
    else:
        rows = h[None, :] * I + j[:, None]
    row_ok = (j < I)[:, None] & (h < 2)[None, :]
    c = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    wi = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L4))))[None, None, None, :]
    w_base = (w_ptr + e.to(gl.int64) * stride_we).to(gl.pointer_type(gl.uint32))
    s_base = s_ptr + e.to(gl.int64) * stride_se
    w_rows = (rows * (K // 8))[:, :, None]
    s_rows = (rows * SROW)[:, :, None]
    cx = gl.arange(0, 32, layout=gl.SliceLayout(1, gl.SliceLayout(2, LX)))
    kx = (gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(0, LX)))[:, None] * 8
          + gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(0, LX)))[None, :])[None, :, :]  # fmt: skip
    if GATE_UP:
        x_row = x_ptr + tok.to(gl.int64) * stride_x
    else:
        x_row = x_ptr + pair.to(gl.int64) * stride_x
    if HAS_BIAS:  # requested now: nothing waits on a load after the last pass
        bias = gl.load(b_ptr + e.to(gl.int64) * stride_be + rows, mask=row_ok, other=0.0)
    acc = gl.zeros([FW, 2, 32], gl.float32, L3)
    # Pass 0's codes, scales and activations; then each pass requests the next pass's before it decodes its own.
    ok = row_ok[:, :, None] & (c < NCH)[None, None, :]
    words = gl.load(w_base + ((w_rows + (c * 4)[None, None, :])[:, :, :, None] + wi), mask=ok[:, :, :, None], other=0)
    sc = gl.load(s_base + (s_rows + c[None, None, :]), mask=ok, other=0)
    if not GATE_UP:
        tw = gl.load(tw_ptr + pair).to(gl.float32)
        # inter is the previous launch's output.
        _grid_wait(PDL)
        _grid_release(PDL)
    if X_SMEM:
        # The activations once, as fp32, for every warp: [pass, lane, 32 values] (16-byte vectors swizzled by lane:
        # a lane's 128 bytes, read as 8 x 16, meet no other lane's bank within a quarter warp).
        LS: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [WARPS, 1], [1, 0])
        x_sm = gl.allocate_shared_memory(gl.float32, [NP, 32, 32], gl.SwizzledSharedLayout(4, 1, 8, [1, 0]))
        ks = (gl.arange(0, 32, layout=gl.SliceLayout(1, LS))[:, None] * 32
              + gl.arange(0, 32, layout=gl.SliceLayout(0, LS))[None, :])  # fmt: skip
        for p in gl.static_range(NP):
            x_sm.index(p).store(gl.load(x_row + (ks + p * 1024), mask=ks + p * 1024 < K, other=0.0).to(gl.float32))
        gl.thread_barrier()
        LXS: gl.constexpr = gl.BlockedLayout([1, 32], [32, 1], [WARPS, 1], [1, 0])
    else:
        xv = gl.load(x_row + (cx[:, None, None] * 32 + kx), mask=(cx < NCH)[:, None, None], other=0.0)
    for p in gl.static_range(NP):
        if p + 1 < NP:
            ch = (p + 1) * 32 + c
            ok_n = row_ok[:, :, None] & (ch < NCH)[None, None, :]
            words_n = gl.load(w_base + ((w_rows + (ch * 4)[None, None, :])[:, :, :, None] + wi),
                              mask=ok_n[:, :, :, None], other=0)  # fmt: skip
            sc_n = gl.load(s_base + (s_rows + ch[None, None, :]), mask=ok_n, other=0)
            if not X_SMEM:
                chx = (p + 1) * 32 + cx
                xv_n = gl.load(x_row + (chx[:, None, None] * 32 + kx), mask=(chx < NCH)[:, None, None], other=0.0)
        if X_SMEM:
            xf = gl.reshape(x_sm.index(p).load(LXS), [32, 4, 2, 2, 2])
        else:
            xf = gl.reshape(xv.to(gl.float32), [32, 4, 2, 2, 2])
        x0, x1, x2, x3, x4, x5, x6, x7 = _nibble_columns(xf, LD)
        dots = _block_dots(words, x0[None, None], x1[None, None], x2[None, None], x3[None, None], x4[None, None],
                           x5[None, None], x6[None, None], x7[None, None])  # fmt: skip
        acc = _scaled_add(acc, dots, sc, BIG_SCALES)
        if p + 1 < NP:
            words = words_n
            sc = sc_n
            if not X_SMEM:
                xv = xv_n
    out = gl.sum(acc, axis=2)  # [feature, gate/up]
    if HAS_BIAS:
        out = out + bias.to(gl.float32)
    if GATE_UP:
        gate, up = gl.split(out)
        hv = _swiglu(gate, up, alpha, limit, up_offset, HAS_LIMIT).to(gl.bfloat16)
        jo = gl.convert_layout(j, hv.type.layout)
        gl.store(y_ptr + pair.to(gl.int64) * stride_y + jo, hv.to(y_ptr.dtype.element_ty), mask=jo < I)
    else:
        y_rows = y_ptr + rows  # + pair * stride_y: row n of pair p at p * stride_y + n
        gl.store(y_rows + pair.to(gl.int64) * stride_y, out * tw, mask=row_ok)
        # Publish this program's rows (a CTA barrier, then a release at GPU scope) and count them.
        gl.thread_barrier()
        cnt = c_ptr + tok * gl.num_programs(1) + tile
        if gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu") == TOP_K - 1:
            gl.store(cnt, 0)  # every arrival of this call is in: zero for the next launch
            gl.thread_barrier()
            tot = gl.zeros([FW, 2], gl.float32, LR)
            for sl in gl.static_range(TOP_K):  # slot order
                tot += gl.load(y_rows + (tok * TOP_K + sl).to(gl.int64) * stride_y, mask=row_ok, cache_modifier=".cg")
            gl.store(o_ptr + tok.to(gl.int64) * stride_o + rows, tot.to(o_ptr.dtype.element_ty), mask=row_ok)


@gluon.jit
def moe_gemv_down(
    inter_ptr, stride_i, ids_ptr, tw_ptr, w_ptr, stride_we, s_ptr, stride_se, b_ptr, stride_be, out_ptr, stride_o,
    K: gl.constexpr, N: gl.constexpr, SROW: gl.constexpr, TOP_K: gl.constexpr, HAS_BIAS: gl.constexpr,
    FEATS: gl.constexpr, SLOTS: gl.constexpr, PDL: gl.constexpr, BIG_SCALES: gl.constexpr = True,
):  # fmt: skip
    """``out[token, n] = sum_s tw[pair_s] * (inter[pair_s] @ W2[e_s][n].T + b2[e_s][n])`` for the ``FEATS`` rows
    ``n`` of program (token, tile); ``pair_s = token * TOP_K + s``, ``e_s = ids[pair_s]``; one warp a slot
    (``SLOTS``: ``TOP_K`` rounded up to a power of two). ``inter``: ``[pairs, K]`` (:func:`moe_gemv`'s);
    ``w``: uint8 ``[E, N, K / 2]``, ``s``: uint8 ``[E, N, K / 32]``, ``b``: ``[E, N]``."""
    tok = gl.program_id(0)
    tile = gl.program_id(1)
    NCH: gl.constexpr = K // 32
    NB: gl.constexpr = 32  # blocks a pass
    NP: gl.constexpr = (NCH + NB - 1) // NB
    # [slot, row, block, word]: a warp a slot; a thread holds FEATS rows, one block of each.
    L4: gl.constexpr = gl.BlockedLayout([1, FEATS, 1, 4], [1, 1, 32, 1], [SLOTS, 1, 1, 1], [3, 2, 1, 0])
    L3: gl.constexpr = gl.SliceLayout(3, L4)
    LR: gl.constexpr = gl.SliceLayout(2, L3)  # [slot, row]
    LX: gl.constexpr = gl.BlockedLayout([1, 1, 4, 8], [1, 32, 1, 1], [SLOTS, 1, 1, 1], [3, 2, 1, 0])
    LD: gl.constexpr = gl.SliceLayout(1, L4)  # [slot, lane, word] of L4
    s = gl.arange(0, SLOTS, layout=gl.SliceLayout(1, LR))
    slot_ok = s < TOP_K
    pairs = tok * TOP_K + s
    # The ids and the routing weights were written two launches or more before this one, so they are complete
    # (.decode's module doc): the first codes are requested before the grid wait.
    e = gl.load(ids_ptr + pairs, mask=slot_ok, other=0).to(gl.int64)
    n = tile * FEATS + gl.arange(0, FEATS, layout=gl.SliceLayout(0, LR))
    row_ok = slot_ok[:, None] & (n < N)[None, :]
    c = gl.arange(0, NB, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    wi = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L4))))[None, None, None, :]
    w_base = (w_ptr + e * stride_we).to(gl.pointer_type(gl.uint32))[:, None, None, None]
    s_base = (s_ptr + e * stride_se)[:, None, None]
    w_rows = (n * (K // 8))[None, :, None]
    s_rows = (n * SROW)[None, :, None]
    ok = row_ok[:, :, None] & (c < NCH)[None, None, :]
    words = gl.load(w_base + ((w_rows + (c * 4)[None, None, :])[:, :, :, None] + wi), mask=ok[:, :, :, None], other=0)
    sc = gl.load(s_base + (s_rows + c[None, None, :]), mask=ok, other=0)
    tw = gl.load(tw_ptr + pairs, mask=slot_ok, other=0.0).to(gl.float32)
    if HAS_BIAS:
        bias = gl.load(b_ptr + e[:, None] * stride_be + n[None, :], mask=row_ok, other=0.0)
    # inter is the previous launch's output.
    _grid_wait(PDL)
    _grid_release(PDL)
    sx = gl.arange(0, SLOTS, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, LX))))
    x_rows = (inter_ptr + (tok * TOP_K + sx).to(gl.int64) * stride_i)[:, None, None, None]
    x_slot_ok = (sx < TOP_K)[:, None, None, None]
    cx = gl.arange(0, NB, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(0, LX))))
    kx = (gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(0, gl.SliceLayout(0, LX))))[:, None] * 8
          + gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(0, gl.SliceLayout(0, LX))))[None, :])[None, :, :]  # fmt: skip
    acc = gl.zeros([SLOTS, FEATS, NB], gl.float32, L3)
    xv = gl.load(x_rows + (cx[:, None, None] * 32 + kx)[None, :, :, :],
                 mask=x_slot_ok & (cx < NCH)[:, None, None][None, :, :, :], other=0.0)  # fmt: skip
    for p in gl.static_range(NP):
        if p + 1 < NP:
            ch = (p + 1) * NB + c
            ok_n = row_ok[:, :, None] & (ch < NCH)[None, None, :]
            words_n = gl.load(w_base + ((w_rows + (ch * 4)[None, None, :])[:, :, :, None] + wi),
                              mask=ok_n[:, :, :, None], other=0)  # fmt: skip
            sc_n = gl.load(s_base + (s_rows + ch[None, None, :]), mask=ok_n, other=0)
            chx = (p + 1) * NB + cx
            xv_n = gl.load(x_rows + (chx[:, None, None] * 32 + kx)[None, :, :, :],
                           mask=x_slot_ok & (chx < NCH)[:, None, None][None, :, :, :], other=0.0)  # fmt: skip
        x0, x1, x2, x3, x4, x5, x6, x7 = _nibble_columns(gl.reshape(xv.to(gl.float32), [SLOTS, NB, 4, 2, 2, 2]), LD)
        dots = _block_dots(words, x0[:, None], x1[:, None], x2[:, None], x3[:, None], x4[:, None], x5[:, None],
                           x6[:, None], x7[:, None])  # fmt: skip
        acc = _scaled_add(acc, dots, sc, BIG_SCALES)
        if p + 1 < NP:
            words = words_n
            sc = sc_n
            xv = xv_n
    out = gl.sum(acc, axis=2)  # [slot, row]
    if HAS_BIAS:
        out = out + bias.to(gl.float32)
    y = gl.sum(out * tw[:, None], axis=0)  # the slots, in a fixed order
    nn = gl.convert_layout(n, y.type.layout)
    gl.store(out_ptr + tok.to(gl.int64) * stride_o + nn, y.to(out_ptr.dtype.element_ty), mask=nn < N)

"""The Gluon GEMV kernel of the MXFP4 MoE for Hopper (sm90): a program per pair (or token), fp32 FMAs, no MMA.

At one or two tokens a call (decode at batch 1-2) each touched expert multiplies one activation row. The MMA decode
kernels (:mod:`.decode`) then spend an ``m16n8k16`` on 1 useful column of 8, and their one-warp programs (about
250 registers, 8 an SM) wait on their own dependent chains: at one token their two GEMMs took 39 us with the
weights already in L2 (host-cost report, sessions 21-22). :func:`moe_gemv` is built for that case instead:

- **A lane owns one MX block of a row at a time**: 16 bytes of codes (32 values, one ``LDG.128``) and its scale
  byte. Lane ``c`` of a warp takes block ``32 p + c`` of each of its rows in pass ``p`` (``cdiv(K / 32, 32)``
  passes; GPT-OSS's K = 2880 is 90 blocks, 3 passes, the last one 26 lanes wide). A thread holds ``FEATS`` row
  pairs (a gate/up feature's gate and up rows; two consecutive output rows of the down GEMM).
- **The activations**, staged (``STAGED``, the gate/up default): once a program in shared memory as fp32 (``[row,
  pass, lane, 32]``, 16-byte vectors swizzled by lane, so a lane's eight 16-byte reads meet no other lane's bank),
  and a pass reads its 32 values a lane from there for every row the thread owns. Not staged (the down default):
  each lane requests its pass's 32 values from global memory with the pass's codes (L1 serves the program's other
  warps), so a program has no shared memory and no barrier, and the down GEMM's inter rows are stored as bf16.
- **Decode through the hardware's e4m3 conversion**: a code's three magnitude bits, shifted to bits 2..4 of a byte,
  and its sign at bit 7 make the e4m3 byte of ``E2M1 * 2**-6`` (exactly, the E2M1 subnormal 0.5 included: e4m3's
  subnormals have the same step), and ``cvt.rn.f16x2.e4m3x2`` turns two such bytes into two f16. A 32-bit word
  (8 codes) costs seven shifts and masks, four conversions, eight f16-to-f32 conversions and eight FMAs (:data:`_DOT8`,
  one inline-asm block a word; the sm90 SASS of a 20B gate/up program: 976 instructions for 192 values a thread).
- **The scale is applied once a block**: the block's fp32 dot product times ``2**(s - 121)`` (``2**6`` undoes the
  decode's ``2**-6``), one FMA into the row's accumulator; weights with a scale byte above
  :data:`ONE_STEP_MAX_SCALE` take ``BIG_SCALES`` (two steps there). Products of bf16 activations and E2M1 values are
  exact in fp32, as in the MMA path; only the fp32 summation order differs from it.
- **Requests ahead**: a program walks its steps (``SUB * passes``: a pass of each sub-tile, or of each slot in the
  down GEMM) and requests each step's codes and scales (and, not staged, activations) ``AHEAD`` steps before it
  decodes it, a ring of requests in registers. With its default register budget ptxas moves such loads towards
  their first use (sm90, Triton 3.6), so a deeper ring pays only under a ``maxnreg`` cap (:class:`.layer.GemvTile`):
  the down default requests three steps ahead under 128 registers (about 110 used, 10 warps an SM at one token).
  The gate/up default stays at one step (62 registers, 32 warps an SM): its launches are bound by the instructions
  they issue rather than by their requests (session 33: deeper rings and unstaged activations were slower).

- **f16 pairs** (``HALF``, :class:`.layer.GemvTile`'s ``dot``; staged only): the activation rows are staged as f16
  times ``2**t`` (``t`` from the row's largest magnitude), a lane multiplies a block with 16 ``fma.rn.f16x2`` in two
  chains of two words (:func:`_half_block_asm`), converts the four f16 sums to fp32 once a block, and the row's sum
  is multiplied by ``2**-t`` at the end. ``HALF`` 1 decodes through the e4m3 conversion (:func:`_decode`), 2 with
  integer instructions only (:func:`_decode_int`: Hopper issues conversions slowly). The sums round to f16 (the
  fp32 path's products and sums within a block are exact); scale bytes above :data:`HALF_ONE_STEP_MAX_SCALE` take
  ``BIG_SCALES``. Session 34 (H100): faster with the weights in L2 (gate/up 15.7 us against 17.4), but not the
  default: the f16 rounding, through SwiGLU's clamp, becomes sign errors for very large terms (:data:`.layer.GEMV_TILES`).

- **L2 prefetches** (``PF_OWN``, ``PF_DOWN``; :data:`.layer.GEMV_PREFETCH`, off until measured): a program requests
  all of its rows' codes and scales into L2 once its first ring requests are out, and a gate/up program its share of
  its expert's down weights too (``prefetch.global.L2``: hints, no register holds the data); ``EVICT`` loads the
  weights ``evict_first`` (:data:`.layer.GEMV_EVICT_FIRST`).

Gate/up, program (pair, group of ``SUB`` row tiles): ``inter[pair, j] = bf16(swiglu(x[token] @ W13[e].T +
b13[e]))`` (stored in inter's dtype: fp32 for a staged down, else bf16). Down, program (token, row tile): it walks
the token's ``TOP_K`` slots over the same rows (its ring of requests runs on across the slots) and sums them in
registers in slot order: ``out[token, n] = sum_s w_s * (inter[pair_s] @ W2[e_s][n].T + b2[e_s][n])``. Two
launches a call, no atomics, no split sums, deterministic. Down with ``PAIRS`` (:class:`.layer.GemvTile`'s
``pairs``): a program a pair and row tile like the gate/up's, fp32 rows ``tw * (inter @ W2.T + b2)``, and
:func:`.decode.combine_slots` sums a token's slots in order (a third launch; four times the warps at one token), or
with ``FUSED`` the last of a token's programs of a tile to arrive does (:data:`.layer.GEMV_FUSED_COMBINE`, off: slower
in the layer, session 35).

Every weight byte is read once a token, so a call of T tokens reads its experts T times: the layer takes this path
up to :data:`.layer.GEMV_MAX_TOKENS` tokens on the canonical layout (``hopper.moe_apply``).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .decode import _grid_release, _grid_wait, _swiglu

__all__ = ["moe_gemv", "MAX_SLOTS", "MAX_STAGED_BYTES", "ONE_STEP_MAX_SCALE", "HALF_ONE_STEP_MAX_SCALE", "staged_bytes"]

#: A down program walks its token's slots (unrolled): ``TOP_K`` up to this many.
MAX_SLOTS = 8
#: The shared memory a program may stage its activation rows in (H100/H200: 227 KB a block).
MAX_STAGED_BYTES = 160 * 1024


def staged_bytes(rows: int, k: int, half: bool = False) -> int:
    """The shared memory a program stages ``rows`` activation rows of ``k`` values in: fp32 (f16 with ``half``),
    whole passes of 32 MX blocks (the gate/up program 1 row, the down program ``TOP_K``, or 1 with ``PAIRS``)."""
    return rows * -(-k // 1024) * 1024 * (2 if half else 4)


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


def _decode(word: str, regs: tuple[str, str, str, str]) -> str:
    """PTX: the 8 E2M1 codes of ``word`` (code i in bits 4 i .. 4 i + 3) as f16 pairs ``E2M1 * 2**-6``: codes (0, 2),
    (4, 6), (1, 3), (5, 7) into ``regs`` (low half the first). Even codes: nibble << 2 (magnitude) and the sign bit
    << 4 make an e4m3 byte; odd codes: >> 2 and the sign in place."""
    return f"""shl.b32 t, {word}, 2;
and.b32 e, t, 0x1C1C1C1C;
shl.b32 t, {word}, 4;
and.b32 t, t, 0x80808080;
or.b32 e, e, t;
shr.u32 t, {word}, 2;
and.b32 o, t, 0x1C1C1C1C;
and.b32 t, {word}, 0x80808080;
or.b32 o, o, t;
mov.b32 {{l, h}}, e;
cvt.rn.f16x2.e4m3x2 {regs[0]}, l;
cvt.rn.f16x2.e4m3x2 {regs[1]}, h;
mov.b32 {{l, h}}, o;
cvt.rn.f16x2.e4m3x2 {regs[2]}, l;
cvt.rn.f16x2.e4m3x2 {regs[3]}, h;
"""


def _decode_int(word: str, regs: tuple[str, str, str, str]) -> str:
    """PTX: the 8 E2M1 codes of ``word`` as f16 pairs ``E2M1 * 2**-14`` in :func:`_decode`'s order, with integer
    instructions only (no conversion). A byte ``s000 mmm0`` as an f16's high half, the low half zero, is ``E2M1 *
    2**-14`` (sign ``s``, exponent and mantissa bits ``mmm`` of the code; the E2M1 subnormal 0.5 is the f16 subnormal
    ``2**-15``): odd codes (the high nibble of a byte) make such bytes with ``>> 3`` and their sign in place, even codes
    with ``<< 1`` and the sign ``<< 4``; each ``prmt`` puts two bytes into the high halves of a pair."""
    return f"""shr.u32 t, {word}, 3;
and.b32 t, t, 0x0E0E0E0E;
and.b32 o, {word}, 0x80808080;
or.b32 o, o, t;
shl.b32 t, {word}, 1;
and.b32 e, t, 0x0E0E0E0E;
shl.b32 t, {word}, 4;
and.b32 t, t, 0x80808080;
or.b32 e, e, t;
prmt.b32 {regs[0]}, e, 0, 0x1404;
prmt.b32 {regs[1]}, e, 0, 0x3424;
prmt.b32 {regs[2]}, o, 0, 0x1404;
prmt.b32 {regs[3]}, o, 0, 0x3424;
"""


def _half_block_asm(decode) -> str:
    """PTX of one MX block a lane (pack 4) in f16 pairs: ``$4..$7`` its code words, ``$8 + 4 p + q`` activation pair
    ``p`` of word ``q`` (f16, :func:`_decode`'s order). Two chains of ``fma.rn.f16x2`` (words 0-1, words 2-3) sum the
    products; ``$0..$3`` are their four f16 halves as fp32."""
    body = ["{", ".reg .b32 t, e, o, a0, a1, a2, a3, c0, c1;", ".reg .b16 l, h;"]
    for q in range(4):
        body.append(decode(f"${4 + q}", ("a0", "a1", "a2", "a3")))
        acc = "c0" if q < 2 else "c1"
        for p in range(4):
            x = f"${8 + 4 * p + q}"
            if q % 2 == 0 and p == 0:
                body.append(f"mul.rn.f16x2 {acc}, a0, {x};")
            else:
                body.append(f"fma.rn.f16x2 {acc}, a{p}, {x}, {acc};")
    body += [
        "mov.b32 {l, h}, c0;",
        "cvt.f32.f16 $0, l;",
        "cvt.f32.f16 $1, h;",
        "mov.b32 {l, h}, c1;",
        "cvt.f32.f16 $2, l;",
        "cvt.f32.f16 $3, h;",
        "}",
    ]
    return "\n".join(body)


_HALF_E4M3: gl.constexpr = gl.constexpr(_half_block_asm(_decode))
_HALF_INT: gl.constexpr = gl.constexpr(_half_block_asm(_decode_int))

#: E8M0 scale bytes above this take the block's ``2**6`` as a separate multiply (``2**(s - 121)`` is no fp32 then):
#: weights holding one take the kernels' ``BIG_SCALES`` variant (chosen from the largest byte, read once).
ONE_STEP_MAX_SCALE = 248
_ONE_STEP_MAX: gl.constexpr = gl.constexpr(ONE_STEP_MAX_SCALE)
#: The same limit for the f16 pairs (``HALF``), whose sums stay times ``2**t``: a block's dot product is at most
#: ``32 * 6 * 2**(T0 + 1 - B)`` (``2**4`` for ``HALF`` 1, ``2**1`` for 2), so ``|acc| < 2**11 * 2**11.6 * 2**(s - 121)``
#: for K up to ``2**16``, below ``2**128`` for bytes up to 226.
HALF_ONE_STEP_MAX_SCALE = 220


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
def _half_block_dots(words, xp, LD: gl.constexpr, HALF: gl.constexpr):
    """Code words ``uint32 [A, B, 32, 4]`` and a lane's activation pairs ``uint32 [32, 16]`` (pair ``p`` of word
    ``q`` at ``4 q + p``) -> each MX block's dot product ``fp32 [A, B, 32]``, of the values ``E2M1 * 2**-6`` (``HALF``
    1) or ``E2M1 * 2**-14`` (2) and the f16 activations, summed in f16 pairs (:func:`_half_block_asm`)."""
    v = gl.reshape(xp, [32, 4, 2, 2])
    v0, v1 = gl.split(v)  # p % 2
    p0, p2 = gl.split(v0)  # p // 2
    p1, p3 = gl.split(v1)
    x0 = gl.convert_layout(p0, LD)[None, None]
    x1 = gl.convert_layout(p1, LD)[None, None]
    x2 = gl.convert_layout(p2, LD)[None, None]
    x3 = gl.convert_layout(p3, LD)[None, None]
    part = gl.inline_asm_elementwise(
        _HALF_E4M3 if HALF == 1 else _HALF_INT, "=f,=f,=f,=f" + ",r" * 20,
        [words, gl.broadcast(words, x0)[1], gl.broadcast(words, x1)[1], gl.broadcast(words, x2)[1],
         gl.broadcast(words, x3)[1]],
        dtype=gl.float32, is_pure=True, pack=4,
    )  # fmt: skip
    return gl.sum(part, axis=3)


@gluon.jit
def _half_pairs(xv):
    """fp32 activations ``[32, 32]`` (a lane's block, already times ``2**t``) -> f16 pairs ``uint32 [32, 16]``: pair
    ``p`` of word ``q`` at ``4 q + p``, pairs (0, 2), (4, 6), (1, 3), (5, 7) of the word's values (:func:`_decode`)."""
    xh = xv.to(gl.float16)
    # value i = 4 a + 2 b + c of word q -> pair p = 2 c + a, half b
    xh = gl.permute(gl.reshape(xh, [32, 4, 2, 2, 2]), [0, 1, 4, 2, 3])
    lo, hi = gl.split(gl.reshape(xh, [32, 16, 2]))
    return lo.to(gl.uint16, bitcast=True).to(gl.uint32) | (hi.to(gl.uint16, bitcast=True).to(gl.uint32) << 16)


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
def _prefetch_l2(base, nbytes, LINES: gl.constexpr, WARPS: gl.constexpr):
    """Request the ``nbytes`` bytes from ``base`` (a uint8 pointer, ``nbytes >= 1``) into L2, a 128-byte line a thread
    and request (``prefetch.global.L2``: no register holds the data and nothing waits for it). ``LINES`` bounds the
    lines the range spans (``cdiv(nbytes, 128) + 1``); requests past its end fall on its last byte."""
    NT: gl.constexpr = 32 * WARPS
    off = gl.arange(0, NT, layout=gl.BlockedLayout([1], [32], [WARPS], [0])) * 128
    for i in gl.static_range((LINES + NT - 1) // NT):
        o = gl.minimum(off + i * NT * 128, nbytes - 1)
        gl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [base + o], dtype=gl.int32,
                                  is_pure=False, pack=1)  # fmt: skip


@gluon.jit
def _prefetch_rows(w_ptr, s_ptr, e, stride_we, stride_se, r0, n, ROWS: gl.constexpr, K: gl.constexpr,
                   SROW: gl.constexpr, WARPS: gl.constexpr):  # fmt: skip
    """:func:`_prefetch_l2` of the codes and scale bytes of rows ``r0 .. r0 + n - 1`` (``1 <= n <= ROWS``) of expert
    ``e`` (rows of ``K / 2`` code bytes, scale rows ``SROW`` bytes apart)."""
    w = w_ptr + e.to(gl.int64) * stride_we + r0.to(gl.int64) * (K // 2)
    _prefetch_l2(w, n * (K // 2), (ROWS * (K // 2) + 127) // 128 + 1, WARPS)
    sc = s_ptr + e.to(gl.int64) * stride_se + r0.to(gl.int64) * SROW
    _prefetch_l2(sc, (n - 1) * SROW + K // 32, ((ROWS - 1) * SROW + K // 32 + 127) // 128 + 1, WARPS)


@gluon.jit
def _prefetch_gate_up(w_ptr, s_ptr, e, stride_we, stride_se, f0, FT: gl.constexpr, I: gl.constexpr,
                      K: gl.constexpr, SROW: gl.constexpr, INTERLEAVED: gl.constexpr, WARPS: gl.constexpr):  # fmt: skip
    """:func:`_prefetch_rows` of the gate and up rows of features ``f0 .. f0 + FT - 1`` (those below ``I``): one range
    when ``INTERLEAVED`` (rows ``2 f``, ``2 f + 1``), else the gate range and the up range (rows ``f``, ``I + f``)."""
    n = gl.minimum(I - f0, FT)
    if INTERLEAVED:
        _prefetch_rows(w_ptr, s_ptr, e, stride_we, stride_se, 2 * f0, 2 * n, 2 * FT, K, SROW, WARPS)
    else:
        _prefetch_rows(w_ptr, s_ptr, e, stride_we, stride_se, f0, n, FT, K, SROW, WARPS)
        _prefetch_rows(w_ptr, s_ptr, e, stride_we, stride_se, I + f0, n, FT, K, SROW, WARPS)


@gluon.jit
def _prefetch_down_share(pw_ptr, ps_ptr, e, pstride_we, pstride_se, tile, NT: gl.constexpr, K: gl.constexpr,
                         I: gl.constexpr, PF_SROW: gl.constexpr, WARPS: gl.constexpr):  # fmt: skip
    """:func:`_prefetch_rows` of gate/up tile ``tile``'s share (of ``NT`` tiles) of expert ``e``'s down weights:
    ``cdiv(K, NT)`` of its ``K`` rows of ``I / 2`` code bytes."""
    RD: gl.constexpr = (K + NT - 1) // NT
    r0 = gl.minimum(tile * RD, K - 1)
    _prefetch_rows(pw_ptr, ps_ptr, e, pstride_we, pstride_se, r0, gl.minimum(K - r0, RD), RD, I, PF_SROW, WARPS)


@gluon.jit
def _rows(j, h, I: gl.constexpr, SPLIT_ROWS: gl.constexpr):
    """Weight rows ``[feature, 2]`` of row pairs ``j``: ``2 j + h``, or ``h I + j`` (``SPLIT_ROWS``)."""
    if SPLIT_ROWS:
        return h[None, :] * I + j[:, None]
    return 2 * j[:, None] + h[None, :]


@gluon.jit
def _load_step(w_ptr, s_ptr, e, stride_we, stride_se, rows, row_ok, c, wi, p: gl.constexpr, K: gl.constexpr,
               SROW: gl.constexpr, EVICT: gl.constexpr = ""):  # fmt: skip
    """Pass ``p``'s code words ``uint32 [F, 2, 32, 4]`` and scale bytes ``[F, 2, 32]`` of expert ``e``'s ``rows``
    (``EVICT``: the loads' L2 eviction policy, ``""`` or ``"evict_first"``)."""
    NCH: gl.constexpr = K // 32
    ch = p * 32 + c
    ok = row_ok[:, :, None] & (ch < NCH)[None, None, :]
    w_base = (w_ptr + e.to(gl.int64) * stride_we).to(gl.pointer_type(gl.uint32))
    words = gl.load(w_base + (((rows * (K // 8))[:, :, None] + (ch * 4)[None, None, :])[:, :, :, None] + wi),
                    mask=ok[:, :, :, None], other=0, eviction_policy=EVICT)  # fmt: skip
    sc = gl.load(s_ptr + e.to(gl.int64) * stride_se + ((rows * SROW)[:, :, None] + ch[None, None, :]), mask=ok, other=0,
                 eviction_policy=EVICT)  # fmt: skip
    return words, sc


@gluon.jit
def _load_at(w_ptr, s_ptr, ids_ptr, e0, stride_we, stride_se, pid, j0, f, h, c, wi, s: gl.constexpr,
             NP: gl.constexpr, FW: gl.constexpr, I: gl.constexpr, K: gl.constexpr, SROW: gl.constexpr,
             TOP_K: gl.constexpr, ONE: gl.constexpr, INTERLEAVED: gl.constexpr, EVICT: gl.constexpr = ""):  # fmt: skip
    """Step ``s``'s codes and scales (sub-tile ``s // NP``, pass ``s % NP``): ``ONE`` (gate/up, or a down program a
    pair), expert ``e0`` and the sub-tile's rows; else (a down program walking its slots), the same rows of slot
    ``s // NP``'s expert (``e0`` for slot 0)."""
    u: gl.constexpr = s // NP
    if ONE:
        e = e0
        jf = j0 + u * FW + f
    else:
        e = e0 if u == 0 else gl.load(ids_ptr + pid * TOP_K + u)
        jf = j0 + f
    rows = _rows(jf, h, I, ONE and not INTERLEAVED)
    row_ok = (jf < I)[:, None] & (h < 2)[None, :]
    return _load_step(w_ptr, s_ptr, e, stride_we, stride_se, rows, row_ok, c, wi, s % NP, K, SROW, EVICT)


@gluon.jit
def _load_x(x_ptr, stride_x, x_row0, kx, s: gl.constexpr, NP: gl.constexpr, K: gl.constexpr, ONE: gl.constexpr):
    """Step ``s``'s activations ``[lane, 32]`` (its pass of the gate/up's row, or of slot ``s // NP``'s row of inter),
    in the activations' dtype."""
    row = x_row0 if ONE else x_row0 + s // NP
    k = kx + (s % NP) * 1024
    return gl.load(x_ptr + row.to(gl.int64) * stride_x + k, mask=k < K, other=0.0)


@gluon.jit
def moe_gemv(
    x_ptr, stride_x, ids_ptr, tw_ptr, w_ptr, stride_we, s_ptr, stride_se, b_ptr, stride_be, y_ptr, stride_y,
    alpha, limit, up_offset, c_ptr, o_ptr, stride_o, pw_ptr, pstride_we, ps_ptr, pstride_se,
    K: gl.constexpr, I: gl.constexpr, SROW: gl.constexpr, TOP_K: gl.constexpr, GATE_UP: gl.constexpr,
    INTERLEAVED: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_LIMIT: gl.constexpr, FEATS: gl.constexpr,
    WARPS: gl.constexpr, SUB: gl.constexpr, PDL: gl.constexpr, BIG_SCALES: gl.constexpr = True,
    AHEAD: gl.constexpr = 1, STAGED: gl.constexpr = True, HALF: gl.constexpr = 0, PAIRS: gl.constexpr = False,
    FUSED: gl.constexpr = False, PF_OWN: gl.constexpr = False, PF_DOWN: gl.constexpr = False,
    PF_SROW: gl.constexpr = 0, EVICT: gl.constexpr = "",
):  # fmt: skip
    """One GEMM; a program walks ``SUB`` sub-tiles of ``FW = FEATS * WARPS`` row pairs ``j`` each, one pass (32 MX
    blocks a row) at a time, requesting the codes and scales ``AHEAD`` passes (across sub-tiles) before it decodes
    them, the activations from shared memory (``STAGED``; as f16 pairs with ``HALF``) or requested with the codes.
    ``w``: uint8 ``[E, 2I, K / 2]`` codes (``stride_we`` bytes an expert), ``s``: uint8 ``[E, 2I, K / 32]`` scales
    (row stride ``SROW``), ``b``: ``[E, 2I]`` bias.

    - ``GATE_UP``, program (pair, group), ``e = ids[pair]``: ``y[pair, j] = bf16(swiglu(x[pair // TOP_K] @ W13[e].T
      + b13[e]))`` (in ``y``'s dtype) for the ``SUB`` consecutive sub-tiles of the group (``INTERLEAVED``: the
      gate/up rows of feature ``j`` are ``2 j``, ``2 j + 1``, else ``j``, ``I + j``);
    - down, program (token, tile), ``SUB = TOP_K`` (a sub-tile a slot, the same rows ``n = 2 j, 2 j + 1``):
      ``y[token, n] = sum_s tw[pair_s] * (x[pair_s] @ W2[e_s][n].T + b2[e_s][n])`` in slot order, ``pair_s =
      token * TOP_K + s`` (``x``: inter ``[pairs, K]``);
    - down with ``PAIRS``, program (pair, tile), ``SUB = 1``: ``y[pair, n] = tw[pair] * (x[pair] @ W2[e][n].T +
      b2[e][n])`` (fp32; :func:`.decode.combine_slots` sums a token's slots in order), or with ``FUSED`` the last of a
      token's ``TOP_K`` programs of a tile to arrive sums them into ``o[token, n]`` (``c``: int32 counters, one a
      token and tile, zero on entry and left zero).

    L2 prefetches (:func:`_prefetch_l2`, :data:`.layer.GEMV_PREFETCH`): ``PF_OWN``, a program requests all of its
    rows' codes and scales into L2 as soon as it knows its experts (its ring then finds them on chip); ``PF_DOWN``
    (gate/up), a program also requests its share of the down GEMM's weights of its expert (``pw``: uint8 ``[E, K,
    I / 2]`` codes, ``pstride_we`` bytes an expert; ``ps``: ``[E, K, I / 32]`` scales, rows ``PF_SROW`` bytes
    apart, ``pstride_se`` an expert), the ``cdiv(K, tiles)`` rows of its tile, so that the next launch reads them
    from L2. ``EVICT``: the codes' and scales' loads' L2 eviction policy.
    """
    pid = gl.program_id(0)
    tile = gl.program_id(1)
    FW: gl.constexpr = FEATS * WARPS
    NCH: gl.constexpr = K // 32  # MX blocks a row
    NP: gl.constexpr = (NCH + 31) // 32  # passes of 32 lanes
    # One activation row and expert a program: gate/up, and a down of a program a pair (PAIRS: the slots are summed by
    # the next launch); else the down's program walks its token's TOP_K slots.
    ONE: gl.constexpr = GATE_UP or PAIRS
    gl.static_assert(not (PAIRS and GATE_UP), "PAIRS is a mode of the down GEMM")
    gl.static_assert(SUB == 1 or not PAIRS, "a PAIRS program takes one row tile (SUB 1)")
    gl.static_assert(PAIRS or not FUSED, "FUSED sums the slots of a PAIRS down")
    gl.static_assert(GATE_UP or not PF_DOWN, "PF_DOWN is the gate/up's prefetch of the down weights")
    XR: gl.constexpr = 1 if ONE else TOP_K  # activation rows a program reads
    # [feature, gate/up (row pair), lane (block), word]: a thread holds its features' two rows, one block of each.
    L4: gl.constexpr = gl.BlockedLayout([FEATS, 2, 1, 4], [1, 1, 32, 1], [WARPS, 1, 1, 1], [3, 2, 1, 0])
    L3: gl.constexpr = gl.SliceLayout(3, L4)
    LR: gl.constexpr = gl.SliceLayout(2, L3)  # [feature, gate/up]
    LD: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, L4))  # [lane, word] of L4
    if GATE_UP:
        # The ids are the previous launch's output (the route): wait before reading them.
        _grid_wait(PDL)
        _grid_release(PDL)
        e = gl.load(ids_ptr + pid)
        x_row0 = pid // TOP_K
        j0 = tile * (SUB * FW)
    else:
        # The ids and the routing weights were written two launches or more before this one, so they are complete
        # (.decode's module doc): the first codes are requested before the grid wait.
        e = gl.load(ids_ptr + pid) if PAIRS else gl.load(ids_ptr + pid * TOP_K)
        x_row0 = pid if PAIRS else pid * TOP_K
        j0 = tile * FW
    f = gl.arange(0, FW, layout=gl.SliceLayout(1, LR))
    h = gl.arange(0, 2, layout=gl.SliceLayout(0, LR))
    c = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    wi = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L4))))[None, None, None, :]
    # The program's steps s = u * NP + p (sub-tile u, pass p): the codes and scales of each requested AHEAD steps
    # before it is decoded (a ring of requests; the first AHEAD before the activations, the down's before its grid
    # wait too).
    S: gl.constexpr = SUB * NP
    NA: gl.constexpr = AHEAD if AHEAD < S else S  # requests before the first decode
    ring = ()
    for s in gl.static_range(NA):
        ring = ring + (_load_at(w_ptr, s_ptr, ids_ptr, e, stride_we, stride_se, pid, j0, f, h, c, wi, s, NP, FW, I, K,
                                SROW, TOP_K, ONE, INTERLEAVED, EVICT),)  # fmt: skip
    # L2 prefetches once the ring's first requests are out (PF_OWN, PF_DOWN; the down's before its grid wait)
    if GATE_UP:
        if PF_OWN:
            _prefetch_gate_up(w_ptr, s_ptr, e, stride_we, stride_se, j0, SUB * FW, I, K, SROW, INTERLEAVED, WARPS)
        if PF_DOWN:
            _prefetch_down_share(pw_ptr, ps_ptr, e, pstride_we, pstride_se, tile, (I + SUB * FW - 1) // (SUB * FW), K, I,
                                 PF_SROW, WARPS)  # fmt: skip
    else:
        if PF_OWN:
            n_own = 2 * gl.minimum(I - j0, FW)  # output rows 2 j, 2 j + 1 of this tile
            for u in gl.static_range(1 if PAIRS else TOP_K):
                e_u = e if u == 0 else gl.load(ids_ptr + pid * TOP_K + u)
                _prefetch_rows(w_ptr, s_ptr, e_u, stride_we, stride_se, 2 * j0, n_own, 2 * FW, K, SROW, WARPS)
        _grid_wait(PDL)  # inter is the previous launch's output
        _grid_release(PDL)
    # A lane's activations of a pass: the 32 values of its block [lane, 32] (every warp the same).
    LXS: gl.constexpr = gl.BlockedLayout([1, 32], [32, 1], [WARPS, 1], [1, 0])
    LXP: gl.constexpr = gl.BlockedLayout([1, 16], [32, 1], [WARPS, 1], [1, 0])  # a lane's 16 f16 pairs
    if HALF:
        # The activation rows once as f16 pairs times 2**t (t from the row's largest magnitude): [row, pass, lane, 16
        # pairs] (16-byte vectors swizzled by lane pair, so a quarter warp's 16-byte reads meet no bank twice).
        gl.static_assert(STAGED, "f16 pairs need staged activations")
        LS: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [WARPS, 1], [1, 0])
        x_sm = gl.allocate_shared_memory(gl.uint32, [XR * NP, 32, 16], gl.SwizzledSharedLayout(4, 2, 4, [1, 0]))
        ks = (gl.arange(0, 32, layout=gl.SliceLayout(1, LS))[:, None] * 32
              + gl.arange(0, 32, layout=gl.SliceLayout(0, LS))[None, :])  # fmt: skip
        # x * 2**t below 2**(T0 + 1): the products' f16 sums stay below 2**11 (2**8 for HALF 2)
        T0: gl.constexpr = 9 if HALF == 1 else 14
        B: gl.constexpr = 6 if HALF == 1 else 14  # the decode's values are E2M1 * 2**-B
        downs = ()
        for r in gl.static_range(XR):
            x_row = x_ptr + (x_row0 + r).to(gl.int64) * stride_x
            xts = ()
            for p in gl.static_range(NP):
                xts = xts + (gl.load(x_row + (ks + p * 1024), mask=ks + p * 1024 < K, other=0.0).to(gl.float32),)
            big = gl.abs(xts[0])
            for p in gl.static_range(1, NP):
                big = gl.maximum(big, gl.abs(xts[p]))
            amax = gl.max(gl.max(big, 1), 0)  # one reduction over the program a row
            t = gl.minimum(gl.maximum(T0 + 127 - (amax.to(gl.int32, bitcast=True) >> 23), -118), 126)
            up = ((t + 127) << 23).to(gl.float32, bitcast=True)
            downs = downs + ((((127 + B - 6) - t) << 23).to(gl.float32, bitcast=True),)
            for p in gl.static_range(NP):
                x_sm.index(r * NP + p).store(_half_pairs(xts[p] * up))
        gl.thread_barrier()
    elif STAGED:
        # The activation rows once, as fp32, for every warp: [row, pass, lane, 32 values] (16-byte vectors swizzled
        # by lane: a lane's 128 bytes, read as 8 x 16, meet no other lane's bank within a quarter warp).
        LS: gl.constexpr = gl.BlockedLayout([1, 8], [8, 4], [WARPS, 1], [1, 0])
        x_sm = gl.allocate_shared_memory(gl.float32, [XR * NP, 32, 32], gl.SwizzledSharedLayout(4, 1, 8, [1, 0]))
        ks = (gl.arange(0, 32, layout=gl.SliceLayout(1, LS))[:, None] * 32
              + gl.arange(0, 32, layout=gl.SliceLayout(0, LS))[None, :])  # fmt: skip
        for r in gl.static_range(XR):
            x_row = x_ptr + (x_row0 + r).to(gl.int64) * stride_x
            for p in gl.static_range(NP):
                x_sm.index(r * NP + p).store(gl.load(x_row + (ks + p * 1024), mask=ks + p * 1024 < K,
                                                     other=0.0).to(gl.float32))  # fmt: skip
        gl.thread_barrier()
    else:
        # Each lane requests its own activations with the codes (a second ring; L1 serves the program's other warps).
        kx = (gl.arange(0, 32, layout=gl.SliceLayout(1, LXS))[:, None] * 32
              + gl.arange(0, 32, layout=gl.SliceLayout(0, LXS))[None, :])  # fmt: skip
        xring = ()
        for s in gl.static_range(NA):
            xring = xring + (_load_x(x_ptr, stride_x, x_row0, kx, s, NP, K, ONE),)
    y = gl.zeros([FW, 2], gl.float32, LR)
    SPLIT: gl.constexpr = GATE_UP and not INTERLEAVED
    for u in gl.static_range(SUB):
        # This sub-tile's expert, rows, bias and routing weight.
        if ONE:
            rows = _rows(j0 + u * FW + f, h, I, SPLIT)
            row_ok = ((j0 + u * FW + f) < I)[:, None] & (h < 2)[None, :]
        else:
            rows = _rows(j0 + f, h, I, False)
            row_ok = ((j0 + f) < I)[:, None] & (h < 2)[None, :]
            if u > 0:
                e = gl.load(ids_ptr + pid * TOP_K + u)
        if HAS_BIAS:
            bias = gl.load(b_ptr + e.to(gl.int64) * stride_be + rows, mask=row_ok, other=0.0)
        if PAIRS:
            tw = gl.load(tw_ptr + pid).to(gl.float32)
        elif not GATE_UP:
            tw = gl.load(tw_ptr + pid * TOP_K + u).to(gl.float32)
        acc = gl.zeros([FW, 2, 32], gl.float32, L3)
        for p in gl.static_range(NP):
            if u * NP + p + AHEAD < S:
                ring = ring + (_load_at(w_ptr, s_ptr, ids_ptr, e, stride_we, stride_se, pid, j0, f, h, c, wi,
                                        u * NP + p + AHEAD, NP, FW, I, K, SROW, TOP_K, ONE, INTERLEAVED,
                                        EVICT),)  # fmt: skip
                if not STAGED:
                    xring = xring + (_load_x(x_ptr, stride_x, x_row0, kx, u * NP + p + AHEAD, NP, K, ONE),)
            words, sc = ring[0]
            ring = ring[1:]
            if HALF:
                xp = x_sm.index((0 if ONE else u) * NP + p).load(LXP)
                dots = _half_block_dots(words, xp, LD, HALF)
                if BIG_SCALES:
                    dots = dots * downs[0 if ONE else u]  # unscaled before the scale's two steps
            else:
                if STAGED:
                    xv = x_sm.index((0 if ONE else u) * NP + p).load(LXS)
                else:
                    xv = xring[0].to(gl.float32)
                    xring = xring[1:]
                x0, x1, x2, x3, x4, x5, x6, x7 = _nibble_columns(gl.reshape(xv, [32, 4, 2, 2, 2]), LD)
                dots = _block_dots(words, x0[None, None], x1[None, None], x2[None, None], x3[None, None],
                                   x4[None, None], x5[None, None], x6[None, None], x7[None, None])  # fmt: skip
            acc = _scaled_add(acc, dots, sc, BIG_SCALES)
        out = gl.sum(acc, axis=2)  # [feature, gate/up]
        if HALF and not BIG_SCALES:
            out = out * downs[0 if ONE else u]  # the sums were of x * 2**t
        if HAS_BIAS:
            out = out + bias.to(gl.float32)
        if GATE_UP:
            gate, up = gl.split(out)
            hv = _swiglu(gate, up, alpha, limit, up_offset, HAS_LIMIT).to(gl.bfloat16)
            jo = gl.convert_layout(j0 + u * FW + f, hv.type.layout)
            gl.store(y_ptr + pid.to(gl.int64) * stride_y + jo, hv.to(y_ptr.dtype.element_ty), mask=jo < I)
        else:
            y += out * tw  # slot order
    if not GATE_UP:
        gl.store(y_ptr + pid.to(gl.int64) * stride_y + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)
        if FUSED:
            # Publish this program's rows (CTA barrier, then a release at GPU scope) and count them: the last of the
            # token's TOP_K programs of this tile sums the slots' rows in slot order, as combine_slots does.
            gl.thread_barrier()
            token = pid // TOP_K
            cnt = c_ptr + token * gl.num_programs(1) + tile
            if gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu") == TOP_K - 1:
                gl.store(cnt, 0)  # every arrival of this call is in: zero for the next launch
                gl.thread_barrier()
                tot = gl.zeros([FW, 2], gl.float32, LR)
                first = y_ptr + (token * TOP_K).to(gl.int64) * stride_y + rows
                for s in gl.static_range(TOP_K):
                    tot += gl.load(first + s * stride_y, mask=row_ok, cache_modifier=".cg")
                gl.store(o_ptr + token.to(gl.int64) * stride_o + rows, tot.to(o_ptr.dtype.element_ty), mask=row_ok)

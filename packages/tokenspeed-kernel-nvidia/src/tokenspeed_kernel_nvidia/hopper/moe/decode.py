"""Gluon decode kernels of the MXFP4 MoE for Hopper (sm90): weights as the MMA's M side.

At a few tokens per expert both GEMMs of a GPT-OSS expert stream E2M1 weights (half a
byte a value plus an E8M0 scale per 32) for very few FLOPs, so what bounds them is the
memory system and the instructions spent decoding each value. These kernels read the
canonical layout (``w [E, N, K/2]``, ``scale [E, N, K/32]``, no weight preprocessing) or,
with ``PACKED``, the same tensors with the bits of each word placed for a shorter decode
(:mod:`.packed`: 12 instructions a word instead of 17, K-adjacent pairs), and keep every
decoded value in registers:

- **Weights are the A operand of ``mma.sync.m16n8k16`` (bf16, fp32 accumulation); the
  tokens of one expert are its N side** (8 or 16 columns). A lane loads 16 contiguous
  bytes of a weight row per 128-value K block: exactly one MX block (32 codes, one scale).
- **Decode by bit placement, two values per 32-bit operation.** Codes ``j`` and
  ``j + 4`` of a 32-bit word sit 16 bits apart, so a mask, one integer multiply (two
  non-overlapping shifted copies) and a mask place both into one bf16x2 register as
  ``E2M1 * 2**-126`` (code 1 is the bf16 subnormal
  ``2**-127``); one ``mul.rn.bf16x2`` by the block's scale ``2**(s - 1)`` then gives the
  exact value ``E2M1 * 2**(s - 127)`` (``TWO_STEP``: ``2**126`` then ``2**(s - 127)``,
  for scale bytes above 128 whose ``2**(s - 1)`` is not a bf16). About two instructions
  a value; no lookup table, no conversion instruction.
- **K is permuted consistently on both operands.** A bf16x2 register of the MMA holds
  two consecutive K positions of the instruction; here they are canonical K ``k`` and
  ``k + 4`` of a lane's MX block. The activations are loaded with the same permutation
  (64 contiguous bytes a lane, rearranged in registers), so the products and their sum
  are those of the canonical order: a dot product does not depend on the order of its
  terms, only the fp32 accumulation order changes.
- **Codes stream through a cp.async ring** (``STAGES`` K blocks deep, 64 bytes a row and
  block in shared memory): many bytes in flight per SM without holding registers. Each
  thread reads back only the bytes it copied (Gluon still places a CTA barrier after each
  wait and before each refill; with one-warp programs they cost nothing). Activations
  (small, L2-resident) come through three unrolled register stages, scale bytes through
  ``SCALES_AHEAD`` (3 or 6, one register a stage and row); the first scale stages, the bias and
  the routing weights are requested before the K loop (and before the grid wait: weights are
  never written, the routing weights were written two launches or more before), so that no
  program waits on a load after its last K block.
- **Decoded values never touch shared memory**: they go from the ring's 16-byte reads through
  the decode to the MMA operand layout in registers (the reshapes below are register
  relabelings; no data moves between lanes).

:func:`moe_decode_gemm` serves both GEMMs. Program (pair ``p``, N tile): it works only if
``p`` is the first (token, slot) pair routed to its expert ``e``; it then gathers every
pair of ``e`` (``TOKENS`` at a time) and computes

- gate/up (``GATE_UP``): ``inter[pair, j] = swiglu(x[token] @ W13[e].T + b13[e])`` for the
  tile's ``BLOCK_M / 2`` intermediate features (gate and up rows of a feature sit in one
  thread: rows ``r`` and ``r + 8`` of the MMA tile);
- down: ``y[pair, n] = w[pair] * (inter[pair] @ W2[e].T + b2[e])`` (fp32), summed over the
  k slots afterwards in slot order by :func:`combine_slots` (deterministic).

Every weight byte of a touched expert is loaded once per N tile; pairs of one expert
share the decode.

**Programmatic dependent launch** (``PDL``, sm90's ``griddepcontrol``; :func:`pdl_kwargs`): every
kernel of ``hopper.moe_apply`` is launched with ``launch_pdl``, so it may start while the kernel
before it in the stream finishes, and waits (:func:`_grid_wait`) before it reads anything that
kernel may write, or writes anything at all. Each kernel lets its successor launch
(:func:`_grid_release`) only after its own wait, so when a kernel starts, every kernel two or more
launches before it has completed: the down GEMM reads the expert ids (written by the route, before
the gate/up GEMM) and starts streaming its weights (never written) before its wait, while the
SwiGLU of the split sums still runs.

**Fused epilogues** (``FUSED``): the split sums' SwiGLU and the combine run in the GEMMs' last
programs instead of two more launches. A program that wrote its fp32 rows publishes them (a CTA
barrier, then an ``atom.acq_rel.gpu`` add on a counter per (chunk, N tile) for gate/up and per
(token, N tile) for down); the program that brings a counter to its total (``KSPLIT`` splits; a
token's ``TOP_K`` pairs times ``KSPLIT``) resets it to zero, reads every partial row (``.cg``: from
L2) and sums them in the order of :func:`swiglu_splits` / :func:`combine_slots`, so the bits are those
of the unfused path. The counters are zero before a launch and after it; a launch never waits on
another program (the last arrival does the work), so no residency is assumed.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from .packed import PAIR_MASK, PAIR_MULTIPLIER

__all__ = ["moe_decode_gemm", "swiglu_splits", "combine_slots", "MAX_PAIRS", "pdl_kwargs"]

#: The expert scan holds every pair's expert id in registers: the decode path's limit.
MAX_PAIRS = 1024

# bf16 bits of the placed E2M1 codes (two bf16 halves of a 32-bit word): exponent/mantissa at
# 6..8 and the sign at 15 (and 22..24, 31).
_BITS: gl.constexpr = gl.constexpr(0x81C081C0)
_TWO_126_X2: gl.constexpr = gl.constexpr(0x7E807E80)  # bf16x2 (2**126, 2**126)
# Plane 3 of the packed layout (:data:`.packed.PAIR_MASK`, :data:`.packed.PAIR_MULTIPLIER`).
_PAIR_MASK: gl.constexpr = gl.constexpr(PAIR_MASK)
_PAIR_MULTIPLIER: gl.constexpr = gl.constexpr(PAIR_MULTIPLIER)


#: Programmatic dependent launch for the MoE kernels (module doc); ``TOKENSPEED_KERNEL_PDL=0`` turns it off.
PDL_ENABLED = os.environ.get("TOKENSPEED_KERNEL_PDL", "1").strip() != "0"


def pdl_kwargs() -> dict[str, bool]:
    """The launch keywords of a kernel with a ``PDL`` constexpr: ``PDL`` and Triton's ``launch_pdl`` option.
    Off under the interpreter (it has no grid dependencies to control) and when :data:`PDL_ENABLED` is false."""
    if PDL_ENABLED and not triton.knobs.runtime.interpret:
        return _PDL_ON
    return _PDL_OFF


_PDL_ON = {"PDL": True, "launch_pdl": True}
_PDL_OFF = {"PDL": False}


@gluon.jit
def _grid_wait(PDL: gl.constexpr):
    """``griddepcontrol.wait``: block until the stream's previous grid completed and its writes are
    visible (returns at once without a programmatic launch)."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _grid_release(PDL: gl.constexpr):
    """``griddepcontrol.launch_dependents``: the stream's next grid may launch once every program of this
    one has called it or exited. Called only after :func:`_grid_wait` (module doc)."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)  # fmt: skip


@triton.jit
def _tl_grid_sync(PDL: tl.constexpr):
    """:func:`_grid_wait` then :func:`_grid_release`, for the Triton kernels (which read their inputs first)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def tl_swiglu(gate, up, alpha, limit, up_offset, HAS_LIMIT: tl.constexpr):
    """GPT-OSS's SwiGLU of fp32 gate and up values, for the Triton kernels (:func:`_swiglu` is the Gluon one)."""
    if HAS_LIMIT:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    return (up + up_offset) * gate * tl.sigmoid(alpha * gate)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _bf16x2_mul(a, b):
    """Elementwise ``mul.rn.bf16x2`` of two uint32 tensors holding bf16 pairs."""
    return gl.inline_asm_elementwise("mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", [a, b], dtype=gl.uint32,
                                     is_pure=True, pack=1)  # fmt: skip


@gluon.jit
def _halves(r):
    """uint32 bf16x2 -> ``[..., 2]`` bf16 (low half first)."""
    lo = r.to(gl.uint16).to(gl.bfloat16, bitcast=True)
    hi = (r >> 16).to(gl.uint16).to(gl.bfloat16, bitcast=True)
    return gl.join(lo, hi)


@gluon.jit
def _scale_x2(sc, TWO_STEP: gl.constexpr):
    """E8M0 bytes -> uint32 bf16x2 factors: ``2**(s - 1)`` (the decode's ``2**-126`` folded in),
    or ``2**(s - 127)`` when ``TWO_STEP`` (code 0: the bf16 subnormal ``2**-127``)."""
    s = sc.to(gl.uint32)
    if TWO_STEP:
        b = gl.where(s == 0, 0x40, s << 7)
    else:
        b = (s + 126) << 7
    return b | (b << 16)


@gluon.jit
def _decode_a(words, sc, BLOCK_M: gl.constexpr, W: gl.constexpr, WARPS: gl.constexpr, AL: gl.constexpr,
              TWO_STEP: gl.constexpr, PACKED: gl.constexpr = False):  # fmt: skip
    """Packed codes ``uint32 [BLOCK_M, 4, W]`` (row, lane q of the row's 4 lanes, word) and
    their scale bytes ``[BLOCK_M, 4]`` -> the MMA's A operand ``bf16 [BLOCK_M, 32 W]`` in ``AL``.

    Lane q's word ``w`` holds canonical K ``8 w .. 8 w + 7`` of its block (``32 q`` / ``8 W q``
    from the K block's start); plane ``p`` pairs codes ``p`` and ``p + 4`` (``PACKED``, the layout of
    :mod:`.packed`: codes ``2 p`` and ``2 p + 1``). The MMA K index of (q, w, p = p0 + 2 p1, half i)
    is ``16 (2 w + p1) + 8 p0 + 2 q + i``.
    """
    f = gl.broadcast(_scale_x2(sc, TWO_STEP)[:, :, None], words)[0]
    if PACKED:
        # The bits already sit where plane p wants them after a rotation by 3 p (planes 0-2); plane
        # 3's three shifted copies do not overlap (:mod:`.packed`). The rotations are funnel shifts.
        r0 = words & _BITS
        r1 = ((words >> 3) | (words << 29)) & _BITS
        r2 = ((words >> 6) | (words << 26)) & _BITS
        r3 = ((words & _PAIR_MASK) * _PAIR_MULTIPLIER) & _BITS
    else:
        # Plane p: codes p and p + 4 (nibbles 16 bits apart). One multiply places both fields of both
        # codes: t * (2**a + 2**(a + 6)) puts magnitude bits at 6..8 (22..24) and the sign at 15 (31),
        # with no carries (the two shifted copies do not overlap); the mask keeps those bits.
        hi = words >> 8
        r0 = ((words & 0x000F000F) * 0x1040) & _BITS
        r1 = ((words & 0x00F000F0) * 0x104) & _BITS
        r2 = ((hi & 0x000F000F) * 0x1040) & _BITS
        r3 = ((hi & 0x00F000F0) * 0x104) & _BITS
    if TWO_STEP:
        two126 = gl.full(words.shape, _TWO_126_X2, gl.uint32, words.type.layout)
        r0 = _bf16x2_mul(r0, two126)
        r1 = _bf16x2_mul(r1, two126)
        r2 = _bf16x2_mul(r2, two126)
        r3 = _bf16x2_mul(r3, two126)
    r0 = _bf16x2_mul(r0, f)
    r1 = _bf16x2_mul(r1, f)
    r2 = _bf16x2_mul(r2, f)
    r3 = _bf16x2_mul(r3, f)
    # [M, q, W, i, p0, p1] -> [M, W, p1, p0, q, i] -> [M, 32 W]
    v = gl.join(gl.join(_halves(r0), _halves(r1)), gl.join(_halves(r2), _halves(r3)))
    v = gl.reshape(gl.permute(v, [0, 2, 5, 4, 1, 3]), [BLOCK_M, 32 * W])
    # Rows: the load put row t = ((rep * 2 + h) * WARPS + w) * 8 + r at lane r of warp w;
    # the MMA wants row ((rep * WARPS + w) * 2 + h) * 8 + r there.
    v = gl.reshape(v, [BLOCK_M // (16 * WARPS), 2, WARPS, 8, 32 * W])
    v = gl.reshape(gl.permute(v, [0, 2, 1, 3, 4]), [BLOCK_M, 32 * W])
    return gl.convert_layout(v, AL)


@gluon.jit
def _arrange_b(xv, TOKENS: gl.constexpr, W: gl.constexpr, BL: gl.constexpr, PACKED: gl.constexpr = False):
    """Activations ``bf16 [TOKENS, 4, 8 W]`` (token, lane q, canonical K of q's block) -> the
    MMA's B operand ``[32 W, TOKENS]`` in ``BL``, K permuted as :func:`_decode_a`."""
    v = gl.reshape(xv, [TOKENS, 4, W, 2, 2, 2])
    if PACKED:
        # canonical 8 w + 4 p1 + 2 p0 + i: [n, q, w, p1, p0, i] -> [w, p1, p0, q, i, n]
        v = gl.reshape(gl.permute(v, [2, 3, 4, 1, 5, 0]), [32 * W, TOKENS])
    else:
        # canonical 8 w + 4 i + 2 p1 + p0: [n, q, w, i, p1, p0] -> [w, p1, p0, q, i, n]
        v = gl.reshape(gl.permute(v, [2, 4, 5, 1, 3, 0]), [32 * W, TOKENS])
    return gl.convert_layout(v, BL)


@gluon.jit
def _word_offsets(w_rows, blk, K: gl.constexpr, W: gl.constexpr, LW: gl.constexpr):
    """Word offsets ``[BLOCK_M, 4, W]`` of K block ``blk`` in one expert's codes (row bytes K / 2
    = K / 8 words; a block is 16 words, lane q's 4, or the 8-word tail, lane q's 2)."""
    q = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, LW)))
    wi = gl.arange(0, W, layout=gl.SliceLayout(0, gl.SliceLayout(1, LW)))
    return w_rows[:, None, None] * (K // 8) + (blk * 16 + q * W)[None, :, None] + wi[None, None, :]


@gluon.jit
def _load_s(s_base, w_rows, w_ok, blk, live, SROW: gl.constexpr, W: gl.constexpr, LW: gl.constexpr):
    """K block ``blk``'s scale bytes ``[BLOCK_M, 4]`` (lane q's MX block); masked off unless ``live``."""
    SL: gl.constexpr = gl.SliceLayout(2, LW)
    qs = gl.arange(0, 4, layout=gl.SliceLayout(0, SL))
    # K block blk holds MX blocks 4 blk .. 4 blk + 3 (the tail: 2 blocks, 2 lanes each).
    s_off = w_rows[:, None] * SROW + (blk * 4 + qs * W // 4)[None, :]
    return gl.load(s_base + s_off, mask=w_ok[:, None] & live, other=127)


@gluon.jit
def _load_x(a_ptr, a_rows, a_ok, stride_a, blk, live, W: gl.constexpr, LX: gl.constexpr):
    """K block ``blk``'s activations ``[TOKENS, 4, 8 W]``; masked off unless ``live``."""
    qx = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, LX)))
    jx = gl.arange(0, 8 * W, layout=gl.SliceLayout(0, gl.SliceLayout(1, LX)))
    x_off = a_rows[:, None, None] * stride_a + (blk * 128 + qx * (8 * W))[None, :, None] + jx[None, None, :]
    return gl.load(a_ptr + x_off, mask=a_ok[:, None, None] & live, other=0.0)


@gluon.jit
def _issue_words(ring, w_base, w_rows, w_ok, blk, slot, live, K: gl.constexpr, LW: gl.constexpr):
    """Start copying K block ``blk``'s codes into ring slot ``slot`` (cp.async, 16 bytes a lane and
    row; zero-filled unless ``live``), as one commit group."""
    ptrs = w_base + _word_offsets(w_rows, blk, K, 4, LW)
    async_copy.async_copy_global_to_shared(ring.index(slot), ptrs, mask=w_ok[:, None, None] & live)
    async_copy.commit_group()


@gluon.jit
def _mma_block(words, sc, xv, acc, BLOCK_M: gl.constexpr, TOKENS: gl.constexpr, W: gl.constexpr, WARPS: gl.constexpr,
               AL: gl.constexpr, BL: gl.constexpr, TWO_STEP: gl.constexpr, PACKED: gl.constexpr):  # fmt: skip
    """``acc += decode(words, sc) @ arrange(xv)`` for one K block."""
    a = _decode_a(words, sc, BLOCK_M, W, WARPS, AL, TWO_STEP, PACKED)
    b = _arrange_b(xv, TOKENS, W, BL, PACKED)
    return gl.nvidia.ampere.mma_v2(a, b, acc)


@gluon.jit
def _ring_step(ring, acc, sc, xv, i, b0, nloc, w_base, w_rows, w_ok, K: gl.constexpr,
               STAGES: gl.constexpr, BLOCK_M: gl.constexpr, TOKENS: gl.constexpr, WARPS: gl.constexpr,
               LW: gl.constexpr, AL: gl.constexpr, BL: gl.constexpr, TWO_STEP: gl.constexpr,
               PACKED: gl.constexpr):  # fmt: skip
    """Decode + MMA the ``i``-th K block of this split (block ``b0 + i``) from its ring slot, after
    refilling the slot freed before it with block ``b0 + i + STAGES - 1``."""
    # Groups issued so far: STAGES - 1 + i; block i's is done when at most STAGES - 2 are pending.
    async_copy.wait_group(STAGES - 2)
    words = ring.index(i % STAGES).load(LW)
    nxt = i + STAGES - 1
    _issue_words(ring, w_base, w_rows, w_ok, b0 + nxt, nxt % STAGES, nxt < nloc, K, LW)
    return _mma_block(words, sc, xv, acc, BLOCK_M, TOKENS, 4, WARPS, AL, BL, TWO_STEP, PACKED)


@gluon.jit
def _expert_tile(w_base, s_base, a_ptr, stride_a, w_rows, w_ok, a_rows, a_ok, ks,
                 K: gl.constexpr, SROW: gl.constexpr, BLOCK_M: gl.constexpr, TOKENS: gl.constexpr,
                 WARPS: gl.constexpr, STAGES: gl.constexpr, KSPLIT: gl.constexpr, TWO_STEP: gl.constexpr,
                 WAIT: gl.constexpr, PACKED: gl.constexpr, SCALES_AHEAD: gl.constexpr = 3):  # fmt: skip
    """``W[w_rows, K slice ks] @ A[a_rows, K slice ks].T`` as fp32 ``[BLOCK_M, TOKENS]`` (MMA layout,
    rows in the MMA's order: see :func:`_decode_a`). Split ``ks`` of ``KSPLIT`` takes full K blocks
    ``ks * NBS ..`` (``NBS = cdiv(K // 128, KSPLIT)``); the last split also takes the 64-value tail.
    ``WAIT``: the grid wait (module doc) once the first weight blocks are in flight, before the first
    activation load."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
    AL: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    BL: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    LW: gl.constexpr = gl.BlockedLayout([1, 1, 4], [8, 4, 1], [WARPS, 1, 1], [2, 1, 0])
    LX: gl.constexpr = gl.BlockedLayout([1, 1, 32], [8, 4, 1], [1, 1, WARPS], [2, 1, 0])
    LWT: gl.constexpr = gl.BlockedLayout([1, 1, 2], [8, 4, 1], [WARPS, 1, 1], [2, 1, 0])
    LXT: gl.constexpr = gl.BlockedLayout([1, 1, 16], [8, 4, 1], [1, 1, WARPS], [2, 1, 0])
    gl.static_assert((SCALES_AHEAD == 3) or (SCALES_AHEAD == 6), "SCALES_AHEAD: 3 or 6 K blocks")
    NB: gl.constexpr = K // 128
    NBS: gl.constexpr = (NB + KSPLIT - 1) // KSPLIT
    b0 = ks * NBS
    nloc = gl.minimum(NB - b0, NBS)
    # The codes stream through a STAGES-deep cp.async ring in shared memory (no registers held
    # while in flight); activations (small, L2-resident) through three register stages, scales through
    # SCALES_AHEAD (3 or 6; a stage is one register a lane and row).
    ring = gl.allocate_shared_memory(gl.uint32, [STAGES, BLOCK_M, 4, 4], gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0]))
    for j in gl.static_range(STAGES - 1):
        _issue_words(ring, w_base, w_rows, w_ok, b0 + j, j, j < nloc, K, LW)
    tail = (K % 128 != 0) & (ks == KSPLIT - 1)
    if K % 128 != 0:
        # The 64-value tail (K is a multiple of 64): 8 bytes a lane, two lanes an MX block; loaded
        # up front into registers (masked off except in the last split).
        wt_rows = gl.convert_layout(w_rows, gl.SliceLayout(1, gl.SliceLayout(2, LWT)))
        wt_ok = gl.convert_layout(w_ok, gl.SliceLayout(1, gl.SliceLayout(2, LWT))) & tail
        wt = gl.load(w_base + _word_offsets(wt_rows, NB, K, 2, LWT), mask=wt_ok[:, None, None], other=0)
    # Scale bytes are weights too (never written by an earlier kernel): the first SCALES_AHEAD blocks' are
    # requested with the codes, before the grid wait.
    if K % 128 != 0:
        st = _load_s(s_base, wt_rows, wt_ok, NB, tail, SROW, 2, LWT)
    sa = _load_s(s_base, w_rows, w_ok, b0, 0 < nloc, SROW, 4, LW)
    sb = _load_s(s_base, w_rows, w_ok, b0 + 1, 1 < nloc, SROW, 4, LW)
    sc = _load_s(s_base, w_rows, w_ok, b0 + 2, 2 < nloc, SROW, 4, LW)
    if SCALES_AHEAD == 6:
        sd = _load_s(s_base, w_rows, w_ok, b0 + 3, 3 < nloc, SROW, 4, LW)
        se = _load_s(s_base, w_rows, w_ok, b0 + 4, 4 < nloc, SROW, 4, LW)
        sf = _load_s(s_base, w_rows, w_ok, b0 + 5, 5 < nloc, SROW, 4, LW)
    if WAIT:
        # The weights are in flight; the activations are the previous kernel's output (module doc).
        _grid_wait(True)
        _grid_release(True)
    if K % 128 != 0:
        at_rows = gl.convert_layout(a_rows, gl.SliceLayout(1, gl.SliceLayout(2, LXT)))
        at_ok = gl.convert_layout(a_ok, gl.SliceLayout(1, gl.SliceLayout(2, LXT)))
        xt = _load_x(a_ptr, at_rows, at_ok, stride_a, NB, tail, 2, LXT)
    acc = gl.zeros([BLOCK_M, TOKENS], gl.float32, MMA)
    xa = _load_x(a_ptr, a_rows, a_ok, stride_a, b0, 0 < nloc, 4, LX)
    xb = _load_x(a_ptr, a_rows, a_ok, stride_a, b0 + 1, 1 < nloc, 4, LX)
    xc = _load_x(a_ptr, a_rows, a_ok, stride_a, b0 + 2, 2 < nloc, 4, LX)
    # Unrolled by three so that no activation stage is copied (a scale stage six ahead is: one register).
    for i in range(0, nloc, 3):
        acc = _ring_step(ring, acc, sa, xa, i, b0, nloc, w_base, w_rows, w_ok, K, STAGES, BLOCK_M, TOKENS, WARPS, LW,
                         AL, BL, TWO_STEP, PACKED)  # fmt: skip
        xa = _load_x(a_ptr, a_rows, a_ok, stride_a, b0 + i + 3, i + 3 < nloc, 4, LX)
        if SCALES_AHEAD == 6:
            sa = sd
            sd = _load_s(s_base, w_rows, w_ok, b0 + i + 6, i + 6 < nloc, SROW, 4, LW)
        else:
            sa = _load_s(s_base, w_rows, w_ok, b0 + i + 3, i + 3 < nloc, SROW, 4, LW)
        if i + 1 < nloc:
            acc = _ring_step(ring, acc, sb, xb, i + 1, b0, nloc, w_base, w_rows, w_ok, K, STAGES, BLOCK_M, TOKENS,
                             WARPS, LW, AL, BL, TWO_STEP, PACKED)  # fmt: skip
        xb = _load_x(a_ptr, a_rows, a_ok, stride_a, b0 + i + 4, i + 4 < nloc, 4, LX)
        if SCALES_AHEAD == 6:
            sb = se
            se = _load_s(s_base, w_rows, w_ok, b0 + i + 7, i + 7 < nloc, SROW, 4, LW)
        else:
            sb = _load_s(s_base, w_rows, w_ok, b0 + i + 4, i + 4 < nloc, SROW, 4, LW)
        if i + 2 < nloc:
            acc = _ring_step(ring, acc, sc, xc, i + 2, b0, nloc, w_base, w_rows, w_ok, K, STAGES, BLOCK_M, TOKENS,
                             WARPS, LW, AL, BL, TWO_STEP, PACKED)  # fmt: skip
        xc = _load_x(a_ptr, a_rows, a_ok, stride_a, b0 + i + 5, i + 5 < nloc, 4, LX)
        if SCALES_AHEAD == 6:
            sc = sf
            sf = _load_s(s_base, w_rows, w_ok, b0 + i + 8, i + 8 < nloc, SROW, 4, LW)
        else:
            sc = _load_s(s_base, w_rows, w_ok, b0 + i + 5, i + 5 < nloc, SROW, 4, LW)
    async_copy.wait_group(0)
    if K % 128 != 0:
        # Masked off (all zeros) outside the last split: adds nothing there.
        acc = _mma_block(wt, st, xt, acc, BLOCK_M, TOKENS, 2, WARPS, AL, BL, TWO_STEP, PACKED)
    return acc


@gluon.jit
def _weight_rows(m, pid_n, N: gl.constexpr, BLOCK_M: gl.constexpr, GATE_UP: gl.constexpr,
                 INTERLEAVED: gl.constexpr):  # fmt: skip
    """The weight row (and whether it exists) of MMA row ``m`` of N tile ``pid_n``. Gate/up: MMA
    rows ``m`` and ``m + 8`` (one thread) are the gate and up rows of one intermediate feature."""
    if GATE_UP:
        h = (m // 8) % 2
        j = pid_n * (BLOCK_M // 2) + (m // 16) * 8 + m % 8
        if INTERLEAVED:
            rows = 2 * j + h
        else:
            rows = h * (N // 2) + j
        return rows, j < N // 2
    else:
        rows = pid_n * BLOCK_M + m
        return rows, rows < N


@gluon.jit
def moe_decode_gemm(
    a_ptr, stride_a, ids_ptr, w_ptr, stride_we, s_ptr, stride_se, b_ptr, stride_be, tw_ptr, y_ptr, stride_y, stride_ys,
    c_ptr, o_ptr, stride_o, num_pairs, alpha, limit, up_offset,
    K: gl.constexpr, N: gl.constexpr, SROW: gl.constexpr, TOP_K: gl.constexpr, PAIRS_P2: gl.constexpr,
    GATE_UP: gl.constexpr, INTERLEAVED: gl.constexpr, HAS_BIAS: gl.constexpr, HAS_LIMIT: gl.constexpr,
    BLOCK_M: gl.constexpr, TOKENS: gl.constexpr, WARPS: gl.constexpr, STAGES: gl.constexpr, KSPLIT: gl.constexpr,
    TWO_STEP: gl.constexpr, PDL: gl.constexpr, PACKED: gl.constexpr = False, FUSED: gl.constexpr = False,
    SCALES_AHEAD: gl.constexpr = 3,
):  # fmt: skip
    """One GEMM of the decode path; see the module docstring.

    ``a``: ``x [T, K]`` (gate/up: row = pair // TOP_K) or ``inter [pairs, K]`` (down: row =
    pair), bf16. ``w``: uint8 ``[E, N, K / 2]`` codes (``stride_we`` in bytes), ``s``: uint8
    ``[E, N, K / 32]`` scales (row stride ``SROW``), ``b``: ``[E, N]`` bias
    (any float dtype). ``y``: ``inter [pairs, N / 2]`` bf16 (gate/up) or ``[pairs, N]``
    fp32 (down, times ``tw[pair]``). ``PACKED``: the codes are in the layout of :mod:`.packed`.

    ``PDL`` (module doc): the gate/up GEMM waits before it reads the ids (the route's output, the
    launch before it); the down GEMM reads them at once and waits once its first weight blocks are
    in flight.

    ``FUSED`` (module doc, "Fused epilogues"): ``c`` is int32 counters, zero on entry and left zero.
    The gate/up GEMM with K splits writes its partial sums to ``y`` and the last split of a tile writes
    ``inter`` to ``o`` (row stride ``stride_o``); the down GEMM writes ``y`` and the last of a token's
    ``TOP_K * KSPLIT`` programs of a tile writes the token's output rows to ``o``. Unfused, ``c`` and
    ``o`` are not read.
    """
    pair = gl.program_id(0)
    pid_n = gl.program_id(1)
    ks = gl.program_id(2)
    if GATE_UP:
        _grid_wait(PDL)
        _grid_release(PDL)
    # -- the expert of this pair, and whether this program is its first pair --------------
    LP: gl.constexpr = gl.BlockedLayout([1, TOKENS], [32, 1], [WARPS, 1], [1, 0])
    idx = gl.arange(0, PAIRS_P2, layout=gl.SliceLayout(1, LP))
    ids = gl.load(ids_ptr + idx, mask=idx < num_pairs, other=-1)
    e = gl.load(ids_ptr + pair)
    same = ids == e
    first = gl.min(gl.where(same, idx, PAIRS_P2), axis=0)
    if first == pair:
        count = gl.sum(same.to(gl.int32), axis=0)
        # The scan needs a plain blocked layout (Triton 3.6 does not lower it on a slice).
        L1: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
        rank = gl.associative_scan(gl.convert_layout(same.to(gl.int32), L1), 0, _add) - 1
        rank = gl.convert_layout(rank, gl.SliceLayout(1, LP))
        w_base = (w_ptr + e.to(gl.int64) * stride_we).to(gl.pointer_type(gl.uint32))
        s_base = s_ptr + e.to(gl.int64) * stride_se
        MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, 8])
        LW: gl.constexpr = gl.BlockedLayout([1, 1, 4], [8, 4, 1], [WARPS, 1, 1], [2, 1, 0])
        LX: gl.constexpr = gl.BlockedLayout([1, 1, 32], [8, 4, 1], [1, 1, WARPS], [2, 1, 0])
        # Weight rows of the tile, as loaded: load row t = ((rep * 2 + h) * WARPS + w) * 8 + r holds
        # MMA row m = ((rep * WARPS + w) * 2 + h) * 8 + r.
        t = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, gl.SliceLayout(2, LW)))
        m_of_t = ((t // (16 * WARPS) * WARPS + (t // 8) % WARPS) * 2 + (t // (8 * WARPS)) % 2) * 8 + t % 8
        w_rows, w_ok = _weight_rows(m_of_t, pid_n, N, BLOCK_M, GATE_UP, INTERLEAVED)
        slots = gl.arange(0, TOKENS, layout=gl.SliceLayout(0, LP))
        COLS: gl.constexpr = gl.SliceLayout(0, MMA)
        m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, MMA))
        n_rows, n_ok = _weight_rows(m, pid_n, N, BLOCK_M, GATE_UP, INTERLEAVED)
        if HAS_BIAS:
            # Added once: by the first K split. Loaded before the K loop (as the routing weights below), so that
            # no load waits at the program's end: the bias is never written by a kernel before this one.
            bias = gl.load(b_ptr + e.to(gl.int64) * stride_be + n_rows, mask=n_ok & (ks == 0), other=0.0)
        for chunk in range(0, count, TOKENS):
            # The pairs of expert e ranked chunk .. chunk + TOKENS (pair order).
            pick = same[:, None] & (rank[:, None] == (chunk + slots)[None, :])
            members = gl.sum(gl.where(pick, idx[:, None], 0), axis=0)
            live = (chunk + slots) < count
            if GATE_UP:
                a_rows = members // TOP_K
            else:
                a_rows = members
            out_pairs = gl.convert_layout(members, COLS)
            out_ok = gl.convert_layout(live, COLS)
            if not GATE_UP:
                # The routing weights: written by the route, two launches or more before this one, so complete
                # when this program starts (module doc, "Programmatic dependent launch").
                tw = gl.load(tw_ptr + out_pairs, mask=out_ok, other=0.0)
            ROWS_X: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, LX))
            acc = _expert_tile(w_base, s_base, a_ptr, stride_a, w_rows, w_ok, gl.convert_layout(a_rows, ROWS_X),
                               gl.convert_layout(live, ROWS_X), ks, K, SROW, BLOCK_M, TOKENS, WARPS, STAGES, KSPLIT, TWO_STEP,
                               PDL and not GATE_UP, PACKED, SCALES_AHEAD)  # fmt: skip
            if HAS_BIAS:
                acc = acc + bias.to(gl.float32)[:, None]
            if GATE_UP and KSPLIT == 1:
                _store_swiglu(acc, y_ptr, stride_y, out_pairs, out_ok, pid_n, N, BLOCK_M, TOKENS, alpha, limit,
                              up_offset, HAS_LIMIT)  # fmt: skip
            else:
                # fp32 rows of y [KSPLIT, pairs, N]: the down GEMM's (times the routing weight), or
                # the gate/up GEMM's partial sums (for :func:`swiglu_splits`, or this grid's last split).
                if not GATE_UP:
                    acc = acc * tw[None, :]
                y_cols = y_ptr + out_pairs[None, :].to(gl.int64) * stride_y + n_rows[:, None]
                gl.store(y_cols + ks.to(gl.int64) * stride_ys, acc, mask=n_ok[:, None] & out_ok[None, :])
                if FUSED:
                    # Publish this program's rows (CTA barrier, then a release at GPU scope), and count them.
                    gl.thread_barrier()
                    if GATE_UP:
                        # One counter per (chunk, N tile), named by the chunk's first pair: the last of
                        # the KSPLIT programs to arrive sums the splits and applies the SwiGLU.
                        c = c_ptr + (gl.min(gl.where(live, members, PAIRS_P2), axis=0) * gl.num_programs(1) + pid_n)
                        if gl.atomic_add(c, 1, sem="acq_rel", scope="gpu") == KSPLIT - 1:
                            gl.store(c, 0)  # reset for the next call (every arrival of this one is in)
                            gl.thread_barrier()
                            tot = gl.zeros([BLOCK_M, TOKENS], gl.float32, MMA)
                            for s in gl.static_range(KSPLIT):  # split order, as swiglu_splits
                                tot += gl.load(y_cols + s * stride_ys, mask=n_ok[:, None] & out_ok[None, :],
                                               cache_modifier=".cg")  # fmt: skip
                            _store_swiglu(tot, o_ptr, stride_o, out_pairs, out_ok, pid_n, N, BLOCK_M, TOKENS, alpha,
                                          limit, up_offset, HAS_LIMIT)  # fmt: skip
                    else:
                        # One counter per (token, N tile): TOP_K pairs x KSPLIT programs arrive; the last one
                        # sums them in the order of :func:`combine_slots` and writes the token's output rows.
                        LT: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
                        tok = gl.convert_layout(members // TOP_K, LT)
                        mine = gl.convert_layout(live, LT)
                        c = c_ptr + tok * gl.num_programs(1) + pid_n
                        seen = gl.atomic_add(c, gl.full([TOKENS], 1, gl.int32, LT), mask=mine, sem="acq_rel",
                                             scope="gpu")  # fmt: skip
                        last = mine & (seen == TOP_K * KSPLIT - 1)
                        gl.store(c, gl.zeros([TOKENS], gl.int32, LT), mask=last)
                        if gl.max(last.to(gl.int32), axis=0) > 0:
                            gl.thread_barrier()
                            tok_c = gl.convert_layout(tok, COLS)
                            ok = n_ok[:, None] & gl.convert_layout(last, COLS)[None, :]
                            tot = gl.zeros([BLOCK_M, TOKENS], gl.float32, MMA)
                            rows = y_ptr + (tok_c * TOP_K)[None, :].to(gl.int64) * stride_y + n_rows[:, None]
                            for s1 in gl.static_range(KSPLIT):
                                for s2 in gl.static_range(TOP_K):
                                    tot += gl.load(rows + (s1 * stride_ys + s2 * stride_y), mask=ok,
                                                   cache_modifier=".cg")  # fmt: skip
                            o_ptrs = o_ptr + tok_c[None, :].to(gl.int64) * stride_o + n_rows[:, None]
                            gl.store(o_ptrs, tot.to(o_ptr.dtype.element_ty), mask=ok)


@gluon.jit
def _store_swiglu(acc, y_ptr, stride_y, out_pairs, out_ok, pid_n, N: gl.constexpr, BLOCK_M: gl.constexpr,
                  TOKENS: gl.constexpr, alpha, limit, up_offset, HAS_LIMIT: gl.constexpr):  # fmt: skip
    """``inter[pair, j] = swiglu(acc)`` for the tile's ``BLOCK_M / 2`` features ``j`` and its pairs."""
    hv = gate_up_swiglu(acc, BLOCK_M, TOKENS, alpha, limit, up_offset, HAS_LIMIT)
    HL: gl.constexpr = hv.type.layout
    jj = pid_n * (BLOCK_M // 2) + gl.arange(0, BLOCK_M // 2, layout=gl.SliceLayout(1, HL))
    cols = gl.convert_layout(out_pairs, gl.SliceLayout(0, HL))
    ok = gl.convert_layout(out_ok, gl.SliceLayout(0, HL))
    ptrs = y_ptr + cols[None, :].to(gl.int64) * stride_y + jj[:, None]
    gl.store(ptrs, hv.to(y_ptr.dtype.element_ty), mask=(jj < N // 2)[:, None] & ok[None, :])


@gluon.jit
def gate_up_swiglu(acc, BLOCK_M: gl.constexpr, COLS: gl.constexpr, alpha, limit, up_offset, HAS_LIMIT: gl.constexpr):
    """The SwiGLU of a gate/up accumulator ``[BLOCK_M, COLS]`` whose MMA rows ``m`` and ``m + 8`` (of
    each 16) are the gate and up rows of one feature (:func:`_weight_rows`) -> ``[BLOCK_M / 2, COLS]``."""
    # [M, T] -> [M / 16, 2 (h), 8, T] -> [M / 16, 8, T, 2] -> gate, up [M / 2, T]
    v = gl.permute(gl.reshape(acc, [BLOCK_M // 16, 2, 8, COLS]), [0, 2, 3, 1])
    gate, up = gl.split(v)
    gate = gl.reshape(gate, [BLOCK_M // 2, COLS])
    up = gl.reshape(up, [BLOCK_M // 2, COLS])
    return _swiglu(gate, up, alpha, limit, up_offset, HAS_LIMIT)


@gluon.jit
def _swiglu(gate, up, alpha, limit, up_offset, HAS_LIMIT: gl.constexpr):
    if HAS_LIMIT:
        gate = gl.minimum(gate, limit)
        up = gl.minimum(gl.maximum(up, -limit), limit)
    return (up + up_offset) * gate * (1.0 / (1.0 + gl.exp(-(alpha * gate))))


@triton.jit
def swiglu_splits(ws_ptr, inter_ptr, stride_ws, I, alpha, limit, up_offset, KSPLIT: tl.constexpr,
                  INTERLEAVED: tl.constexpr, HAS_LIMIT: tl.constexpr, BLOCK: tl.constexpr,
                  PDL: tl.constexpr = False):  # fmt: skip
    """``inter[p, j] = swiglu(sum_ks ws[ks, p, gate_j], sum_ks ws[ks, p, up_j])``, splits summed in
    order (deterministic); ``ws [KSPLIT, pairs, 2I]`` fp32, bias already in split 0."""
    _tl_grid_sync(PDL)
    p = tl.program_id(0)
    j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = j < I
    if INTERLEAVED:
        g_col, u_col = 2 * j, 2 * j + 1
    else:
        g_col, u_col = j, I + j
    gate = tl.zeros([BLOCK], dtype=tl.float32)
    up = tl.zeros([BLOCK], dtype=tl.float32)
    for ks in tl.static_range(KSPLIT):
        row = ws_ptr + ks * stride_ws + p.to(tl.int64) * (2 * I)
        gate += tl.load(row + g_col, mask=ok, other=0.0)
        up += tl.load(row + u_col, mask=ok, other=0.0)
    h = tl_swiglu(gate, up, alpha, limit, up_offset, HAS_LIMIT)
    tl.store(inter_ptr + p.to(tl.int64) * I + j, h.to(inter_ptr.dtype.element_ty), mask=ok)


@triton.jit
def combine_slots(y_ptr, out_ptr, stride_out, stride_ys, H, TOP_K: tl.constexpr, KSPLIT: tl.constexpr,
                  BLOCK: tl.constexpr, PDL: tl.constexpr = False):  # fmt: skip
    """``out[t, :] = sum_ks sum_s y[ks, t * TOP_K + s, :]`` (fp32, in that order) in ``out``'s dtype."""
    _tl_grid_sync(PDL)
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for ks in tl.static_range(KSPLIT):
        for s in tl.static_range(TOP_K):
            acc += tl.load(y_ptr + ks * stride_ys + (t * TOP_K + s).to(tl.int64) * H + cols, mask=ok, other=0.0)
    tl.store(out_ptr + t.to(tl.int64) * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)

"""The Hopper MXFP4 MoE (``hopper.moe_apply``): registration and host checks on a CPU, its
Gluon kernels cross-compiled for sm_90 (no GPU), numerics and graph replay on a GPU.

Cross-compilation builds the three launches exactly as the host does (CPU tensors stand in
for device tensors) and compiles each for ``cuda:90``. The PTX/SASS must then show, in the
GEMMs' K loop:

- ``mma.sync.m16n8k16`` bf16 with fp32 accumulation (the weights decoded into the MMA);
- ``mul.rn.bf16x2`` (the E8M0 scale applied to two decoded values at once);
- the codes streamed by 16-byte ``cp.async`` into the ring and read back with 16-byte
  shared loads;

and for every kernel: shared memory no more than the ring plus :data:`MAX_SCRATCH_BYTES`
(the prologue's reduction scratch), and no register spills: at most :data:`MAX_SPILLS`
local-memory instructions in the SASS (measured 0 with Triton 3.6 at every case).
"""

from __future__ import annotations

import itertools
import re
import traceback
from dataclasses import replace

import pytest
import torch

import tokenspeed_kernel as tk

NAME = "hopper.moe_apply"
GPT_OSS = tk.MoEActivation()
SM90 = tk.make_platform("sm90", device_name="NVIDIA H200")
MAX_SCRATCH_BYTES = 1024
MAX_SPILLS = 0


def _weights(e, h, i, *, bias=True, interleaved=True, scale_hi=128, device="cpu", seed=0, packed=False, codes=True):
    """Random canonical MXFP4 weights (``packed``: converted to the layout of ``hopper.moe_apply_packed``). Without
    ``codes`` the code bytes are zeros (the scales and biases still random): for launches that are only recorded and
    compiled, whose code bytes nothing reads (random bytes of 128 GPT-OSS experts take seconds to draw)."""
    g = torch.Generator().manual_seed(seed)

    def code_bytes(*shape):
        if codes:
            return torch.randint(0, 256, shape, dtype=torch.uint8, generator=g).to(device)
        return torch.zeros(shape, dtype=torch.uint8, device=device)

    w = tk.MoEWeights(
        w13=code_bytes(e, 2 * i, h // 2),
        w2=code_bytes(e, h, i // 2),
        w13_scale=torch.randint(118, scale_hi, (e, 2 * i, h // 32), dtype=torch.uint8, generator=g).to(device),
        w2_scale=torch.randint(118, scale_hi, (e, h, i // 32), dtype=torch.uint8, generator=g).to(device),
        w13_bias=(0.1 * torch.randn(e, 2 * i, generator=g)).to(torch.bfloat16).to(device) if bias else None,
        w2_bias=(0.1 * torch.randn(e, h, generator=g)).to(torch.bfloat16).to(device) if bias else None,
        format="mxfp4",
        gate_up_interleaved=interleaved,
    )
    w.validate()
    if packed:
        from tokenspeed_kernel_nvidia.hopper.moe.packed import preprocess_weights

        return preprocess_weights(w)
    return w


def _candidates(traits, sig=("bf16", "mxfp4"), sizes=None):
    return {c.name: c for c in tk.explain_selection("moe_apply", sig, traits, platform=SM90, sizes=sizes)}


GPT_OSS_TRAITS = {"activation": "swiglu", "clamp": True, "bias": True, "gate_up_interleaved": True, "up_offset": 1.0}


def test_registered_for_bf16_mxfp4_on_sm90_at_every_token_count():
    tk.load_plugins()
    spec = tk.registry.get(NAME)
    assert spec is not None and spec.solution == "hopper"
    assert spec.hardware_validated  # GPU tests + numerics on an H200: docs/benchmarks/h200-2026-12-01/hopper-moe
    assert "deterministic" in spec.tags and "cuda_graph_safe" in spec.tags
    assert spec.weight_preprocessor is None  # the canonical layout
    for tokens in (1, 7, 8, 255, 256, 16384):  # the decode path, then the prefill path
        ok = _candidates(GPT_OSS_TRAITS, sizes={"tokens": tokens})[NAME]
        assert ok.eligible, (tokens, ok.reason)
    fp16 = _candidates(GPT_OSS_TRAITS, sig=("fp16", "mxfp4"), sizes={"tokens": 8})[NAME]
    assert not fp16.eligible
    sm80 = {c.name: c for c in tk.explain_selection("moe_apply", ("bf16", "mxfp4"), GPT_OSS_TRAITS,
                                                      platform=tk.make_platform("sm80"))}  # fmt: skip
    assert NAME not in sm80 or not sm80[NAME].eligible


def test_shape_stride_and_slot_limits_raise_naming_the_argument():
    from tokenspeed_kernel_nvidia.hopper.moe import layer
    from tokenspeed_kernel_nvidia.hopper.moe.decode import MAX_PAIRS

    w = _weights(2, 96, 64)  # hidden 96 is not a multiple of 64
    x = torch.zeros(1, 96, dtype=torch.bfloat16)
    ids = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="hidden"):
        layer.moe_apply(x, torch.ones(1, 2), ids, w, GPT_OSS)
    w = _weights(2, 64, 64)
    with pytest.raises(TypeError, match="x: .*bf16"):
        layer.moe_apply(torch.zeros(1, 64, dtype=torch.float16), torch.ones(1, 2), ids, w, GPT_OSS)
    with pytest.raises(TypeError, match="topk_ids"):
        layer.moe_apply(torch.zeros(1, 64, dtype=torch.bfloat16), torch.ones(1, 2), ids.long(), w, GPT_OSS)
    k = MAX_PAIRS + 1
    with pytest.raises(ValueError, match="topk_ids"):
        layer.moe_apply(torch.zeros(1, 64, dtype=torch.bfloat16), torch.ones(1, k), torch.zeros(1, k, dtype=torch.int32),
                        w, GPT_OSS)  # fmt: skip
    sliced = replace(w, w13=w.w13[:, :, :16])  # rows of 16 bytes inside rows of 32: not the K / 2 stride
    with pytest.raises(ValueError, match="w13: .*contiguous"):
        layer.moe_apply(torch.zeros(1, 64, dtype=torch.bfloat16), torch.ones(1, 2), ids, sliced, GPT_OSS)


@pytest.mark.parametrize("fused", [False, True], ids=["separate", "fused"])
def test_calls_above_the_pair_limit_run_as_token_slices(monkeypatch, fused):
    from tokenspeed_kernel_nvidia.hopper.moe import decode, layer
    from tokenspeed_kernel_nvidia.hopper.moe.decode import MAX_PAIRS

    calls = []
    for name in ("moe_decode_gemm", "swiglu_splits", "combine_slots"):
        monkeypatch.setattr(layer, name, _Recorder(getattr(decode, name), calls))
    w = _weights(4, 64, 64)
    t, k = MAX_PAIRS // 2 + 3, 2  # 1030 pairs: a slice of 512 tokens (1024 pairs), then one of 3
    x = torch.randn(t, 64).to(torch.bfloat16)
    out = torch.empty_like(x)
    # Decode tiles keep the decode path (from PREFILL_MIN_TOKENS on, calls take the prefill path).
    layer.moe_apply(x, torch.ones(t, k), torch.zeros(t, k, dtype=torch.int32), w, GPT_OSS, out=out,
                    tiles=_fused(layer._tiles(t), fused))  # fmt: skip
    combines = [c for c in calls if c[0] is decode.combine_slots]
    gemms = [c for c in calls if c[0] is decode.moe_decode_gemm]
    assert [c[1][0] for c in gemms] == [1024, 1024, 6, 6]
    assert all(c[2][2].numel() == c[1][0] for c in gemms)  # the ids tensor has exactly the slice's pairs
    row = out.stride(0) * out.element_size()
    if fused:  # each slice's down GEMM (its fused combine, the last programs) writes its own rows of out
        assert not combines and all(c[3]["FUSED"] for c in gemms[1::2])
        assert not any(c[3]["FUSED"] for c in gemms[0::2])  # a gate/up GEMM without splits has no sums to fuse
        starts = [c[2][14].data_ptr() for c in gemms[1::2]]
    else:  # each slice's combine writes its own rows of out
        assert [c[1][0] for c in combines] == [512, 3]  # grid rows = tokens of each slice
        starts = [c[2][1].data_ptr() for c in combines]
    assert starts == [out.data_ptr(), out.data_ptr() + 512 * row]


def test_two_step_decode_is_chosen_from_the_largest_scale_byte():
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    assert layer._two_step(_weights(2, 64, 64, scale_hi=129)) is False  # bytes 118..128: 2**(s - 1) is a bf16
    w = _weights(2, 64, 64, scale_hi=129)
    w.w2_scale[0, 0, 0] = 129
    object.__setattr__(w, "_hopper_max_scale", None)
    assert layer._two_step(w) is True


def test_decode_tile_rejects_shapes_the_kernel_cannot_lay_out():
    from tokenspeed_kernel_nvidia.hopper.moe.layer import DecodeTile

    assert tuple(DecodeTile(64, 8, 2)) == (64, 8, 2, 6, 1, False, None, 3)
    assert DecodeTile(32, 8, 1, scales_ahead=6).scales_ahead == 6
    for depth in (4, 6.0):
        with pytest.raises(ValueError, match="scales_ahead"):
            DecodeTile(32, 8, 1, scales_ahead=depth)
    assert DecodeTile(64, 8, 2, 6, 4, 1).fused is True and not DecodeTile(64, 8, 2).fused
    assert DecodeTile(32, 8, 1, 8, 1, maxnreg=128).maxnreg == 128 and DecodeTile(64, 8, 2).maxnreg is None
    for cap in (31, 256, 128.0, "128"):
        with pytest.raises(ValueError, match="maxnreg"):
            DecodeTile(32, 8, 1, maxnreg=cap)
    with pytest.raises(TypeError, match="fused"):
        DecodeTile(64, 8, 2, 6, 4, "yes")
    with pytest.raises(ValueError, match="ksplit"):
        DecodeTile(64, 8, 2, 6, 0)
    with pytest.raises(ValueError, match="stages"):
        DecodeTile(64, 8, 2, 1)
    with pytest.raises(ValueError, match="tokens"):
        DecodeTile(64, 32, 2)
    with pytest.raises(ValueError, match="block_m"):
        DecodeTile(48, 8, 2)  # 16 * warps rows is the MMA tile of the program's warps
    with pytest.raises(ValueError, match="warps"):
        DecodeTile(64, 8, 3)


# -- cross-compiled for sm_90 ---------------------------------------------------------------


class _Recorder:
    """Stands in for a jitted kernel: records ``kernel[grid](*args, **kwargs)``."""

    def __init__(self, fn, calls):
        self.fn, self.calls = fn, calls

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((self.fn, grid, args, kwargs))

        return launch


def _launches(monkeypatch, tokens, e=128, h=2880, i=2880, tiles=None, gemv=False, k=4, **wkw):
    """The launches of one layer call at ``tokens`` (the MMA decode path unless ``gemv``: the GEMV path's tokens)."""
    from tokenspeed_kernel_nvidia.hopper.moe import decode, gemv_tc, layer
    from tokenspeed_kernel_nvidia.hopper.moe import gemv as gemv_module

    calls = []
    for name in ("moe_decode_gemm", "swiglu_splits", "combine_slots"):
        monkeypatch.setattr(layer, name, _Recorder(getattr(decode, name), calls))
    monkeypatch.setattr(layer, "moe_gemv", _Recorder(gemv_module.moe_gemv, calls))
    monkeypatch.setattr(layer, "moe_gemv_tc", _Recorder(gemv_tc.moe_gemv_tc, calls))
    if not gemv:
        monkeypatch.setattr(layer, "GEMV_MAX_TOKENS", 0)
    w = _weights(e, h, i, codes=False, **wkw)  # the launches are recorded, not run
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, h, generator=g).to(torch.bfloat16)
    tw, ids = tk.moe_route(torch.randn(tokens, e, generator=g), k, solution="reference")
    layer.moe_apply(x, tw, ids, w, GPT_OSS, tiles=tiles)
    return calls


def _innermost_loop(ptx: str) -> str:
    """The PTX of the deepest loop (the K loop): every basic block LLVM marks as its header or
    as "in Loop: Header=<it>" (the blocks of a loop need not be contiguous)."""
    lines = ptx.splitlines()
    starts = [n for n, line in enumerate(lines) if re.match(r"^\$L__BB\d+_\d+:", line)] + [len(lines)]
    blocks = {}  # label -> (loop header, depth, text)
    for a, b in itertools.pairwise(starts):
        label = lines[a].split(":")[0].removeprefix("$L__")
        head = " ".join(lines[a : a + 2])
        if m := re.search(r"Loop Header: Depth=(\d+)", head):
            blocks[label] = (label, int(m.group(1)), lines[a:b])
        elif m := re.search(r"in Loop: Header=(\w+) Depth=(\d+)", head):
            blocks[label] = (m.group(1), int(m.group(2)), lines[a:b])
    assert blocks, "no loop in the PTX"
    deepest = max(blocks.values(), key=lambda v: v[1])[0]
    return "\n".join(line for h, _, text in blocks.values() if h == deepest for line in text)


def _ptx_ops(ptx: str) -> dict[str, int]:
    ops: dict[str, int] = {}
    for line in ptx.splitlines():
        m = re.match(r"\s*(?:@!?%p\d+\s+)?([a-z][a-z0-9_.]*)", line)
        if m and not line.strip().startswith(("//", ".")):
            ops[m.group(1)] = ops.get(m.group(1), 0) + 1
    return ops


def _split_tiles(ksplit, fused=False):
    from tokenspeed_kernel_nvidia.hopper.moe.layer import DecodeTile

    return DecodeTile(64, 8, 4, 6, ksplit, fused), DecodeTile(64, 8, 4, 6, ksplit, fused)


def _fused(tiles, fused):
    """Decode tiles ``(gate/up, down)`` with both ``fused`` flags set to ``fused``."""
    from tokenspeed_kernel_nvidia.hopper.moe.layer import DecodeTile

    return tuple(DecodeTile(*v[:5], fused, *v[6:]) for v in tiles)


CASES = [
    ("gpt_oss_120b_T1", 1, {}),  # the table's 4 K splits
    ("gpt_oss_120b_T64_decode_tiles", 64, {"tiles": "split1"}),  # above PREFILL_MIN_TOKENS: forced
    ("no_bias_not_interleaved_T3", 3, {"bias": False, "interleaved": False}),
    ("scales_above_128_T2", 2, {"scale_hi": 140}),
    ("k_split_4_T1", 1, {"tiles": "split4"}),
    ("k_split_3_not_interleaved_T2", 2, {"tiles": "split3", "interleaved": False, "bias": False}),
]


def _atomics(ptx: str) -> list[str]:
    return re.findall(r"\batom\.[a-z0-9_.]+", ptx)


def test_sass_loop_counts_takes_the_innermost_loop_holding_the_opcode():
    """``tokenspeed_kernel.testing.sass_loop_counts`` (``tools/decode_sass_counts.py``'s loop counter) on synthetic
    SASS."""
    from tokenspeed_kernel.testing import sass_loop_counts

    ins = "--:-:-:-:1\t{}"
    sass = "\n".join([
        ins.format("S2R R0, SR_TID.X;"),
        "LBB0:",
        ins.format("IMAD R1, R0, R0, RZ;"),
        "LBB1:",
        ins.format("FFMA R2, R1, R1, R2;"),
        ins.format("@P0 FFMA R3, R1, R2, R3;"),
        ins.format("@P1 BRA LBB1;"),
        ins.format("FADD R4, R2, R3;"),
        ins.format("@P2 BRA LBB0;"),
        ins.format("EXIT;"),
    ])  # fmt: skip
    c = sass_loop_counts(sass, "FFMA")
    assert c == {"before": 2, "loop": 3, "after": 3, "mix": {"FFMA": 2, "BRA": 1}}
    assert sass_loop_counts(sass, "IMAD")["loop"] == 6  # the outer loop: the inner one has no IMAD
    with pytest.raises(ValueError, match="HMMA"):
        sass_loop_counts(sass, "HMMA")


@pytest.mark.slow
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("label,tokens,wkw", CASES, ids=[c[0] for c in CASES])
def test_kernels_cross_compile_for_sm90_with_mma_and_no_shared_tiles(monkeypatch, label, tokens, wkw, fused):
    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel_nvidia.hopper.moe import decode, layer

    if not fused and label not in ("gpt_oss_120b_T1", "k_split_3_not_interleaved_T2"):
        pytest.skip("the separate launches: two cases")
    if isinstance(wkw.get("tiles"), str):
        wkw = {**wkw, "tiles": _split_tiles(int(wkw["tiles"][-1]), fused)}
    else:  # the table's tiles, with the case's flag
        tables = _fused(layer.TWO_STEP_TILES, fused), tuple((b, _fused(v, fused)) for b, v in layer.DECODE_TILES)
        monkeypatch.setattr(layer, "TWO_STEP_TILES", tables[0])
        monkeypatch.setattr(layer, "DECODE_TILES", tables[1])
    calls = _launches(monkeypatch, tokens, **wkw)
    split = calls[0][3]["KSPLIT"] > 1  # the gate/up GEMM's K splits (the table's or the case's)
    if fused:  # gate/up, down: the split sums' SwiGLU and the combine run in their last programs
        assert [c[0] for c in calls] == [decode.moe_decode_gemm, decode.moe_decode_gemm]
    else:  # gate/up, [the split sums' SwiGLU], down, combine
        assert [c[0] for c in calls] == [decode.moe_decode_gemm, *([decode.swiglu_splits] if split else []),
                                         decode.moe_decode_gemm, decode.combine_slots]  # fmt: skip
    for fn, _grid, args, kwargs in calls:
        ck = compile_launch(fn, args, dict(kwargs), "sm90")
        gemm = fn is decode.moe_decode_gemm
        ring = kwargs["STAGES"] * kwargs["BLOCK_M"] * 64 if gemm else 0  # 64 code bytes a row and K block
        assert ck.metadata.shared <= ring + MAX_SCRATCH_BYTES, (fn, ck.metadata.shared)
        if gemm:
            # The fused epilogue's counters: GPU-scope acquire-release adds (one a program for gate/up's
            # splits, one a token column for down); none unfused, nor in a gate/up GEMM without splits.
            counted = fused and (not kwargs["GATE_UP"] or kwargs["KSPLIT"] > 1)
            atoms = _atomics(ck.asm["ptx"])
            assert bool(atoms) == counted, atoms
            assert all(a.startswith("atom.global.gpu.acq_rel.add") for a in atoms), atoms
            text = _innermost_loop(ck.asm["ptx"])
            loop = _ptx_ops(text)
            assert loop.get("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 0) >= 8, loop
            assert loop.get("mul.rn.bf16x2", 0) > 0, loop
            copies = re.findall(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], (0x[0-9a-f]+|\d+)", text)
            assert copies and all(int(c, 0) == 16 for c in copies), copies
            assert loop.get("ld.shared.v4.b32", 0) > 0, loop
        # ptxas output (SASS): spills are local-memory stores/loads.
        from tokenspeed_kernel.testing import sass as sm90_sass

        sass = sm90_sass(ck.asm["cubin"])
        assert ("HMMA" in sass) == gemm, fn  # the disassembly is real: the GEMMs' tensor-core MMAs
        spills = len(re.findall(r"\b(STL|LDL)(\.[A-Z0-9]+)*\b", sass))
        assert spills <= MAX_SPILLS, spills


def _registers(cubin: bytes) -> int:
    """Registers a thread of the cubin's kernel (``cuobjdump --dump-resource-usage``, Triton's copy)."""
    import subprocess
    import tempfile

    from triton.tools.disasm import path_to_cuobjdump

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([path_to_cuobjdump(), "--dump-resource-usage", f.name], capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
    return int(re.search(r"REG:(\d+)", usage).group(1))


@pytest.mark.slow
def test_a_tiles_register_cap_reaches_ptxas(monkeypatch):
    """``DecodeTile.maxnreg`` is the GEMM launch's ``maxnreg``: capped at 128, both one-token GEMMs compile to at
    most 128 registers a thread (uncapped they take more than 200), and still use the MMA."""
    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel.testing import sass as sm90_sass
    from tokenspeed_kernel_nvidia.hopper.moe import decode
    from tokenspeed_kernel_nvidia.hopper.moe.layer import DecodeTile

    for cap in (None, 128):
        tiles = DecodeTile(32, 8, 1, 8, 1, maxnreg=cap), DecodeTile(32, 8, 1, 4, 4, maxnreg=cap)
        gemms = [c for c in _launches(monkeypatch, 1, tiles=tiles) if c[0] is decode.moe_decode_gemm]
        assert len(gemms) == 2
        for fn, _grid, args, kwargs in gemms:
            assert kwargs.get("maxnreg") == cap
            ck = compile_launch(fn, args, dict(kwargs), "sm90")
            regs = _registers(ck.asm["cubin"])
            assert (regs <= 128) if cap else (regs > 200), (cap, regs)
            assert "HMMA" in sm90_sass(ck.asm["cubin"])


@pytest.mark.slow
def test_scales_six_blocks_ahead_are_requested_before_the_k_loop_and_the_grid_wait(monkeypatch):
    """``DecodeTile.scales_ahead``: at 6 a one-warp 32-row GEMM issues 12 more scale-byte loads before its K loop than
    at 3 (three more stages, 4 rows a lane), the same number inside it; in the down GEMM (programmatic launch) every
    scale-byte load before the K loop precedes its grid wait (weights are never written by an earlier kernel); another
    depth does not compile."""
    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel_nvidia.hopper.moe import decode, layer
    from tokenspeed_kernel_nvidia.hopper.moe.layer import DecodeTile

    monkeypatch.setattr(layer, "pdl_kwargs", lambda: {"PDL": True, "launch_pdl": True})
    counts = {}
    for depth in (3, 6):
        tiles = DecodeTile(32, 8, 1, 4, 1, scales_ahead=depth), DecodeTile(32, 8, 1, 4, 4, scales_ahead=depth)
        gemms = [c for c in _launches(monkeypatch, 1, tiles=tiles) if c[0] is decode.moe_decode_gemm]
        assert [c[3]["SCALES_AHEAD"] for c in gemms] == [depth, depth]
        for fn, _grid, args, kwargs in gemms:
            ptx = compile_launch(fn, args, dict(kwargs), "sm90").asm["ptx"]
            byte_load = r"ld\.global[.\w]*\.(?:u8|b8)"
            inside = len(re.findall(byte_load, _innermost_loop(ptx)))
            counts[depth, kwargs["GATE_UP"]] = (len(re.findall(byte_load, ptx)) - inside, inside)
            if not kwargs["GATE_UP"]:
                wait = ptx.index("griddepcontrol.wait")
                loop_start = ptx.index(_innermost_loop(ptx).splitlines()[0])
                early = [m.start() for m in re.finditer(byte_load, ptx) if m.start() < loop_start]
                assert early and max(early) < wait, (depth, len(early))
    for gate_up in (True, False):
        (before3, in3), (before6, in6) = counts[3, gate_up], counts[6, gate_up]
        assert before6 - before3 == 12 and in6 == in3, counts
    # another depth is refused when the kernel compiles, not run as 3
    fn, _grid, args, kwargs = gemms[0]
    with pytest.raises(Exception) as refused:  # (Triton nests the assertion's message in the error's causes)
        compile_launch(fn, args, {**kwargs, "SCALES_AHEAD": 4}, "sm90")
    assert "SCALES_AHEAD: 3 or 6" in "".join(traceback.format_exception(refused.value))


# -- on the H200 ----------------------------------------------------------------------------


def _reference(x, tw, ids, w, act):
    wf = replace(w, w13_bias=None if w.w13_bias is None else w.w13_bias.float(),
                 w2_bias=None if w.w2_bias is None else w.w2_bias.float())  # fmt: skip
    return tk.moe_apply(x.float(), tw, ids, wf, act, solution="reference")


def gpu_inputs(e, tokens, wkw, routing):
    """GPT-OSS-sized weights (``e`` experts), bf16 tokens and their reference top-4 routing on the GPU
    ("hot": every token's first expert is 3), and the generator for more inputs. ``wkw["hidden"]``:
    H = I other than GPT-OSS's 2880; ``wkw["x_scale"]``: the activations times it."""
    wkw = dict(wkw)
    h = wkw.pop("hidden", 2880)
    x_scale = wkw.pop("x_scale", 1.0)
    w = _weights(e, h, h, device="cuda", seed=tokens, **wkw)
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = (torch.randn(tokens, h, device="cuda", generator=g) * x_scale).to(torch.bfloat16)
    logits = torch.randn(tokens, e, device="cuda", generator=g)
    if routing == "hot":
        logits[:, 3] += 100.0
    topk_w, topk_ids = tk.moe_route(logits, 4, solution="reference")
    return w, x, topk_w, topk_ids, g


#: Both weight layouts the kernels read: canonical (``hopper.moe_apply``) and packed (``hopper.moe_apply_packed``).
LAYOUTS = ("canonical", "packed")


def in_layout(canonical, layout):
    """``(weights, kernel name)`` for ``layout``: the canonical weights, or them converted once by
    ``moe_process_weights`` for a plan of the packed kernel (the way an engine gets them)."""
    if layout == "canonical":
        return canonical, NAME
    plan = tk.moe_plan(canonical, GPT_OSS, override="hopper.moe_apply_packed")
    w = tk.moe_process_weights(plan, canonical)
    assert w.layout == "hopper.moe_apply_packed" and w.w13.data_ptr() != canonical.w13.data_ptr()
    return w, plan.kernel


GPU_CASES = [
    ("120b_T1", 128, 1, {}, "random"),
    ("120b_T7", 128, 7, {}, "random"),
    ("120b_T4_table_no_split_gate_up", 128, 4, {}, "random"),
    ("20b_T3_table_no_split_gate_up", 32, 3, {}, "random"),
    ("120b_T64_decode_tiles", 128, 64, {"tiles": "split1"}, "random"),
    ("20b_T33", 32, 33, {}, "random"),
    ("120b_T40_one_hot_expert", 128, 40, {}, "hot"),
    ("no_bias_not_interleaved_T5", 128, 5, {"bias": False, "interleaved": False}, "random"),
    ("scales_above_128_T4", 128, 4, {"scale_hi": 140}, "random"),
    ("k_split_4_T2", 128, 2, {"tiles": "split4"}, "random"),
    ("k_split_3_not_interleaved_T3", 128, 3, {"tiles": "split3", "interleaved": False}, "random"),
    ("k_split_4_T40_one_hot_expert", 128, 40, {"tiles": "split4"}, "hot"),  # 5 chunks of one expert's pairs
    # The GEMV kernel forced above the table's tokens, two sub-tiles a gate/up program, 2 row pairs a down thread.
    ("gemv_tiles_T5_no_bias_not_interleaved", 32, 5, {"tiles": "gemv", "bias": False, "interleaved": False}, "hot"),
    # The tensor-core GEMV forced: two row groups a gate/up warp, 4 chunk ranges a down slot, top-3 (a masked slot
    # warp); and scale bytes above its one-step limit (BIG_SCALES).
    ("tc_tiles_T3_no_bias_not_interleaved", 32, 3, {"tiles": "tc", "bias": False, "interleaved": False}, "hot"),
    ("tc_tiles_T1_scales_above_220", 32, 1, {"tiles": "tc", "scale_hi": 230}, "random"),
    # The integer decode (the E2M1 0.5 an f16 subnormal): 120B at one token, 20B top-3 not interleaved at two, and
    # scale bytes above 220; activations times 2**20 (the case the f16 sums of the GEMV's f16 pairs fail).
    ("tc_int_tiles_T1", 128, 1, {"tiles": "tc_int"}, "random"),
    ("tc_int_tiles_T2_top3_not_interleaved", 32, 2, {"tiles": "tc_int", "interleaved": False}, "hot"),
    ("tc_int_tiles_T1_scales_above_220", 32, 1, {"tiles": "tc_int", "scale_hi": 230}, "random"),
    ("tc_int_tiles_T1_x_times_2_20", 32, 1, {"tiles": "tc_int", "x_scale": 2.0**20}, "random"),
    # K split in the gate/up too: 2 feature warps x 2 ranges with 2 ranges a down slot (120B; 20B top-3 not
    # interleaved), and one feature warp x 4 ranges with 2 row groups x 4 ranges a down slot and scale bytes above 220.
    ("tc_ksplit_tiles_T1", 128, 1, {"tiles": "tc_ksplit"}, "random"),
    ("tc_ksplit_tiles_T2_top3_not_interleaved", 32, 2, {"tiles": "tc_ksplit", "interleaved": False}, "hot"),
    ("tc_ksplit4_tiles_T1_scales_above_220", 32, 1, {"tiles": "tc_ksplit4", "scale_hi": 230}, "random"),
    # The fp32 GEMV gate/up with the tensor-core down (either kernel takes either GEMM), 120B at one and two tokens.
    ("mixed_gemv_tiles_T1", 128, 1, {"tiles": "mixed"}, "random"),
    ("mixed_gemv_tiles_T2_not_interleaved", 128, 2, {"tiles": "mixed", "interleaved": False}, "random"),
    # The fp32 GEMV requesting steps ahead under a register cap: a gate/up ring of 3 across two sub-tiles, a down
    # ring of 4 across top-3's slots; then the activations not staged (each lane loads its own, inter in bf16):
    # 2 row pairs a gate/up thread with a ring of 2, a down ring of 3 (120B, scale bytes up to 140), and top-3.
    ("gemv_ahead_tiles_T2_top3_not_interleaved", 32, 2, {"tiles": "gemv_ahead", "interleaved": False}, "hot"),
    ("gemv_unstaged_tiles_T1_scales_above_128", 128, 1, {"tiles": "gemv_unstaged", "scale_hi": 140}, "random"),
    ("gemv_unstaged_tiles_T2_top3_not_interleaved", 32, 2, {"tiles": "gemv_unstaged", "interleaved": False}, "hot"),
    # f16 pairs: the integer decode in both GEMMs (120B at one token; top-3 not interleaved at two; scale bytes above
    # 220, the two-step scale), then the e4m3 decode with two row pairs a thread and a down ring of 3.
    ("gemv_f16i_tiles_T1", 128, 1, {"tiles": "gemv_f16i"}, "random"),
    ("gemv_f16i_tiles_T2_top3_not_interleaved", 32, 2, {"tiles": "gemv_f16i", "interleaved": False}, "hot"),
    # (activations times 2**-110: with scale bytes up to 229 and unit activations SwiGLU's clamp saturates every
    # feature and keeps only the sums' signs, which the f16 sums' rounding then decides for the few features whose
    # largest-scale block nearly cancels: 2.4e-2 in session 34, call 2)
    (
        "gemv_f16i_tiles_T1_scales_above_220",
        32,
        1,
        {"tiles": "gemv_f16i", "scale_hi": 230, "x_scale": 2.0**-110},
        "random",
    ),
    ("gemv_f16_tiles_T2", 128, 2, {"tiles": "gemv_f16"}, "random"),
    # A down program a pair (the slots summed by combine_slots): f16 pairs (120B at one token; top-3 not interleaved
    # at two), and fp32 unstaged with a ring of 3 and scale bytes above 220.
    ("gemv_pairs_tiles_T1", 128, 1, {"tiles": "gemv_pairs"}, "random"),
    ("gemv_pairs_tiles_T2_top3_not_interleaved", 32, 2, {"tiles": "gemv_pairs", "interleaved": False}, "hot"),
    (
        "gemv_pairs_unstaged_tiles_T1_scales_above_220",
        32,
        1,
        {"tiles": "gemv_pairs_unstaged", "scale_hi": 230},
        "random",
    ),
]


def _gpu_tiles(wkw):
    """The tiles a GPU case forces (``wkw["tiles"]``: ``splitN`` MMA decode tiles, ``gemv`` GEMV tiles, ``tc``
    tensor-core GEMV tiles, ``mixed`` one of each), or None."""
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile, TcTile

    name = wkw.pop("tiles", None)
    if name is None:
        return None
    if name == "gemv":
        return GemvTile(1, 8, 2), GemvTile(2, 4)
    if name == "tc":
        return TcTile(2, 2), TcTile(1, None, 4)
    if name == "tc_int":
        return TcTile(1, 4, 1, 168, "int"), TcTile(1, None, 1, None, "int")
    if name == "tc_ksplit":
        return TcTile(1, 2, 2), TcTile(1, None, 2)
    if name == "tc_ksplit4":
        return TcTile(1, 1, 4), TcTile(2, None, 4)
    if name == "mixed":
        return GemvTile(1, 8), TcTile(1, None, 1)
    if name == "gemv_ahead":
        return GemvTile(1, 8, 2, 3, 128), GemvTile(1, 4, 1, 4, 128)
    if name == "gemv_f16i":
        return GemvTile(1, 8, dot="f16i"), GemvTile(1, 4, dot="f16i")
    if name == "gemv_pairs":
        return GemvTile(1, 8, dot="f16i"), GemvTile(1, 8, dot="f16i", pairs=True)
    if name == "gemv_pairs_unstaged":
        return GemvTile(1, 8), GemvTile(1, 4, 1, 3, 128, staged=False, pairs=True)
    if name == "gemv_f16":
        return GemvTile(2, 8, dot="f16"), GemvTile(1, 4, 1, 3, 128, dot="f16")
    if name == "gemv_unstaged":
        return GemvTile(2, 4, 1, 2, staged=False), GemvTile(1, 4, 1, 3, 128, staged=False)
    return _split_tiles(int(name[-1]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("label,e,tokens,wkw,routing", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_matches_the_reference_and_replays_in_a_graph(label, e, tokens, wkw, routing, layout):
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    tk.load_plugins()
    wkw = dict(wkw)  # the parameters are shared by both layouts' runs
    tiles = _gpu_tiles(wkw)
    if layout == "packed" and tiles is not None and isinstance(tiles[0], (layer.GemvTile, layer.TcTile)):
        pytest.skip("the GEMV kernel reads the canonical layout")
    canonical, x, topk_w, topk_ids, g = gpu_inputs(e, tokens, wkw, routing)
    w, name = in_layout(canonical, layout)
    if tiles is None:

        def run(out=None):
            return tk.moe_apply(x, topk_w, topk_ids, w, GPT_OSS, out=out, override=name)
    else:

        def run(out=None):
            return layer.moe_apply(x, topk_w, topk_ids, w, GPT_OSS, out=out, tiles=tiles)

    got = run()
    ref = _reference(x, topk_w, topk_ids, canonical, GPT_OSS)
    assert torch.isfinite(ref).all() and torch.isfinite(got).all()
    err = ((got.double() - ref.double()).norm() / ref.double().norm()).item()  # float64: large scale bytes' squares
    assert err < 1e-2, err  # bf16 activations through two GEMMs
    assert torch.equal(run(), got)  # deterministic
    if tiles is None:
        # Eager calls of <= GRAPH_MAX_TOKENS tokens replay a cached graph: the same bits as launching
        # directly, also on new inputs (a replay of the graph the calls above captured).
        assert torch.equal(layer.moe_apply(x, topk_w, topk_ids, w, GPT_OSS, graphs=False), got)
        x2 = torch.randn(x.shape, device="cuda", generator=g).to(torch.bfloat16)
        again = tk.moe_apply(x2, topk_w, topk_ids, w, GPT_OSS, override=name)
        assert torch.equal(again, layer.moe_apply(x2, topk_w, topk_ids, w, GPT_OSS, graphs=False))
        # The second run() above captured the graph that reads x, topk_w, topk_ids where they are: new values
        # at those addresses replay through it.
        x_was = x.clone()
        x.copy_(x2)
        assert torch.equal(run(), again)
        x.copy_(x_was)
    assert_replays_in_a_graph(run, got)


def assert_replays_in_a_graph(run, got):
    """``run(out)`` captured in a CUDA graph and replayed writes ``got``'s bits into ``out``."""
    graph = torch.cuda.CUDAGraph()
    out = torch.empty_like(got)
    with torch.cuda.graph(graph):
        run(out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, got)


FUSED_CASES = [
    ("120b_T1", 128, 1, {}, "random"),  # the table's tiles: 4 K splits in both GEMMs
    ("120b_T4_table_no_split_gate_up", 128, 4, {}, "random"),
    ("k_split_3_not_interleaved_T3", 128, 3, {"tiles": "split3", "interleaved": False, "bias": False}, "random"),
    ("k_split_4_T40_one_hot_expert", 128, 40, {"tiles": "split4"}, "hot"),
    ("20b_T2_scales_above_128", 32, 2, {"scale_hi": 140}, "random"),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("label,e,tokens,wkw,routing", FUSED_CASES, ids=[c[0] for c in FUSED_CASES])
def test_gpu_fused_epilogues_give_the_bits_of_the_separate_launches(label, e, tokens, wkw, routing):
    """The split sums' SwiGLU and the combine in the GEMMs' last programs: the same sums in the same order as
    ``swiglu_splits`` and ``combine_slots``, so the same bits; the counters are zero again after every call,
    on every stream that used them, and a second stream counts in its own."""
    from tokenspeed_kernel import launch
    from tokenspeed_kernel_nvidia.hopper.moe import layer

    tk.load_plugins()
    tiles = _split_tiles(int(wkw.pop("tiles")[-1])) if "tiles" in wkw else None
    w, x, topk_w, topk_ids, _ = gpu_inputs(e, tokens, wkw, routing)
    tiles = tiles or layer._tiles(tokens, layer._two_step(w))  # the decode path at every token count here

    def run(fused, **kw):
        return layer.moe_apply(x, topk_w, topk_ids, w, GPT_OSS, tiles=_fused(tiles, fused), graphs=False, **kw)

    separate = run(False)
    fused = run(True)
    assert torch.equal(fused, separate)
    assert torch.equal(run(True), separate)  # the counters were left zero: a second call counts from zero
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = run(True)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(on_side, separate)
    torch.cuda.synchronize()
    used = [c for (_, kind), c in launch._BUFFERS.items() if kind == "counters" and c.device == x.device]
    assert len({c.data_ptr() for c in used}) >= 2  # the main stream's and the side stream's
    assert all(int(c.abs().max()) == 0 for c in used + [c for c in launch._OUTGROWN if c.dtype == torch.int32])
    ref = _reference(x, topk_w, topk_ids, w, GPT_OSS)
    assert ((fused.float() - ref).norm() / ref.norm()).item() < 1e-2


def _assert_replays_equal(run, want):
    """``run`` captured in a CUDA graph gives ``want`` on each of two replays."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        captured = run()
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("tokens", [1, 2])
@pytest.mark.parametrize(
    "down",
    [
        (1, 8, 1, 3, 128, False, "f32", True),
        (1, 8, 1, 3, 96, True, "f32", True),
        (1, 8, 1, 1, None, True, "f16i", True),
    ],
    ids=["pd1,8,1,3@128", "p1,8,1,3@96", "pi1,8"],
)
def test_gpu_gemv_pairs_down_sums_its_slots_in_its_last_program_with_the_bits_of_combine_slots(monkeypatch, down,
                                                                                               tokens):  # fmt: skip
    """A pairs down tile (a program a pair) summing a token's slots in the last of its programs to arrive
    (:data:`.layer.GEMV_FUSED_COMBINE`, a tuning switch) gives the bits of the separate ``combine_slots`` launch; the
    counters are zero again after every call, so a second call (and a captured graph's replay) gives them too."""
    from tokenspeed_kernel import launch
    from tokenspeed_kernel_nvidia.hopper.moe import layer
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile

    tk.load_plugins()
    dn = GemvTile(*down)
    tiles = (GemvTile(1, 8, dot=dn.dot), dn)
    w, x, topk_w, topk_ids, _ = gpu_inputs(32, tokens, {}, "random")

    def run():
        return layer.moe_apply(x, topk_w, topk_ids, w, GPT_OSS, tiles=tiles, graphs=False)

    monkeypatch.setattr(layer, "GEMV_FUSED_COMBINE", False)
    separate = run()
    monkeypatch.setattr(layer, "GEMV_FUSED_COMBINE", True)
    fused = run()
    assert torch.equal(fused, separate)
    assert torch.equal(run(), separate)  # the counters were left zero
    _assert_replays_equal(run, separate)
    used = [c for (_, kind), c in launch._BUFFERS.items() if kind == "counters" and c.device == x.device]
    assert used and all(int(c.abs().max()) == 0 for c in used)
    ref = _reference(x, topk_w, topk_ids, w, GPT_OSS)
    assert ((fused.float() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("tokens", [1, 2])
@pytest.mark.parametrize(
    "tiles,wkw",
    [(None, {}), (((1, 8), (1, 8, 1, 1, None, True, "f16i", True)), {"interleaved": False, "bias": False})],
    ids=["default", "pi1,8_not_interleaved_no_bias"],
)
def test_gpu_gemv_l2_prefetches_and_evict_first_keep_the_bits(monkeypatch, tiles, wkw, tokens):
    """The GEMV path's L2 prefetches (:data:`.layer.GEMV_PREFETCH`: a program's own rows, the gate/up's share of the
    down weights) and ``evict_first`` loads are hints: the same bits as without them, in a captured graph too, on the
    last expert (the prefetched ranges' ends are the weights' ends)."""
    from tokenspeed_kernel_nvidia.hopper.moe import layer
    from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile

    tk.load_plugins()
    tiles = tuple(GemvTile(*t) for t in tiles) if tiles else layer.GEMV_TILES
    w, x, topk_w, topk_ids, _ = gpu_inputs(32, tokens, wkw, "random")
    topk_ids = topk_ids.clone()
    topk_ids[:, 0] = 31  # the last expert: its down share of the last tile ends at the weights' last byte

    def run():
        return layer.moe_apply(x, topk_w, topk_ids, w, GPT_OSS, tiles=tiles, graphs=False)

    monkeypatch.setattr(layer, "GEMV_PREFETCH", ())
    monkeypatch.setattr(layer, "GEMV_EVICT_FIRST", False)
    plain = run()
    monkeypatch.setattr(layer, "GEMV_PREFETCH", ("own", "down"))
    monkeypatch.setattr(layer, "GEMV_EVICT_FIRST", True)
    assert torch.equal(run(), plain)
    _assert_replays_equal(run, plain)
    ref = _reference(x, topk_w, topk_ids, w, GPT_OSS)
    assert ((plain.float() - ref).norm() / ref.norm()).item() < 1e-2


# -- the layer's Triton helpers, run under the interpreter --------------------------------

_INTERPRETED = r"""
import json, torch
from tokenspeed_kernel_nvidia.hopper.moe.decode import combine_slots, swiglu_splits

g = torch.Generator().manual_seed(0)
out = {}
# combine: y [KS, T*k, H] fp32 -> out [T, H] bf16, sum over splits and slots in order.
ks, t, k, h = 3, 5, 4, 96
y = torch.randn(ks, t * k, h, generator=g)
res = torch.empty(t, h, dtype=torch.bfloat16)
combine_slots[(t, 2)](y, res, res.stride(0), y.stride(0), h, TOP_K=k, KSPLIT=ks, BLOCK=64)
want = y.view(ks, t, k, h).sum(dim=(0, 2)).to(torch.bfloat16)
def rel(a, b):
    return ((a.float() - b.float()).abs() / b.float().abs().clamp_min(1e-2)).max().item()


out["combine"] = rel(res, want)
# swiglu over split partial sums, both gate/up orders, with and without the clamp.
for interleaved in (True, False):
    for limit in (7.0, None):
        i = 80
        ws = 3 * torch.randn(ks, 6, 2 * i, generator=g)
        inter = torch.empty(6, i, dtype=torch.bfloat16)
        swiglu_splits[(6, 2)](ws, inter, ws.stride(0), i, 1.702, limit or 0.0, 1.0, KSPLIT=ks,
                              INTERLEAVED=interleaved, HAS_LIMIT=limit is not None, BLOCK=64)
        s = ws.sum(0)
        gate, up = (s[:, 0::2], s[:, 1::2]) if interleaved else (s[:, :i], s[:, i:])
        if limit is not None:
            gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
        want = ((up + 1.0) * gate * torch.sigmoid(1.702 * gate)).to(torch.bfloat16)
        out[f"swiglu_{interleaved}_{limit}"] = rel(inter, want)
print(json.dumps(out))
"""


def test_combine_and_split_swiglu_match_torch_under_the_interpreter():
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    errs = json.loads(proc.stdout.strip().splitlines()[-1])
    # fp32 sums in another order, then one bf16 rounding each: within one bf16 ulp (2**-7 relative).
    assert len(errs) == 5 and all(v <= 2**-7 for v in errs.values()), errs

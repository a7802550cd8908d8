"""Programmatic dependent launch in ``hopper.moe_apply`` (:mod:`tokenspeed_kernel_nvidia.hopper.moe.decode`).

Every kernel of the layer is launched with ``launch_pdl`` and may start before the kernel before it
finished, so each must wait (``griddepcontrol.wait``) before it reads that kernel's output or writes
anything, and let its successor launch only after that wait. On a CPU: the launches of the decode and
prefill paths (bf16 and W4A8, the one-launch sort and torch's) cross-compiled for sm_90, with the
order of the wait, the release, the loads and the stores checked in the PTX; with PDL off, no grid
control at all. On a GPU: PDL on and off give the same bits, over back-to-back calls eager and in a
replayed graph, where a kernel that read too early would see a previous call's data.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import tokenspeed_kernel as tk

sys.path.insert(0, os.path.dirname(__file__))
from test_hopper_moe import GPT_OSS, _launches, _split_tiles, gpu_inputs
from test_hopper_moe_prefill import _prefill_launches

WAIT, RELEASE = "griddepcontrol.wait", "griddepcontrol.launch_dependents"


def _blocks(ptx: str) -> tuple[list[list[str]], dict[str, int]]:
    """The kernel body's basic blocks (instruction lines) in text order, and block index by label."""
    body = ptx[ptx.index("{", ptx.index(".entry")) :]
    blocks, labels, cur = [], {}, []
    for line in body.splitlines():
        if m := re.match(r"^(\$L__BB\d+_\d+):", line):
            blocks.append(cur)
            labels[m.group(1)], cur = len(blocks), []
        elif line.strip() and not line.strip().startswith(("//", ".", "{", "}")):
            cur.append(line.split("//")[0] if "griddepcontrol" not in line else line)
    blocks.append(cur)
    return blocks, labels


def _before(ptx: str, pattern: str, barrier: str) -> bool:
    """Whether an instruction matching ``pattern`` can run before any ``barrier`` instruction: a walk of
    the PTX's control-flow graph from the entry that stops at each ``barrier``."""
    blocks, labels = _blocks(ptx)
    seen, todo = set(), [0]
    while todo:
        b = todo.pop()
        if b in seen or b >= len(blocks):
            continue
        seen.add(b)
        stopped = False
        for line in blocks[b]:
            if barrier in line:
                stopped = True
                break
            if re.match(r"^\s*(?:@!?%p\d+\s+)?" + pattern, line):
                return True
        if stopped:
            continue
        last = blocks[b][-1].strip() if blocks[b] else ""
        for target in re.findall(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+)", "\n".join(blocks[b])):
            todo.append(labels[target])
        if not re.match(r"^(bra\.uni|ret|exit)\b", last):
            todo.append(b + 1)  # falls through
    return False


def _check_order(fn, kwargs, ptx):
    """The grid-control order of one kernel's PTX (module doc), on every path through its control flow."""
    from tokenspeed_kernel_nvidia.hopper.moe import decode, gemv, gemv_tc, prefill

    name = getattr(fn, "__name__", repr(fn))
    assert ptx.count(WAIT) == 1 and ptx.count(RELEASE) == 1, name
    assert not _before(ptx, re.escape(RELEASE), WAIT), f"{name}: the release can come before the wait"
    assert not _before(ptx, r"(st|red|atom)\.global", WAIT), f"{name}: a global write can come before the wait"
    if fn is decode.moe_decode_gemm and not kwargs["GATE_UP"]:
        # The down GEMM: the ids and the first weight blocks before the wait (cp.async into its ring).
        assert _before(ptx, r"cp\.async\.cg\.shared\.global", WAIT), name
    elif fn in (gemv.moe_gemv, gemv_tc.moe_gemv_tc) and not kwargs["GATE_UP"]:
        # A GEMV down GEMM: the ids and the first code words before the wait, the activations after it.
        assert _before(ptx, r"ld\.global", WAIT), name
        assert not _before(ptx, r"st\.shared", WAIT), name
        if fn is gemv.moe_gemv:  # 16-byte loads before the wait: a thread's code words of the steps ahead, no inter
            head = ptx[: ptx.index(WAIT)]
            ahead = min(kwargs.get("AHEAD", 1), kwargs["SUB"] * -(-kwargs["K"] // 1024))
            assert len(re.findall(r"ld\.global[\w.]*\.v4", head)) == 2 * kwargs["FEATS"] * ahead, name
    elif fn is prefill.moe_prefill_gemm:
        # The offsets and the first code words before the wait; the activations' TMA after it.
        assert not _before(ptx, r"cp\.async\.bulk\.tensor", WAIT), name
        assert _before(ptx, r"ld\.global", WAIT), name
    else:
        assert not _before(ptx, r"ld\.global", WAIT), f"{name}: a global load can come before the wait"


LAYER_CASES = [
    ("gemv_T1", "gemv", 1, {}),
    ("gemv_staged_T1", "gemv", 1, {"tiles": "staged"}),  # the down's activations staged in shared memory
    ("gemv_tc_T1", "gemv", 1, {"tiles": "tc"}),  # the tensor-core GEMV for both GEMMs
    # f16 pairs staged after the wait; the down a program a pair, then combine_slots
    ("gemv_f16i_pairs_T1", "gemv", 1, {"tiles": "f16i_pairs"}),
    ("decode_T1_splits", "decode", 1, {}),
    ("decode_T3_one_split", "decode", 3, {"tiles": "split1"}),
    ("decode_T2_fused_epilogues", "decode", 2, {"tiles": "fused4"}),  # the counters' atomics after the wait
    ("prefill_T64", "prefill", 64, {}),
    ("prefill_T600_two_launch_sort", "prefill", 600, {}),  # 2400 pairs: above SORT_MAX_PAIRS
    ("w4a8_T1024", "prefill", 1024, {"fp8": True}),
]


class _Patch:
    """``monkeypatch.setattr`` for the child process (which ends after one check)."""

    def setattr(self, obj, name, value):
        setattr(obj, name, value)


def _in_subprocess(check: str, *args: str) -> None:
    """Run ``check(*args)`` of this module in a child process: the cross-compilations of a whole layer hold
    several GB that the compiler does not give back, so the test process would keep growing."""
    r = subprocess.run([sys.executable, __file__, check, *args], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, (r.stdout[-4000:], r.stderr[-4000:])


def _layer_check(label: str) -> None:
    from tokenspeed_kernel.testing import compile_launch

    path, tokens, kw = {c[0]: c[1:] for c in LAYER_CASES}[label]
    kw = dict(kw)
    if path == "gemv":
        from tokenspeed_kernel_nvidia.hopper.moe.layer import GemvTile, TcTile

        tiles = {
            "tc": (TcTile(1, 4), TcTile(1, None, 2)),
            "staged": (GemvTile(1, 8), GemvTile(2, 4, 1, 2)),
            "f16i_pairs": (GemvTile(1, 8, dot="f16i"), GemvTile(1, 8, dot="f16i", pairs=True)),
            None: None,
        }[kw.pop("tiles", None)]
        calls = _launches(_Patch(), tokens, gemv=True, tiles=tiles)
    elif path == "decode":
        tiles = {"split1": _split_tiles(1), "fused4": _split_tiles(4, True), None: None}[kw.pop("tiles", None)]
        calls = _launches(_Patch(), tokens, tiles=tiles)
        if tiles is not None and tiles[0].fused:  # both GEMMs count (their epilogues fused), nothing else launches
            assert [c[3]["FUSED"] for c in calls] == [True, True]
    else:
        calls, _ = _prefill_launches(_Patch(), tokens, **kw)
    assert len(calls) >= 2  # decode: the two GEMMs (their epilogues fused); prefill: the sort, GEMMs, combine
    for fn, _grid, args, kwargs in calls:
        assert kwargs.get("PDL") is True and kwargs.get("launch_pdl") is True, fn
        ck = compile_launch(fn, args, dict(kwargs), "sm90")
        assert ck.metadata.launch_pdl
        _check_order(fn, kwargs, ck.asm["ptx"])


def _off_check() -> None:
    from tokenspeed_kernel.testing import compile_launch
    from tokenspeed_kernel_nvidia.hopper.moe import decode, prefill

    decode.PDL_ENABLED = False
    calls = _launches(_Patch(), 1) + _prefill_launches(_Patch(), 64)[0]
    for fn, _grid, _args, kwargs in calls:
        assert kwargs["PDL"] is False and "launch_pdl" not in kwargs, fn
    gluon_gemm = calls[0]
    triton_kernel = next(c for c in calls if c[0] not in (decode.moe_decode_gemm, prefill.moe_prefill_gemm))
    for fn, _grid, args, kwargs in (gluon_gemm, triton_kernel):  # one Gluon GEMM and one Triton kernel compiled
        ptx = compile_launch(fn, args, dict(kwargs), "sm90").asm["ptx"]
        assert "griddepcontrol" not in ptx, fn


@pytest.mark.slow
@pytest.mark.parametrize("label", [c[0] for c in LAYER_CASES])
def test_each_launch_waits_before_it_reads_the_previous_output_or_writes(label):
    _in_subprocess("_layer_check", label)


@pytest.mark.slow
def test_pdl_off_launches_without_grid_control():
    _in_subprocess("_off_check")


def test_the_interpreter_gets_no_grid_control(monkeypatch):
    import triton

    from tokenspeed_kernel_nvidia.hopper.moe import decode

    monkeypatch.setattr(triton.knobs.runtime, "interpret", True)
    assert decode.pdl_kwargs() == {"PDL": False}
    monkeypatch.setattr(triton.knobs.runtime, "interpret", False)
    assert decode.pdl_kwargs() == {"PDL": True, "launch_pdl": True}


# -- on the H200 ----------------------------------------------------------------------------

GPU_CASES = [
    ("120b_T1", 128, 1, False),
    ("120b_T3", 128, 3, False),
    ("120b_T8", 128, 8, False),
    ("20b_T64", 32, 64, False),
    ("120b_T600_two_launch_sort", 128, 600, False),
    ("120b_T1024_w4a8", 128, 1024, True),
]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("label,e,tokens,fp8", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_gpu_pdl_on_and_off_give_the_same_bits_back_to_back(monkeypatch, label, e, tokens, fp8):
    from tokenspeed_kernel_nvidia.hopper.moe import decode, layer

    w, x, _, _, g = gpu_inputs(e, tokens, {}, "random")
    xs = [x] + [torch.randn(x.shape, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3)]
    logits = [torch.randn(tokens, e, device="cuda", generator=g) for _ in xs]

    def chain(outs, with_route):
        """Four calls back to back; with_route=False: one routing, so the layers' kernels follow each other."""
        routed = None if with_route else tk.moe_route(logits[0], 4, solution="triton")
        for j, xj in enumerate(xs):
            tw, ids = tk.moe_route(logits[j], 4, solution="triton") if with_route else routed
            layer.moe_apply(xj, tw, ids, w, GPT_OSS, out=outs[j], graphs=False, fp8=fp8)

    expected = {}
    monkeypatch.setattr(decode, "PDL_ENABLED", False)
    for with_route in (True, False):
        outs = [torch.empty_like(v) for v in xs]
        chain(outs, with_route)
        torch.cuda.synchronize()
        expected[with_route] = [o.clone() for o in outs]
    monkeypatch.setattr(decode, "PDL_ENABLED", True)
    for with_route in (True, False):
        for _ in range(3):  # eager, no sync between the calls
            outs = [torch.full_like(v, float("nan")) for v in xs]
            chain(outs, with_route)
            torch.cuda.synchronize()
            for j, (o, r) in enumerate(zip(outs, expected[with_route])):
                assert torch.equal(o, r), (label, with_route, "eager", j)
        outs = [torch.empty_like(v) for v in xs]
        chain(outs, with_route)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            chain(outs, with_route)
        for _ in range(5):
            for o in outs:
                o.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            for j, (o, r) in enumerate(zip(outs, expected[with_route])):
                assert torch.equal(o, r), (label, with_route, "graph", j)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])

"""``bench --host``: the host cost of one call, per op (eager public op, the kernel called directly,
CUDA-graph replay, the torch equivalent).

Per op and case (default: :data:`HOST_CASES`, the calls of a GPT-OSS-20B decode step at
batch 1 and context 2048, else the op's default case; ``--shape`` for others) the
selected kernel is timed four ways, each as ``calls`` back-to-back calls and one
synchronisation (so a call costs what the slower of host and device costs), in
``ROUNDS`` round-robin rounds whose median is kept:

- ``public_us``: the public op, eager (validation + selection + wrapper + launches; on a
  CUDA machine, calls of metadata seen before are served by a prepared call replaying its
  recorded launches: ``core/op.py``, "Launch plans");
- ``public_before_us``: the same with Triton's JIT launch path and no eager graph
  replay (:func:`~tokenspeed_kernel.launch.jit_launches`,
  :func:`~tokenspeed_kernel.graphs.no_eager_graphs`), in the same process. On a CUDA
  machine the served call's replay falls back to its wrapper there, but validation and
  selection stay skipped: a lower bound of the host path before cached launches;
- ``direct_us``: the selected kernel's function called with the arguments the op's
  ``bind`` produced (wrapper + launches); ``public - direct`` is the dispatch cost;
- ``graph_us``: the public op captured 10 times in a CUDA graph and replayed (the
  device time per call; GPU only, kernels tagged ``cuda_graph_safe``);
- ``torch_us``: the torch equivalent where one exists (``TORCH_EQUIVALENTS``);
- ``plan_us``: for the attention ops, the public op given an attention plan of the
  call's lengths (``tk.mha_plan``, built once before the timing, as an engine builds
  one per step for every layer);
- ``prepared_us``: the call prepared once (``op.prepare(**call)``, validation and selection
  done before the timing) and called with the same arguments; ``prepared - direct`` is
  what dispatch costs a prepared call. Empty where the op cannot be prepared (the sampler).

On a CPU the graph column is empty and the times are the host path with the
kernel (a PyTorch reference, or Triton's interpreter) included.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "HOST_CASES",
    "TORCH_EQUIVALENTS",
    "graph_us",
    "host_bench",
    "per_call_us",
    "write_host_json",
    "write_host_markdown",
]


def _rmsnorm_torch(call: Mapping[str, Any]) -> Callable[[], Any] | None:
    x, w = call["x"], call["weight"]
    if call.get("residual") is not None:
        return None
    return lambda: torch.nn.functional.rms_norm(x, (x.shape[-1],), w, call.get("eps", 1e-5))


def _mm_torch(call: Mapping[str, Any]) -> Callable[[], Any] | None:
    a, b, bias = call["a"], call["b"], call.get("bias")
    if a.dtype != b.dtype or not a.is_floating_point() or a.element_size() < 2:
        return None
    return lambda: torch.nn.functional.linear(a, b, bias)


def _argmax_torch(call: Mapping[str, Any]) -> Callable[[], Any] | None:
    logits = call["logits"]
    return lambda: torch.argmax(logits, dim=-1)


#: op -> (name, function of the case's call returning a thunk, or None where the case has no equivalent).
TORCH_EQUIVALENTS: dict[str, tuple[str, Callable[[Mapping[str, Any]], Callable[[], Any] | None]]] = {
    "rmsnorm": ("F.rms_norm", _rmsnorm_torch),
    "mm": ("F.linear", _mm_torch),
    "argmax": ("torch.argmax", _argmax_torch),
}


_OSS20_ATTN = {"heads_q": 64, "heads_kv": 8, "head_dim": 64, "sinks": True, "page_size": 16, "dtype": "bf16"}
_OSS20_MOE = {"experts": 32, "top_k": 4, "hidden": 2880, "inter": 2880, "weight_format": "mxfp4", "dtype": "bf16"}

#: op -> case parameters: the calls of a GPT-OSS-20B decode step (batch 1, context 2048).
HOST_CASES: dict[str, list[dict[str, Any]]] = {
    "rmsnorm": [{"tokens": 1, "hidden": 2880, "residual": r, "dtype": "bf16"} for r in (False, True)],
    "mm": [
        {"m": 1, "n": 5120, "k": 2880, "bias": True, "b_format": "dense", "dtype": "bf16", "label": "qkv"},
        {"m": 1, "n": 2880, "k": 4096, "bias": True, "b_format": "dense", "dtype": "bf16", "label": "o"},
        {"m": 1, "n": 32, "k": 2880, "bias": True, "b_format": "dense", "dtype": "bf16", "label": "router"},
    ],
    "apply_rotary": [{"tokens": 1, "heads_q": 64, "heads_k": 8, "max_position": 131072, "dtype": "bf16"}],
    "kvcache_store": [{"tokens": 1, "heads_kv": 8, "page_size": 16, "num_pages": 2048, "pad": 0, "dtype": "bf16"}],
    "apply_rotary_and_store": [
        {"tokens": 1, "heads_q": 64, "heads_k": 8, "max_position": 131072, "num_pages": 2048, "pad": 0, "dtype": "bf16"}
    ],
    "mha_decode_with_kvcache": [{"cache_lens": (2048,), "window_left": w, **_OSS20_ATTN} for w in (-1, 127)],
    # (GPT-OSS's decode call: the rotation and the cache write of the new token inside the attention's call)
    "mha_decode_append_kvcache": [{"cache_lens": (2048,), "window_left": w, **_OSS20_ATTN} for w in (-1, 127)],
    "moe_route": [{"tokens": 1, "experts": 32, "top_k": 4, "dtype": "bf16"}],
    "moe_gate": [  # (with the post-attention norm of the stream first: GPT-OSS's call)
        {"tokens": 1, "hidden": 2880, "experts": 32, "top_k": 4, "bias": True, "dtype": "bf16", **norm}
        for norm in ({}, {"norm": True, "residual": True})
    ],
    "moe_apply": [{"tokens": 1, **_OSS20_MOE}],
    "swiglu": [{"tokens": 1, "inter": 2880, "dtype": "bf16"}],
    "argmax": [{"batch": 1, "vocab": 201088, "dtype": "bf16"}],
    "top_k_top_p_sample": [{"batch": 1, "vocab": 201088, "dtype": "bf16"}],
}


def per_call_us(fn: Callable[[], Any], calls: int, device: torch.device) -> float:
    """Host+device time per call of ``calls`` back-to-back calls and one sync (after a warm-up)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(max(3, calls // 20)):
        fn()
    sync()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t) / calls * 1e6


def graph_us(fn: Callable[[], Any], calls: int) -> float:
    """Per call of ``fn`` captured 10 times in one CUDA graph (warm-up on a side stream), replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    reps = max(1, calls // 10)
    t = time.perf_counter()
    for _ in range(reps):
        graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / (reps * 10) * 1e6


def host_bench(
    ops: Sequence[str],
    *,
    device: torch.device,
    cases: Mapping[str, Sequence[Any]] | None = None,
    calls: int = 400,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per (op, case): the four times (module doc), the kernel, the case."""
    from ..numerics.cases import custom_case, get_op_cases
    from ..numerics.inputs import make_generator

    rows = []
    for op in ops:
        oc = get_op_cases(op)
        chosen = (cases or {}).get(op)
        if not chosen:
            chosen = [c for p in HOST_CASES.get(op, [{}]) for c in custom_case(op, p, device_type=device.type)[:1]]
        for case in chosen:
            row: dict[str, Any] = {"op": op, "case": case.describe(defaults=oc.defaults)}
            try:
                call = oc.make(case, device, make_generator(device, case.seed(seed)))
                row.update(_measure(op, oc.fn, call, device, calls))
            except Exception as exc:  # one op failing does not stop the table
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            rows.append(row)
            if progress is not None:
                progress(_line(row))
    return rows


#: attention ops -> the call arguments an attention plan is made from (``plan_us``).
PLAN_FIELDS: dict[str, tuple[str, ...]] = {
    "mha_decode_with_kvcache": ("cache_seqlens",),
    "mha_decode_append_kvcache": ("cache_seqlens",),
    "mha_extend_with_kvcache": ("cache_seqlens", "cu_seqlens_q"),
    "mha_prefill": ("cu_seqlens_q", "cu_seqlens_k"),
}


#: rounds per figure: the figures of one case are timed round-robin and the median kept, so the
#: host's drift (frequency, other processes) hits every column alike.
ROUNDS = 5


def _measure(op: str, fn: Any, call: dict[str, Any], device: torch.device, calls: int) -> dict[str, Any]:
    from ..core.op import NotPreparable
    from ..core.selection import select_for_device
    from ..graphs import no_eager_graphs
    from ..launch import jit_launches

    dev, signature, traits, sizes, kargs, kkwargs = fn.bind(**call)
    sel = select_for_device(op, signature, traits, sizes, dev, None, None)
    row: dict[str, Any] = {"kernel": sel.spec.name}
    if sel.captured is not None:  # (graph_us runs the captured pick: selection's "Eager and captured calls")
        row["kernel_captured"] = sel.captured.spec.name

    def public():
        return fn(**call)

    def direct():
        return sel.fn(*kargs, **kkwargs)

    eq = TORCH_EQUIVALENTS.get(op)
    thunk = eq[1](call) if eq else None
    planned = None
    if op in PLAN_FIELDS:
        from ..ops.attention import mha_plan

        plan = mha_plan(**{name: call[name].cpu() for name in PLAN_FIELDS[op]})

        def planned():
            return fn(**call, plan=plan)

    try:
        prepared = fn.prepare(**call)
    except NotPreparable:  # bind builds kernel arguments per call (the sampler's [B] constants)
        prepared = None
    samples: dict[str, list[float]] = {
        "public_us": [], "public_before_us": [], "direct_us": [], "torch_us": [], "plan_us": [], "prepared_us": [],
    }  # fmt: skip
    per_round = max(1, calls // ROUNDS)
    for _ in range(ROUNDS):
        samples["public_us"].append(per_call_us(public, per_round, device))
        with jit_launches(), no_eager_graphs():
            samples["public_before_us"].append(per_call_us(public, per_round, device))
        samples["direct_us"].append(per_call_us(direct, per_round, device))
        if thunk is not None:
            samples["torch_us"].append(per_call_us(thunk, per_round, device))
        if planned is not None:
            samples["plan_us"].append(per_call_us(planned, per_round, device))
        if prepared is not None:
            samples["prepared_us"].append(per_call_us(lambda: prepared(**call), per_round, device))
    for name, vals in samples.items():
        if vals:
            row[name] = statistics.median(vals)
    row["dispatch_us"] = row["public_us"] - row["direct_us"]
    if thunk is not None:
        row["torch"] = eq[0]
    if device.type == "cuda" and "cuda_graph_safe" in sel.spec.tags:
        row["graph_us"] = graph_us(public, calls)
    return row


def _fmt(v: Any) -> str:
    return f"{v:.1f}" if isinstance(v, float) else ("" if v is None else str(v))


def _line(row: Mapping[str, Any]) -> str:
    if "error" in row:
        return f"{row['op']:28s} error: {row['error']}"
    cols = (
        "public_us",
        "public_before_us",
        "direct_us",
        "dispatch_us",
        "graph_us",
        "torch_us",
        "plan_us",
        "prepared_us",
    )
    kernel = row["kernel"] + (f" (captured: {row['kernel_captured']})" if row.get("kernel_captured") else "")
    return f"{row['op']:28s} {kernel:34s} " + " ".join(f"{c[:-3]}={_fmt(row.get(c))}" for c in cols)


def write_host_json(rows: list[dict[str, Any]], path: str, meta: Mapping[str, Any]) -> None:
    from ..launch import launch_cache_info

    with open(path, "w") as f:
        json.dump({"meta": dict(meta), "rows": rows, "launch_cache": launch_cache_info()}, f, indent=1)


def write_host_markdown(rows: list[dict[str, Any]], path: str, meta: Mapping[str, Any]) -> None:
    lines = [
        "# Host cost per call",
        "",
        f"{meta.get('device', '')}; {meta.get('calls', '')} back-to-back calls then one sync per figure (us per call).",
        "",
    ]
    if meta.get("command"):
        lines += [f"Command: `{meta['command']}`", ""]
    lines += [
        "| op | case | kernel | public op, eager | before (JIT launch, no eager graph) | kernel directly | dispatch "
        "| graph replay | torch equivalent | public op with a plan | prepared call |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['op']} | {r['case']} | error: {r['error']} | | | | | | | | |")
            continue
        torch_col = f"{r['torch']} {r['torch_us']:.1f}" if "torch_us" in r else ""
        kernel = r["kernel"] + (f" (captured: {r['kernel_captured']})" if r.get("kernel_captured") else "")
        lines.append(
            f"| {r['op']} | {r['case']} | {kernel} | {_fmt(r['public_us'])} | {_fmt(r['public_before_us'])} | "
            f"{_fmt(r['direct_us'])} | "
            f"{_fmt(r['dispatch_us'])} | {_fmt(r.get('graph_us'))} | {torch_col} | {_fmt(r.get('plan_us'))} | "
            f"{_fmt(r.get('prepared_us'))} |"
        )
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")

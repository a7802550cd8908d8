#!/usr/bin/env python3
"""The AMD MoE's portable Triton twin on an NVIDIA GPU: numerics at GPT-OSS-120B shapes and
timings next to ``triton.moe_apply`` (issue: the gfx950 Gluon MoE is compile-verified only;
its twin runs the same host plan, tiles and schedule on hardware).

    python tools/bench_amd_moe_twin.py --out OUT [--tokens 1,8,64,512,4096] [--numerics-max 4096]

Layer: 128 experts, top-4, hidden = intermediate = 2880, MXFP4 experts with biases,
interleaved gate/up, SwiGLU alpha 1.702, clamp 7, +1 on up. Random weights (every E2M1
code, E8M0 scales 2^-9 .. 2^-5, as vLLM's test), x ~ N(0, 1) bf16, random router logits.

Numerics (``rel`` = max |out - ref| / max |ref|):
- ``bf16``: the twin with the caller's routing and bf16 activations (our ``moe_apply``
  form) against ``tokenspeed_kernel.reference.moe.moe_apply``, next to ``triton.moe_apply``
  against the same reference;
- ``w4a8``: vLLM's sequence (``preprocess_gluon_mxfp4_gfx950_moe_weights`` on a layer,
  then ``gluon_mxfp_fused_moe(..., target="portable")``, routing inside, static FP8
  scales) against the W4A8 reference of ``packages/tokenspeed-kernel-amd/tests/_moe_ref.py``;
  at T <= 8 both the decode path and the grouped path.

Timing: ``tokenspeed_kernel.benchmark.timer.time_fn`` with ``graph=True`` (one CUDA graph
replay per sample, L2 flushed before each): ``triton.moe_apply`` = its fused route +
apply (what ``tools/bench_triton_moe.py`` calls "ours"); ``twin bf16`` = the same route +
the twin; ``twin w4a8`` = vLLM's call (routing inside).
Writes ``OUT/amd_moe_twin.json`` and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "packages/tokenspeed-kernel-amd/tests"))

E, TOP_K, H, I = 128, 4, 2880, 2880
TIMING = {"device": "cuda", "warmup_ms": 10.0, "rep_ms": 60.0}


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).abs().max() / ref.abs().max())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="1,8,64,512,4096")
    ap.add_argument("--numerics-max", type=int, default=4096, help="skip the references above this token count")
    args = ap.parse_args()

    from _moe_ref import moe_reference, random_experts

    import tokenspeed_kernel as tk
    from tokenspeed_kernel.benchmark.timer import time_fn
    from tokenspeed_kernel.ops.moe import MoEActivation, MoEWeights
    from tokenspeed_kernel.reference import moe as ref_moe
    from tokenspeed_kernel_amd.moe import fused
    from tokenspeed_kernel_amd.moe.weights import prepare_weights
    from tokenspeed_kernel_amd.ops.moe.fused_mxfp_gfx950 import gluon_mxfp_fused_moe
    from tokenspeed_kernel_amd.ops.moe.mxfp4_gfx950_preprocess import preprocess_gluon_mxfp4_gfx950_moe_weights
    from tokenspeed_kernel_triton.moe import experts, route

    dev = "cuda"
    raw = random_experts(E, H, I, device=dev, seed=0)
    w13, s13, w2, s2, b13, b2 = raw
    canonical = MoEWeights(w13=w13, w2=w2, format="mxfp4", w13_scale=s13, w2_scale=s2, w13_bias=b13, w2_bias=b2,
                           gate_up_interleaved=True)  # fmt: skip
    act = MoEActivation()
    twin_w = prepare_weights(*raw)
    layer = torch.nn.Module()
    for name, t in (("w13_weight", w13), ("w2_weight", w2), ("w13_weight_scale", s13), ("w2_weight_scale", s2),
                    ("w13_weight_bias", b13), ("w2_weight_bias", b2)):  # fmt: skip
        setattr(layer, name, torch.nn.Parameter(t.clone(), requires_grad=False))
    # Static scales a calibration would give for x ~ N(0, 1) (|x| < 6) and this SwiGLU (|h| < 56).
    layer.w13_input_scale = torch.nn.Parameter(torch.full((E,), 6.0 / 448, device=dev), requires_grad=False)
    layer.w2_input_scale = torch.nn.Parameter(torch.full((E,), 56.0 / 448, device=dev), requires_grad=False)
    preprocess_gluon_mxfp4_gfx950_moe_weights({}, layer)

    def vllm_call(x, logits, decode=True):
        return gluon_mxfp_fused_moe(
            x, logits, layer.w13_weight_triton_tensor, layer.w2_weight_triton_tensor,
            w13_mx_scale=layer.w13_precision_config.b_mx_scale, w2_mx_scale=layer.w2_precision_config.b_mx_scale,
            w13_act_scale=layer.w13_act_scale, w2_act_scale=layer.w2_act_scale, top_k=TOP_K,
            w13_bias=layer.w13_weight_bias, w2_bias=layer.w2_weight_bias, out_dtype=x.dtype,
            enable_warp_decode=decode, swiglu_alpha=1.702, swiglu_limit=7.0, swiglu_beta=1.0, target="portable",
        )  # fmt: skip

    rows = []
    gen = torch.Generator(device=dev).manual_seed(1)
    for t in [int(v) for v in args.tokens.split(",")]:
        x = torch.randn(t, H, device=dev, generator=gen).to(torch.bfloat16)
        logits = torch.randn(t, E, device=dev, generator=gen)
        row: dict = {"tokens": t, "tiles": fused.choose_tiles(t, E, TOP_K).__dict__}
        t0 = time.time()
        if t <= args.numerics_max:
            tw, ids = ref_moe.moe_route(logits, TOP_K, renormalize=True)
            ref = ref_moe.moe_apply(x, tw, ids, canonical, act).float()
            ours = fused.fused_moe(x, twin_w, top_k=TOP_K, topk_weights=tw, topk_ids=ids, target="portable")
            tri = experts.moe_apply(x, tw, ids, canonical, act)
            row["rel_bf16_twin"] = _rel(ours, ref)
            row["rel_bf16_triton"] = _rel(tri, ref)
            ref8 = moe_reference(x, raw, top_k=TOP_K, router_logits=logits, a1=layer.w13_act_scale,
                                 a2=layer.w2_act_scale)  # fmt: skip
            row["rel_w4a8_twin"] = _rel(vllm_call(x, logits), ref8)
            if t <= 8:
                row["rel_w4a8_twin_grouped"] = _rel(vllm_call(x, logits, decode=False), ref8)
            row["rel_w4a8_vs_bf16_ref"] = _rel(vllm_call(x, logits), ref)
        out = torch.empty_like(x)

        def triton_layer(x=x, logits=logits, out=out):
            a, b = route.moe_route(logits, TOP_K)
            return experts.moe_apply(x, a, b, canonical, act, out=out)

        def twin_bf16(x=x, logits=logits, out=out):
            a, b = route.moe_route(logits, TOP_K)
            return fused.fused_moe(x, twin_w, top_k=TOP_K, topk_weights=a, topk_ids=b, target="portable", out=out)

        def twin_w4a8(x=x, logits=logits):
            return vllm_call(x, logits)

        for name, fn in (("triton.moe_apply", triton_layer), ("twin_bf16", twin_bf16), ("twin_w4a8", twin_w4a8)):
            try:
                row[f"us_{name}"] = time_fn(fn, graph=True, **TIMING).median_us
            except Exception as exc:  # report, keep going
                row[f"us_{name}"] = None
                row[f"error_{name}"] = f"{type(exc).__name__}: {exc}"[:300]
        row["seconds"] = round(time.time() - t0, 1)
        print(json.dumps(row), flush=True)
        rows.append(row)

    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "tk": tk.__version__,
            "shapes": {"E": E, "top_k": TOP_K, "H": H, "I": I}, "timing": TIMING, "rows": rows}  # fmt: skip
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "amd_moe_twin.json").write_text(json.dumps(info, indent=1))
    print(
        "| tokens | triton.moe_apply us | twin bf16 us | twin w4a8 us | rel bf16 twin | rel bf16 triton | rel w4a8 twin |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        f = [r.get(k) for k in ("us_triton.moe_apply", "us_twin_bf16", "us_twin_w4a8")]
        g = [r.get(k) for k in ("rel_bf16_twin", "rel_bf16_triton", "rel_w4a8_twin")]
        print(f"| {r['tokens']} | " + " | ".join("-" if v is None else f"{v:.1f}" for v in f) + " | "
              + " | ".join("-" if v is None else f"{v:.2e}" for v in g) + " |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

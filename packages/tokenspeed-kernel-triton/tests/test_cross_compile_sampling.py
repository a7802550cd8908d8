"""The sampling kernels (one-launch argmax; the top-k / top-p sampler's passes) compile for sm90,
gfx942 and gfx950 for bf16 logits at GPT-OSS's vocabulary (201088), spilling nothing.

``python test_cross_compile_sampling.py sm90`` prints one target's raw results.
"""

from __future__ import annotations

from typing import Any

from _compile_cases import VOCAB, Case, child_main, cross_compile_tests, ints

from tokenspeed_kernel_triton import sampling


def _sample_cases(smp: Any) -> dict[str, Case]:
    """The sampler's kernels for bf16 logits (2 key levels) at a GPT-OSS vocabulary row."""
    block, steps, levels = smp.block, smp.steps, 2
    logits = {"logits_ptr": "*bf16"}
    rows = dict.fromkeys(("top_k_ptr",), "*i32") | dict.fromkeys(
        ("top_p_ptr", "temperature_ptr", "uniform_ptr"), "*fp32"
    )
    scratch = {
        "scratch_i32_ptr": "*i32",
        "scratch_f64_ptr": "*fp64",
        "cand_i_ptr": "*i32",
        "cand_e_ptr": "*fp32",
        "pmax_ptr": "*fp32",
    }
    types = logits | rows | scratch | {"out_ptr": "*i64"} | ints("V", "stride_row", "n_chunks")
    pass_cx = {"LEVELS": levels, "BLOCK": block, "STEPS": steps}
    cases = {
        f"sample-topk-level{level}": Case(sampling._topk_pass_kernel, types, {"LEVEL": level, **pass_cx}, smp.num_warps)
        for level in range(levels)
    }
    n_chunks = -(-VOCAB // (block * steps))
    cases["sample-candidates"] = Case(
        sampling._candidates_kernel,
        types,
        {"CAP": smp.cap, "BLOCK_C": 1 << (n_chunks - 1).bit_length(), **pass_cx},
        smp.num_warps,
    )
    for p in (1, 3):  # histogram pass, compaction pass
        cases[f"sample-topp-pass{p}"] = Case(
            sampling._topp_pass_kernel, types, {"PASS": p, "CAP": smp.cap, **pass_cx}, smp.num_warps
        )
    cases["sample-topp-threshold"] = Case(
        sampling._topp_threshold_kernel,
        types,
        {"LEVELS": levels, "CAP": smp.cap, "BLOCK": block, "PROBES": smp.probes},
        smp.num_warps,
    )
    cases["sample-final-mass"] = Case(sampling._final_mass_kernel, types, pass_cx, smp.num_warps)
    cases["sample-final-pick"] = Case(sampling._final_pick_kernel, types, pass_cx, smp.num_warps)
    for case in cases.values():
        case.values = {"V": VOCAB, "stride_row": VOCAB, "n_chunks": n_chunks}
    return cases


def cases(family: str) -> dict[str, Case]:
    am = sampling.ARGMAX_CONFIGS[family]
    return {
        "argmax": Case(
            sampling._argmax_kernel,
            {
                "x_ptr": "*bf16",
                "out_ptr": "*i64",
                "part_ptr": "*fp32",
                "counter_ptr": "*i32",
                **ints("V", "stride_x", "n_chunks"),
            },
            # the number of chunks of one GPT-OSS vocabulary row, rounded up to a power of two
            {
                "BLOCK": am.block,
                "STEPS": am.rows,
                "BLOCK_C": 1 << (-(-VOCAB // (am.block * am.rows)) - 1).bit_length(),
                "SPLIT": True,
            },
            am.num_warps,
            values={"V": VOCAB, "stride_x": VOCAB, "n_chunks": 50},
        ),
        **_sample_cases(sampling.SAMPLE_CONFIGS[family]),
    }


compiled, test_every_kernel_has_a_cross_compile_case, test_kernel_compiles = cross_compile_tests(
    sampling.TRITON_KERNELS, cases, __file__
)

if __name__ == "__main__":
    child_main(cases)

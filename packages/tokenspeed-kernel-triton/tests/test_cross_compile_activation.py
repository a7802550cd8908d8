"""swiglu's Triton kernel (also silu_and_mul's) compiles for sm90, gfx942 and gfx950 at GPT-OSS shapes.

Both gate/up layouts: interleaved pairs with the clamp (GPT-OSS's experts) and halves
without it; nothing may spill. ``python test_cross_compile_activation.py sm90`` prints
one target's raw results.
"""

from __future__ import annotations

from _compile_cases import HIDDEN, Case, child_main, cross_compile_tests, ints

from tokenspeed_kernel_triton import activation

_TYPES = {
    "x_ptr": "*bf16",
    "y_ptr": "*bf16",
    **ints("I", "stride_x", "stride_y"),
    **dict.fromkeys(("alpha", "limit", "up_offset"), "fp32"),
}
_VALUES = {"I": HIDDEN, "stride_x": 2 * HIDDEN, "stride_y": HIDDEN}


def cases(family: str) -> dict[str, Case]:
    cfg = activation.SWIGLU_CONFIGS[family]
    return {
        f"swiglu-{name}": Case(
            activation._swiglu_kernel,
            _TYPES,
            {"INTERLEAVED": interleaved, "CLAMP": interleaved, "BLOCK": cfg.block},
            cfg.num_warps,
            values=_VALUES,
        )
        for name, interleaved in (("interleaved-clamp", True), ("halves", False))
    }


compiled, test_every_kernel_has_a_cross_compile_case, test_kernel_compiles = cross_compile_tests(
    activation.TRITON_KERNELS, cases, __file__
)

if __name__ == "__main__":
    child_main(cases)

"""The quantization kernels (FP8 per token / static / per tensor / 1x128 blocks, MXFP4 both ways)
compile for sm90, gfx942 and gfx950 at GPT-OSS shapes, spilling nothing.

4096 tokens of 2880 (fp8, mxfp4 quantize); a 5760 x 2880 MXFP4 weight (dequantize).
``python test_cross_compile_quantization.py sm90`` prints one target's raw results.
"""

from __future__ import annotations

from _compile_cases import HIDDEN, Case, child_main, cross_compile_tests, ints

from tokenspeed_kernel_triton import quantization as q


def cases(family: str) -> dict[str, Case]:
    fp8 = q.QUANTIZE_FP8_CONFIGS[family]
    fp8_block = q.QUANTIZE_FP8_BLOCK128_CONFIGS[family]
    mx_quant = q.QUANTIZE_MXFP4_CONFIGS[family]
    mx_dequant = q.DEQUANTIZE_MXFP4_CONFIGS[family]
    fp8_rows_types = {
        "x_ptr": "*bf16",
        "q_ptr": "*fp8e4nv",
        "scale_ptr": "*fp32",
        "partial_ptr": "*fp32",
        **ints("n_partials", "M", "K", "stride_xm", "stride_qm"),
    }
    fp8_rows = {"BLOCK_M": fp8.rows, "BLOCK_K": min(fp8.block, 4096), "BLOCK_P": 512}
    fp8_rows_values = {"n_partials": 512, "M": 4096, "K": HIDDEN, "stride_xm": HIDDEN, "stride_qm": HIDDEN}
    return {
        "quantize_fp8-amax_partial": Case(
            q._amax_partial_kernel,
            {"x_ptr": "*bf16", "partial_ptr": "*fp32", **ints("M", "K", "stride_xm", "rows_per_program")},
            {"BLOCK_M": fp8.rows, "BLOCK_K": 4096},
            fp8.num_warps,
            values={"M": 4096, "K": HIDDEN, "stride_xm": HIDDEN, "rows_per_program": 8},
        ),
        **{
            f"quantize_fp8-{name}": Case(
                q._fp8_rows_kernel, fp8_rows_types, {"MODE": mode, **fp8_rows}, values=fp8_rows_values
            )
            for name, mode in (
                ("per_token", q._MODE_PER_ROW),
                ("static", q._MODE_STATIC),
                ("per_tensor", q._MODE_PER_TENSOR),
            )
        },
        "quantize_fp8-block128": Case(
            q._fp8_block128_kernel,
            {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "scale_ptr": "*fp32"}
            | ints("K", "n_blocks", "stride_xm", "stride_qm", "stride_sm"),
            {"BLOCKS": fp8_block.rows},
            fp8_block.num_warps,
            values={"K": HIDDEN, "n_blocks": 23, "stride_xm": HIDDEN, "stride_qm": HIDDEN, "stride_sm": 23},
        ),
        "quantize_mxfp4": Case(
            q._mxfp4_quantize_kernel,
            {"x_ptr": "*bf16", "blocks_ptr": "*u8", "scales_ptr": "*u8"}
            | ints("n_groups", "stride_xm", "stride_bm", "stride_sm"),
            {"GROUPS": mx_quant.rows},
            mx_quant.num_warps,
            values={"n_groups": HIDDEN // 32, "stride_xm": HIDDEN, "stride_bm": HIDDEN // 2, "stride_sm": HIDDEN // 32},
        ),
        "dequantize_mxfp4": Case(
            q._mxfp4_dequantize_kernel,
            {"blocks_ptr": "*u8", "scales_ptr": "*u8", "out_ptr": "*bf16"}
            | ints("n_rows", "K", "stride_bm", "stride_sm", "stride_om"),
            {"BLOCK_R": mx_dequant.rows, "BLOCK_K": mx_dequant.block},
            mx_dequant.num_warps,
            values={
                "n_rows": 5760,
                "K": HIDDEN,
                "stride_bm": HIDDEN // 2,
                "stride_sm": HIDDEN // 32,
                "stride_om": HIDDEN,
            },
        ),
    }


compiled, test_every_kernel_has_a_cross_compile_case, test_kernel_compiles = cross_compile_tests(
    q.TRITON_KERNELS, cases, __file__
)

if __name__ == "__main__":
    child_main(cases)

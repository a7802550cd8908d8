"""rmsnorm's Triton kernel compiles for sm90, gfx942 and gfx950 at GPT-OSS shapes, spilling nothing.

Three paths: a 2880 row held as a 2048 + 1024 tile pair with the fused residual (the
two-tile rows of the table, 4096 tokens), one 4096-lane tile (16384 tokens) and the
two-pass loop of rows longer than a tile. ``python test_cross_compile_rmsnorm.py sm90``
prints one target's raw results.
"""

from __future__ import annotations

from _compile_cases import HIDDEN, Case, child_main, cross_compile_tests, ints

from tokenspeed_kernel_triton import rmsnorm
from tokenspeed_kernel_triton.rmsnorm import RMSNORM_CONFIGS, RowConfig

_TYPES = {
    **dict.fromkeys(("x_ptr", "res_ptr", "w_ptr", "y_ptr", "sum_ptr"), "*bf16"),
    **ints("n_rows", "H", "stride_x", "stride_r", "stride_y", "stride_sum"),
    "eps": "fp32",
}


def _table_row(family: str, n_rows: int) -> RowConfig:
    return next(cfg for max_rows, cfg in RMSNORM_CONFIGS[family] if max_rows is None or n_rows <= max_rows)


def _values(n_rows: int) -> dict[str, int]:
    return {"n_rows": n_rows, "H": HIDDEN, **dict.fromkeys(("stride_x", "stride_r", "stride_y", "stride_sum"), HIDDEN)}


def cases(family: str) -> dict[str, Case]:
    rms, rms_big = _table_row(family, 4096), _table_row(family, 16384)
    kernel = rmsnorm._rmsnorm_kernel
    return {
        "rmsnorm-residual": Case(
            kernel,
            _TYPES,
            # 2880 = a 2048 tile + a 1024 tail tile (832 used)
            {"HAS_RESIDUAL": True, "ONE_PASS": True, "BLOCK": 2048, "BLOCK_TAIL": 1024, "ROWS": rms.rows},
            rms.num_warps,
            values=_values(4096),
        ),
        "rmsnorm-one-tile": Case(
            kernel,
            _TYPES,
            {"HAS_RESIDUAL": False, "ONE_PASS": True, "BLOCK": 4096, "BLOCK_TAIL": 0, "ROWS": rms_big.rows},
            rms_big.num_warps,
            values=_values(16384),
        ),
        "rmsnorm-two-pass": Case(
            kernel,
            _TYPES,
            {"HAS_RESIDUAL": False, "ONE_PASS": False, "BLOCK": 1024, "BLOCK_TAIL": 0, "ROWS": rms.rows},
            rms.num_warps,
            values=_values(4096),
        ),
    }


compiled, test_every_kernel_has_a_cross_compile_case, test_kernel_compiles = cross_compile_tests(
    rmsnorm.TRITON_KERNELS, cases, __file__
)

if __name__ == "__main__":
    child_main(cases)

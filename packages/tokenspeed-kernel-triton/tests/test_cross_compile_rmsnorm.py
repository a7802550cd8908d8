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
    return {
        name: Case(
            rmsnorm._rmsnorm_kernel,
            _TYPES,
            {"HAS_RESIDUAL": residual, "ONE_PASS": one_pass, "BLOCK": block, "BLOCK_TAIL": tail, "ROWS": cfg.rows},
            cfg.num_warps,
            values=_values(n_rows),
        )
        for name, n_rows, residual, one_pass, block, tail in (
            ("rmsnorm-residual", 4096, True, True, 2048, 1024),  # 2880 = a 2048 tile + a 1024 tail tile (832 used)
            ("rmsnorm-one-tile", 16384, False, True, 4096, 0),
            ("rmsnorm-two-pass", 4096, False, False, 1024, 0),
        )
        for cfg in [_table_row(family, n_rows)]
    }


compiled, test_every_kernel_has_a_cross_compile_case, test_kernel_compiles = cross_compile_tests(
    rmsnorm.TRITON_KERNELS, cases, __file__
)

if __name__ == "__main__":
    child_main(cases)

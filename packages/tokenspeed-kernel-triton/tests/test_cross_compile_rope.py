"""The Triton kernels of apply_rotary and apply_rotary_and_store compile for sm90, gfx942 and gfx950 at GPT-OSS
shapes, spilling nothing.

64 q / 8 kv heads of 64 inside one packed QKV row, neox pairing. ``python
test_cross_compile_rope.py sm90`` prints one target's raw results.
"""

from __future__ import annotations

from _compile_cases import QKV_N, Case, child_main, cross_compile_tests, ints

from tokenspeed_kernel_triton import rope


def cases(family: str) -> dict[str, Case]:
    cfg = rope.ROTARY_CONFIGS[family]
    types = {
        **dict.fromkeys(("q_ptr", "k_ptr", "q_out_ptr", "k_out_ptr"), "*bf16"),
        "cache_ptr": "*fp32",
        "pos_ptr": "*i64",
        **ints("Hq", "Hk", "D", "R", "stride_qt", "stride_qh", "stride_kt", "stride_kh"),
        **ints("stride_qot", "stride_qoh", "stride_kot", "stride_koh", "stride_cache"),
    }
    values = {
        "Hq": 64, "Hk": 8, "D": 64, "R": 64, "stride_qt": QKV_N, "stride_qh": 64, "stride_kt": QKV_N,
        "stride_kh": 64, "stride_qot": 4096, "stride_qoh": 64, "stride_kot": 512, "stride_koh": 64,
        "stride_cache": 64,
    }  # fmt: skip
    # apply_rotary_and_store: k and v rotated / copied into a paged cache of 16-token pages, 8 heads of 64.
    store_types = {
        **dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "q_out_ptr", "k_cache_ptr", "v_cache_ptr"), "*bf16"),
        "cache_ptr": "*fp32",
        "pos_ptr": "*i64",
        "slot_ptr": "*i64",
        **ints("Hq", "Hk", "D", "R", "page_size", "stride_qt", "stride_qh", "stride_kt", "stride_kh"),
        **ints("stride_vt", "stride_vh", "stride_qot", "stride_qoh", "stride_kc_page", "stride_kc_tok"),
        **ints("stride_kc_head", "stride_vc_page", "stride_vc_tok", "stride_vc_head", "stride_cache"),
    }
    store_values = {
        "Hq": 64, "Hk": 8, "D": 64, "R": 64, "page_size": 16, "stride_qt": QKV_N, "stride_qh": 64,
        "stride_kt": QKV_N, "stride_kh": 64, "stride_vt": QKV_N, "stride_vh": 64, "stride_qot": 4096,
        "stride_qoh": 64, "stride_kc_page": 8192, "stride_kc_tok": 512, "stride_kc_head": 64, "stride_vc_page": 8192,
        "stride_vc_tok": 512, "stride_vc_head": 64, "stride_cache": 64,
    }  # fmt: skip
    constexprs = {"GPTJ": False, "BLOCK_H": cfg.rows, "BLOCK_D": 64}  # GPT-OSS: 64 q heads, head_dim 64
    return {
        "apply_rotary-neox": Case(rope._rotary_kernel, types, constexprs, cfg.num_warps, values=values),
        "apply_rotary_and_store-neox": Case(
            rope._rotary_store_kernel, store_types, constexprs, cfg.num_warps, values=store_values
        ),
    }


compiled, test_every_kernel_has_a_cross_compile_case, test_kernel_compiles = cross_compile_tests(
    rope.TRITON_KERNELS, cases, __file__
)

if __name__ == "__main__":
    child_main(cases)

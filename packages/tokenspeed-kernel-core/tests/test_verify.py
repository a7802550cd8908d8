"""verify: cases, tolerances, comparisons, a deliberately wrong kernel caught and bisected, CLI."""

from __future__ import annotations

import argparse
import io
import json

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel import ANY, Capability, register_kernel, registry, unregister_kernel
from tokenspeed_kernel.core.plugins import ensure_loaded
from tokenspeed_kernel.numerics import Case, custom_case, get_op_cases, standard_cases, tolerance, verify
from tokenspeed_kernel.numerics import cli as verify_cli
from tokenspeed_kernel.numerics.bisect import shrink
from tokenspeed_kernel.numerics.cases import all_op_cases, parse_value
from tokenspeed_kernel.numerics.compare import check_close, check_codes, check_tokens
from tokenspeed_kernel.numerics.inputs import decode_e2m1, make_generator, paged_kv_cache

FLOATS = ("fp32", "bf16", "fp16")


@pytest.fixture
def temp_kernels():
    """Register kernels for one test and remove them afterwards."""
    ensure_loaded()
    names: list[str] = []

    def add(op: str, name: str, fn, **kw):
        register_kernel(op, name=name, solution="test", impl=fn, **kw)
        names.append(name)
        return name

    yield add
    for n in names:
        if registry.get(n) is not None:
            unregister_kernel(n)


def _rmsnorm_without_eps(x, weight, eps, *, residual=None, out=None):
    """A wrong rmsnorm: forgets eps."""
    from tokenspeed_kernel.reference.norm import rmsnorm

    return rmsnorm(x, weight, 0.0, residual=residual, out=out)


def _prefill_ignoring_window(q, k, v, cu_q, cu_k, max_q, max_k, *, window_left, **kw):
    """A wrong prefill: attends to every earlier key whatever the window."""
    from tokenspeed_kernel.reference.attention import mha_prefill

    return mha_prefill(q, k, v, cu_q, cu_k, max_q, max_k, window_left=-1, **kw)


# ---------------------------------------------------------------------------
# comparisons and tolerances


def test_check_close_boundary_and_worst_elements():
    want = torch.tensor([1.0, -2.0, 0.0, 4.0])
    tol = tolerance("elementwise", "bf16")  # rtol 2 * 2**-7, atol 8 * 2**-23 * rms
    inside = want * (1 + 0.9 * tol.rtol)
    assert check_close("y", inside, want, tol).passed
    outside = want.clone()
    outside[3] = 4.0 * (1 + 1.5 * tol.rtol)
    c = check_close("y", outside, want, tol)
    assert not c.passed and c.mismatches == 1
    assert c.worst[0][0] == (3,) and c.worst[0][2] == 4.0
    assert c.ratio == pytest.approx(
        1.5 * 4.0 * tol.rtol / (tol.atol(float(want.square().mean().sqrt())) + 4.0 * tol.rtol), rel=1e-3
    )


def test_check_close_matches_infinities_and_rejects_nan():
    want = torch.tensor([float("-inf"), 2.0, 1.0])
    assert check_close("lse", want.clone(), want, tolerance("lse")).passed
    got = torch.tensor([float("-inf"), float("nan"), 1.0])
    assert not check_close("lse", got, want, tolerance("lse")).passed
    nan_ref = torch.tensor([float("nan"), 1.0])
    c = check_close("lse", nan_ref.clone(), nan_ref, tolerance("lse"))
    assert not c.passed and "reference has 1 NaN" in c.note


def test_matmul_tolerance_scales_with_dtype_and_uses_tf32_for_fp32():
    assert tolerance("matmul", "bf16").rtol == 2 * 2.0**-7
    assert tolerance("matmul", "fp32").atol_rms == 4 * 2.0**-10
    assert tolerance("elementwise", "fp32").rtol == 2 * 2.0**-23


def test_check_tokens_allows_one_row_in_a_hundred():
    want = torch.arange(200)
    got = want.clone()
    got[5] += 1
    got[77] += 1
    assert check_tokens("t", got, want, tolerance("tokens")).passed
    got[100] += 1
    c = check_tokens("t", got, want, tolerance("tokens"))
    assert not c.passed and c.mismatches == 3


def test_check_codes_one_step_and_mismatch_budget():
    want = torch.full((2000,), 1.5)
    step = torch.full((2000,), 0.5)
    got = want.clone()
    got[0] = 2.0  # one step: fine while rare
    tol = tolerance("quantized")
    assert check_codes("q", got, want, step, tol).passed
    got[1] = 2.5  # two steps: never fine
    assert not check_codes("q", got, want, step, tol).passed
    got = want.clone()
    got[:5] = 2.0  # 5 of 2000 > 0.1 %
    assert not check_codes("q", got, want, step, tol).passed


# ---------------------------------------------------------------------------
# cases and generators


def test_cases_exist_for_every_public_op():
    assert set(all_op_cases()) == set(tk.all_contracts())


def test_paged_cache_pages_are_disjoint_shuffled_and_cover_the_lengths():
    gen = make_generator(torch.device("cpu"), 3)
    lens = (1, 37, 70, 16)
    k, _, table, seqlens = paged_kv_cache(lens, 16, 2, 8, torch.float32, gen)
    assert seqlens.tolist() == list(lens)
    used = [table[b, : -(-n // 16)].tolist() for b, n in enumerate(lens)]
    flat = [p for row in used for p in row]
    assert len(flat) == len(set(flat)) == sum(-(-n // 16) for n in lens)
    assert max(flat) < k.shape[0]
    assert flat != sorted(flat)


def test_decode_e2m1_low_nibble_first():
    # 0x91: low nibble 1 (0.5), high nibble 9 (-0.5)
    assert decode_e2m1(torch.tensor([0x91], dtype=torch.uint8)).tolist() == [0.5, -0.5]


@pytest.mark.parametrize("op", sorted(tk.all_contracts()))
def test_generated_inputs_pass_the_public_ops_validation(op, temp_kernels):
    """Every CPU case of every op builds arguments the public op accepts and dispatches."""
    reference = tk.get_contract(op).reference
    formats, traits = reference.formats, dict(reference.traits)
    seen = []

    def record(*args, **kwargs):
        seen.append((args, kwargs))
        raise _Stop

    name = temp_kernels(op, f"test.capture.{op}", record, formats=formats, traits=traits)
    oc = get_op_cases(op)
    cases = standard_cases(op, "cpu", device_type="cpu")
    for case in cases:
        call = oc.make(case, torch.device("cpu"), make_generator(torch.device("cpu"), case.seed(0)))
        with pytest.raises(_Stop):
            oc.fn(**call, override=name)
    assert len(seen) == len(cases)


class _Stop(Exception):
    pass


def test_every_op_reference_passes_against_its_upcast_self():
    """The reference at bf16/fp32 against the fp32-upcast reference: the tolerances hold for it."""
    cases = []
    for op in sorted(all_op_cases()):
        first = standard_cases(op, "cpu", device_type="cpu")[0]
        cases += [Case.make(op, dt, first.as_dict()) for dt in ("bf16", "fp32")]
    report = verify(None, cases=cases, device="cpu", stream=None)
    ran = [r for r in report.results if r.kernel.startswith("reference.")]
    assert {r.op for r in ran} == set(all_op_cases())
    assert all(r.status == "PASS" for r in ran), [
        (r.kernel, r.reason, [c.summary() for c in r.checks]) for r in ran if r.status != "PASS"
    ]


def test_parse_value_round_trips_case_descriptions():
    assert parse_value("5,17") == (5, 17)
    assert parse_value("6,") == (6,)
    assert parse_value("(3,4)") == (3, 4)
    assert parse_value("true") is True and parse_value("none") is None
    assert parse_value("1e-3") == 1e-3 and parse_value("neox") == "neox"
    case = custom_case("mha_prefill", {"seqlens_q": 9})[0]
    assert case["seqlens_q"] == (9,)


# ---------------------------------------------------------------------------
# a wrong kernel: caught, shrunk


def test_rmsnorm_without_eps_is_caught_where_eps_matters_and_bisected(temp_kernels):
    name = temp_kernels(
        "rmsnorm",
        "test.rmsnorm_no_eps",
        _rmsnorm_without_eps,
        formats=[{"x": FLOATS}],
        traits={"fused_residual": (False, True)},
    )
    out = io.StringIO()
    report = verify(name, device="cpu", bisect=True, stream=out)
    assert not report.ok
    by = {(r.case.dtype, r.case.label): r for r in report.results}
    # fp32 resolves eps = 1e-5 relative to a unit mean square; bf16/fp16 only when the mean square is below eps.
    for (dtype, label), r in by.items():
        expect_fail = dtype == "fp32" or label == "mean square below eps"
        assert r.failed == expect_fail, (dtype, label, r.status, [c.summary() for c in r.checks])
    failing = by[("bf16", "mean square below eps")]
    check = failing.checks[0]
    assert check.ratio > 10 and check.worst and len(check.worst) == 5
    bisected = [r for r in report.results if r.minimal_case is not None]
    assert len(bisected) == 1
    assert bisected[0].minimal_case["tokens"] == 1 and bisected[0].minimal_case["hidden"] == 1
    text = out.getvalue()
    assert "FAIL  test.rmsnorm_no_eps" in text and "worst: [" in text and "bisect: minimal failing case" in text


def test_prefill_ignoring_the_window_is_caught_and_shrunk_to_window_plus_two(temp_kernels):
    pytest.importorskip("tokenspeed_kernel.reference.attention")
    traits = {k: ANY for k in ("head_dim", "gqa_group", "window", "sinks", "logit_cap", "return_lse", "causal")}
    name = temp_kernels("mha_prefill", "test.prefill_no_window", _prefill_ignoring_window,
                        formats=[{"q": FLOATS, "kv": FLOATS}], traits=traits)  # fmt: skip
    cases = [
        Case.make(
            "mha_prefill", "fp32", {**get_op_cases("mha_prefill").defaults, "seqlens_q": (5, 17), "window_left": 3}
        ),
        Case.make("mha_prefill", "bf16", {**get_op_cases("mha_prefill").defaults, "seqlens_q": (5, 17)}),
    ]
    report = verify(name, cases=cases, device="cpu", bisect=True, include_reference=False, stream=None)
    windowed, full = report.results
    assert windowed.status == "FAIL" and full.status == "PASS"
    minimal = windowed.minimal_case
    # The window (3) first matters for the query at position 4: a single sequence of 5 tokens, one head.
    assert minimal["seqlens_q"] == (5,) and minimal["heads_q"] == 1 and minimal["heads_kv"] == 1
    assert minimal["window_left"] == 3


def test_shrink_is_greedy_and_bounded():
    case = Case.make("rmsnorm", "fp32", {"tokens": 100, "hidden": 64})
    fails = lambda c: c["tokens"] >= 13

    def tokens_move(c):
        v = c["tokens"]
        return [c.replace(tokens=x) for x in (1, v // 2, v - 1) if 1 <= x < v]

    minimal, steps = shrink(case, fails, [tokens_move])
    assert minimal["tokens"] == 13 and steps < 40
    _, capped = shrink(case, fails, [tokens_move], max_steps=3)
    assert capped == 3


def test_kernels_that_cannot_run_here_are_skipped_with_the_reason(temp_kernels):
    name = temp_kernels("rmsnorm", "test.rmsnorm_nvidia", _rmsnorm_without_eps, formats=[{"x": FLOATS}],
                        capability=Capability(vendors=frozenset({"nvidia"})))  # fmt: skip
    report = verify(name, device="cpu", stream=None)
    assert report.ok
    [r] = report.results
    assert r.status == "SKIP" and "needs vendor nvidia" in r.reason


def test_trait_mismatch_is_a_skip_not_a_failure(temp_kernels):
    name = temp_kernels("rmsnorm", "test.rmsnorm_plain", _rmsnorm_without_eps, formats=[{"x": ("bf16",)}])
    report = verify(name, device="cpu", dtypes=["fp32"], stream=None)
    assert report.ok and report.results and all(r.status == "SKIP" for r in report.results)
    assert "formats" in report.results[0].reason


def test_missing_reference_is_reported_not_raised():
    ensure_loaded()
    original = registry.get("reference.rmsnorm")
    broken = register_kernel(
        "rmsnorm", name="reference.rmsnorm", solution="reference", formats=[{"x": FLOATS}],
        traits={"fused_residual": ANY}, priority=0, impl="tokenspeed_kernel.reference.not_written_yet:rmsnorm", replace=True,
    )  # fmt: skip
    try:
        assert broken.name == "reference.rmsnorm"
        report = verify("rmsnorm", device="cpu", stream=None)
        assert report.results and all(r.status == "SKIP" for r in report.results)
        assert "reference for rmsnorm is unavailable" in report.results[0].reason
    finally:
        registry.register(original, replace=True)


def test_a_kernel_that_raises_is_an_error_with_its_message(temp_kernels):
    def boom(*a, **k):
        raise RuntimeError("kaput")

    name = temp_kernels("rmsnorm", "test.rmsnorm_boom", boom, formats=[{"x": FLOATS}], traits={"fused_residual": ANY})
    report = verify(name, device="cpu", dtypes=["bf16"], stream=None)
    assert not report.ok and report.results
    assert all(r.status == "ERROR" and "kaput" in r.reason for r in report.results)


def test_sampling_compares_tokens_with_a_small_allowance(temp_kernels):
    pytest.importorskip("tokenspeed_kernel.reference.sampling")
    from tokenspeed_kernel.reference.sampling import top_k_top_p_sample as ref

    def one_row_off(logits, top_k, top_p, temperature, uniform):
        out = ref(logits, top_k, top_p, temperature, uniform).clone()
        out[0] = (out[0] + 1) % logits.shape[1]
        return out

    def reversed_uniform(logits, top_k, top_p, temperature, uniform):
        return ref(logits, top_k, top_p, temperature, 1.0 - uniform - 1e-7)

    ok = temp_kernels("top_k_top_p_sample", "test.sample_one_off", one_row_off, formats=[{"logits": FLOATS}])
    bad = temp_kernels("top_k_top_p_sample", "test.sample_reversed", reversed_uniform, formats=[{"logits": FLOATS}])
    case = standard_cases("top_k_top_p_sample", "cpu", dtypes=["fp32"])[0]
    assert verify(ok, cases=[case], device="cpu", stream=None).ok
    report = verify(bad, cases=[case], device="cpu", stream=None)
    assert not report.ok and report.results[0].checks[0].mismatches > 10


# ---------------------------------------------------------------------------
# command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tokenspeed-kernel")
    verify_cli.add_parser(parser.add_subparsers(dest="command"))
    return parser


def test_cli_passes_writes_json_and_fails_with_exit_1(temp_kernels, tmp_path, capsys):
    path = tmp_path / "v.json"
    args = _parser().parse_args(
        ["verify", "reference.rmsnorm", "--dtype", "bf16", "--shape", "tokens=3", "hidden=96", "--json", str(path)]
    )
    assert args.func(args) == 0
    data = json.loads(path.read_text())
    assert data["ok"] and data["results"][0]["case"]["params"]["hidden"] == 96
    name = temp_kernels("rmsnorm", "test.rmsnorm_no_eps", _rmsnorm_without_eps, formats=[{"x": FLOATS}])
    args = _parser().parse_args(["verify", name, "--dtype", "fp32", "--shape", "tokens=2", "hidden=8"])
    assert args.func(args) == 1
    assert "FAIL" in capsys.readouterr().out


def test_cli_rejects_unknown_shape_parameters_with_exit_2(capsys):
    args = _parser().parse_args(["verify", "rmsnorm", "--shape", "seqlen=3"])
    assert args.func(args) == 2
    assert "no op in the target takes these parameters" in capsys.readouterr().err


def test_cli_shapes_file(tmp_path):
    path = tmp_path / "cases.json"
    path.write_text(
        json.dumps([{"op": "rmsnorm", "dtype": "fp16", "params": {"tokens": 2, "hidden": 40, "residual": True}}])
    )
    args = _parser().parse_args(["verify", "rmsnorm", "--shapes", str(path), "--json", str(tmp_path / "o.json")])
    assert args.func(args) == 0
    results = json.loads((tmp_path / "o.json").read_text())["results"]
    [r] = [r for r in results if r["kernel"] == "reference.rmsnorm"]
    assert r["status"] == "PASS" and r["case"]["dtype"] == "fp16" and r["case"]["params"]["residual"] is True


def test_top_level_cli_has_verify():
    cli = pytest.importorskip("tokenspeed_kernel.cli")
    assert cli.main(["verify", "reference.silu_and_mul", "--dtype", "fp32", "--shape", "tokens=2", "inter=8"]) == 0


def _transpose_weights(weights):
    """A preprocessor: the kernel wants w13/w2 transposed (its own layout)."""
    import dataclasses

    return dataclasses.replace(
        weights, w13=weights.w13.transpose(1, 2).contiguous(), w2=weights.w2.transpose(1, 2).contiguous()
    )


def _moe_apply_transposed(x, topk_weights, topk_ids, weights, activation, *, out=None):
    import dataclasses

    from tokenspeed_kernel.reference.moe import moe_apply

    assert weights.layout == "test.moe_apply_transposed", weights.layout
    canonical = dataclasses.replace(
        weights, w13=weights.w13.transpose(1, 2), w2=weights.w2.transpose(1, 2), layout="canonical"
    )
    return moe_apply(x, topk_weights, topk_ids, canonical, activation, out=out)


def test_moe_kernels_with_their_own_layout_get_converted_weights(temp_kernels):
    pytest.importorskip("tokenspeed_kernel.reference.moe")
    traits = {"activation": ANY, "clamp": ANY, "bias": ANY, "gate_up_interleaved": ANY}
    name = temp_kernels("moe_apply", "test.moe_apply_transposed", _moe_apply_transposed,
                        formats=[{"x": FLOATS, "w": FLOATS}], traits=traits,
                        weight_preprocessor=_transpose_weights)  # fmt: skip
    case = standard_cases("moe_apply", "cpu", dtypes=["bf16"])[0]
    report = verify(name, cases=[case], device="cpu", stream=None)
    [r] = report.results
    assert r.status == "PASS", (r.reason, [c.summary() for c in r.checks])


def _moe_w4a8(x, topk_weights, topk_ids, weights, activation, *, out=None):
    from tokenspeed_kernel.reference.moe import moe_apply_w4a8

    return moe_apply_w4a8(x, topk_weights, topk_ids, weights, activation).to(x.dtype)


def _moe_w4a8_without_x_rounding(x, topk_weights, topk_ids, weights, activation, *, out=None):
    """A wrong W4A8 kernel: it forgets to round the activations (its intermediate is rounded)."""
    from tokenspeed_kernel.reference import moe as ref

    real = ref.quantize_rows_e4m3
    try:
        ref.quantize_rows_e4m3 = lambda rows: rows.to(torch.float32)
        return ref.moe_apply_w4a8(x, topk_weights, topk_ids, weights, activation).to(x.dtype)
    finally:
        ref.quantize_rows_e4m3 = real


def test_fp8_matmul_allows_a_few_one_step_outliers_only():
    tol = tolerance("fp8_matmul", "bf16")
    want = torch.linspace(-1, 1, 10000)
    flips = want.clone()
    flips[:5] += 5 * tol.atol(float(want.square().mean().sqrt()))  # 5 outliers within 16 x
    assert check_close("out", flips, want, tol).passed
    many = want.clone()
    many[:50] += 5 * tol.atol(float(want.square().mean().sqrt()))  # 0.5 % of the elements
    assert not check_close("out", many, want, tol).passed
    far = want.clone()
    far[5000] += 20 * tol.atol(float(want.square().mean().sqrt()))  # one element (want ~0) beyond 16 x
    assert not check_close("out", far, want, tol).passed


def test_w4a8_kernels_are_verified_against_the_w4a8_reference(temp_kernels):
    """A kernel declaring fp8 activations (only) is compared with the W4A8 reference, on cases that
    allow them; one that skips a rounding fails there, and neither runs on cases that do not."""
    traits = {"activation": ANY, "clamp": ANY, "bias": ANY, "gate_up_interleaved": ANY, "fp8_activations": (True,)}
    good = temp_kernels("moe_apply", "test.moe_w4a8", _moe_w4a8, formats=[{"x": FLOATS, "w": FLOATS}], traits=traits)
    bad = temp_kernels("moe_apply", "test.moe_w4a8_bad", _moe_w4a8_without_x_rounding,
                       formats=[{"x": FLOATS, "w": FLOATS}], traits=traits)  # fmt: skip
    case = custom_case("moe_apply", {"fp8_activations": True, "tokens": 16, "hidden": 128, "inter": 64},
                       dtypes=["bf16"])[0]  # fmt: skip
    results = {r.kernel: r for r in verify("moe_apply", cases=[case], device="cpu", stream=None).results}
    assert results[good].status == "PASS", [c.summary() for c in results[good].checks]
    assert results[bad].status == "FAIL"
    assert results["reference.moe_apply"].status == "PASS"  # the exact kernels: against the exact reference
    plain = standard_cases("moe_apply", "cpu", dtypes=["bf16"])[0]
    [r] = [r for r in verify(good, cases=[plain], device="cpu", stream=None).results]
    assert r.status == "SKIP" and "fp8_activations" in r.reason


def test_a_preprocessed_moe_kernel_is_skipped_not_run_on_formats_it_does_not_take(temp_kernels):
    """Its weight preprocessor is not run on weights outside its formats (it may raise there)."""

    def refuse(weights):
        raise ValueError("this preprocessor takes mxfp4 only")

    traits = {"activation": ANY, "clamp": ANY, "bias": ANY, "gate_up_interleaved": ANY}
    name = temp_kernels("moe_apply", "test.moe_apply_mxfp4_only", _moe_apply_transposed,
                        formats=[{"x": FLOATS, "w": "mxfp4"}], traits=traits, weight_preprocessor=refuse)  # fmt: skip
    case = standard_cases("moe_apply", "cpu", dtypes=["bf16"])[0]
    assert case["weight_format"] == "dense"
    [r] = verify(name, cases=[case], device="cpu", stream=None).results
    assert r.status == "SKIP" and "formats" in r.reason, (r.status, r.reason)

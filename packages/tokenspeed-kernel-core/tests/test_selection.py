"""Registry, contracts, selection, overrides, caching and explain."""

from __future__ import annotations

import threading

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.core import selection
from tokenspeed_kernel.core.contracts import ANY, Range
from tokenspeed_kernel.core.registry import Capability, Priority, register_kernel, registry, unregister_kernel

PREFILL_SIG = ("bf16", "bf16")
GPT_OSS_PREFILL = {"head_dim": 64, "gqa_group": 8, "window": True, "sinks": True}


@pytest.fixture
def scratch():
    """Register throwaway kernels; unregister them afterwards."""
    names: list[str] = []

    def add(op: str, name: str, **kw):
        kw.setdefault("solution", name.split(".")[0])
        kw.setdefault("formats", [{r: ("bf16", "fp16", "fp32") for r in tk.get_contract(op).roles}])
        kw.setdefault("impl", lambda *a, **k: name)
        spec = register_kernel(op, name=name, **kw)
        names.append(name)
        return spec

    tk.load_plugins()
    yield add
    for n in names:
        if registry.get(n) is not None:
            unregister_kernel(n)
    selection.reload_settings()


def _attn_traits(**kw):
    return {
        "head_dim": ANY,
        "gqa_group": ANY,
        "causal": (True, False),
        "window": (False, True),
        "sinks": (False, True),
        **kw,
    }


# -- registration errors ----------------------------------------------------------


def test_unknown_trait_fails_at_registration(scratch):
    with pytest.raises(ValueError, match=r"unknown trait\(s\) \['head_dimension'\]"):
        scratch("rmsnorm", "t1.rmsnorm", traits={"head_dimension": 64})


def test_wrong_typed_trait_fails_at_registration(scratch):
    with pytest.raises(TypeError, match=r"trait 'fused_residual' of op 'rmsnorm' must be bool, got 'yes'"):
        scratch("rmsnorm", "t2.rmsnorm", traits={"fused_residual": "yes"})
    with pytest.raises(TypeError, match="must be int"):
        scratch("mha_prefill", "t2.prefill", traits={**_attn_traits(), "head_dim": 64.0})


def test_value_outside_contract_fails(scratch):
    with pytest.raises(ValueError, match="must be one of"):
        scratch("apply_rotary", "t3.rope", traits={"style": "llama"})


def test_required_trait_must_be_declared(scratch):
    with pytest.raises(ValueError, match="requires every kernel to declare trait 'head_dim'"):
        scratch("mha_prefill", "t4.prefill", traits={"gqa_group": ANY})


def test_unknown_format_and_role_fail(scratch):
    with pytest.raises(ValueError, match="unknown format 'bfloat16'"):
        scratch("rmsnorm", "t5.rmsnorm", formats=[{"x": "bfloat16"}])
    with pytest.raises(ValueError, match="unknown format role"):
        scratch("rmsnorm", "t5.rmsnorm", formats=[{"x": "bf16", "y": "bf16"}])
    with pytest.raises(ValueError, match="misses role"):
        scratch("mm", "t5.mm", formats=[{"a": "bf16", "b": "bf16"}])


def test_duplicate_name_needs_replace(scratch):
    scratch("rmsnorm", "t6.rmsnorm")
    with pytest.raises(ValueError, match="already registered"):
        scratch("rmsnorm", "t6.rmsnorm")
    scratch("rmsnorm", "t6.rmsnorm", replace=True, priority=Priority.SPECIALIZED)
    assert registry.get("t6.rmsnorm").priority == Priority.SPECIALIZED


def test_unknown_capability_feature_and_tag():
    with pytest.raises(ValueError, match="unknown feature"):
        Capability(features=frozenset({"warp_drive"}))
    with pytest.raises(ValueError, match="unknown tag"):
        register_kernel("rmsnorm", name="t7.x", solution="t7", formats=[{"x": "bf16"}], tags=("fast",), impl=print)


# -- selection ----------------------------------------------------------------------


def test_undeclared_trait_means_default_only(scratch):
    scratch("rmsnorm", "t8.rmsnorm", priority=Priority.PERFORMANT)
    assert tk.select_spec("rmsnorm", ("bf16",), {}).spec.name == "t8.rmsnorm"
    # fused_residual=True is not the default: t8 does not declare it, so it is rejected.
    cands = tk.explain_selection("rmsnorm", ("bf16",), {"fused_residual": True})
    t8 = next(c for c in cands if c.name == "t8.rmsnorm")
    assert not t8.eligible and "fused_residual=True" in t8.reason
    assert next(c for c in cands if c.selected).name != "t8.rmsnorm"


def test_rank_by_priority_and_capability(scratch):
    # SPECIALIZED bands keep kernels of installed plugins (triton, amd, nvidia) out of the way.
    scratch("mha_prefill", "nv.prefill", traits=_attn_traits(), priority=Priority.SPECIALIZED + 10,
            capability=Capability(vendors=frozenset({"nvidia"}), min_arch="sm90"))  # fmt: skip
    scratch("mha_prefill", "port.prefill", traits=_attn_traits(), priority=Priority.SPECIALIZED)
    on = lambda arch: tk.select_spec("mha_prefill", PREFILL_SIG, GPT_OSS_PREFILL, platform=tk.make_platform(arch))
    assert on("sm90").spec.name == "nv.prefill"
    assert on("sm100").spec.name == "nv.prefill"
    assert on("sm80").spec.name == "port.prefill"
    assert on("gfx950").spec.name == "port.prefill"
    cands = tk.explain_selection("mha_prefill", PREFILL_SIG, GPT_OSS_PREFILL, platform=tk.make_platform("sm80"))
    nv = next(c for c in cands if c.name == "nv.prefill")
    assert nv.reason == "needs arch >= sm90, platform is sm80"
    amd = tk.explain_selection("mha_prefill", PREFILL_SIG, GPT_OSS_PREFILL, platform=tk.make_platform("gfx942"))
    assert next(c for c in amd if c.name == "nv.prefill").reason == "needs vendor nvidia, platform is amd"


def test_format_and_trait_rejections_are_exact(scratch):
    scratch(
        "mha_prefill",
        "fmt.prefill",
        traits={**_attn_traits(), "head_dim": (128,)},
        formats=[{"q": "fp16", "kv": "fp16"}],
    )
    cands = {c.name: c for c in tk.explain_selection("mha_prefill", PREFILL_SIG, GPT_OSS_PREFILL)}
    assert cands["fmt.prefill"].reason == "formats q=bf16, kv=bf16 not supported (supports {q: fp16, kv: fp16})"
    cands = {c.name: c for c in tk.explain_selection("mha_prefill", ("fp16", "fp16"), GPT_OSS_PREFILL)}
    assert cands["fmt.prefill"].reason == "trait head_dim=64 (supports 128)"


def test_range_traits(scratch):
    scratch("mha_decode_with_kvcache", "rng.decode", priority=Priority.PERFORMANT,
            traits={"head_dim": ANY, "gqa_group": ANY, "page_size": Range(1, 256, power_of_two=True)})  # fmt: skip
    pick = lambda ps: tk.select_spec(
        "mha_decode_with_kvcache", PREFILL_SIG, {"head_dim": 64, "gqa_group": 8, "page_size": ps}
    )
    assert pick(16).spec.name == "rng.decode"
    assert pick(24).spec.name == "reference.mha_decode_with_kvcache"
    assert pick(512).spec.name == "reference.mha_decode_with_kvcache"


def test_call_traits_are_checked():
    with pytest.raises(ValueError, match="has no trait"):
        tk.select_kernel("rmsnorm", ("bf16",), {"fused": True})
    with pytest.raises(TypeError, match="must be bool"):
        tk.select_kernel("rmsnorm", ("bf16",), {"fused_residual": 1})
    with pytest.raises(ValueError, match="format roles"):
        tk.select_kernel("rmsnorm", ("bf16", "bf16"), {})


def test_no_kernel_found_lists_reasons(scratch):
    scratch("mha_prefill", "only.prefill", traits=_attn_traits(), formats=[{"q": "fp16", "kv": "fp16"}])
    with pytest.raises(tk.NoKernelFoundError) as err:
        tk.select_kernel("mha_prefill", ("fp8_e4m3", "fp8_e4m3"), GPT_OSS_PREFILL)
    text = str(err.value)
    assert "only.prefill [only]: formats q=fp8_e4m3" in text
    assert "reference.mha_prefill [reference]: formats q=fp8_e4m3" in text


def test_objective_tag_ranks_first(scratch):
    scratch("rmsnorm", "a.rmsnorm", priority=Priority.PERFORMANT)
    scratch("rmsnorm", "b.rmsnorm", priority=Priority.PORTABLE, tags=("deterministic",))
    assert tk.select_spec("rmsnorm", ("bf16",), {}).spec.name == "a.rmsnorm"
    assert tk.select_spec("rmsnorm", ("bf16",), {}, objective="deterministic").spec.name == "b.rmsnorm"


def test_oracle_ranks_measured_first(scratch):
    scratch("rmsnorm", "fast.rmsnorm", priority=Priority.PORTABLE)
    scratch("rmsnorm", "slow.rmsnorm", priority=Priority.PERFORMANT)
    times = {"fast.rmsnorm": 1.0, "slow.rmsnorm": 2.0}
    tk.set_selection_oracle(lambda op, sig, traits, buckets, plat: times)
    try:
        assert tk.select_spec("rmsnorm", ("bf16",), {}).spec.name == "fast.rmsnorm"
    finally:
        tk.set_selection_oracle(None)
    assert tk.select_spec("rmsnorm", ("bf16",), {}).spec.name == "slow.rmsnorm"


def test_measured_kernels_rank_by_score_and_unmeasured_ones_by_band(scratch):
    """Fair ranking: a kernel missing from the measurements is placed by its band, not below them all."""
    scratch("rmsnorm", "port.rmsnorm", priority=Priority.PORTABLE)
    scratch("rmsnorm", "perf.rmsnorm", priority=Priority.PERFORMANT)
    scratch("rmsnorm", "new.rmsnorm", priority=Priority.SPECIALIZED)  # a plugin's kernel nobody measured
    scratch("rmsnorm", "late.rmsnorm", priority=Priority.PORTABLE + 50)  # unmeasured, lower band than perf
    measured = {"port.rmsnorm": 1.0, "perf.rmsnorm": 1.4}
    tk.set_selection_oracle(lambda op, sig, traits, buckets, plat: measured)
    try:
        cands = [c for c in tk.explain_selection("rmsnorm", ("bf16",), {}) if c.eligible]
        order = [c.name for c in cands if c.name.split(".")[0] in ("port", "perf", "new", "late")]
        assert order == ["new.rmsnorm", "port.rmsnorm", "perf.rmsnorm", "late.rmsnorm"]
        assert cands[-1].name == "reference.rmsnorm"  # the last resort, whatever its score
        why = {c.name: c.reason for c in cands}
        assert "measured 1.4" in why["perf.rmsnorm"] and "above the measured" in why["new.rmsnorm"]
        assert "below the measured kernels (band PERFORMANT)" in why["late.rmsnorm"]
    finally:
        tk.set_selection_oracle(None)


def test_sizes_reach_the_oracle_and_the_cache_by_bucket(scratch):
    """Selection sees the call's size buckets: the oracle answers per bucket, the cache keys by it."""
    scratch("mm", "small.mm", priority=Priority.PERFORMANT, traits={"bias": ANY})
    scratch("mm", "large.mm", priority=Priority.PERFORMANT + 1, traits={"bias": ANY})
    seen = []

    def oracle(op, sig, traits, buckets, plat):
        seen.append(buckets)
        if buckets is None:
            return None
        return {"small.mm": 1.0, "large.mm": 1.5} if buckets["m"] <= 4 else {"small.mm": 2.0, "large.mm": 1.0}

    tk.set_selection_oracle(oracle)
    try:
        a, b = torch.randn(3, 16), torch.randn(8, 16)
        assert tk.mm.selected_kernel(a, b).spec.name == "small.mm"
        assert tk.mm.selected_kernel(torch.randn(300, 16), b).spec.name == "large.mm"
        assert tk.mm.selected_kernel(torch.randn(2, 16), b).spec.name == "small.mm"  # m=2: bucket 2..3
        assert seen == [{"m": 2}, {"m": 9}, {"m": 2}][: len(seen)] and len(seen) == 2  # the third was a cache hit
        assert tk.select_spec("mm", ("fp32",) * 3, {}).spec.name == "large.mm"  # no sizes: priority
        sel = tk.select_spec("mm", ("fp32",) * 3, {}, sizes={"m": 1000})
        assert sel.spec.name == "large.mm"
    finally:
        tk.set_selection_oracle(None)


def test_kernel_size_ranges_filter_and_must_cover_whole_buckets(scratch):
    scratch("mm", "gemv.mm", priority=Priority.SPECIALIZED, traits={"bias": ANY}, sizes={"m": Range(1, 15)})
    a, b = torch.randn(3, 16), torch.randn(8, 16)
    assert tk.mm.selected_kernel(a, b).spec.name == "gemv.mm"
    assert tk.mm.selected_kernel(torch.randn(16, 16), b).spec.name != "gemv.mm"
    cands = {c.name: c for c in tk.explain_selection("mm", ("fp32",) * 3, {}, sizes={"m": 40})}
    assert cands["gemv.mm"].reason == "size m=32..63 (supports 1..15)"
    with pytest.raises(ValueError, match="whole power-of-two buckets"):
        scratch("mm", "bad.mm", traits={"bias": ANY}, sizes={"m": Range(1, 10)})
    with pytest.raises(ValueError, match=r"unknown size\(s\) \['tokens'\]"):
        scratch("mm", "bad2.mm", traits={"bias": ANY}, sizes={"tokens": Range(1, 15)})


# -- caching ------------------------------------------------------------------------


def test_cache_invalidation_on_register_and_unregister(scratch):
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    w = torch.ones(8)
    ref = tk.rmsnorm(x, w)
    assert isinstance(ref, torch.Tensor)
    scratch("rmsnorm", "inv.rmsnorm", priority=Priority.SPECIALIZED, impl=lambda *a, **k: "inv")
    assert tk.rmsnorm(x, w) == "inv"  # the cached reference decision was dropped
    unregister_kernel("inv.rmsnorm")
    assert isinstance(tk.rmsnorm(x, w), torch.Tensor)


def test_cache_distinguishes_platforms(scratch):
    scratch(
        "rmsnorm", "nvonly.rmsnorm", priority=Priority.PERFORMANT, capability=Capability(vendors=frozenset({"nvidia"}))
    )
    x, w = torch.randn(2, 8, dtype=torch.bfloat16), torch.ones(8)
    assert isinstance(tk.rmsnorm(x, w), torch.Tensor)
    with tk.fake_platform("sm90"):
        assert tk.rmsnorm(x, w) == "nvonly.rmsnorm"
    assert isinstance(tk.rmsnorm(x, w), torch.Tensor)


# -- overrides ----------------------------------------------------------------------


@pytest.fixture
def two_kernels(scratch):
    scratch("rmsnorm", "hi.rmsnorm", solution="hi", priority=Priority.PERFORMANT)
    scratch("rmsnorm", "lo.rmsnorm", solution="lo", priority=Priority.PORTABLE)
    scratch("rmsnorm", "nv.rmsnorm", solution="nv", capability=Capability(vendors=frozenset({"nvidia"})))
    return torch.randn(2, 8, dtype=torch.bfloat16), torch.ones(8)


def test_override_per_call(two_kernels):
    x, w = two_kernels
    assert tk.rmsnorm(x, w) == "hi.rmsnorm"
    assert tk.rmsnorm(x, w, solution="lo") == "lo.rmsnorm"
    assert tk.rmsnorm(x, w, override="lo.rmsnorm") == "lo.rmsnorm"
    assert isinstance(tk.rmsnorm(x, w, solution="reference"), torch.Tensor)


def test_override_incompatible_raises_with_reasons(two_kernels):
    x, w = two_kernels
    with pytest.raises(tk.OverrideError) as err:
        tk.rmsnorm(x, w, override="nv.rmsnorm")
    assert "override= forces 'nv.rmsnorm'" in str(err.value)
    assert "nv.rmsnorm [nv]: needs vendor nvidia, platform is cpu" in str(err.value)
    with pytest.raises(tk.OverrideError, match="neither a registered kernel nor a solution"):
        tk.rmsnorm(x, w, solution="nonexistent")


def test_override_list_tries_in_order(two_kernels):
    x, w = two_kernels
    assert tk.rmsnorm(x, w, solution=("nv", "lo")) == "lo.rmsnorm"


def test_override_context_manager(two_kernels):
    x, w = two_kernels
    with tk.kernel_override("lo"):
        assert tk.rmsnorm(x, w) == "lo.rmsnorm"
        with tk.kernel_override(rmsnorm="hi.rmsnorm"):
            assert tk.rmsnorm(x, w) == "hi.rmsnorm"
        assert tk.rmsnorm(x, w, solution="hi") == "hi.rmsnorm"  # per call beats context
    assert tk.rmsnorm(x, w) == "hi.rmsnorm"
    with pytest.raises(ValueError, match="unknown op"):
        with tk.kernel_override(rmsnrm="lo"):
            pass


def test_override_context_is_thread_local(two_kernels):
    x, w = two_kernels
    barrier = threading.Barrier(2)
    results: dict[str, list[str]] = {"forced": [], "free": []}

    def forced():
        with tk.kernel_override("lo"):
            barrier.wait()
            for _ in range(50):
                results["forced"].append(tk.rmsnorm(x, w))
            barrier.wait()

    def free():
        barrier.wait()
        for _ in range(50):
            results["free"].append(tk.rmsnorm(x, w))
        barrier.wait()

    threads = [threading.Thread(target=forced), threading.Thread(target=free)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(results["forced"]) == {"lo.rmsnorm"}
    assert set(results["free"]) == {"hi.rmsnorm"}


def test_override_env_var(two_kernels, monkeypatch):
    x, w = two_kernels
    monkeypatch.setenv("TOKENSPEED_KERNEL_OVERRIDE", "rmsnorm=lo.rmsnorm")
    tk.reload_settings()
    assert tk.rmsnorm(x, w) == "lo.rmsnorm"
    with tk.kernel_override("hi"):
        assert tk.rmsnorm(x, w) == "hi.rmsnorm"  # context beats env
    monkeypatch.setenv("TOKENSPEED_KERNEL_OVERRIDE", "nv|lo")
    tk.reload_settings()
    assert tk.rmsnorm(x, w) == "lo.rmsnorm"
    monkeypatch.setenv("TOKENSPEED_KERNEL_OVERRIDE", "nv")
    tk.reload_settings()
    with pytest.raises(tk.OverrideError, match="TOKENSPEED_KERNEL_OVERRIDE forces 'nv'"):
        tk.rmsnorm(x, w)


def test_override_config_file(two_kernels, monkeypatch, tmp_path):
    x, w = two_kernels
    cfg = tmp_path / "kernels.toml"
    cfg.write_text('[override]\n"*" = "lo"\n')
    monkeypatch.setenv("TOKENSPEED_KERNEL_CONFIG", str(cfg))
    tk.reload_settings()
    assert tk.rmsnorm(x, w) == "lo.rmsnorm"
    monkeypatch.setenv("TOKENSPEED_KERNEL_OVERRIDE", "hi")
    tk.reload_settings()
    assert tk.rmsnorm(x, w) == "hi.rmsnorm"  # env beats file
    cfg.write_text("[overrides]\nrmsnorm = 'lo'\n")
    with pytest.raises(ValueError, match="unknown table"):
        tk.reload_settings()
    monkeypatch.delenv("TOKENSPEED_KERNEL_CONFIG")


OPS_LISTED = r"ops: apply_rotary, apply_rotary_and_store, argmax, .*, top_k_top_p_sample \(or '\*'\)"


@pytest.fixture
def fresh_settings(monkeypatch):
    """Settings read from a clean environment; read again, as they were, afterwards."""
    for var in ("TOKENSPEED_KERNEL_OVERRIDE", "TOKENSPEED_KERNEL_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    yield monkeypatch
    monkeypatch.undo()
    tk.reload_settings()


@pytest.mark.parametrize(
    "value,message",
    [
        (
            "RMSNORM=reference",
            r"TOKENSPEED_KERNEL_OVERRIDE entry 'RMSNORM=reference': 'RMSNORM' is not an op; " + OPS_LISTED,
        ),
        ("nosuchop=reference", r"TOKENSPEED_KERNEL_OVERRIDE entry 'nosuchop=reference': 'nosuchop' is not an op; "),
        ("rmsnorm=lo,nosuchop=reference", r"TOKENSPEED_KERNEL_OVERRIDE entry 'nosuchop=reference': 'nosuchop' is not"),
        ("=reference", r"TOKENSPEED_KERNEL_OVERRIDE: entry '=reference' names no op before '='"),
        ("rmsnorm=", r"TOKENSPEED_KERNEL_OVERRIDE entry 'rmsnorm=' \(op rmsnorm\): expected a kernel or solution name"),
        ("rmsnorm=a||b", r"TOKENSPEED_KERNEL_OVERRIDE entry 'rmsnorm=a\|\|b' \(op rmsnorm\): expected"),
        ("rmsnorm=lo,,mm=lo", r"TOKENSPEED_KERNEL_OVERRIDE: empty entry"),
        ("rmsnorm=lo,rmsnorm=hi", r"TOKENSPEED_KERNEL_OVERRIDE: op 'rmsnorm' is given twice"),
    ],
)
def test_override_env_mistakes_raise_naming_the_variable(fresh_settings, value, message):
    """Before: RMSNORM=..., nosuchop=... and =... were ignored silently; rmsnorm= named neither variable nor op."""
    fresh_settings.setenv("TOKENSPEED_KERNEL_OVERRIDE", value)
    with pytest.raises(tk.SettingsError, match="^" + message):
        tk.reload_settings()


@pytest.mark.parametrize(
    "text,message",
    [
        ("[override]\nrmsnrom = 'reference'\n", r"TOKENSPEED_KERNEL_CONFIG .*kernels.toml \[override\] rmsnrom: "
         r"'rmsnrom' is not an op; " + OPS_LISTED),
        ("[override\n", r"TOKENSPEED_KERNEL_CONFIG: .*kernels.toml is not valid TOML: Expected ']'"),
        ("override = 'x'\n", r"TOKENSPEED_KERNEL_CONFIG .*kernels.toml: 'override' must be a table .* got a str"),
        ("[override]\nrmsnorm = 3\n", r"TOKENSPEED_KERNEL_CONFIG .*\[override\] rmsnorm: expected a kernel/solution "
         r"name or a non-empty list of them, got 3"),
        ("[override]\nrmsnorm = []\n", r"TOKENSPEED_KERNEL_CONFIG .*\[override\] rmsnorm: expected"),
        ("[overrides]\nrmsnorm = 'lo'\n", r"TOKENSPEED_KERNEL_CONFIG .*: unknown table\(s\) \['overrides'\]"),
    ],
)  # fmt: skip
def test_config_file_mistakes_raise_naming_the_file(fresh_settings, tmp_path, text, message):
    """Before: a typo'd op was ignored silently, bad TOML was a bare TOMLDecodeError, a non-table an AttributeError."""
    cfg = tmp_path / "kernels.toml"
    cfg.write_text(text)
    fresh_settings.setenv("TOKENSPEED_KERNEL_CONFIG", str(cfg))
    with pytest.raises(tk.SettingsError, match="^" + message):
        tk.reload_settings()


def test_a_missing_config_file_raises(fresh_settings, tmp_path):
    fresh_settings.setenv("TOKENSPEED_KERNEL_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(tk.SettingsError, match="^TOKENSPEED_KERNEL_CONFIG: no such file"):
        tk.reload_settings()


def test_settings_errors_reach_the_first_op_call(fresh_settings):
    """Read lazily, the settings fail the first call that selects, with the same message (a ValueError)."""
    fresh_settings.setenv("TOKENSPEED_KERNEL_OVERRIDE", "nosuchop=reference")
    selection._settings._settings = None  # as in a fresh process: nothing read yet
    tk.clear_selection_cache()
    with pytest.raises(ValueError, match="^TOKENSPEED_KERNEL_OVERRIDE entry 'nosuchop=reference'"):
        tk.rmsnorm(torch.randn(2, 8), torch.ones(8))


def test_kernel_override_with_an_unknown_op_raises():
    with pytest.raises(ValueError, match=r"^kernel_override\(nosuchop=...\): unknown op 'nosuchop'; ops: apply_rotary"):
        with tk.kernel_override(nosuchop="reference"):
            pass


def test_an_override_naming_nothing_lists_the_candidates(two_kernels):
    """Before: the message ended with "(no kernel is registered for this op)" although kernels were."""
    x, w = two_kernels
    with pytest.raises(tk.OverrideError) as err:
        tk.rmsnorm(x, w, override="nosuch")
    text = str(err.value)
    assert text.startswith("override=: 'nosuch' is neither a registered kernel nor a solution (solutions: ")
    assert "no kernel is registered" not in text
    for name in ("hi.rmsnorm", "lo.rmsnorm", "nv.rmsnorm", "reference.rmsnorm"):
        assert f"  - {name} [" in text


def test_selection_log_once(two_kernels, monkeypatch, caplog):
    x, w = two_kernels
    monkeypatch.setenv("TOKENSPEED_KERNEL_LOG", "selection")
    tk.reload_settings()
    with caplog.at_level("WARNING", logger="tokenspeed_kernel.core.selection"):
        for _ in range(3):
            tk.rmsnorm(x, w)
    lines = [r.getMessage() for r in caplog.records if "rmsnorm" in r.getMessage()]
    assert len(lines) == 1 and "-> hi.rmsnorm" in lines[0]


def test_explain_marks_selected_and_ranks(two_kernels):
    cands = tk.explain_selection("rmsnorm", ("bf16",), {})
    by = {c.name: c for c in cands}
    assert by["hi.rmsnorm"].selected and by["hi.rmsnorm"].rank == 1
    assert by["lo.rmsnorm"].rank == 2 and not by["lo.rmsnorm"].selected
    assert not by["nv.rmsnorm"].eligible
    text = tk.format_explanation(cands)
    assert text.splitlines()[0].startswith("*  #1 hi.rmsnorm")
    assert "- " in text and "needs vendor nvidia" in text


def test_kernel_whose_library_fails_to_load_is_skipped(scratch):
    scratch("rmsnorm", "gone.rmsnorm", priority=Priority.SPECIALIZED, impl="tokenspeed_no_such_module:rmsnorm")
    x, w = torch.randn(2, 8, dtype=torch.bfloat16), torch.ones(8)
    with pytest.warns(RuntimeWarning, match="'gone.rmsnorm' failed to load"):
        y = tk.rmsnorm(x, w)
    assert isinstance(y, torch.Tensor)
    reason = next(c.reason for c in tk.explain_selection("rmsnorm", ("bf16",), {}) if c.name == "gone.rmsnorm")
    assert reason.startswith("implementation failed to load: ModuleNotFoundError")
    with pytest.raises(tk.OverrideError, match="implementation failed to load"):
        tk.rmsnorm(x, w, override="gone.rmsnorm")
    selection._broken.pop("gone.rmsnorm")


def _tiny_moe_weights():
    e, h, i = 4, 32, 32
    g = torch.Generator().manual_seed(0)
    w13, s13 = tk.quantize_mxfp4(torch.randn(e, 2 * i, h, generator=g), solution="reference")
    w2, s2 = tk.quantize_mxfp4(torch.randn(e, h, i, generator=g), solution="reference")
    return tk.MoEWeights(w13=w13, w2=w2, format="mxfp4", w13_scale=s13, w2_scale=s2, gate_up_interleaved=True)


def test_prepacked_moe_kernel_needs_a_plan(scratch):
    """A kernel with its own weight layout serves weights in that layout only; canonical calls go elsewhere."""
    calls = []

    def packed_apply(x, topk_weights, topk_ids, weights, activation, *, out=None):
        calls.append(weights.extra)
        return tk.moe_apply(x, topk_weights, topk_ids, weights.extra[0], activation, solution="reference")

    def pack(weights):
        from dataclasses import replace

        return replace(weights, extra=(weights,))

    moe_traits = {"activation": ANY, "clamp": ANY, "bias": ANY, "gate_up_interleaved": ANY}
    scratch("moe_apply", "packed.moe_apply", formats=[{"x": ("bf16", "fp32"), "w": "mxfp4"}], traits=moe_traits,
            priority=Priority.SPECIALIZED, impl=packed_apply, weight_preprocessor=pack)  # fmt: skip
    w = _tiny_moe_weights()
    act = tk.MoEActivation()
    x = torch.randn(5, 32)
    topk_w, topk_ids = tk.moe_route(torch.randn(5, 4), 2)
    canonical = tk.moe_apply(x, topk_w, topk_ids, w, act)  # not the packed kernel: it needs converted weights
    assert calls == []
    plan = tk.moe_plan(w, act, dtype=torch.float32, device="cpu")
    assert plan.kernel == "packed.moe_apply" and plan.layout == "packed.moe_apply"
    packed = tk.moe_process_weights(plan, w)
    assert packed.layout == "packed.moe_apply" and w.layout == "canonical"
    planned = tk.moe_apply(x, topk_w, topk_ids, packed, act, plan=plan)
    assert len(calls) == 1
    torch.testing.assert_close(planned, canonical)
    assert torch.equal(tk.moe_apply(x, topk_w, topk_ids, packed, act), planned)  # the layout alone selects it
    with pytest.raises(ValueError, match="is not the plan's"):
        tk.moe_apply(x, topk_w, topk_ids, w, act, plan=plan)
    with pytest.raises(tk.OverrideError, match="trait layout='canonical'"):
        tk.moe_apply(x, topk_w, topk_ids, w, act, override="packed.moe_apply")
    with pytest.raises(ValueError, match="writes its own layout"):
        register_kernel("moe_apply", name="bad.moe", solution="bad", formats=[{"x": "bf16", "w": "mxfp4"}],
                        traits={"layout": "canonical"}, weight_preprocessor=pack, impl=packed_apply)  # fmt: skip

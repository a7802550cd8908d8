"""Plugin discovery, the worked example plugin, import cost, platform faking, dispatch overhead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from importlib import metadata
from pathlib import Path

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.core import plugins

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def fake_entry_points(monkeypatch, tmp_path):
    """Serve a chosen list of entry points to the plugin loader, then restore it."""

    def install(modules: dict[str, str]) -> None:
        eps = []
        for name, source in modules.items():
            (tmp_path / f"tkplug_{name}.py").write_text(textwrap.dedent(source))
            eps.append(metadata.EntryPoint(name=name, value=f"tkplug_{name}:register", group=plugins.PLUGIN_GROUP))
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setattr(
            plugins.metadata, "entry_points", lambda group: eps if group == plugins.PLUGIN_GROUP else []
        )
        plugins._reset_for_tests()

    yield install
    monkeypatch.undo()
    plugins._reset_for_tests()
    tk.reload_settings()
    plugins.load_plugins()


GOOD = """
from tokenspeed_kernel import Priority, register_kernel
def register():
    register_kernel("silu_and_mul", name="good.silu", solution="good", formats=[{"x": "bf16"}],
                    priority=Priority.PERFORMANT, impl=lambda x, out=None: "good")
"""
BROKEN_IMPORT = "raise ImportError('libfoo.so: cannot open shared object file')\n"
BROKEN_REGISTER = """
def register():
    raise RuntimeError("no device library")
"""


def test_broken_plugin_is_reported_and_skipped(fake_entry_points):
    fake_entry_points({"good": GOOD, "badimport": BROKEN_IMPORT, "badreg": BROKEN_REGISTER})
    with pytest.warns(RuntimeWarning, match="plugin 'badimport'.*failed and was skipped"):
        reports = plugins.load_plugins()
    assert reports["good"].status == "loaded" and reports["good"].kernels == ["good.silu"]
    assert reports["badimport"].status == "failed" and "libfoo.so" in reports["badimport"].error
    assert reports["badreg"].status == "failed" and "no device library" in reports["badreg"].error
    x = torch.randn(2, 4, dtype=torch.bfloat16)
    assert tk.silu_and_mul(x) == "good"  # the healthy plugin still serves calls
    assert tk.registry.get("good.silu").source == "good"


VENDOR_WITH_TABLE = """
import json, pathlib, tempfile
from tokenspeed_kernel import Capability, Priority, register_kernel, register_measured_table
def register():
    for name in ("vendor.rmsnorm_a", "vendor.rmsnorm_b"):
        register_kernel("rmsnorm", name=name, solution="vendor", formats=[{"x": "fp32"}], priority=Priority.PORTABLE,
                        capability=Capability(vendors={"nvidia"}), impl=lambda *a, _n=name, **k: _n)
    entry = {"arch": "sm90", "device": "Test GPU", "op": "rmsnorm", "signature": ["fp32"],
             "traits": {"fused_residual": False}, "buckets": {"rows": 3}, "cases": 1, "timing": "graph",
             "scores": {"vendor.rmsnorm_a": 1.0, "vendor.rmsnorm_b": 1.3}}
    path = pathlib.Path(tempfile.mkdtemp()) / "table.json"
    path.write_text(json.dumps({"schema": 2, "kind": "tokenspeed-kernel-measured-table", "entries": [entry]}))
    register_measured_table(path, device="Test GPU")
"""
THIRD_PARTY_SPECIALIZED = """
from tokenspeed_kernel import Capability, Priority, register_kernel
def register():
    register_kernel("rmsnorm", name="thirdparty.rmsnorm", solution="thirdparty", formats=[{"x": "fp32"}],
                    priority=Priority.SPECIALIZED, capability=Capability(vendors={"nvidia"}),
                    impl=lambda *a, **k: "thirdparty")
"""


def test_an_unmeasured_specialized_plugin_kernel_beats_measured_portable_ones(fake_entry_points):
    """Plugins compete on equal terms: no table regenerated in core, the SPECIALIZED band wins."""
    fake_entry_points({"vendor": VENDOR_WITH_TABLE})
    gpu = tk.make_platform("sm90", device_name="Test GPU")
    x = {"sizes": {"rows": 5}, "platform": gpu}
    ranked = [c for c in tk.explain_selection("rmsnorm", ("fp32",), {}, **x) if c.eligible]
    assert [c.name for c in ranked[:2]] == ["vendor.rmsnorm_a", "vendor.rmsnorm_b"]  # the table, shipped by its plugin
    assert ranked[0].reason.startswith("measured 1 (Test GPU, rows=4..7)")
    fake_entry_points({"vendor": VENDOR_WITH_TABLE, "thirdparty": THIRD_PARTY_SPECIALIZED})
    ranked = [c for c in tk.explain_selection("rmsnorm", ("fp32",), {}, **x) if c.eligible]
    assert [c.name for c in ranked[:3]] == ["thirdparty.rmsnorm", "vendor.rmsnorm_a", "vendor.rmsnorm_b"]
    assert "not measured, above the measured kernels' PORTABLE band" in ranked[0].reason
    assert tk.plugin_reports()["vendor"].tables  # the report lists the plugin's table


PARTIAL_REGISTER = """
from tokenspeed_kernel import Priority, register_kernel
def register():
    register_kernel("silu_and_mul", name="partial.silu", solution="partial", formats=[{"x": "bf16"}],
                    priority=Priority.SPECIALIZED, impl=lambda x, out=None: "partial")
    raise RuntimeError("the second kernel's library is missing")
"""
EXITING = """
def register():
    raise SystemExit(3)
"""


CUSTOM_BASE = """
def register():
    class LibraryAbort(BaseException):
        pass
    raise LibraryAbort("device lost")
"""


def test_a_failed_plugin_leaves_nothing_registered_and_never_ends_the_process(fake_entry_points):
    fake_entry_points({"partial": PARTIAL_REGISTER, "exiting": EXITING, "custom": CUSTOM_BASE, "good": GOOD})
    with pytest.warns(RuntimeWarning) as caught:
        reports = plugins.load_plugins()
    assert reports["partial"].status == "failed" and reports["partial"].kernels == []
    assert tk.registry.get("partial.silu") is None  # rolled back: not selectable
    assert reports["exiting"].status == "failed" and "SystemExit" in reports["exiting"].error
    assert reports["custom"].status == "failed" and "device lost" in reports["custom"].error
    x = torch.randn(2, 4, dtype=torch.bfloat16)
    assert tk.silu_and_mul(x) == "good"
    # One warning per failed plugin, its error said once.
    texts = [str(w.message) for w in caught]
    partial = [t for t in texts if "'partial'" in t]
    assert len(partial) == 1 and partial[0].count("the second kernel's library is missing") == 1


def test_a_plugin_filter_naming_no_installed_plugin_warns(fake_entry_points, monkeypatch):
    monkeypatch.setenv("TOKENSPEED_KERNEL_PLUGINS", "nosuchplugin")
    fake_entry_points({"good": GOOD})
    with pytest.warns(
        RuntimeWarning, match=r"names plugin\(s\) \['nosuchplugin'\] that are not installed; installed plugins: good"
    ):
        reports = plugins.load_plugins()
    assert reports["good"].status == "filtered"


def test_plugin_loading_is_idempotent(fake_entry_points):
    fake_entry_points({"good": GOOD})
    first = plugins.load_plugins()
    second = plugins.load_plugins()
    assert first["good"].kernels == second["good"].kernels == ["good.silu"]
    assert [s.name for s in tk.registry.for_op("silu_and_mul")].count("good.silu") == 1


def test_plugin_filter_env(fake_entry_points, monkeypatch):
    monkeypatch.setenv("TOKENSPEED_KERNEL_PLUGINS", "-good")
    fake_entry_points({"good": GOOD})
    reports = plugins.load_plugins()
    assert reports["good"].status == "filtered" and tk.registry.get("good.silu") is None
    assert reports["core"].status == "loaded"


def test_plugin_loading_is_thread_safe(fake_entry_points):
    import threading

    fake_entry_points({"good": GOOD})
    errors: list[BaseException] = []

    def go():
        try:
            plugins.load_plugins()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert tk.registry.get("good.silu") is not None


def _run(code: str, **env: str) -> str:
    full_env = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, check=True)
    return out.stdout


def test_import_loads_no_triton_no_vendor_and_queries_no_gpu():
    code = textwrap.dedent(
        """
        import json, sys, time
        t0 = time.perf_counter()
        import torch
        t1 = time.perf_counter()
        import tokenspeed_kernel
        dt = time.perf_counter() - t1
        heavy = [m for m in ("triton", "flash_attn_interface", "flashinfer", "aiter", "tokenspeed_kernel_triton",
                             "tokenspeed_kernel_nvidia", "tokenspeed_kernel_amd") if m in sys.modules]
        print(json.dumps({"heavy": heavy, "cuda_initialized": torch.cuda.is_initialized(),
                          "plugins_loaded": tokenspeed_kernel.core.plugins._loaded, "seconds": dt,
                          "torch_seconds": t1 - t0}))
        """
    )
    res = json.loads(_run(code))
    assert res["heavy"] == []
    assert res["cuda_initialized"] is False
    assert res["plugins_loaded"] is False
    print(
        f"\nimport torch {res['torch_seconds'] * 1e3:.0f} ms, then import tokenspeed_kernel {res['seconds'] * 1e3:.0f} ms"
    )


def test_worked_example_plugin_installs_and_is_selected(tmp_path):
    """Build the example plugin's wheel, install it to a private dir and use it from a fresh process."""
    pytest.importorskip("hatchling")
    example = REPO / "examples" / "tokenspeed-kernel-example-plugin"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(example),
        ],
        check=True,
    )
    wheel = next(tmp_path.glob("*.whl"))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
        check=True,
    )
    code = textwrap.dedent(
        """
        import json, torch, tokenspeed_kernel as tk
        x = torch.randn(3, 8)
        y = tk.silu_and_mul(x)
        gate, up = x.chunk(2, -1)
        err = (y - torch.nn.functional.silu(gate) * up).abs().max().item()
        spec = tk.select_spec("silu_and_mul", ("fp32",), {}, platform=tk.current_platform()).spec
        print(json.dumps({"kernel": spec.name, "source": spec.source, "err": err,
                          "report": tk.plugin_reports()["example"].status}))
        """
    )
    env = {"PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
    res = json.loads(_run(code, **env))
    assert res == {"kernel": "example.silu_and_mul", "source": "example", "err": res["err"], "report": "loaded"}
    assert res["err"] < 1e-6


def test_fake_platform_without_reload():
    real = tk.current_platform()
    with tk.fake_platform("gfx950") as plat:
        assert tk.current_platform() is plat
        assert plat.vendor == "amd" and plat.has("mfma_scaled", "mxfp4_mma")
        with tk.fake_platform("sm90"):
            assert tk.current_platform().has("wgmma", "tma")
        assert tk.current_platform().arch == "gfx950"
    assert tk.current_platform() == real
    assert tk.make_platform("sm90").arch_version < tk.make_platform("sm100").arch_version
    with pytest.raises(ValueError, match="unknown arch"):
        tk.make_platform("tpu7")


def test_dispatch_overhead_on_cpu():
    """Cached selection + wrapper vs calling the kernel function directly."""

    def noop(x, weight, eps, *, residual=None, out=None):
        return x

    tk.register_kernel("rmsnorm", name="overhead.noop", solution="overhead", formats=[{"x": "bf16"}],
                       priority=tk.Priority.SPECIALIZED + 50, impl=noop)  # fmt: skip
    try:
        x, w = torch.randn(4, 64, dtype=torch.bfloat16), torch.ones(64, dtype=torch.bfloat16)
        assert tk.rmsnorm(x, w) is x
        n = 20000

        def best(fn):
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                times.append((time.perf_counter() - t0) / n)
            return min(times)

        api = best(lambda: tk.rmsnorm(x, w))
        direct = best(lambda: noop(x, w, 1e-5))
        overhead_us = (api - direct) * 1e6
        print(f"\ndispatch overhead: {overhead_us:.2f} us/call (api {api * 1e6:.2f} us, direct {direct * 1e6:.2f} us)")
        # The target is <= 3 us on an idle core; CI machines are shared, so the
        # assertion only guards against a regression by an order of magnitude.
        assert overhead_us < 30
    finally:
        tk.unregister_kernel("overhead.noop")

"""The tokenspeed-kernel CLI: list, explain, plugins, extension subcommands, `python -m`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib import metadata

import pytest

import tokenspeed_kernel as tk
from tokenspeed_kernel import cli
from tokenspeed_kernel.core import plugins
from tokenspeed_kernel.core.registry import Capability, Priority, register_kernel, registry, unregister_kernel

TEST_KERNEL = "clitest.rmsnorm_hopper"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def hopper_only_kernel():
    """A throwaway rmsnorm kernel that needs NVIDIA >= sm90 and takes bf16 only."""
    tk.load_plugins()
    spec = register_kernel(
        "rmsnorm",
        name=TEST_KERNEL,
        solution="clitest",
        formats=[{"x": "bf16"}],
        capability=Capability(vendors={"nvidia"}, min_arch="sm90"),
        # Above every real kernel so that it wins wherever it can run.
        priority=Priority.SPECIALIZED + 50,
        tags=("latency",),
        hardware_validated=False,
        impl=lambda *a, **k: None,
    )
    yield spec
    if registry.get(TEST_KERNEL) is not None:
        unregister_kernel(TEST_KERNEL)
    tk.clear_selection_cache()


# ---------------------------------------------------------------------------
# list


def test_list_shows_every_op_with_its_reference_kernel(capsys):
    code, out, _ = run_cli(capsys, "list")
    assert code == 0
    for op in tk.all_contracts():
        assert f"reference.{op}  [reference]  REFERENCE (0)  from core" in out
    assert "== attention ==" in out and "== sampling ==" in out
    # The trait schema: type, requiredness, allowed values.
    assert "head_dim: int, required, 8..512" in out
    assert "style: str, default 'neox', one of ['neox', 'gptj']" in out


def test_list_json_filters_by_op_and_solution(capsys):
    code, out, _ = run_cli(capsys, "list", "--op", "mm", "--json")
    assert code == 0
    ops = json.loads(out)["ops"]
    assert [o["op"] for o in ops] == ["mm"]
    assert ops[0]["family"] == "gemm" and ops[0]["roles"] == ["a", "b", "out"]
    assert ops[0]["traits"]["bias"] == {
        "type": "bool",
        "required": False,
        "default": False,
        "allowed": None,
        "doc": "bias added to the output",
    }
    ref = next(k for k in ops[0]["kernels"] if k["name"] == "reference.mm")
    assert ref["solution"] == "reference" and ref["band"] == "REFERENCE" and ref["source"] == "core"
    assert ref["traits"] == {"bias": "any"} and ref["hardware_validated"] is True
    assert {"a": ["bf16", "fp16"], "b": ["mxfp4"], "out": ["bf16", "fp16", "fp32"]} in ref["formats"]

    code, out, _ = run_cli(capsys, "list", "--solution", "reference", "--json")
    ops = json.loads(out)["ops"]
    assert sorted(o["op"] for o in ops) == sorted(tk.all_contracts())
    assert {k["solution"] for o in ops for k in o["kernels"]} == {"reference"}


def test_list_marks_kernels_not_run_on_hardware(capsys, hopper_only_kernel):
    code, out, _ = run_cli(capsys, "list", "--op", "rmsnorm")
    assert code == 0
    line = next(ln for ln in out.splitlines() if TEST_KERNEL in ln)
    assert "SPECIALIZED (350)" in line and "NOT run on hardware" in line
    # Higher priority lists first.
    assert out.index(TEST_KERNEL) < out.index("reference.rmsnorm")
    assert "capability: nvidia sm90.." in out
    code, out, _ = run_cli(capsys, "list", "--solution", "clitest", "--json")
    (op,) = json.loads(out)["ops"]
    (kernel,) = op["kernels"]
    assert kernel["hardware_validated"] is False and kernel["capability"]["vendors"] == ["nvidia"]
    assert kernel["tags"] == ["latency"]


def test_list_bad_input(capsys):
    code, _, err = run_cli(capsys, "list", "--op", "nosuch_op")
    assert code == 2 and "--op: unknown op 'nosuch_op'" in err
    code, _, err = run_cli(capsys, "list", "--solution", "nosuch")
    assert code == 2 and "--solution: no kernel of solution 'nosuch'" in err


# ---------------------------------------------------------------------------
# explain


def test_explain_shows_why_a_kernel_is_rejected(capsys, hopper_only_kernel):
    code, out, _ = run_cli(capsys, "explain", "rmsnorm", "--platform", "cpu")
    assert code == 0
    line = next(ln for ln in out.splitlines() if TEST_KERNEL in ln)
    assert line.startswith("-") and "needs vendor nvidia, platform is cpu" in line
    selected = next(ln for ln in out.splitlines() if ln.startswith("selected:"))
    assert TEST_KERNEL not in selected and "none" not in selected

    code, out, _ = run_cli(capsys, "explain", "rmsnorm", "--platform", "gfx950")
    assert "needs vendor nvidia, platform is amd" in out

    code, out, _ = run_cli(capsys, "explain", "rmsnorm", "--platform", "sm90")
    assert code == 0 and f"selected:  {TEST_KERNEL} [clitest]  (NOT run on hardware)" in out

    # Format and trait rejections on a platform the capability accepts.
    code, out, _ = run_cli(capsys, "explain", "rmsnorm", "--platform", "sm90", "--dtype", "fp16")
    assert "formats x=fp16 not supported (supports {x: bf16})" in out
    code, out, _ = run_cli(capsys, "explain", "rmsnorm", "--platform", "sm90", "--trait", "fused_residual=true")
    assert "trait fused_residual=True (supports False)" in out
    selected = next(ln for ln in out.splitlines() if ln.startswith("selected:"))
    assert TEST_KERNEL not in selected and "none" not in selected


def test_explain_forced_kernel_that_cannot_run_exits_1(capsys, hopper_only_kernel):
    code, out, _ = run_cli(capsys, "explain", "rmsnorm", "--platform", "cpu", "--solution", "clitest")
    assert code == 1
    assert "forced:    solution=clitest" in out
    assert "selected:  none: solution=clitest names no kernel that can run this call" in out
    code, out, _ = run_cli(capsys, "explain", "rmsnorm", "--platform", "sm100", "--override", TEST_KERNEL, "--json")
    data = json.loads(out)
    assert code == 0 and data["selected"] == TEST_KERNEL
    assert data["platform"]["arch"] == "sm100"


def test_explain_derives_traits_and_sizes_from_the_call_its_shape_describes(capsys):
    argv = ["explain", "mha_decode_with_kvcache", "--kv-dtype", "fp8_e4m3", "--platform", "cpu", "--json"]
    argv += ["--shape", "head_dim=64", "heads_q=64", "heads_kv=8", "--shape", "page_size=16", "cache_lens=100,2000"]
    code, out, _ = run_cli(capsys, *argv, "--trait", "sinks=true", "--solution", "reference")
    assert code == 0
    data = json.loads(out)
    assert data["signature"] == {"q": "bf16", "kv": "fp8_e4m3"}
    assert data["traits"] == {
        "head_dim": 64,
        "gqa_group": 8,
        "window": False,
        "sinks": True,
        "logit_cap": False,
        "return_lse": False,
        "page_size": 16,
    }
    # Two sequences; the generated page table has ceil(2000 / 16) = 125 pages a row plus one spare
    # column (numerics.inputs.paged_kv_cache): 126 x 16 = 2016 slots.
    assert data["sizes"] == {"batch": 2, "context": 2016}
    assert data["buckets"] == {"batch": "2..3", "context": "1024..2047"}
    assert data["selected"] == "reference.mha_decode_with_kvcache"


def test_explain_rope_and_mm_signatures_and_sizes(capsys):
    code, out, _ = run_cli(capsys, "explain", "apply_rotary", "--shape", "head_dim=128", "rotary_dim=64", "--json")
    assert code == 0 and json.loads(out)["traits"] == {"style": "neox", "partial": True}
    code, out, _ = run_cli(capsys, "explain", "mm", "--dtype", "fp8_e4m3:per_token", "--json", "--platform", "cpu")
    sig = json.loads(out)["signature"]
    assert sig == {"a": "fp8_e4m3:per_token", "b": "fp8_e4m3:per_channel", "out": "bf16"}
    code, out, _ = run_cli(capsys, "explain", "mm", "--dtype", "float16", "--format", "b=mxfp4", "--json")
    assert json.loads(out)["signature"] == {"a": "fp16", "b": "mxfp4", "out": "fp16"}
    code, out, _ = run_cli(capsys, "explain", "mm", "--shape", "m=64", "n=5120", "k=2880")
    assert code == 0 and "sizes:     m=64 (bucket 64..127)" in out
    code, out, _ = run_cli(capsys, "explain", "mm", "--size", "m=4096", "--json")
    assert json.loads(out)["buckets"] == {"m": "4096..8191"}


def test_the_readme_explain_example_runs(capsys):
    """The command the README shows (one convention: K=V options take several values and repeat)."""
    argv = ["explain", "mha_prefill", "--dtype", "bf16", "--shape", "head_dim=64", "heads_q=64", "heads_kv=8",
            "seqlens_q=1024", "window_left=127", "sinks=true"]  # fmt: skip
    code, out, _ = run_cli(capsys, *argv)
    assert code == 0
    assert "traits:    head_dim=64, gqa_group=8, window=True, sinks=True" in out
    assert "sizes:     tokens=1024 (bucket 1024..2047)" in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["explain", "nosuch"], "OP: unknown op 'nosuch'"),
        (["explain", "mha_prefill", "--shape", "heads=8"], "--shape: unknown key 'heads' for op 'mha_prefill'"),
        (["explain", "mha_prefill", "--shape", "heads_q=6", "heads_kv=4"], "the call these values describe"),
        (["explain", "mm", "--shape", "m=4", "m=5"], "--shape: 'm' given twice"),
        (["explain", "mm", "--trait", "bias=maybe"], "--trait bias: trait 'bias' is a bool"),
        (["explain", "mm", "--trait", "causal=true"], "op 'mm' has no trait 'causal'; its traits: bias"),
        (["explain", "mm", "--dtype", "fp12"], "--dtype: unknown format 'fp12'"),
        (["explain", "mm", "--format", "c=bf16"], "--format: op 'mm' has no role 'c'"),
        (["explain", "mm", "--kv-dtype", "bf16"], "--kv-dtype: op 'mm' has no kv role"),
        (["explain", "mm", "--platform", "sm9x"], "--platform: arch: unknown arch name 'sm9x'"),
        (["explain", "mm", "--override", "nosuch.kernel"], "--override: 'nosuch.kernel' is neither"),
        (["explain", "mm", "--size", "tokens=4"], "--size: op 'mm' has no size 'tokens'; its sizes: m"),
        (["explain", "mm", "--size", "m=-1"], "--size m: expected an integer >= 0"),
        (["explain", "mha_prefill", "--trait", "head_dim=1024"], "must be one of 8..512"),
        (["explain", "rmsnorm", "--trait", "fused_residual"], "--trait: expected KEY=VALUE"),
        (
            ["explain", "mha_prefill", "--shape", "head_dim=64", "--trait", "head_dim=128"],
            "--trait head_dim=128 contradicts the call --shape describes (head_dim=64)",
        ),
    ],
)
def test_explain_bad_input_exits_2_with_a_clear_message(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    # The error is the last line (plugin notes, if any, come before it).
    last = err.strip().splitlines()[-1]
    assert last.startswith("tokenspeed-kernel explain: error: ")
    assert message in last
    assert out == ""


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["no-such-command"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2
    capsys.readouterr()


# ---------------------------------------------------------------------------
# plugins


def test_plugins_lists_core_with_its_kernels(capsys):
    code, out, _ = run_cli(capsys, "plugins")
    assert code == 0
    core = next(ln for ln in out.splitlines() if ln.startswith("core "))
    assert "loaded" in core and f" {len(tk.all_contracts())} " in core
    code, out, _ = run_cli(capsys, "plugins", "--json")
    reports = {r["name"]: r for r in json.loads(out)["plugins"]}
    assert reports["core"]["kernels"] == sorted(f"reference.{op}" for op in tk.all_contracts())
    assert reports["core"]["distribution"] == "tokenspeed-kernel-core"


BROKEN_PLUGIN = """
def register():
    raise RuntimeError("no device library")
"""
GOOD_PLUGIN = """
from tokenspeed_kernel import Priority, register_kernel
def register():
    register_kernel("silu_and_mul", name="cligood.silu", solution="cligood", formats=[{"x": "bf16"}],
                    priority=Priority.PERFORMANT, impl=lambda x, out=None: x)
"""


@pytest.fixture
def fake_plugins(monkeypatch, tmp_path):
    """Serve two fake plugins (one broken) to the loader, then restore the real ones."""
    eps = []
    for name, source in (("clibroken", BROKEN_PLUGIN), ("cligood", GOOD_PLUGIN)):
        (tmp_path / f"tkcli_{name}.py").write_text(textwrap.dedent(source))
        eps.append(metadata.EntryPoint(name=name, value=f"tkcli_{name}:register", group=plugins.PLUGIN_GROUP))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: eps if group == plugins.PLUGIN_GROUP else [])
    plugins._reset_for_tests()
    yield
    monkeypatch.undo()
    plugins._reset_for_tests()
    tk.reload_settings()
    plugins.load_plugins()


def test_plugins_reports_failures_with_errors(capsys, fake_plugins):
    code, out, _ = run_cli(capsys, "plugins")
    assert code == 0
    lines = out.splitlines()
    broken = lines.index(next(ln for ln in lines if ln.startswith("clibroken ")))
    assert "failed" in lines[broken] and " 0 " in lines[broken]
    assert lines[broken + 1].strip() == "error: RuntimeError: no device library"
    good = next(ln for ln in lines if ln.startswith("cligood "))
    assert "loaded" in good and " 1 " in good
    assert "1 plugin(s) failed to load" in out
    assert run_cli(capsys, "plugins", "--strict")[0] == 1
    # Other commands mention the failure in one line on stderr, without a traceback.
    code, out, err = run_cli(capsys, "list", "--op", "silu_and_mul")
    assert code == 0 and "cligood.silu  [cligood]  PERFORMANT (200)  from cligood" in out
    assert "plugin 'clibroken' failed to load" in err and "Traceback" not in err


def test_plugin_filter_naming_no_installed_plugin_is_a_note(capsys, fake_plugins, monkeypatch):
    """Before: TOKENSPEED_KERNEL_PLUGINS=nosuchplugin filtered every plugin out and the CLI said nothing."""
    monkeypatch.setenv("TOKENSPEED_KERNEL_PLUGINS", "nosuchplugin")
    code, out, err = run_cli(capsys, "plugins")
    assert code == 0
    assert err.strip() == (
        "tokenspeed-kernel: note: TOKENSPEED_KERNEL_PLUGINS names plugin(s) ['nosuchplugin'] that are not installed; "
        "installed plugins: clibroken, cligood"
    )
    assert "filtered out by TOKENSPEED_KERNEL_PLUGINS: clibroken, cligood" in out


# ---------------------------------------------------------------------------
# settings mistakes: one line, exit 2, for every command


def _cli_process(*argv: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tokenspeed_kernel", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "TOKENSPEED_KERNEL_PLUGINS": "none", **env},
        timeout=300,
    )


def test_a_malformed_config_file_is_one_line_of_error_not_a_traceback(tmp_path):
    """Before: `explain` printed a TOMLDecodeError traceback naming neither the file nor the variable."""
    cfg = tmp_path / "kernels.toml"
    cfg.write_text("[override\n")
    for argv in (["explain", "rmsnorm"], ["verify", "rmsnorm", "--dtype", "fp32"]):
        proc = _cli_process(*argv, TOKENSPEED_KERNEL_CONFIG=str(cfg))
        assert proc.returncode == 2, (argv, proc.stderr)
        assert proc.stdout == "" and "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines() == [
            f"tokenspeed-kernel {argv[0]}: error: TOKENSPEED_KERNEL_CONFIG: {cfg} is not valid TOML: "
            "Expected ']' at the end of a table declaration (at line 1, column 10)"
        ]


@pytest.mark.parametrize("argv", [["list"], ["explain", "rmsnorm"], ["plugins"], ["verify", "rmsnorm"],
                                  ["bench", "rmsnorm"], ["demo"]])  # fmt: skip
def test_a_bad_override_variable_stops_every_command(capsys, monkeypatch, argv):
    from tokenspeed_kernel.core import settings as settings_module

    monkeypatch.setenv("TOKENSPEED_KERNEL_OVERRIDE", "rmsnrom=reference")
    monkeypatch.setattr(settings_module, "_settings", None)  # as in a fresh process
    try:
        code, out, err = run_cli(capsys, *argv)
    finally:
        monkeypatch.undo()
        tk.reload_settings()
    assert code == 2 and out == ""
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"tokenspeed-kernel {argv[0]}: error: TOKENSPEED_KERNEL_OVERRIDE entry 'rmsnrom=reference':")
    assert "'rmsnrom' is not an op; ops: apply_rotary" in last


# ---------------------------------------------------------------------------
# extension subcommands


EXTENSION = """
def _run(args):
    print(f"ext ran with {args.size}")
    return 3

def add_parser(subparsers):
    p = subparsers.add_parser("fakeext", help="a contributed subcommand")
    p.add_argument("--size", type=int, default=1)
    p.set_defaults(func=_run)
"""


def test_extension_subcommands_load_or_stay_absent(capsys, monkeypatch, tmp_path):
    (tmp_path / "tkcli_ext.py").write_text(textwrap.dedent(EXTENSION))
    (tmp_path / "tkcli_broken_ext.py").write_text("import tkcli_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(
        cli,
        "EXTENSIONS",
        (("tkcli_ext", "fakeext"), ("tkcli_missing_ext", "missing"), ("tkcli_broken_ext", "broken")),
    )
    code, out, _ = run_cli(capsys, "fakeext", "--size", "5")
    assert code == 3 and out == "ext ran with 5\n"
    help_text = cli.build_parser().format_help()
    assert "fakeext" in help_text
    assert "missing" not in help_text  # not installed: silently absent
    assert "broken: unavailable (ModuleNotFoundError: No module named 'tkcli_no_such_dependency')" in help_text
    with pytest.raises(SystemExit):
        cli.main(["broken"])
    capsys.readouterr()


# ---------------------------------------------------------------------------
# python -m and import cost


def test_python_m_runs_the_cli():
    env = {**os.environ, "TOKENSPEED_KERNEL_PLUGINS": "none"}
    proc = subprocess.run(
        [sys.executable, "-m", "tokenspeed_kernel", "explain", "silu_and_mul", "--platform", "sm90"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "selected:  reference.silu_and_mul [reference]" in proc.stdout


@pytest.mark.parametrize(
    "module,argv,expect",
    [
        ("tokenspeed_kernel.plugins", [], "core             loaded"),
        ("tokenspeed_kernel.numerics", ["silu_and_mul", "--dtype", "fp32"], "verify on cpu"),
        ("tokenspeed_kernel.benchmark", ["silu_and_mul", "--shapes", "cpu", "--dtype", "fp32", "--quiet",
                                         "--no-ceilings", "--warmup-ms", "1", "--rep-ms", "2"], "reference.silu_and_mul"),
        ("tokenspeed_kernel.numerics", ["--help"], "usage: python -m tokenspeed_kernel.numerics"),
        ("tokenspeed_kernel.benchmark", ["--help"], "usage: python -m tokenspeed_kernel.benchmark"),
    ],
)  # fmt: skip
def test_python_m_entry_points_of_the_upstream_readme(module, argv, expect):
    """Before: `python -m tokenspeed_kernel.numerics / .benchmark / .plugins` did not run."""
    env = {**os.environ, "TOKENSPEED_KERNEL_PLUGINS": "none"}
    proc = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert expect in proc.stdout


def test_help_imports_no_extension_dependency_and_no_model():
    """``--help`` builds the parser only: no plugin, no model code, no profiler (torch comes with the package)."""
    code = (
        "import sys, runpy, time\n"
        "sys.argv = ['tokenspeed-kernel', '--help']\n"
        "t0 = time.perf_counter()\n"
        "try:\n"
        "    runpy.run_module('tokenspeed_kernel', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "from tokenspeed_kernel.core import plugins\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('tokenspeed_kernel.models', 'tokenspeed_kernel_',"
        " 'triton', 'matplotlib', 'transformers')))\n"
        "print('RESULT', plugins._loaded, bad, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: tokenspeed-kernel" in proc.stdout and "demo" in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == "RESULT False []"


def test_importing_the_cli_loads_no_plugin_and_no_extension():
    code = (
        "import sys, tokenspeed_kernel.cli\n"
        "from tokenspeed_kernel.core import plugins\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('triton', 'tokenspeed_kernel_triton')"
        " or m in ('tokenspeed_kernel.numerics.cli', 'tokenspeed_kernel.benchmark.cli', 'tokenspeed_kernel.demo')]\n"
        "print(plugins._loaded, bad)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False []"

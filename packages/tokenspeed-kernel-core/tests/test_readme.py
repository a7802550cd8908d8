"""Every command and snippet README.md shows runs (what can run on a CPU).

Read from the README at test time, so a changed README is tested as it is:

- commands (in ``bash`` blocks, their comments, and inline code) of ``tokenspeed-kernel``,
  ``python -m tokenspeed_kernel...`` and ``./run``: each runs in a fresh process and must
  exit 0. ``./run demo ARGS`` runs ``tokenspeed-kernel demo ARGS`` in this environment
  (the ``run`` script only creates ``.venv/`` around it); ``./run tests`` is skipped (it
  is the run these tests belong to). A command with a placeholder (``OP``,
  ``REPORT.json...``) is a synopsis: its subcommand's ``--help`` must work; so must a
  command named in prose without its required arguments (``tokenspeed-kernel oracle
  build``), while an unknown option or a bad value fails;
- the CLI table's commands: each has ``--help``;
- the ``python`` blocks: run in order in one namespace in a fresh process, as a reader
  pastes them, on the CPU when there is no GPU (``device="cuda"`` -> ``"cpu"``); a
  ``solution="triton"`` the CPU cannot serve is given a stand-in kernel of that solution
  (the reference), since the point is the API the snippet uses;
- the ``toml`` blocks parse, and an entry-point table names the plugin group.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import tomllib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from tokenspeed_kernel.core.plugins import PLUGIN_GROUP

REPO = Path(__file__).resolve().parents[3]
README = (REPO / "README.md").read_text()
PROGRAMS = ("tokenspeed-kernel", "./run", "python -m tokenspeed_kernel")
_COMMAND = re.compile(r"(?:tokenspeed-kernel|\./run|python -m tokenspeed_kernel[\w.]*)(?: [^`:;)(]*)?")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README, re.S | re.M)


def _commands() -> dict[str, str]:
    """command -> where it is shown ("block" or "prose")."""
    found: dict[str, str] = {}
    for block in _blocks("bash"):
        for line in block.splitlines():
            code, _, comment = line.partition("#")
            for m in [*_COMMAND.finditer(code), *_COMMAND.finditer(comment)]:
                found.setdefault(m.group(0).strip().rstrip("."), "block")
    prose = re.sub(r"^```.*?^```", "", README, flags=re.S | re.M)
    for span in re.findall(r"`([^`\n]+)`", prose):
        if span.startswith(PROGRAMS):
            found.setdefault(span.strip().rstrip("."), "prose")
    return found


def _placeholder(word: str) -> bool:
    return "..." in word or bool(re.fullmatch(r"[A-Z][A-Z_]*(\.[a-z]+)?|\[.*|.*\]", word))


def _argv(command: str) -> tuple[list[str] | None, str]:
    """(argv to run in this environment, or None to skip; what is checked)."""
    words = shlex.split(command)
    if words[0] == "./run":
        if words[1:2] == ["tests"]:
            return None, "the CI run these tests belong to"
        words = ["tokenspeed-kernel", *words[1:]]
    if words[0] == "tokenspeed-kernel":
        prefix, rest = [sys.executable, "-m", "tokenspeed_kernel"], words[1:]
    else:  # python -m tokenspeed_kernel[.module]
        prefix, rest = [sys.executable, "-m", words[2]], words[3:]
    if "cuda" in rest and not torch.cuda.is_available():
        return None, "needs a CUDA device"
    if not rest:
        return [*prefix, "--help"], "the program exists"
    if any(_placeholder(w) for w in rest):
        sub = [w for w in rest[:1] if not _placeholder(w) and not w.startswith("-")]
        return [*prefix, *sub, "--help"], "a synopsis: the subcommand exists"
    return [*prefix, *rest], "runs"


COMMANDS = _commands()


def test_the_readme_shows_commands():
    assert any(c.startswith("./run demo") for c in COMMANDS), COMMANDS
    assert any(c.startswith("tokenspeed-kernel ") for c in COMMANDS), COMMANDS


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENSPEED_KERNEL_", "TRITON_INTERPRET"))}
    return subprocess.run(argv, capture_output=True, text=True, env={**full, **env}, timeout=600, cwd=REPO)


@functools.cache
def _started() -> dict[tuple[str, ...], Future]:
    """Every README command, started at once on a few workers (the demos take seconds each)."""
    pool = ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2)))
    argvs = [argv for argv, _ in map(_argv, COMMANDS) if argv is not None]
    return {tuple(a): pool.submit(_run, a) for a in argvs}


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_runs(command):
    argv, what = _argv(command)
    if argv is None:
        pytest.skip(f"{command}: {what}")
    proc = _started()[tuple(argv)].result()
    if COMMANDS[command] == "prose" and proc.returncode == 2 and "the following arguments are required" in proc.stderr:
        argv, what = [*argv, "--help"], "named in prose: the command exists"
        proc = _run(argv)
    assert proc.returncode == 0, f"{command} ({what}): exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr}"
    assert proc.stdout.strip(), f"{command}: printed nothing"
    assert "Traceback" not in proc.stderr


def _cli_table_commands() -> list[str]:
    section = README.split("\n## CLI", 1)[1].split("\n## ", 1)[0]
    return [m for m in re.findall(r"^\| `([a-z]+)", section, re.M)]


def test_every_command_of_the_cli_table_exists():
    names = _cli_table_commands()
    assert {"list", "explain", "plugins", "verify", "bench", "demo"} <= set(names), names
    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        procs = pool.map(lambda n: _run([sys.executable, "-m", "tokenspeed_kernel", n, "--help"]), names)
    for name, proc in zip(names, procs):
        assert proc.returncode == 0 and f"usage: tokenspeed-kernel {name}" in proc.stdout, (name, proc.stderr)


_PRELUDE = textwrap.dedent(
    """
    import json, sys
    import torch
    import tokenspeed_kernel as tk

    tk.load_plugins()
    if not torch.cuda.is_available():
        # The snippets force solution="triton"; this CPU runs none (no TRITON_INTERPRET): stand-ins of that
        # solution (each op's reference) keep the API the snippets use under test.
        for op in tk.all_contracts().values():
            ref = op.reference
            tk.register_kernel(op.name, name=f"readme_stand_in.{op.name}", solution="triton", formats=ref.formats,
                               traits=ref.traits, priority=tk.Priority.PORTABLE, impl=ref.impl)
    """
)
_EPILOGUE = textwrap.dedent(
    """
    shown = {k: [list(v.shape), str(v.dtype), bool(v.float().isfinite().all())] for k, v in dict(globals()).items()
             if isinstance(v, torch.Tensor)}
    if "register" in globals():  # the plugin snippet: register its kernel and use it
        register()
        x = torch.randn(3, 8)
        gate, up = x.chunk(2, -1)
        y = tk.silu_and_mul(x)
        spec = tk.select_spec("silu_and_mul", ("fp32",), {}, platform=tk.current_platform()).spec
        shown["plugin"] = [spec.name, (y - torch.nn.functional.silu(gate) * up).abs().max().item()]
    print("RESULT " + json.dumps(shown))
    """
)


def test_readme_python_snippets_run_in_order():
    blocks = _blocks("python")
    assert blocks, "README.md shows no python block"
    code = "\n".join(blocks)
    if not torch.cuda.is_available():
        code = code.replace('device="cuda"', 'device="cpu"')
    script = _PRELUDE + "\n" + code + "\n" + _EPILOGUE
    proc = _run([sys.executable, "-c", script], TOKENSPEED_KERNEL_PLUGINS="none")
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = json.loads(proc.stdout.rsplit("RESULT ", 1)[1])
    # The "Use" snippet: two prefill outputs of q's shape, finite; its explanation selected a kernel.
    for name in ("out", "ref"):
        assert shown[name][0] == [300, 64, 64] and shown[name][2], shown
    assert re.search(r"^\*  #1 \S+\.mha_prefill", proc.stdout, re.M), proc.stdout
    # The plugin snippet: its kernel is selected on a CPU and computes silu(gate) * up.
    kernel, err = shown["plugin"]
    assert kernel == "example.silu_and_mul" and err < 1e-6


def test_readme_toml_blocks_parse_and_name_the_plugin_group():
    blocks = _blocks("toml")
    assert blocks
    for block in blocks:
        data = tomllib.loads(block)
        eps = data.get("project", {}).get("entry-points", {})
        if eps:
            assert list(eps) == [PLUGIN_GROUP]
            for target in eps[PLUGIN_GROUP].values():
                assert re.fullmatch(r"[\w.]+:\w+", target), target

"""ROCm install path: the wheel requires no ``triton`` distribution, and a missing or
unsupported Triton gives an error naming the supported range at first use."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from tokenspeed_kernel_amd._triton import SUPPORTED, TritonVersionError, check_triton_version

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
RANGE = ">=3.6,<3.7"


def _names(requirements):
    return {re.split(r"[\s;<>=!~\[]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_pyproject_requires_no_triton():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert "triton" not in _names(project["dependencies"])
    for extra, reqs in project.get("optional-dependencies", {}).items():
        assert "triton" not in _names(reqs), extra


def test_installed_metadata_requires_no_triton():
    # The metadata pip resolves from (the installed wheel's, in the nox 'amd' session).
    reqs = metadata.requires("tokenspeed-kernel-amd") or []
    unconditional = [r for r in reqs if "extra ==" not in r]
    assert "triton" not in _names(unconditional), reqs
    # Nor through the core it depends on.
    core = [r for r in metadata.requires("tokenspeed-kernel-core") or [] if "extra ==" not in r]
    assert "triton" not in _names(core), core


@pytest.mark.parametrize("version", ["3.6.0", "3.6.1+rocm7.0.0.git1234", "3.6.0.post1"])
def test_supported_versions_pass(version):
    check_triton_version(version)


@pytest.mark.parametrize("version", ["3.5.1", "3.7.0", "4.0.0", "2.3.1+rocm6.2", "", "nightly"])
def test_unsupported_versions_name_the_range(version):
    with pytest.raises(TritonVersionError, match=re.escape(RANGE)) as info:
        check_triton_version(version, source="pytorch-triton-rocm")
    assert isinstance(info.value, ImportError)
    assert "pytorch-triton-rocm" in str(info.value)


def test_supported_range_is_the_one_stated():
    assert SUPPORTED == ((3, 6), (3, 7))
    # The README's install instructions state the range the check enforces.
    assert f"`{RANGE}`" in (PYPROJECT.parent / "README.md").read_text()


def _import_kernel_with(tmp_path, triton_init: str | None):
    """Import a Gluon kernel module in a fresh interpreter whose ``triton`` is a fake
    package (``triton_init``) or absent (None)."""
    fake = tmp_path / "site"
    fake.mkdir()
    if triton_init is not None:
        (fake / "triton").mkdir()
        (fake / "triton" / "__init__.py").write_text(triton_init)
        prelude = ""
    else:
        prelude = "import sys; sys.modules['triton'] = None\n"  # 'import triton' raises ImportError
    code = prelude + textwrap.dedent(
        """
        try:
            import tokenspeed_kernel_amd.gfx950.attention
        except ImportError as exc:
            print(type(exc).__name__ + ": " + str(exc))
        else:
            print("imported")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_too_old_triton_gives_the_clear_error_at_first_use(tmp_path):
    line = _import_kernel_with(tmp_path, "__version__ = '3.4.0'\n")
    assert line.startswith("TritonVersionError: ") and RANGE in line and "found 3.4.0" in line, line
    assert "pytorch-triton-rocm" in line
    # Where the unsupported Triton was imported from (here the fake one shadowing any other).
    assert f"imported from {tmp_path / 'site' / 'triton'};" in line


def test_missing_triton_gives_the_clear_error_at_first_use(tmp_path):
    line = _import_kernel_with(tmp_path, None)
    assert line.startswith("TritonVersionError: ") and RANGE in line and "and none is importable" in line, line


def test_selection_reports_the_error_and_skips_the_kernel(tmp_path):
    """Through the public op: the Gluon kernel fails to load with that message and
    selection moves on (here to the reference), saying why."""
    fake = tmp_path / "site"
    (fake / "triton").mkdir(parents=True)
    (fake / "triton" / "__init__.py").write_text("__version__ = '3.4.0'\n")
    code = textwrap.dedent(
        """
        import warnings, torch, tokenspeed_kernel as tk
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with tk.fake_platform("gfx950"):
                sel = tk.select_spec("rmsnorm", ("bf16",), {"fused_residual": False})
        print(sel.spec.name)
        print([str(w.message) for w in caught if "amd.gfx950.rmsnorm" in str(w.message)][0])
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    chosen, warning = out.stdout.strip().splitlines()[-2:]
    assert chosen != "amd.gfx950.rmsnorm"
    assert "failed to load" in warning and "TritonVersionError" in warning and RANGE in warning, warning


def test_real_triton_is_supported():
    pytest.importorskip("triton")
    from tokenspeed_kernel_amd._triton import require_triton

    require_triton()  # the Triton CI runs with is one the kernels support
    with pytest.raises(TritonVersionError):
        check_triton_version("3.5.0")

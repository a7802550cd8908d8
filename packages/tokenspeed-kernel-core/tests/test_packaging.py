"""Packaging: the license text ships, the metadata is complete, each package's tests run alone cleanly."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGES = sorted((REPO / "packages").glob("tokenspeed-kernel-*"))
ROOT_LICENSE = REPO / "LICENSE"


def _pyproject(path: Path) -> dict:
    return tomllib.loads((path / "pyproject.toml").read_text())


def test_the_license_is_the_apache_2_text_at_the_root_and_in_each_package():
    text = ROOT_LICENSE.read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    assert len(PACKAGES) == 4
    for package in PACKAGES:
        assert (package / "LICENSE").read_text() == text, f"{package.name}/LICENSE differs from the root LICENSE"


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_project_metadata_is_complete(package):
    project = _pyproject(package)["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert project["authors"] and all(a.get("name") for a in project["authors"])
    assert {"Homepage", "Repository", "Issues"} <= set(project["urls"])
    assert all(u.startswith("https://") for u in project["urls"].values())
    classifiers = project["classifiers"]
    python = {c.rsplit(" ", 1)[1] for c in classifiers if c.startswith("Programming Language :: Python :: 3.")}
    assert python == {"3.11", "3.12", "3.13"} and project["requires-python"] == ">=3.11"
    assert any(c.startswith("Operating System ::") for c in classifiers)
    assert any(c.startswith("Topic ::") for c in classifiers)
    assert "Typing :: Typed" in classifiers
    assert not any(c.startswith("License ::") for c in classifiers)  # the SPDX expression says it (PEP 639)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_each_package_declares_the_test_markers_of_the_root(package):
    root = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    own = _pyproject(package)["tool"]["pytest"]["ini_options"]
    assert own == root
    names = {m.split(":")[0] for m in own["markers"]}
    assert {"gpu", "slow"} <= names


def test_the_core_tests_collect_alone_without_marker_warnings(tmp_path):
    """The core package copied out of the workspace (no root pyproject above it): its tests collect with unknown
    markers as errors."""
    core = REPO / "packages" / "tokenspeed-kernel-core"
    alone = tmp_path / "core"
    alone.mkdir()
    shutil.copy(core / "pyproject.toml", alone)
    shutil.copytree(core / "tests", alone / "tests")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-W", "error::pytest.PytestUnknownMarkWarning", "tests/test_demo.py", "tests/test_packaging.py"],
        cwd=alone, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "tests/test_demo.py::test_layer_demo" in proc.stdout
    assert "PytestUnknownMarkWarning" not in proc.stdout + proc.stderr


def test_the_core_wheel_ships_the_license_and_the_metadata(tmp_path):
    pytest.importorskip("hatchling")
    core = REPO / "packages" / "tokenspeed-kernel-core"
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
            str(core),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [wheel] = tmp_path.glob("tokenspeed_kernel_core-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        [license_file] = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert z.read(license_file).decode() == ROOT_LICENSE.read_text()
        [meta] = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = z.read(meta).decode()
    for line in ("License-Expression: Apache-2.0", "License-File: LICENSE", "Project-URL: Repository, https://",
                 "Author: ", "Classifier: Programming Language :: Python :: 3.11", "Classifier: Topic :: "):  # fmt: skip
        assert line in metadata, line
    # The entry points of the upstream README run as modules.
    assert {"tokenspeed_kernel/plugins.py", "tokenspeed_kernel/numerics/__main__.py",
            "tokenspeed_kernel/benchmark/__main__.py", "tokenspeed_kernel/__main__.py"} <= set(names)  # fmt: skip

"""Test sessions, one per package, each in a fresh environment.

Sessions see torch/triton/pytest of the environment that runs nox (the
``.venv/base`` environment that ``./run`` creates) through a ``.pth`` file naming
its site-packages (one download of torch, not one per session), and install only
TokenSpeed-kernel packages themselves, built as wheels by hatchling. So ``nox -s amd`` proves that core + the AMD wheel work with no other
TokenSpeed-kernel package present.

    nox -s core triton nvidia amd lint    # what ./run tests does
    nox -s demo                           # the demo, every package installed
    nox -s gpu                            # GPU-marked tests (a machine with CUDA)
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["core", "triton", "nvidia", "amd", "lint"]
nox.options.reuse_existing_virtualenvs = False

CORE = "packages/tokenspeed-kernel-core"
PACKAGES = {
    "triton": "packages/tokenspeed-kernel-triton",
    "nvidia": "packages/tokenspeed-kernel-nvidia",
    "amd": "packages/tokenspeed-kernel-amd",
}
PYTEST = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def _inherit_base(session: nox.Session) -> None:
    """Put the base environment's site-packages on the session's path (after its own)."""
    base = sysconfig.get_paths()["purelib"]
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    own = session.run("python", "-c", code, silent=True).strip()
    Path(own, "_tokenspeed_base.pth").write_text(base + "\n")


def _install(session: nox.Session, *paths: str) -> None:
    _inherit_base(session)
    # --no-build-isolation: hatchling comes from the base environment, so no
    # download happens per session; --no-deps: torch/triton are already there.
    session.install("--no-deps", "--no-build-isolation", *paths)


@nox.session
def core(session: nox.Session) -> None:
    """Core alone: registry, selection, plugins, references, CLI, tooling."""
    _install(session, CORE)
    session.run(*PYTEST, f"{CORE}/tests", *session.posargs)


@nox.session
def triton(session: nox.Session) -> None:
    """Core + Triton package: kernels under TRITON_INTERPRET=1, cross-compilation."""
    _install(session, CORE, PACKAGES["triton"])
    session.run(*PYTEST, f"{PACKAGES['triton']}/tests", *session.posargs, env={"TOKENSPEED_INSTALL_ALONE": "triton"})


@nox.session
def nvidia(session: nox.Session) -> None:
    """Core + NVIDIA package (+ the FA3 and triton_kernels wheels, to test their registration and layouts)."""
    _install(session, CORE, PACKAGES["nvidia"])
    session.install("--no-deps", "tokenspeed-fa3", "tokenspeed-triton-kernels")
    session.run(*PYTEST, f"{PACKAGES['nvidia']}/tests", *session.posargs, env={"TOKENSPEED_INSTALL_ALONE": "nvidia"})


@nox.session
def amd(session: nox.Session) -> None:
    """Core + AMD package: Gluon cross-compilation to gfx942/gfx950, registration; then the
    MoE's portable Triton twin under TRITON_INTERPRET=1 (its own process: the variable must
    be set before Triton compiles anything)."""
    _install(session, CORE, PACKAGES["amd"])
    session.run(*PYTEST, f"{PACKAGES['amd']}/tests", *session.posargs, env={"TOKENSPEED_INSTALL_ALONE": "amd"})
    session.run(*PYTEST, f"{PACKAGES['amd']}/tests/interpreter", *session.posargs, env={"TRITON_INTERPRET": "1"})


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    session.run(sys.executable, "-m", "ruff", "check", ".")
    session.run(sys.executable, "-m", "ruff", "format", "--check", ".")


@nox.session
def demo(session: nox.Session) -> None:
    _install(session, CORE, *PACKAGES.values())
    session.run("tokenspeed-kernel", "demo", *session.posargs)


@nox.session
def gpu(session: nox.Session) -> None:
    """GPU-marked tests of every package (needs CUDA)."""
    _install(session, CORE, *PACKAGES.values())
    for path in (CORE, *PACKAGES.values()):
        session.run(*PYTEST, "-m", "gpu", f"{path}/tests", *session.posargs, success_codes=[0, 5])

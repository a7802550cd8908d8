from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tokenspeed_kernel_amd._launch import KernelLaunch

# Helper modules of this folder (_moe_ref) import by name, here and from tests/interpreter.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def recorded_launches(monkeypatch: pytest.MonkeyPatch) -> list[KernelLaunch]:
    """Kernel launches made by this package's host code, recorded instead of run.

    With a faked AMD platform the public ops select and call this package's kernels
    on CPU tensors; everything up to the launch (selection, argument plumbing, launch
    planning) runs for real, and the recorded launch can then be cross-compiled.
    """
    launches: list[KernelLaunch] = []
    monkeypatch.setattr(KernelLaunch, "__call__", lambda self: launches.append(self))
    return launches

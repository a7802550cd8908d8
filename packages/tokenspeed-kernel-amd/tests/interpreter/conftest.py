"""Tests of the portable Triton twin under ``TRITON_INTERPRET=1`` (the nox ``amd`` session
runs this folder in its own pytest process with the variable set: it must be set before
Triton compiles anything, and the rest of this package's tests cross-compile)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") != "1":
    collect_ignore_glob = ["test_*.py"]

sys.path.insert(0, str(Path(__file__).parent.parent))

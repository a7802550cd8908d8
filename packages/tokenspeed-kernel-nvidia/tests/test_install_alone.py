"""Installed alone (nox session `nvidia`: core + this package's wheel): only its kernels join selection."""

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(os.environ.get("TOKENSPEED_INSTALL_ALONE") != "nvidia", reason="only in the nox 'nvidia' session")
def test_installed_alone():
    # A fresh interpreter: other tests in this process import Triton and kernels themselves.
    code = "import json; from tokenspeed_kernel.testing import installed_alone_problems as p; print(json.dumps(p('nvidia')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []

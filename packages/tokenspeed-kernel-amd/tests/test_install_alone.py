"""Installed alone (nox session `amd`: core + this package's wheel): only its kernels join selection."""

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(os.environ.get("TOKENSPEED_INSTALL_ALONE") != "amd", reason="only in the nox 'amd' session")
def test_installed_alone():
    # A fresh interpreter: other tests in this process import Triton and kernels themselves.
    code = (
        "import json; from tokenspeed_kernel.testing import installed_alone_problems as p; print(json.dumps(p('amd')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


_VLLM_IMPORTS = """
import json, sys
from tokenspeed_kernel_amd.ops.moe.fused_mxfp_gfx950 import gluon_mxfp_fused_moe
from tokenspeed_kernel_amd.ops.moe.mxfp4_gfx950_preprocess import preprocess_gluon_mxfp4_gfx950_moe_weights
from tokenspeed_kernel_amd.ops.gfx950.moe.mxfp4.fused import gluon_mxfp_fused_moe as fused_new
from tokenspeed_kernel_amd.ops.gfx950.moe.mxfp4.weight_preprocess import preprocess_gluon_mxfp4_gfx950_moe_weights as pre_new
assert fused_new is gluon_mxfp_fused_moe and pre_new is preprocess_gluon_mxfp4_gfx950_moe_weights
from tokenspeed_kernel.testing import VENDOR_MODULES
others = [m for v, mods in VENDOR_MODULES.items() if v != "amd" for m in mods]
print(json.dumps(sorted(n for n in sys.modules if n.split(".")[0] in others)))
"""


def test_vllm_import_paths_import_no_other_vendor():
    """What vLLM's TokenSpeed MoE backend imports, old and new paths: one implementation,
    and nothing of the other vendor packages (in any environment; alone in the nox session)."""
    out = subprocess.run([sys.executable, "-c", _VLLM_IMPORTS], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []

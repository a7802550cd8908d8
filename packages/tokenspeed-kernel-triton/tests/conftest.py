import os
import sys
from pathlib import Path

import torch

# Triton kernels run on CPU tensors through Triton's interpreter when no GPU is
# present; this must be set before Triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

import tokenspeed_kernel as tk
from tokenspeed_kernel_triton._interpreter import apply_interpreter_fixes

# Kernels imported directly by tests (not through selection) need the fixes too.
apply_interpreter_fixes()

# The helper modules of this folder (_checks, _compile_cases) import by name, as they do in
# the compile child processes, which run a test file as a script.
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def triton_on_gpu(request):
    """On a GPU other plugins' kernels (cuBLAS, ...) outrank Triton: ``gpu``-marked tests force Triton."""
    if request.node.get_closest_marker("gpu") is None:
        yield
        return
    with tk.kernel_override("triton"):
        yield

import os

import torch

# Triton kernels run on CPU tensors through Triton's interpreter when no GPU is
# present; this must be set before Triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from tokenspeed_kernel_triton._interpreter import apply_interpreter_fixes

# Kernels imported directly by tests (not through selection) need the fixes too.
apply_interpreter_fixes()


@pytest.fixture
def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"

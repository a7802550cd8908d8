"""Session 29: session 27's ``alloc_probe.py`` (``../s27-call1/``) with torch's C allocation (what a replay now
allocates with) and the two checks a replay with allocations now makes, us a call. Same timing; writes
``OUT/alloc_probe.json``.

    python alloc_probe.py OUT
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "s27-call1"))
import alloc_probe as base  # (s27-call1's, first on the path)

base.g.update(C=torch._C._dynamo.guards._empty_strided_cuda, det=torch._C._get_deterministic_algorithms,
              modes=torch._C._len_torch_dispatch_stack)  # fmt: skip
base.STMTS[1:1] = [
    "C((1, 2880), (2880, 1), bf)",
    "C((1, 4), (4, 1), f32)",
    "C((1, 4), (4, 1), f32); C((1, 4), (4, 1), i32); C((1, 2880), (2880, 1), bf); C((1, 2880), (2880, 1), bf)",
    "det()",
    "modes()",
]

if __name__ == "__main__":
    base.main()

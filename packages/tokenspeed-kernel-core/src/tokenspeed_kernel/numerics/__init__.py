"""Numerics tooling: verify kernels against the PyTorch reference.

``verify`` (also ``tokenspeed-kernel verify``) runs every registered kernel that
matches a filter on each op's standard shapes (or custom ones), compares with the
reference run on the same inputs (upcast to fp32 where the op allows), prints
PASS/FAIL with the largest errors and the worst elements, and can shrink a
failing shape to a minimal one. The per-op cases and input generators in
:mod:`.cases` are shared with ``bench``; every tolerance lives in :mod:`.tolerances`.
"""

from __future__ import annotations

from .cases import Case, OpCases, cases_from_capture, cases_from_file, custom_case, get_op_cases, standard_cases
from .compare import Check
from .runner import KernelResult, VerifyReport, verify
from .tolerances import Tolerance, tolerance

__all__ = [
    "Case",
    "OpCases",
    "Check",
    "KernelResult",
    "VerifyReport",
    "Tolerance",
    "verify",
    "tolerance",
    "get_op_cases",
    "standard_cases",
    "custom_case",
    "cases_from_file",
    "cases_from_capture",
]

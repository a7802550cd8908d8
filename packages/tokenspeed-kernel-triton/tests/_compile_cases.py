"""Cross-compilation of this package's kernels for sm90, gfx942 and gfx950 with no GPU, for the tests.

Compiling happens in child processes (``python <test file> <target>``, the file's
``__main__`` calling :func:`child_main`): under ``TRITON_INTERPRET=1`` (set by conftest
for the numerics tests) ``@triton.jit`` yields interpreter objects that cannot be
compiled. The compiles themselves are ``tokenspeed_kernel.testing.cross_compile``.

A dense op's test file declares its :class:`Case` objects (``cases(family)``, with the
tiles its config tables give that arch family, so what compiles here is what runs
there) and gets its tests from :func:`cross_compile_tests`. A case must land on the
matrix units where it says so (``Case.checks``), use no more shared memory than the
target has, and spill nothing: no local memory in the PTX, no VGPR spilled to scratch
on AMD (SGPR spills go to VGPR lanes, not memory, and are tolerated).
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from tokenspeed_kernel.testing import amdgcn_stats, cross_compile

#: target -> the arch family whose config tables it runs.
TARGETS = {"sm90": "nvidia", "gfx942": "amd", "gfx950": "amd"}
#: GPT-OSS shapes: hidden size (and MoE intermediate size), QKV projection width, vocabulary.
HIDDEN = 2880
QKV_N = 64 * 64 + 2 * 8 * 64
VOCAB = 201088
#: Shared memory (LDS) a workgroup may use: H200 227 KB opt-in; MI300X 64 KB; MI355X 160 KB.
SHARED_LIMIT = {"sm90": 232448, "gfx942": 65536, "gfx950": 163840}


@dataclass
class Case:
    kernel: Any
    types: dict[str, str]  # runtime argument -> Triton type
    constexprs: dict[str, Any]
    num_warps: int = 4
    num_stages: int = 2
    checks: dict[str, str] = field(default_factory=dict)  # target prefix -> regex the asm must contain
    values: dict[str, int] = field(default_factory=dict)  # integer arguments' values at GPT-OSS shapes


def ints(*names: str) -> dict[str, str]:
    return dict.fromkeys(names, "i32")


def specialize(case: Case) -> tuple[dict[str, str], dict[str, Any], dict[tuple[int, ...], list]]:
    """(signature, constexprs, attrs) as Triton's launcher would specialize the call: an
    integer equal to 1 becomes a constexpr, pointers (torch allocations are 16-byte aligned)
    and integers divisible by 16 carry ``tt.divisibility = 16``. Without this, unit strides
    and alignment are unknown, loads stay scalar, and the sm90 pipeliner (which needs
    vector copies) never runs: the compiled code would not be the code that runs."""
    params = list(inspect.signature(case.kernel.fn).parameters)
    missing = set(params) - set(case.types) - set(case.constexprs)
    assert not missing, f"{case.kernel.fn.__name__}: no type for {sorted(missing)}"
    constexprs = dict(case.constexprs)
    constexprs.update({p: 1 for p, v in case.values.items() if v == 1 and p not in constexprs})
    signature = {p: "constexpr" if p in constexprs else case.types[p] for p in params}
    attrs = {}
    for i, p in enumerate(params):
        aligned = signature[p].startswith("*") or (p in case.values and case.values[p] % 16 == 0)
        if signature[p] != "constexpr" and aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return signature, constexprs, attrs


def asm_of(kernel: Any, target: str) -> str:
    return kernel.asm["ptx"] if target.startswith("sm") else kernel.asm["amdgcn"]


def vgpr_spills(asm: str, target: str) -> int:
    return amdgcn_stats(asm).vgpr_spills if target.startswith("gfx") else 0


def case_problems(case: Case, target: str) -> list[str]:
    """Compile ``case`` for ``target``; what is wrong with the result (empty: nothing)."""
    signature, constexprs, attrs = specialize(case)
    kernel = cross_compile(
        case.kernel, signature, constexprs, target, num_warps=case.num_warps, num_stages=case.num_stages, attrs=attrs
    )
    asm, shared = asm_of(kernel, target), int(kernel.metadata.shared)
    problems = []
    if shared > SHARED_LIMIT[target]:
        problems.append(f"{shared} bytes of shared memory (limit {SHARED_LIMIT[target]})")
    for prefix, pattern in case.checks.items():
        if target.startswith(prefix) and not re.search(pattern, asm):
            problems.append(f"expected /{pattern}/ in the assembly")
    spills = vgpr_spills(asm, target)
    if spills:
        problems.append(f"{spills} VGPRs spilled")
    if target.startswith("sm") and ".local" in asm:
        problems.append("local-memory spills in the PTX")
    return problems


def child_main(cases: Callable[[str], dict[str, Case]], slow_cases: Callable[[str], dict[str, Case]] | None = None):
    """``python <test file> <target> [--slow]``: print case name -> problems, as JSON."""
    target = sys.argv[1]
    build = slow_cases if slow_cases is not None and "--slow" in sys.argv[2:] else cases
    results = {}
    for name, case in build(TARGETS[target]).items():
        try:
            results[name] = case_problems(case, target)
        except Exception as exc:  # reported per case by the parent
            results[name] = [f"compile failed: {type(exc).__name__}: {str(exc)[:2000]}"]
    print(json.dumps(results))


def start_script(script: str, *args: str) -> subprocess.Popen:
    """``python script *args`` without ``TRITON_INTERPRET``, its output captured."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.Popen(
        [sys.executable, os.path.abspath(script), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def script_result(child: subprocess.Popen, timeout: float = 1500) -> Any:
    """The JSON a child started by :func:`start_script` printed last."""
    out, err = child.communicate(timeout=timeout)
    assert child.returncode == 0, f"compile child {child.args[2:]} failed:\n{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


def run_children(script: str, *flags: str) -> dict[str, dict[str, list[str]]]:
    """target -> case name -> problems: one child per target, in parallel."""
    children = {target: start_script(script, target, *flags) for target in TARGETS}
    return {target: script_result(child) for target, child in children.items()}


def cross_compile_tests(kernels: dict[str, Any], cases: Callable[[str], dict[str, Case]], script: str) -> tuple:
    """The tests of one op module's test file ``script``: ``(compiled fixture,
    test_every_kernel_has_a_cross_compile_case, test_kernel_compiles)``.

    ``kernels``: the module's ``TRITON_KERNELS``, every one of which needs a case;
    ``cases(family)``: its cases, the same names for ``"nvidia"`` and ``"amd"``. Every case
    must compile cleanly for every target (children started once for the file).
    """

    @pytest.fixture(scope="module", name="compiled")
    def compiled() -> dict[str, dict[str, list[str]]]:
        return run_children(script)

    def test_every_kernel_has_a_cross_compile_case() -> None:
        covered = {case.kernel for case in cases("nvidia").values()}
        assert set(cases("nvidia")) == set(cases("amd"))
        assert set(kernels.values()) == covered, (
            f"kernels without a cross-compile case: {set(kernels.values()) - covered}"
        )

    @pytest.mark.parametrize("target", list(TARGETS))
    @pytest.mark.parametrize("name", list(cases("nvidia")))
    def test_kernel_compiles(compiled: dict, target: str, name: str) -> None:
        assert compiled[target][name] == [], f"{name} on {target}: {compiled[target][name]}"

    return compiled, test_every_kernel_has_a_cross_compile_case, test_kernel_compiles


def signature_by_name(
    fn: Any, constexprs: dict[str, Any], types: dict[str, str], is_pointer: Callable[[str], bool], floats: set[str]
) -> dict[str, str]:
    """Triton types for every argument of ``fn``, by name: constexprs, then ``types``, then
    bf16 tensors (``is_pointer(name)``), fp32 scalars (``floats``), i32 for the rest."""
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in types:
            sig[name] = types[name]
        elif is_pointer(name):
            sig[name] = "*bf16"
        else:
            sig[name] = "fp32" if name in floats else "i32"
    return sig


def compile_summary(fn: Any, signature: dict[str, str], constexprs: dict[str, Any], target: str, **options) -> dict:
    """What the attention and MoE cross-compile tests check of ``fn`` compiled for ``target``:
    ``{"mma": matrix instructions used, "vgpr_spills": int, "error": None or why it failed}``."""
    try:
        kernel = cross_compile(fn, signature, constexprs, target, **options)
    except Exception as exc:  # reported per kernel and target by the tests
        return {"mma": False, "vgpr_spills": 0, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    asm = asm_of(kernel, target)
    mma = ("wgmma" in asm or "mma.sync" in asm) if target.startswith("sm") else "v_mfma" in asm
    return {"mma": mma, "vgpr_spills": vgpr_spills(asm, target), "error": None if asm else "empty assembly"}

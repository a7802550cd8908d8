"""Helpers for vendor packages' own tests: cross-compilation with no GPU, install-alone checks.

Cross-compilation (``triton.compile`` with an explicit ``GPUTarget``) checks Triton
and Gluon kernels for sm_90, gfx942 and gfx950 on a CPU machine:

- :func:`compile_launch` specialises a launch's arguments exactly as Triton's
  launcher does at run time (pointer alignment, integers divisible by 16,
  constexprs), so what CI compiles is what a GPU would compile; CPU tensors stand
  in for device tensors (only dtype, strides, alignment and storage size matter);
- :func:`cross_compile` compiles from an explicit signature (``"*bf16"``, ``"i32"``,
  ``"constexpr"``) when there is no launch to copy;
- :func:`amdgcn_stats` reads the instruction families and register metadata
  AMD tests assert on;
- :func:`sass` disassembles a cubin whole (``triton.tools.disasm.get_sass`` stops at the
  4096th instruction: its line pattern takes 4-digit offsets), and :func:`sass_loop_counts`
  counts the instructions of a kernel's innermost loop in such a listing.

Triton is imported only inside these functions.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from .core.plugins import plugin_reports
from .core.registry import registry

__all__ = [
    "CROSS_COMPILE_TARGETS",
    "compile_launch",
    "cross_compile",
    "AmdgcnStats",
    "amdgcn_stats",
    "sass",
    "sass_loop_counts",
    "installed_alone_problems",
    "VENDOR_MODULES",
]

#: Target name -> (backend, arch, warp size): every Triton kernel must compile for these (CI, no GPU).
CROSS_COMPILE_TARGETS: dict[str, tuple[str, Any, int]] = {
    "sm90": ("cuda", 90, 32),
    "gfx942": ("hip", "gfx942", 64),
    "gfx950": ("hip", "gfx950", 64),
}


def _gpu_target(target: str) -> Any:
    from triton.backends.compiler import GPUTarget

    try:
        backend, arch, warp = CROSS_COMPILE_TARGETS[target]
    except KeyError:
        raise ValueError(f"target: expected one of {sorted(CROSS_COMPILE_TARGETS)}, got {target!r}") from None
    return GPUTarget(backend, arch, warp)


def compile_launch(fn: Any, args: tuple, kwargs: dict[str, Any], target: str) -> Any:
    """Compile ``fn[grid](*args, **kwargs)`` for ``target`` ("sm90", "gfx942", "gfx950") as the
    launcher would specialise it. Works for ``@triton.jit`` and Gluon kernels; returns the
    compiled kernel (``.asm`` holds ``ptx``/``amdgcn``, ``.metadata`` the resources)."""
    import triton
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    gpu = _gpu_target(target)
    backend = make_backend(gpu)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    if fn.is_gluon():
        from triton.experimental.gluon._runtime import GluonASTSource as Source
    else:
        from triton.compiler import ASTSource as Source
    src = Source(fn, signature, constexprs, attrs)
    return triton.compile(src, target=gpu, options=options.__dict__)


def cross_compile(
    fn: Any,
    signature: dict[str, str],
    constexprs: dict[str, Any],
    target: str,
    *,
    num_warps: int = 4,
    num_stages: int = 2,
    attrs: dict | None = None,
) -> Any:
    """Compile a ``@triton.jit`` function for ``target`` from an explicit signature.

    ``signature`` maps every argument name to a Triton type string (``"*bf16"``,
    ``"i32"``, ``"fp32"``, ``"constexpr"``); ``constexprs`` gives the constexpr
    values; ``attrs`` optional specialisation attributes (e.g. 16-byte alignment).
    """
    import triton

    src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    opts = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(src, target=_gpu_target(target), options=opts)


@dataclass(frozen=True)
class AmdgcnStats:
    """What the cross-compilation tests check in a kernel's AMDGCN.

    ``lds_*`` count the direct-to-LDS forms (``buffer_load_dwordx4 ... lds``,
    ``global_load_lds_dwordx4``), which are also counted in ``buffer_loads`` /
    ``global_loads``.
    """

    mfma: frozenset[str]
    buffer_loads: int
    lds_buffer_loads: int
    global_loads: int
    lds_global_loads: int
    vgpr_spills: int
    sgpr_spills: int
    vgprs: int
    agprs: int
    occupancy: int


def amdgcn_stats(asm: str) -> AmdgcnStats:
    """Instruction families and register metadata of one kernel's AMDGCN text."""

    def meta(pattern: str) -> int:
        m = re.search(pattern, asm, re.MULTILINE)
        if m is None:
            raise ValueError(f"AMDGCN text has no match for {pattern!r}")
        return int(m.group(1))

    code = [ln.split("//")[0].strip() for ln in asm.splitlines()]
    code = [ln for ln in code if ln and not ln.startswith(".")]
    buffer_loads = [ln for ln in code if ln.startswith("buffer_load")]
    return AmdgcnStats(
        mfma=frozenset(ln.split()[0] for ln in code if ln.startswith("v_mfma")),
        buffer_loads=len(buffer_loads),
        lds_buffer_loads=sum(1 for ln in buffer_loads if ln.endswith(" lds")),
        global_loads=sum(1 for ln in code if ln.startswith("global_load")),
        lds_global_loads=sum(1 for ln in code if ln.startswith("global_load_lds")),
        # Kernel descriptor metadata (.amdhsa / code object v5) and the assembler's comments.
        vgpr_spills=meta(r"^\s*\.vgpr_spill_count:\s*(\d+)"),
        sgpr_spills=meta(r"^\s*\.sgpr_spill_count:\s*(\d+)"),
        vgprs=meta(r"^; NumVgprs:\s*(\d+)"),
        agprs=meta(r"^; NumAgprs:\s*(\d+)"),
        occupancy=meta(r"^; Occupancy:\s*(\d+)"),
    )


_SASS_INSTRUCTION = re.compile(r"^[-\w:]+\t(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def sass(cubin: bytes) -> str:
    """The sm90 SASS of ``cubin`` in ``triton.tools.disasm.get_sass``'s format (``ctrl<TAB>instruction`` lines,
    ``LBBn:`` branch labels), every instruction of it: Triton's reader matches 4-digit offsets only and so stops
    silently at the 4096th instruction (64 KiB of code); this one reads offsets of any width, and raises
    ``ValueError`` if a function's listing does not reach an ``EXIT``."""
    from triton.tools import disasm

    pattern = disasm.FLINE_RE
    disasm.FLINE_RE = re.compile(pattern.pattern.replace(r"\w{4}", r"\w{4,}"))
    try:  # past get_sass's cache, which may hold the cut listing
        text = getattr(disasm.get_sass, "__wrapped__", disasm.get_sass)(cubin)
    finally:
        disasm.FLINE_RE = pattern
    for body in text.split("Function:")[1:]:
        if not re.search(r"\bEXIT\b", body):
            raise ValueError("sass: a function's listing ends before its EXIT (an unread instruction format?)")
    return text


def sass_loop_counts(sass: str, needs: str) -> dict[str, Any]:
    """Static instruction counts of the innermost loop of ``sass`` whose body has the opcode ``needs`` (the
    smallest body a backward branch closes that holds it): ``before``, ``loop`` and ``after`` it, and the loop's
    ``mix`` (opcode -> count, most common first). ``ValueError`` when no loop holds ``needs``."""
    import collections

    lines = sass.splitlines()
    labels = {ln.rstrip(":"): i for i, ln in enumerate(lines) if re.match(r"^LBB\d+:$", ln)}
    best = None
    for i, ln in enumerate(lines):
        m = re.search(r"\bBRA (LBB\d+);", ln)
        if m and m.group(1) in labels and labels[m.group(1)] < i:
            body = lines[labels[m.group(1)] : i + 1]
            if any(needs in b for b in body) and (best is None or i - labels[m.group(1)] < best[1] - best[0]):
                best = (labels[m.group(1)], i)
    if best is None:
        raise ValueError(f"no loop with {needs} in the SASS")
    a, b = best
    mix = collections.Counter(m.group(2) for ln in lines[a : b + 1] if (m := _SASS_INSTRUCTION.match(ln)))
    return {
        "before": sum(1 for ln in lines[:a] if _SASS_INSTRUCTION.match(ln)),
        "loop": sum(mix.values()),
        "after": sum(1 for ln in lines[b + 1 :] if _SASS_INSTRUCTION.match(ln)),
        "mix": dict(mix.most_common()),
    }


#: Modules of the project's vendor packages and their libraries: a plugin installed alone must
#: import none of the others' (a third-party plugin passes its own ``forbidden``).
VENDOR_MODULES = {
    "triton": ("tokenspeed_kernel_triton",),
    "nvidia": ("tokenspeed_kernel_nvidia", "flash_attn_interface", "flashinfer", "triton_kernels", "fla"),
    "amd": ("tokenspeed_kernel_amd", "aiter"),
}


def installed_alone_problems(plugin: str, *, forbidden: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """Why this environment is not "core + ``plugin``'s wheel and nothing else" (empty: it is).

    Checks: only the core and ``plugin`` are discovered, every registered kernel
    comes from one of them, no module of ``forbidden`` (default: the project's other
    vendor packages, :data:`VENDOR_MODULES`) was imported while loading, Triton only
    by the ``triton`` plugin, and ``plugin``'s distribution (the one its entry point
    belongs to) was installed from a wheel (not editable).
    """
    problems = []
    reports = plugin_reports()
    if set(reports) != {"core", plugin}:
        problems.append(f"plugins discovered: {sorted(reports)}, expected ['core', {plugin!r}]")
    report = reports.get(plugin)
    if report is None or report.status != "loaded":
        problems.append(f"plugin {plugin!r} did not load: {report}")
    sources = {s.source for s in registry.all()}
    if not sources <= {"core", plugin}:
        problems.append(f"kernels registered by {sorted(sources - {'core', plugin})}")
    others = forbidden if forbidden is not None else {k: v for k, v in VENDOR_MODULES.items() if k != plugin}
    for other, modules in others.items():
        loaded = [m for m in modules if m in sys.modules]
        if loaded:
            problems.append(f"modules of {other!r} imported: {loaded}")
    if plugin != "triton" and "triton" in sys.modules:
        problems.append("triton was imported by loading the plugins")
    if report is not None and report.distribution:
        dist = metadata.distribution(report.distribution)
        direct = dist.read_text("direct_url.json")
        if direct and json.loads(direct).get("dir_info", {}).get("editable"):
            problems.append(f"{dist.name} is an editable install, not a wheel")
    return problems

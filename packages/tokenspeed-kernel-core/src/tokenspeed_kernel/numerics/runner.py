"""``verify``: run registered kernels against the reference on standard or custom shapes."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch

from ..core.platform import platform_for_device
from ..core.plugins import ensure_loaded
from ..core.registry import KernelSpec, registry
from ..core.selection import OverrideError
from .bisect import shrink
from .cases import Case, OpCases, all_op_cases, call_for_kernel, clone_call, get_op_cases, standard_cases
from .compare import Check
from .inputs import make_generator

__all__ = ["KernelResult", "VerifyReport", "verify", "resolve_target", "run_case", "default_device"]

PASS, FAIL, ERROR, SKIP = "PASS", "FAIL", "ERROR", "SKIP"


@dataclass
class KernelResult:
    """The verdict of one kernel on one case (``case`` is None for a kernel-wide skip)."""

    op: str
    kernel: str
    case: Case | None
    status: str
    reason: str = ""
    checks: list[Check] = field(default_factory=list)
    #: the smallest failing case ``--bisect`` found, and how many cases it tried.
    minimal_case: Case | None = None
    bisect_steps: int = 0

    @property
    def failed(self) -> bool:
        return self.status in (FAIL, ERROR)

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "kernel": self.kernel,
            "case": self.case.to_json() if self.case else None,
            "status": self.status,
            "reason": self.reason,
            "checks": [c.to_json() for c in self.checks],
            "minimal_case": self.minimal_case.to_json() if self.minimal_case else None,
            "bisect_steps": self.bisect_steps,
        }


@dataclass
class VerifyReport:
    results: list[KernelResult] = field(default_factory=list)
    device: str = "cpu"

    @property
    def ok(self) -> bool:
        return not any(r.failed for r in self.results)

    @property
    def failures(self) -> list[KernelResult]:
        return [r for r in self.results if r.failed]

    def count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    def summary(self) -> str:
        return (
            f"verify on {self.device}: {self.count(PASS)} passed, {self.count(FAIL)} failed, "
            f"{self.count(ERROR)} errors, {self.count(SKIP)} skipped"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "ok": self.ok,
            "summary": self.summary(),
            "results": [r.to_json() for r in self.results],
        }


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve_target(target: str | None) -> dict[str, list[KernelSpec]]:
    """op -> kernels for ``target``: an op name, a kernel name, a solution name, or None (everything)."""
    ensure_loaded()
    ops = all_op_cases()
    if target is None:
        return {op: list(registry.for_op(op)) for op in sorted(ops)}
    if target in ops:
        return {target: list(registry.for_op(target))}
    spec = registry.get(target)
    if spec is not None:
        return {spec.op: [spec]}
    by_solution = [s for s in registry.all() if s.solution == target]
    if by_solution:
        out: dict[str, list[KernelSpec]] = {}
        for s in by_solution:
            out.setdefault(s.op, []).append(s)
        return out
    raise ValueError(
        f"target: {target!r} is neither an op ({', '.join(sorted(ops))}), a registered kernel nor a solution "
        f"({', '.join(sorted(registry.solutions()))})"
    )


def _short_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:400] if text else type(exc).__name__


def _override_reason(exc: OverrideError, kernel: str) -> str:
    for cand in exc.candidates:
        if cand.name == kernel:
            return cand.reason
    return _short_error(exc)


def run_case(
    oc: OpCases,
    case: Case,
    spec: KernelSpec,
    device: torch.device,
    seed: int,
    *,
    reference: dict[str, torch.Tensor] | None = None,
    call: dict[str, Any] | None = None,
) -> KernelResult:
    """Run ``spec`` on ``case`` and compare it with the reference (computed here unless given)."""
    op = oc.op
    try:
        if call is None:
            call = oc.make(case, device, make_generator(device, case.seed(seed)))
        if reference is None:
            ref_call = oc.reference_call(case, clone_call(call))
            reference = oc.outputs(ref_call, oc.fn(**ref_call, override=f"reference.{op}"))
    except Exception as exc:
        return KernelResult(op, spec.name, case, ERROR, f"inputs or reference failed: {_short_error(exc)}")
    compare = oc.compare
    if oc.kernel_reference is not None:
        try:
            own = oc.kernel_reference(case, clone_call(call), spec)
        except Exception as exc:
            return KernelResult(op, spec.name, case, ERROR, f"the kernel's reference failed: {_short_error(exc)}")
        if own is not None:
            reference, compare = own
    kcall = clone_call(call)
    try:
        kcall = call_for_kernel(op, kcall, spec)
        result = oc.fn(**kcall)
    except OverrideError as exc:
        return KernelResult(op, spec.name, case, SKIP, _override_reason(exc, spec.name))
    except Exception as exc:
        detail = "".join(traceback.format_exception_only(exc)).strip().splitlines()
        return KernelResult(op, spec.name, case, ERROR, f"raised {detail[0][:400] if detail else type(exc).__name__}")
    try:
        got = oc.outputs(kcall, result)
    except Exception as exc:
        return KernelResult(
            op, spec.name, case, FAIL, f"unexpected result {type(result).__name__}: {_short_error(exc)}"
        )
    checks = compare(case, got, reference)
    passed = all(c.passed for c in checks)
    return KernelResult(op, spec.name, case, PASS if passed else FAIL, "", checks)


def _reference_problem(op: str) -> str | None:
    spec = registry.get(f"reference.{op}")
    if spec is None:
        return f"no reference kernel is registered for {op}"
    try:
        spec.resolve()
    except Exception as exc:
        return f"the reference for {op} is unavailable ({_short_error(exc)})"
    return None


class _Printer:
    def __init__(self, stream: TextIO | None, defaults: dict[str, dict[str, Any]]) -> None:
        self.stream = stream
        self.defaults = defaults

    def __call__(self, r: KernelResult) -> None:
        if self.stream is None:
            return
        w = self.stream.write
        where = f"{r.op} {r.case.describe(defaults=self.defaults.get(r.op, {}))}" if r.case else r.op
        if r.case and r.case.label:
            where += f" [{r.case.label}]"
        head = f"{r.status:<5} {r.kernel:<36} {where}"
        if r.status == PASS:
            w(f"{head}  {'; '.join(c.summary() for c in r.checks)}\n")
        elif r.status == FAIL and r.checks:
            w(f"{head}\n")
            for c in r.checks:
                mark = "ok " if c.passed else "BAD"
                w(f"        {mark} {c.summary()} [{c.tolerance}]\n")
                if not c.passed and c.worst:
                    w(f"            worst: {c.worst_text()}\n")
        else:
            w(f"{head}  {r.reason}\n")
        if r.minimal_case is not None:
            w(f"        bisect: minimal failing case ({r.bisect_steps} tried): "
              f"{r.minimal_case.describe(defaults=self.defaults.get(r.op, {}))}\n")  # fmt: skip
        self.stream.flush()


def verify(
    target: str | None = None,
    *,
    dtypes: Sequence[str] | None = None,
    cases: Iterable[Case] | None = None,
    shape_set: str | None = None,
    device: torch.device | str | None = None,
    bisect: bool = False,
    seed: int = 0,
    include_reference: bool = True,
    stream: TextIO | str | None = "stdout",
    max_bisect_steps: int = 200,
) -> VerifyReport:
    """Verify every kernel matching ``target`` against the reference.

    Args:
        target: an op, a kernel name, a solution name, or None for every kernel.
        dtypes: activation dtypes to run (``"bf16"``, ``"fp16"``, ``"fp32"``); default
            the op's sweep for the device.
        cases: explicit cases (e.g. from :func:`~tokenspeed_kernel.numerics.cases.custom_case`
            or a ``--shapes`` file); default the op's standard set.
        shape_set: ``"cpu"`` or ``"gpu"`` (default: by device).
        device: where to run (default: CUDA if available, else CPU).
        bisect: shrink the first failing case of each kernel to a minimal failing one.
        seed: base seed of the input generators.
        include_reference: also check ``reference.<op>`` at the case dtype against the
            upcast reference (a check of the tolerances themselves).
        stream: where PASS/FAIL lines go (default ``sys.stdout`` at call time; None: silent).

    Returns:
        :class:`VerifyReport`; ``report.ok`` is False on any failure.
    """
    if stream == "stdout":
        stream = sys.stdout
    assert not isinstance(stream, str)
    dev = torch.device(device) if device is not None else default_device()
    plan = resolve_target(target)
    set_name = shape_set or ("gpu" if dev.type == "cuda" else "cpu")
    explicit = list(cases) if cases is not None else None
    report = VerifyReport(device=f"{dev} ({platform_for_device(dev).describe()})")
    defaults = {op: oc.defaults for op, oc in all_op_cases().items()}
    emit = _Printer(stream, defaults)

    def add(r: KernelResult) -> None:
        report.results.append(r)
        emit(r)

    platform = platform_for_device(dev)
    for op, specs in plan.items():
        oc = get_op_cases(op)
        if not include_reference:
            specs = [s for s in specs if s.solution != "reference"]
        if not specs:
            continue
        if explicit is not None:
            op_cases = [c for c in explicit if c.op == op]
            if dtypes:
                op_cases = [c for c in op_cases if c.dtype in dtypes]
        else:
            op_cases = standard_cases(op, set_name, dtypes=dtypes, device_type=dev.type)
        if not op_cases:
            continue
        problem = _reference_problem(op)
        if problem is not None:
            for spec in specs:
                add(KernelResult(op, spec.name, None, SKIP, problem))
            continue
        runnable = []
        for spec in specs:
            why = spec.capability.reject_reason(platform)
            if why is not None:
                add(KernelResult(op, spec.name, None, SKIP, f"cannot run on {platform.arch}: {why}"))
            else:
                runnable.append(spec)
        if not runnable:
            continue
        bisected: set[str] = set()
        for case in op_cases:
            try:
                call = oc.make(case, dev, make_generator(dev, case.seed(seed)))
                ref_call = oc.reference_call(case, clone_call(call))
                reference = oc.outputs(ref_call, oc.fn(**ref_call, override=f"reference.{op}"))
            except Exception as exc:
                for spec in runnable:
                    add(KernelResult(op, spec.name, case, ERROR, f"inputs or reference failed: {_short_error(exc)}"))
                continue
            for spec in runnable:
                r = run_case(oc, case, spec, dev, seed, reference=reference, call=call)
                if bisect and r.failed and spec.name not in bisected:
                    bisected.add(spec.name)
                    fails = failing(oc, spec, dev, seed)
                    r.minimal_case, r.bisect_steps = shrink(case, fails, oc.shrink, max_steps=max_bisect_steps)
                add(r)
    if stream is not None:
        stream.write(report.summary() + "\n")
    return report


def failing(oc: OpCases, spec: KernelSpec, device: torch.device, seed: int) -> Callable[[Case], bool]:
    """A predicate: does ``spec`` fail (FAIL, or raise) on this case? Skips and bad inputs count as passing."""

    def fails(case: Case) -> bool:
        r = run_case(oc, case, spec, device, seed)
        if r.status == ERROR and r.reason.startswith("inputs or reference failed"):
            return False
        return r.failed

    return fails

"""The shape of the core: every op is one complete object; modules import in one direction."""

from __future__ import annotations

import ast
import collections
import importlib
import inspect
import pathlib

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.core.op import Op
from tokenspeed_kernel.numerics.cases import Case, OpCases, standard_cases
from tokenspeed_kernel.numerics.inputs import make_generator

ROOT = pathlib.Path(tk.__file__).parent
OPS = sorted(tk.all_contracts())

# -- every op is one complete object ------------------------------------------------------


@pytest.mark.parametrize("name", OPS)
def test_every_op_has_every_piece(name):
    op = tk.get_contract(name)
    assert isinstance(op, Op) and op.name == name and getattr(tk, name) is op
    assert name in tk.__all__
    # contract: roles, typed traits, sizes
    assert op.roles and op.family and op.doc
    assert op.sizes, f"{name} declares no size buckets"
    # the argument checks: the public signature and a docstring naming the arguments
    sig = inspect.signature(op)
    assert list(sig.parameters)[-2:] == ["solution", "override"]
    assert op.__doc__ and len(op.__doc__) > 40
    # the fake implementation takes the op's arguments
    assert callable(op.fake)
    fake_params = inspect.signature(op.fake).parameters
    bind_params = list(inspect.signature(op.bind).parameters)
    # (called like the op: each argument by its name, so **kwargs or every name)
    by_name = any(p.kind is p.VAR_KEYWORD for p in fake_params.values()) or set(bind_params) <= set(fake_params)
    assert by_name, f"{name}: the fake does not take {set(bind_params) - set(fake_params)} by name"
    # the reference: importable, registered as reference.<op> with what it declares
    module, _, attr = op.reference.impl.partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
    tk.load_plugins()
    spec = tk.registry.get(f"reference.{name}")
    assert spec is not None and spec.solution == "reference" and spec.impl == op.reference.impl
    # the workload: cases for verify and bench, a cost model, the rate reports plot
    cases = op.cases
    assert isinstance(cases, OpCases) and cases.op == name
    assert {"cpu", "gpu", "bench-cpu", "bench-gpu"} <= set(cases.sets), f"{name}: shape sets {sorted(cases.sets)}"
    assert cases.metric in ("tflops", "tbps") and callable(cases.cost)
    assert isinstance(cases.peers, list)
    # the custom op of torch.compile comes from the same object
    from tokenspeed_kernel import compile as tk_compile

    assert name in tk_compile.OP_NAMES


@pytest.mark.parametrize("name", OPS)
def test_fake_outputs_match_the_reference_on_a_cpu_case(name):
    """The fake (meta) implementation promises the shapes and dtypes the op really returns."""
    op = tk.get_contract(name)
    case: Case = standard_cases(name, "cpu", device_type="cpu")[0]
    cpu = torch.device("cpu")
    call = op.cases.make(case, cpu, make_generator(cpu, case.seed(0)))
    real = op(**call, solution="reference")
    fake = op.fake(**call)

    def flat(r):
        if r is None:
            return []
        if isinstance(r, torch.Tensor):
            return [r]
        if hasattr(r, "__dataclass_fields__"):
            return [getattr(r, f) for f in r.__dataclass_fields__]
        return list(r)

    assert [(t.shape, t.dtype) for t in flat(fake)] == [(t.shape, t.dtype) for t in flat(real)]


def test_a_new_op_touches_few_files():
    """Where a new op's pieces live: its family's op module, reference, cases (and the exports).

    Counted from one op: every piece of rmsnorm is in one of these files.
    """
    op = tk.rmsnorm
    files = {
        pathlib.Path(inspect.getsourcefile(op.bind)).relative_to(ROOT),
        pathlib.Path(importlib.import_module(op.reference.impl.split(":")[0]).__file__).relative_to(ROOT),
        pathlib.Path(importlib.import_module(op.workload.split(":")[0]).__file__).relative_to(ROOT),
    }
    assert {str(f) for f in files} == {"ops/norm.py", "reference/norm.py", "numerics/cases/norm.py"}


# -- imports run in one direction ---------------------------------------------------------

#: What each part of the package may import (besides itself); the folder layout shows the order.
ALLOWED = {
    "core": set(),
    "ops": {"core"},
    "reference": {"core", "ops"},
    "numerics": {"core", "ops", "reference"},
    "benchmark": {"core", "ops", "reference", "numerics", "launch", "graphs"},
    # the host-path helpers the vendor packages launch through: torch (and Triton, lazily), and core's
    # dependency-free modules (core.codegen, the key generator shared with the validation memo; core.recording,
    # the slot through which core's prepared calls reach the launch path's recorder)
    "launch": {"core"},
    "graphs": {"core"},
    "compile": {"core", "ops"},
    "testing": {"core"},
    "<package>": {"core", "ops"},
    "models": {"<package>", "core", "ops"},
}
#: Inside core, each module imports only modules listed before it.
CORE_ORDER = [
    "codegen",
    "recording",
    "platform",
    "formats",
    "contracts",
    "registry",
    "settings",
    "measured",
    "plugins",
    "selection",
    "validation",
    "profiling",
    "op",
]


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = ["tokenspeed_kernel", *p.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(mods: dict[str, pathlib.Path]) -> dict[str, set[str]]:
    """Every tokenspeed_kernel module each module imports, function-local imports included."""
    edges: dict[str, set[str]] = collections.defaultdict(set)
    for mod, path in mods.items():
        package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                if not target or not target.startswith("tokenspeed_kernel"):
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    edges[mod].add(sub if sub in mods else target)
            elif isinstance(node, ast.Import):
                edges[mod] |= {a.name for a in node.names if a.name.startswith("tokenspeed_kernel")}
    return edges


def _part(mod: str) -> str:
    parts = mod.split(".")
    return "<package>" if len(parts) == 1 else parts[1]


def test_parts_of_the_package_import_in_one_direction():
    mods = _modules()
    bad = []
    for mod, targets in _imports(mods).items():
        part = _part(mod)
        if part not in ALLOWED:
            continue  # the command line and the demo sit on top and may use anything
        for t in targets:
            if _part(t) != part and _part(t) not in ALLOWED[part]:
                bad.append(f"{mod} imports {t}")
    assert not bad, "\n".join(sorted(bad))


def test_core_modules_import_only_earlier_core_modules():
    mods = _modules()
    assert {m.split(".")[2] for m in mods if m.startswith("tokenspeed_kernel.core.")} == set(CORE_ORDER)
    bad = []
    for mod, targets in _imports(mods).items():
        if not mod.startswith("tokenspeed_kernel.core."):
            continue
        me = CORE_ORDER.index(mod.split(".")[2])
        for t in targets:
            if t.startswith("tokenspeed_kernel.core.") and CORE_ORDER.index(t.split(".")[2]) >= me:
                bad.append(f"{mod} imports {t}")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycle_between_modules():
    mods = _modules()
    edges = _imports(mods)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in mods or w == v:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in mods:
        if m not in index:
            visit(m)
    assert not cycles


def test_no_import_statement_on_the_hot_path():
    """The op call path (ops' argument checks, dispatch, selection, validation) imports nothing per call."""
    hot = [ROOT / "core" / f for f in ("op.py", "selection.py", "validation.py", "contracts.py")]
    hot += sorted((ROOT / "ops").glob("*.py"))
    found = []
    for path in hot:
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef):
                found += [
                    f"{path.name}:{fn.name}"
                    for n in ast.walk(fn)
                    if isinstance(n, (ast.Import, ast.ImportFrom)) and n is not fn
                ]
    assert not found, found


@pytest.mark.parametrize(
    "alias,name", [("mha_prefill_with_kvcache", "mha_extend_with_kvcache"), ("moe_fused", "moe_apply")]
)
def test_aliases_of_the_upstream_readme_are_the_op_objects(alias, name):
    """The upstream README's names: the same Op (one contract, one selection, one custom op), exported, documented."""
    from tokenspeed_kernel import ops

    assert getattr(tk, alias) is getattr(tk, name) is tk.get_contract(name)
    assert alias in tk.__all__ and alias in ops.__all__
    assert alias not in tk.all_contracts()  # the catalog holds each op once, under its name
    assert getattr(tk, alias).name == name
    assert f"Also exported as ``{alias}``" in getattr(tk, name).__doc__


def test_the_launch_path_imports_only_dependency_free_core_modules():
    """``launch`` and ``graphs`` stay torch-only host helpers: of the package, they may use ``core.codegen`` and
    ``core.recording``, which import nothing."""
    edges = _imports(_modules())
    free = {"tokenspeed_kernel.core.codegen", "tokenspeed_kernel.core.recording"}
    assert edges["tokenspeed_kernel.launch"] <= free, edges["tokenspeed_kernel.launch"]
    assert edges["tokenspeed_kernel.graphs"] <= free, edges["tokenspeed_kernel.graphs"]
    assert not any(edges.get(m) for m in free)

"""The ``tokenspeed-kernel`` command line (also ``python -m tokenspeed_kernel``).

Subcommands:

- ``list``: every op (family, roles, trait schema) and its registered kernels.
- ``explain OP``: which kernel a call would get on a (possibly faked) platform, and
  why every other candidate was ranked lower or rejected.
- ``plugins``: the discovered plugins, their versions, status and kernel counts.
- ``verify``, ``bench``, ``demo``: added by ``tokenspeed_kernel.numerics.cli``,
  ``tokenspeed_kernel.benchmark.cli`` and ``tokenspeed_kernel.demo`` when those
  modules import. Each module defines ``add_parser(subparsers)``, which adds its
  subcommand and sets ``func=handler`` with ``set_defaults``; the handler takes the
  parsed ``argparse.Namespace`` and returns an exit code (``None`` means 0). A
  handler may raise :class:`CliError` for bad input: the message is printed and the
  exit code is 2.

Exit codes: 0 success; 1 the question has a negative answer (``explain``: no
kernel can run the call; ``plugins --strict``: a plugin failed); 2 bad input.

Importing this module loads no plugin, imports none of the extension modules and
none of the core's (they import torch): the parser is built first, the core is
imported by the command that runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core.contracts import OpContract, TraitSpec
    from .core.registry import KernelSpec

__all__ = ["main", "build_parser", "CliError"]

PROG = "tokenspeed-kernel"

#: (module, subcommand) of the subcommands other modules contribute.
EXTENSIONS: tuple[tuple[str, str], ...] = (
    ("tokenspeed_kernel.numerics.cli", "verify"),
    ("tokenspeed_kernel.benchmark.cli", "bench"),
    ("tokenspeed_kernel.demo", "demo"),
)


class CliError(Exception):
    """Bad command-line input; the message names the option and what was expected."""


def _ops() -> dict[str, OpContract]:
    """The op catalog (importing the ops fills it)."""
    from . import ops  # noqa: F401
    from .core.contracts import all_contracts

    return all_contracts()


# ---------------------------------------------------------------------------
# Plugin loading with compact failure notes


def _load_plugins(*, quiet: bool = False) -> None:
    """Load the plugins once; a failed plugin becomes a one-line note instead of a warning with a traceback,
    and the loader's other warnings (an allow-list naming no installed plugin) one line each."""
    from .core.plugins import ensure_loaded, plugin_reports

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        ensure_loaded()
    notes = [
        str(w.message).removeprefix("tokenspeed_kernel: ")
        for w in caught
        if issubclass(w.category, RuntimeWarning) and "failed and was skipped" not in str(w.message)
    ]
    for report in plugin_reports().values():
        if report.status == "failed" and not quiet:
            notes.append(f"plugin {report.name!r} failed to load and was skipped (`{PROG} plugins` shows why)")
    for note in notes:
        print(f"{PROG}: note: {note}", file=sys.stderr)


# ---------------------------------------------------------------------------
# list


def _allowed_json(allowed: object) -> object:
    from .core.contracts import Range

    if allowed is None:
        return None
    if isinstance(allowed, Range):
        return {"lo": allowed.lo, "hi": allowed.hi, "power_of_two": allowed.power_of_two}
    return list(allowed)  # type: ignore[call-overload]


def _trait_schema_json(spec: TraitSpec) -> dict[str, object]:
    from .core.contracts import REQUIRED

    required = spec.default is REQUIRED
    return {
        "type": spec.type.__name__,
        "required": required,
        "default": None if required else spec.default,
        "allowed": _allowed_json(spec.allowed),
        "doc": spec.doc,
    }


def _matcher_json(matcher: Any) -> object:
    from .core.contracts import Range

    if matcher.everything:
        return "any"
    if isinstance(matcher.values, Range):
        return _allowed_json(matcher.values)
    return sorted(matcher.values, key=repr)


def _kernel_json(spec: KernelSpec) -> dict[str, object]:
    cap = spec.capability
    return {
        "name": spec.name,
        "op": spec.op,
        "solution": spec.solution,
        "priority": spec.priority,
        "band": spec.band,
        "capability": {
            "vendors": sorted(cap.vendors),
            "min_arch": cap.min_arch,
            "max_arch": cap.max_arch,
            "features": sorted(cap.features),
            "text": cap.describe(),
        },
        "formats": [{role: sorted(fmts) for role, fmts in alt.items()} for alt in spec.formats],
        "traits": {name: _matcher_json(m) for name, m in spec.traits.items()},
        "tags": sorted(spec.tags),
        "source": spec.source,
        "hardware_validated": spec.hardware_validated,
        "doc": spec.doc,
    }


def _hardware_text(spec: KernelSpec) -> str:
    return "run on hardware" if spec.hardware_validated else "NOT run on hardware"


def _trait_schema_text(name: str, spec: TraitSpec) -> str:
    from .core.contracts import REQUIRED, Range

    default = "required" if spec.default is REQUIRED else f"default {spec.default!r}"
    allowed = ""
    if spec.allowed is not None:
        allowed = f", {spec.allowed!r}" if isinstance(spec.allowed, Range) else f", one of {list(spec.allowed)}"
    doc = f"  {spec.doc}" if spec.doc else ""
    return f"{name}: {spec.type.__name__}, {default}{allowed}{doc}"


def _print_op_text(contract: OpContract, kernels: Sequence[KernelSpec]) -> None:
    print(f"{contract.name} [{contract.family}]  {contract.doc}".rstrip())
    print(f"  roles: {', '.join(contract.roles)}")
    if contract.traits:
        print("  traits:")
        for name, spec in contract.traits.items():
            print(f"    {_trait_schema_text(name, spec)}")
    else:
        print("  traits: none")
    print(f"  kernels ({len(kernels)}):" if kernels else "  kernels: none registered")
    for spec in kernels:
        hw = _hardware_text(spec)
        if not spec.hardware_validated:
            hw = f"** {hw} **"
        print(f"    {spec.name}  [{spec.solution}]  {spec.band} ({spec.priority})  from {spec.source}  {hw}")
        print(f"      capability: {spec.capability.describe()}")
        print(f"      formats: {spec.describe_formats()}")
        if spec.traits:
            print(f"      traits: {spec.describe_traits()}")
        print(f"      tags: {', '.join(sorted(spec.tags)) or 'none'}")


def _cmd_list(args: argparse.Namespace) -> int:
    from .core.registry import registry

    _load_plugins(quiet=args.json)
    contracts = _ops()
    if args.op is not None and args.op not in contracts:
        raise CliError(f"--op: unknown op {args.op!r}; known ops: {', '.join(sorted(contracts))}")
    if args.solution is not None and args.solution not in registry.solutions():
        raise CliError(
            f"--solution: no kernel of solution {args.solution!r} is registered; "
            f"solutions: {', '.join(sorted(registry.solutions()))}"
        )
    ops = [args.op] if args.op else sorted(contracts, key=lambda o: (contracts[o].family, o))
    rows: list[tuple[OpContract, list[KernelSpec]]] = []
    for op in ops:
        kernels = sorted(registry.for_op(op), key=lambda s: (-s.priority, s.name))
        if args.solution is not None:
            kernels = [k for k in kernels if k.solution == args.solution]
            if not kernels:
                continue
        rows.append((contracts[op], kernels))
    if args.json:
        payload = [
            {
                "op": c.name,
                "family": c.family,
                "doc": c.doc,
                "roles": list(c.roles),
                "traits": {name: _trait_schema_json(t) for name, t in c.traits.items()},
                "kernels": [_kernel_json(k) for k in ks],
            }
            for c, ks in rows
        ]
        print(json.dumps({"ops": payload}, indent=2, default=repr))
        return 0
    family = None
    for contract, kernels in rows:
        if contract.family != family:
            family = contract.family
            print(f"== {family} ==")
        _print_op_text(contract, kernels)
        print()
    return 0


# ---------------------------------------------------------------------------
# explain

_FORMAT_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
}


def _format_value(text: str, what: str) -> str:
    from .core.formats import is_known_format, known_formats

    fmt = _FORMAT_ALIASES.get(text.lower(), text)
    if not is_known_format(fmt):
        raise CliError(f"{what}: unknown format {text!r}; known formats: {', '.join(sorted(known_formats()))}")
    return fmt


def _key_values(items: Sequence[str] | Sequence[Sequence[str]] | None, what: str) -> dict[str, str]:
    """``K=V`` items (``--flag K=V [K=V ...]``, the flag repeatable) as a dict; a key given twice is an error."""
    flat = [x for group in items or () for x in ([group] if isinstance(group, str) else group)]
    out: dict[str, str] = {}
    for item in flat:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise CliError(f"{what}: expected KEY=VALUE, got {item!r}")
        if key in out:
            raise CliError(f"{what}: {key!r} given twice")
        out[key] = value
    return out


def _weight_counterpart(fmt: str) -> str:
    """The weight-side granularity that goes with an activation-side FP8 format."""
    return fmt.replace(":per_token", ":per_channel")


def _signature(contract: OpContract, args: argparse.Namespace, derived: tuple[str, ...]) -> tuple[str, ...]:
    """The call's format signature: the one its arguments derive, with --dtype/--kv-dtype/--format applied.

    A non-dense ``--dtype`` (``fp8_e4m3:per_token``, ``mxfp4``) sets every role from it (the weight
    side of an FP8 ``mm`` per channel; ``out`` bf16)."""
    dtype = _format_value(args.dtype, "--dtype") if args.dtype else None
    kv = _format_value(args.kv_dtype, "--kv-dtype") if args.kv_dtype else None
    if kv and "kv" not in contract.roles:
        raise CliError(f"--kv-dtype: op {contract.name!r} has no kv role (roles: {', '.join(contract.roles)})")
    explicit = _key_values(args.format, "--format")
    for role in explicit:
        if role not in contract.roles:
            raise CliError(f"--format: op {contract.name!r} has no role {role!r}; roles: {', '.join(contract.roles)}")
    sig = dict(zip(contract.roles, derived))
    if dtype is not None and dtype not in _DENSE:
        for role in contract.roles:
            if role == "out":
                sig[role] = "bf16"
            elif contract.name == "mm" and role == "b":
                sig[role] = _weight_counterpart(dtype)
            else:
                sig[role] = dtype
    if kv:
        sig["kv"] = kv
    for role, text in explicit.items():
        sig[role] = _format_value(text, f"--format {role}")
    return tuple(sig[r] for r in contract.roles)


_DENSE = ("fp32", "bf16", "fp16")


def _case_params(contract: OpContract, args: argparse.Namespace) -> dict[str, object]:
    from .numerics.cases import parse_value

    defaults = contract.cases.defaults
    params = _key_values(args.shape, "--shape")
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise CliError(
            f"--shape: unknown key {unknown[0]!r} for op {contract.name!r}; its keys (as in verify/bench): "
            + ", ".join(sorted(defaults))
        )
    return {k: parse_value(v) for k, v in params.items()}


def _derived_call(contract: OpContract, args: argparse.Namespace) -> tuple[tuple[str, ...], dict, dict[str, int]]:
    """(signature, traits, sizes) of the call the op's case with these --shape values makes (fake tensors)."""
    from .numerics.cases import case_call_key, custom_case

    params = _case_params(contract, args)
    dtype = _format_value(args.dtype, "--dtype") if args.dtype else None
    try:
        [case] = custom_case(contract.name, params, dtypes=[dtype if dtype in _DENSE else "bf16"])
        return case_call_key(case)
    except (TypeError, ValueError) as exc:
        raise CliError(f"--shape: the call these values describe is not valid: {exc}") from None


def _parse_trait(contract: OpContract, name: str, text: str, what: str) -> object:
    spec = contract.traits.get(name)
    if spec is None:
        known = ", ".join(contract.traits) or "none"
        raise CliError(f"{what}: op {contract.name!r} has no trait {name!r}; its traits: {known}")
    value: object
    if spec.type is bool:
        low = text.lower()
        if low in ("1", "true", "yes", "on"):
            value = True
        elif low in ("0", "false", "no", "off"):
            value = False
        else:
            raise CliError(f"{what}: trait {name!r} is a bool (true/false), got {text!r}")
    elif spec.type is int:
        try:
            value = int(text)
        except ValueError:
            raise CliError(f"{what}: trait {name!r} is an int, got {text!r}") from None
    else:
        value = spec.type(text)
    try:
        spec.check_value(contract.name, name, value, who=what)
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from None
    return value


def _traits(contract: OpContract, args: argparse.Namespace, derived: dict) -> dict[str, object]:
    given = _key_values(args.trait, "--trait")
    shape_keys = _key_values(args.shape, "--shape")
    traits = dict(derived)
    for name, text in given.items():
        value = _parse_trait(contract, name, text, f"--trait {name}")
        if name in shape_keys and derived.get(name) != value:
            raise CliError(
                f"--trait {name}={value!r} contradicts the call --shape describes ({name}={derived.get(name)!r}); "
                "change the --shape value instead"
            )
        traits[name] = value
    try:
        return contract.normalize_traits(traits)
    except (TypeError, ValueError) as exc:
        raise CliError(str(exc)) from None


def _sizes(contract: OpContract, args: argparse.Namespace, derived: dict[str, int]) -> dict[str, int]:
    sizes = dict(derived)
    names = [s.name for s in contract.sizes]
    for name, text in _key_values(args.size, "--size").items():
        if name not in names:
            raise CliError(
                f"--size: op {contract.name!r} has no size {name!r}; its sizes: {', '.join(names) or 'none'}"
            )
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 0:
            raise CliError(f"--size {name}: expected an integer >= 0, got {text!r}")
        sizes[name] = value
    return sizes


def _check_target(flag: str, target: str | None) -> None:
    from .core.registry import registry

    if target is not None and registry.get(target) is None and target not in registry.solutions():
        raise CliError(
            f"{flag}: {target!r} is neither a registered kernel nor a solution; "
            f"solutions: {', '.join(sorted(registry.solutions()))}"
        )


def _cmd_explain(args: argparse.Namespace) -> int:
    from .core.contracts import describe_bucket, size_bucket
    from .core.platform import current_platform, fake_platform, make_platform
    from .core.registry import registry
    from .core.selection import explain_selection, format_explanation

    contracts = _ops()
    contract = contracts.get(args.op)
    if contract is None:
        raise CliError(f"OP: unknown op {args.op!r}; known ops: {', '.join(sorted(contracts))}")
    derived_sig, derived_traits, derived_sizes = _derived_call(contract, args)
    signature = _signature(contract, args, derived_sig)
    traits = _traits(contract, args, derived_traits)
    sizes = _sizes(contract, args, derived_sizes)
    if args.platform is not None:
        try:
            platform = make_platform(args.platform)
        except ValueError as exc:
            raise CliError(f"--platform: {exc} (e.g. sm90, sm100, gfx942, gfx950, cpu)") from None
    _load_plugins(quiet=args.json)
    _check_target("--solution", args.solution)
    _check_target("--override", args.override)
    kwargs = {"objective": args.objective, "solution": args.solution, "override": args.override, "sizes": sizes,
              "captured": args.captured}  # fmt: skip
    if args.platform is not None:
        with fake_platform(platform):
            candidates = explain_selection(contract.name, signature, traits, **kwargs)
    else:
        platform = current_platform()
        candidates = explain_selection(contract.name, signature, traits, **kwargs)
    selected = next((c for c in candidates if c.selected), None)
    if args.json:
        print(
            json.dumps(
                {
                    "op": contract.name,
                    "platform": {
                        "arch": platform.arch,
                        "vendor": platform.vendor,
                        "features": sorted(platform.features),
                    },
                    "signature": dict(zip(contract.roles, signature)),
                    "traits": traits,
                    "sizes": sizes,
                    "buckets": {k: describe_bucket(size_bucket(v)) for k, v in sizes.items()},
                    "selected": selected.name if selected else None,
                    "captured": args.captured,
                    "candidates": [c.__dict__ for c in candidates],
                },
                indent=2,
            )
        )
        return 0 if selected else 1
    faked = "  (faked with --platform)" if args.platform is not None else ""
    print(f"op:        {contract.name} [{contract.family}]")
    print(f"platform:  {platform.describe()}{faked}")
    print(f"signature: {', '.join(f'{r}={f}' for r, f in zip(contract.roles, signature))}")
    print(f"traits:    {', '.join(f'{k}={v!r}' for k, v in traits.items()) or 'none'}")
    if sizes:
        buckets = ", ".join(f"{k}={v} (bucket {describe_bucket(size_bucket(v))})" for k, v in sizes.items())
        print(f"sizes:     {buckets}")
    forced = [f"{flag}={value}" for flag, value in (("solution", args.solution), ("override", args.override)) if value]
    if forced:
        print(f"forced:    {', '.join(forced)}")
    if args.objective:
        print(f"objective: {args.objective}")
    print(f"ranked as: {'a call captured in a CUDA graph (device time)' if args.captured else 'an eager call'}")
    print("candidates (* selected, + eligible, - rejected with the reason):")
    print(format_explanation(candidates) if candidates else "  (no kernel is registered for this op)")
    if selected is None:
        why = f"{' and '.join(forced)} names no kernel that can" if forced else "no registered kernel can"
        print(f"selected:  none: {why} run this call")
        return 1
    spec = registry.get(selected.name)
    hw = "" if spec is None or spec.hardware_validated else "  (NOT run on hardware)"
    print(f"selected:  {selected.name} [{selected.solution}]{hw}")
    return 0


# ---------------------------------------------------------------------------
# plugins


def _cmd_plugins(args: argparse.Namespace) -> int:
    from .core.plugins import plugin_reports

    _load_plugins(quiet=True)
    reports = sorted(plugin_reports().values(), key=lambda r: (r.name != "core", r.name))
    failed = [r for r in reports if r.status == "failed"]
    if args.json:
        print(json.dumps({"plugins": [dict(r.__dict__) for r in reports]}, indent=2))
    else:
        header = (
            f"{'plugin':<16} {'status':<9} {'version':<10} {'kernels':>7} {'load s':>7}  distribution / entry point"
        )
        print(header)
        for r in reports:
            dist = r.distribution or "?"
            print(
                f"{r.name:<16} {r.status:<9} {r.version or '?':<10} {len(r.kernels):>7} {r.seconds:>7.3f}  "
                f"{dist} ({r.target})"
            )
            if r.error:
                print(f"    error: {r.error}")
        filtered = [r.name for r in reports if r.status == "filtered"]
        if filtered:
            print(f"filtered out by TOKENSPEED_KERNEL_PLUGINS: {', '.join(filtered)}")
        if failed:
            print(f"{len(failed)} plugin(s) failed to load and were skipped; their kernels are not available.")
    return 1 if failed and args.strict else 0


# ---------------------------------------------------------------------------
# parser and entry point


def _add_extensions(subparsers: Any) -> list[str]:
    """Add the contributed subcommands; returns notes on those whose module is present but broken."""
    notes = []
    for module, command in EXTENSIONS:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            missing = isinstance(exc, ModuleNotFoundError) and exc.name is not None
            if missing and (module == exc.name or module.startswith(f"{exc.name}.")):
                continue  # not installed / not written: the subcommand is simply absent
            notes.append(f"{command}: unavailable ({type(exc).__name__}: {exc})")
            continue
        add_parser: Callable[[Any], Any] | None = getattr(mod, "add_parser", None)
        if add_parser is None:
            notes.append(f"{command}: unavailable ({module} defines no add_parser)")
            continue
        add_parser(subparsers)
    return notes


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with the contributed subcommands whose modules import."""
    from . import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="TokenSpeed-kernel: inspect registered kernels, explain selection, check plugins.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("list", help="ops and their registered kernels")
    p.add_argument("--op", help="only this op")
    p.add_argument("--solution", help="only kernels of this solution (e.g. reference, triton)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_list)

    p = sub.add_parser(
        "explain",
        help="which kernel a call gets, and why the others do not",
        description="Describe a call as verify/bench do (the op's case parameters with --shape, the dtype with "
        "--dtype), derive its format signature, traits and size buckets from those arguments, run kernel "
        "selection (on a faked platform with --platform) and show every candidate with its rank or rejection "
        "reason. Exit 0 if a kernel is selected, 1 if none can run the call, 2 on bad input.",
        epilog="Every K=V option takes one or more K=V and may be repeated (as in verify and bench). "
        "Example: explain mha_prefill --dtype bf16 --shape head_dim=64 heads_q=64 heads_kv=8 "
        "seqlens_q=1024 window_left=127 sinks=true",
    )
    p.add_argument("op", metavar="OP", help="op name, e.g. mha_decode_with_kvcache (see `list`)")
    p.add_argument(
        "--dtype", help="the call's dtype (bf16, fp16, fp32), or a format for every role (fp8_e4m3:per_token)"
    )
    p.add_argument("--kv-dtype", help="format of the kv role (attention), e.g. fp8_e4m3")
    p.add_argument("--format", action="append", nargs="+", metavar="ROLE=FMT", help="format of a role, e.g. b=mxfp4")
    p.add_argument("--shape", action="append", nargs="+", metavar="K=V",
                   help="the op's case parameters (verify/bench's --shape), e.g. m=64 n=5120 k=2880")  # fmt: skip
    p.add_argument("--trait", action="append", nargs="+", metavar="K=V", help="a trait value, e.g. sinks=true")
    p.add_argument("--size", action="append", nargs="+", metavar="K=V", help="a size directly, e.g. m=4096")
    p.add_argument("--platform", metavar="ARCH", help="pretend to run on this arch: sm90, sm100, gfx942, gfx950, cpu")
    p.add_argument("--solution", help="force a solution, as solution= does")
    p.add_argument("--override", help="force a kernel (or solution), as override= does")
    p.add_argument("--objective", help="rank kernels carrying this tag first (e.g. latency)")
    p.add_argument(
        "--captured",
        action="store_true",
        help="rank as for a call captured in a CUDA graph (device time), not an eager call (eager scores where measured)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_explain)

    p = sub.add_parser("plugins", help="discovered plugins: version, status, kernel count, errors")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--strict", action="store_true", help="exit 1 if any plugin failed to load")
    p.set_defaults(func=_cmd_plugins)

    notes = _add_extensions(sub)
    if notes:
        parser.epilog = "unavailable commands:\n  " + "\n  ".join(notes)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from .core.settings import SettingsError, settings

    try:
        _ops()  # settings name ops: the catalog first
        settings()  # a bad TOKENSPEED_KERNEL_* setting is bad input to every command
        code = args.func(args)
    except (CliError, SettingsError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())

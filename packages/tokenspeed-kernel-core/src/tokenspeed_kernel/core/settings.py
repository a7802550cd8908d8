"""Settings read from the environment and the config file, once (``reload_settings`` re-reads).

- ``TOKENSPEED_KERNEL_OVERRIDE``: ``"triton"`` (every op) or
  ``"rmsnorm=reference,mha_prefill=fa3|triton"`` (``a|b`` tries each in order);
- ``TOKENSPEED_KERNEL_CONFIG``: a TOML file with an ``[override]`` table
  (``"*" = "triton"``, ``rmsnorm = "reference"`` or a list of targets);
- ``TOKENSPEED_KERNEL_LOG=selection``: log each new selection once;
- ``TOKENSPEED_KERNEL_DEBUG=1``: also run the checks that read device tensors' values;
- ``TOKENSPEED_KERNEL_ORACLE``: which measured tables rank kernels (``none``, or
  table paths and ``default`` for the tables the plugins ship; unset = ``default``).

Every mistake raises :class:`SettingsError` naming the variable (or file) and what
was expected; an op name that is not an op lists the ops.
"""

from __future__ import annotations

import os
import threading
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass

from .contracts import all_contracts

__all__ = ["Target", "Settings", "SettingsError", "settings", "load_settings", "parse_targets", "ENV"]

#: A kernel name or solution name, or several tried in order.
Target = str | tuple[str, ...]

ENV = {
    "override": "TOKENSPEED_KERNEL_OVERRIDE",
    "config": "TOKENSPEED_KERNEL_CONFIG",
    "log": "TOKENSPEED_KERNEL_LOG",
    "debug": "TOKENSPEED_KERNEL_DEBUG",
    "oracle": "TOKENSPEED_KERNEL_ORACLE",
    "eager_scores": "TOKENSPEED_KERNEL_EAGER_SCORES",
}
_LOG_TOPICS = ("selection",)


class SettingsError(ValueError):
    """A setting (environment variable or config file) that cannot be used as written."""


@dataclass(frozen=True)
class Settings:
    env_override: Mapping[str, Target]
    config_override: Mapping[str, Target]
    config_path: str | None
    log_selection: bool
    debug: bool
    #: measured tables: ``("default",)`` = the plugins' shipped tables, ``()`` = none, else paths (and "default").
    oracle: tuple[str, ...]
    #: rank eager calls by the tables' eager scores (default); off: one pick for eager and captured calls, ranked
    #: by device time, so an eager call and its CUDA-graph replay run the same kernel (``selection``'s module doc).
    eager_scores: bool = True


def parse_targets(raw: str, *, where: str) -> Target:
    """``"a|b"`` -> ``("a", "b")``; ``"a"`` -> ``"a"``."""
    parts = tuple(p.strip() for p in raw.split("|"))
    if not raw.strip() or any(not p for p in parts):
        raise SettingsError(f"{where}: expected a kernel or solution name (or names joined by '|'), got {raw!r}")
    return parts[0] if len(parts) == 1 else parts


def _check_op(op: str, *, where: str) -> None:
    if op != "*" and op not in all_contracts():
        raise SettingsError(f"{where}: {op!r} is not an op; ops: {', '.join(sorted(all_contracts()))} (or '*')")


def _parse_env_override(raw: str) -> dict[str, Target]:
    var = ENV["override"]
    out: dict[str, Target] = {}
    items = [x.strip() for x in raw.split(",")]
    for item in items:
        if not item:
            raise SettingsError(f"{var}: empty entry in {raw!r} (entries are 'op=target' or 'target', comma-separated)")
        op, sep, target = item.partition("=")
        op = op.strip() if sep else "*"
        if sep and not op:
            raise SettingsError(f"{var}: entry {item!r} names no op before '='")
        _check_op(op, where=f"{var} entry {item!r}")
        if op in out:
            raise SettingsError(f"{var}: op {op!r} is given twice")
        out[op] = parse_targets(target if sep else item, where=f"{var} entry {item!r} (op {op})")
    return out


def _parse_config(path: str) -> dict[str, Target]:
    var = ENV["config"]
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise SettingsError(f"{var}: no such file {path!r}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{var}: {path} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise SettingsError(f"{var}: cannot read {path!r}: {exc}") from None
    unknown = set(data) - {"override"}
    if unknown:
        raise SettingsError(f"{var} {path}: unknown table(s) {sorted(unknown)}; expected [override]")
    table = data.get("override", {})
    if not isinstance(table, dict):
        raise SettingsError(
            f"{var} {path}: 'override' must be a table ([override] with op = \"target\" lines), "
            f"got a {type(table).__name__}"
        )
    out: dict[str, Target] = {}
    for op, target in table.items():
        where = f"{var} {path} [override] {op}"
        _check_op(op, where=where)
        if isinstance(target, str):
            out[op] = parse_targets(target, where=where)
        elif isinstance(target, list) and target and all(isinstance(t, str) and t.strip() for t in target):
            out[op] = tuple(t.strip() for t in target)
        else:
            raise SettingsError(f"{where}: expected a kernel/solution name or a non-empty list of them, got {target!r}")
    return out


def _parse_log(raw: str) -> bool:
    topics = {x.strip() for x in raw.split(",") if x.strip()}
    unknown = topics - set(_LOG_TOPICS)
    if unknown:
        raise SettingsError(f"{ENV['log']}: unknown topic(s) {sorted(unknown)}; known: {', '.join(_LOG_TOPICS)}")
    return "selection" in topics


def _parse_flag(raw: str, what: str, default: bool = False) -> bool:
    low = raw.strip().lower()
    if not low:
        return default
    if low in ("0", "false", "no", "off"):
        return False
    if low in ("1", "true", "yes", "on"):
        return True
    raise SettingsError(f"{ENV[what]}: expected 1 or 0, got {raw!r}")


def _parse_oracle(raw: str) -> tuple[str, ...]:
    raw = raw.strip()
    if not raw:
        return ("default",)
    if raw.lower() in ("none", "off", "0"):
        return ()
    parts = tuple(p.strip() for p in raw.split(","))
    if any(not p for p in parts):
        raise SettingsError(f"{ENV['oracle']}: empty entry in {raw!r} (table paths or 'default', comma-separated)")
    return parts


def load_settings() -> Settings:
    """Read every setting now (raises :class:`SettingsError` on the first mistake)."""
    env = os.environ
    override_raw = env.get(ENV["override"], "")
    path = env.get(ENV["config"], "").strip() or None
    return Settings(
        env_override=_parse_env_override(override_raw) if override_raw.strip() else {},
        config_override=_parse_config(path) if path else {},
        config_path=path,
        log_selection=_parse_log(env.get(ENV["log"], "")),
        debug=_parse_flag(env.get(ENV["debug"], ""), "debug"),
        oracle=_parse_oracle(env.get(ENV["oracle"], "")),
        eager_scores=_parse_flag(env.get(ENV["eager_scores"], ""), "eager_scores", default=True),
    )


_settings: Settings | None = None
_lock = threading.Lock()
_listeners: list = []


def settings() -> Settings:
    """The settings, read on first use."""
    s = _settings
    if s is None:
        s = reload()
    return s


def reload() -> Settings:
    """Read the settings again and tell the listeners (the selection cache)."""
    global _settings
    with _lock:
        _settings = load_settings()
        s = _settings
    for fn in _listeners:
        fn()
    return s


def debug_checks_enabled() -> bool:
    """True when ``TOKENSPEED_KERNEL_DEBUG=1``: checks that read device tensors' values run too."""
    s = _settings
    return (s if s is not None else settings()).debug

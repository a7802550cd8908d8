"""Measured tables: the times ``bench`` measured, as scores selection ranks kernels by.

A table holds groups keyed by (arch, device, op, format signature, traits, size
buckets). A group's score for a kernel is the geometric mean over the group's
cases of its time over the fastest kernel's time in that case: 1.0 is "always
fastest", 1.3 "30 % slower on average". ``scores`` rank by device time (CUDA-graph
medians where measured): what a call captured in a CUDA graph costs. A group may
also hold ``eager_scores``, the same ratios of the public op's eager cost (calls
back to back and one synchronisation: the slower of its host path and its device
time); selection ranks eager calls by them (``selection``, "Eager and captured
calls"). Traits marked ``measured=False`` in the
op's contract (MoE's weight ``layout``) are not part of the key, so kernels that
differ only in them are compared with each other.

Lookup for a call: the group of the call's buckets if measured; else the nearest
measured buckets of the same (arch, op, signature, traits) (fewest power-of-two
steps; the larger size on a tie); with no buckets given (``moe_plan`` without a
token count), the geometric mean over every bucket of the group, for kernels
measured in all of them. The platform's own device is preferred over other
devices of the same arch.

Tables come from plugins (:func:`register_measured_table`: a vendor package ships
the tables measured on its devices) or from ``TOKENSPEED_KERNEL_ORACLE`` paths.
The builder is :mod:`tokenspeed_kernel.benchmark.oracle` (``tokenspeed-kernel
oracle build``).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .contracts import describe_bucket, get_contract

__all__ = [
    "MeasuredEntry",
    "MeasuredTable",
    "SCHEMA",
    "KIND",
    "register_measured_table",
    "registered_tables",
    "tables_for_device",
]

SCHEMA = 2
KIND = "tokenspeed-kernel-measured-table"

_Key = tuple[tuple[str, Any], ...]


def _key(d: Mapping[str, Any]) -> _Key:
    return tuple(sorted(d.items()))


@dataclass(frozen=True)
class MeasuredEntry:
    """The scores of one (arch, device, op, signature, traits, buckets) group."""

    arch: str
    device: str
    op: str
    signature: tuple[str, ...]
    #: the call's traits, without those its contract marks ``measured=False``.
    traits: dict[str, Any]
    #: size name -> power-of-two bucket (``n.bit_length()``); empty for ops without sizes.
    buckets: dict[str, int]
    #: kernel name -> geometric mean of its time over the case's fastest (>= 1.0).
    scores: dict[str, float]
    cases: int
    #: ``graph`` (CUDA-graph medians), ``events``/``wall-clock`` (plain medians) or ``mixed``.
    timing: str
    #: kernel name -> geometric mean of its eager public-op time over the case's fastest; empty if not measured.
    eager_scores: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "arch": self.arch,
            "device": self.device,
            "op": self.op,
            "signature": list(self.signature),
            "traits": dict(self.traits),
            "buckets": dict(self.buckets),
            "sizes": {k: describe_bucket(b) for k, b in self.buckets.items()},
            "cases": self.cases,
            "timing": self.timing,
            "scores": dict(sorted(self.scores.items(), key=lambda kv: (kv[1], kv[0]))),
            **(
                {"eager_scores": dict(sorted(self.eager_scores.items(), key=lambda kv: (kv[1], kv[0])))}
                if self.eager_scores
                else {}
            ),
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> MeasuredEntry:
        return MeasuredEntry(
            arch=str(data["arch"]),
            device=str(data.get("device", "")),
            op=str(data["op"]),
            signature=tuple(data["signature"]),
            traits=dict(data["traits"]),
            buckets={str(k): int(v) for k, v in data.get("buckets", {}).items()},
            scores={str(k): float(v) for k, v in data["scores"].items()},
            cases=int(data.get("cases", 0)),
            timing=str(data.get("timing", "")),
            eager_scores={str(k): float(v) for k, v in data.get("eager_scores", {}).items()},
        )


@dataclass
class MeasuredTable:
    """Measured scores, looked up by selection (see the module doc)."""

    entries: list[MeasuredEntry] = field(default_factory=list)
    #: the reports the table was built from: path, device, arch, date, cases used.
    sources: list[dict[str, Any]] = field(default_factory=list)
    created: str = ""
    #: what the build left out and why (failed cases, groups with one kernel, ...).
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._index: dict[tuple, list[MeasuredEntry]] = {}
        for e in self.entries:
            self._index.setdefault((e.arch, e.op, e.signature, _key(e.traits)), []).append(e)

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(
        self,
        op: str,
        signature: Sequence[str],
        traits: Mapping[str, Any],
        buckets: Mapping[str, int] | None,
        platform: Any,
        *,
        eager: bool = False,
    ) -> tuple[dict[str, float], str] | None:
        """(kernel -> score, what was matched) for a call on ``platform``, or None without data.

        ``traits`` complete (the contract's defaults filled in), as selection passes them.
        ``eager``: the groups' eager scores instead (only groups that hold them are looked at).
        """
        contract = get_contract(op)
        found = self._index.get((platform.arch, op, tuple(signature), _key(contract.measured_traits(traits))))
        if found and eager:
            found = [e for e in found if e.eager_scores]
        if not found:
            return None
        field_ = "eager_scores" if eager else "scores"
        name = getattr(platform, "device_name", "")
        own = [e for e in found if e.device == name]
        found = own or [e for e in found if e.device == found[0].device]
        if buckets is None or not found[0].buckets:
            if len(found) == 1:
                return dict(getattr(found[0], field_)), _describe_entry(found[0], eager)
            return _aggregate(found, field_), f"{len(found)} size buckets aggregated" + (", eager" if eager else "")
        want = dict(buckets)

        def distance(e: MeasuredEntry) -> tuple[int, int]:
            d = sum(abs(e.buckets.get(k, 0) - b) for k, b in want.items())
            return d, -sum(e.buckets.values())

        best = min(found, key=distance)
        how = _describe_entry(best, eager)
        if best.buckets != want:
            how += " (nearest measured)"
        return dict(getattr(best, field_)), how

    # -- persistence ---------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "kind": KIND,
            "created": self.created,
            "sources": list(self.sources),
            "notes": list(self.notes),
            "entries": [e.to_json() for e in self.entries],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, where: str = "measured table") -> MeasuredTable:
        """A table from its JSON form. Traits are completed with the ops' current defaults;
        an entry naming an unknown op or trait is left out (and noted)."""
        if not isinstance(data, Mapping) or data.get("kind") != KIND or data.get("schema") != SCHEMA:
            got = (
                f"kind {data.get('kind')!r}, schema {data.get('schema')!r}"
                if isinstance(data, Mapping)
                else "not a JSON object"
            )
            raise ValueError(
                f"{where}: not a TokenSpeed-kernel measured table (expected kind {KIND!r}, schema {SCHEMA}; got {got})"
            )
        entries, notes = [], list(data.get("notes", []))
        for raw in data.get("entries", []):
            entry = MeasuredEntry.from_json(raw)
            try:
                contract = get_contract(entry.op)
                traits = contract.measured_traits(contract.normalize_traits(entry.traits))
                sizes = {s.name for s in contract.sizes}
                if set(entry.buckets) != sizes:
                    raise ValueError(f"buckets {sorted(entry.buckets)} are not the op's sizes {sorted(sizes)}")
            except (KeyError, ValueError, TypeError) as exc:
                notes.append(f"{where}: entry {entry.op} {entry.signature} left out: {exc}")
                continue
            entries.append(MeasuredEntry(**{**entry.__dict__, "traits": traits}))
        return cls(entries, sources=list(data.get("sources", [])), created=str(data.get("created", "")), notes=notes)

    def save(self, path: str | os.PathLike) -> None:
        """Write the table as JSON."""
        with open(path, "w") as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> MeasuredTable:
        """Read a table written by :meth:`save` (or shipped by a plugin)."""
        with open(path) as f:
            data = json.load(f)
        return cls.from_json(data, where=str(path))

    @classmethod
    def merge(cls, tables: Iterable[MeasuredTable]) -> MeasuredTable:
        """One table from several; for a group two tables hold (same device), the later one wins."""
        by_group: dict[tuple, MeasuredEntry] = {}
        sources: list[dict[str, Any]] = []
        notes: list[str] = []
        for t in tables:
            for e in t.entries:
                by_group[(e.arch, e.device, e.op, e.signature, _key(e.traits), _key(e.buckets))] = e
            sources += t.sources
            notes += t.notes
        return cls(list(by_group.values()), sources=sources, created=time.strftime("%Y-%m-%d %H:%M:%S %Z"), notes=notes)

    def describe(self) -> str:
        """A human-readable listing: one block per group, kernels best first."""
        lines = [f"measured table: {len(self.entries)} group(s), created {self.created or '?'}"]
        for s in self.sources:
            lines.append(
                f"  source {s.get('path')}: {s.get('device') or s.get('arch')} {s.get('date', '')}"
                f" ({s.get('cases_used', '?')} case(s) used)"
            )
        for e in sorted(
            self.entries, key=lambda e: (e.arch, e.device, e.op, e.signature, _key(e.traits), _key(e.buckets))
        ):
            traits = ", ".join(f"{k}={v}" for k, v in e.traits.items())
            sizes = ", ".join(f"{k}={describe_bucket(b)}" for k, b in e.buckets.items())
            lines.append(f"{e.device or e.arch} {e.op} {'/'.join(e.signature)} {{{traits}}} [{sizes or 'no sizes'}]")
            lines.append(f"  {e.cases} case(s), {e.timing} timing")
            for name, score in sorted(e.scores.items(), key=lambda kv: (kv[1], kv[0])):
                lines.append(f"    {score:7.3f}  {name}")
            if e.eager_scores:
                lines.append("  eager (public op, calls back to back):")
                for name, score in sorted(e.eager_scores.items(), key=lambda kv: (kv[1], kv[0])):
                    lines.append(f"    {score:7.3f}  {name}")
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)


def _describe_entry(e: MeasuredEntry, eager: bool = False) -> str:
    sizes = ", ".join(f"{k}={describe_bucket(b)}" for k, b in e.buckets.items())
    what = f"{e.device or e.arch}, {sizes}" if sizes else (e.device or e.arch)
    return what + ", eager" if eager else what


def _aggregate(entries: Sequence[MeasuredEntry], field_: str = "scores") -> dict[str, float]:
    tables = [getattr(e, field_) for e in entries]
    common = set(tables[0])
    for t in tables[1:]:
        common &= set(t)
    return {k: math.exp(sum(math.log(t[k]) for t in tables) / len(tables)) for k in common}


# ---------------------------------------------------------------------------
# Tables plugins ship


@dataclass
class _Registered:
    device: str
    load: Callable[[], MeasuredTable]
    where: str
    table: MeasuredTable | None = None
    failed: bool = False


_registered: list[_Registered] = []
_lock = threading.Lock()


def register_measured_table(source: str | os.PathLike | Any, *, device: str) -> None:
    """Make a measured table rank kernels on devices whose name contains ``device``.

    Called by a plugin's ``register()`` (a vendor package ships the tables measured
    on its devices). ``source``: a path, an ``importlib.resources`` file, or a
    zero-argument callable returning a :class:`MeasuredTable`; it is read on the
    first selection on such a device, not at registration. A table that fails to
    load is reported once (a warning) and not used.
    """
    if not isinstance(device, str) or not device:
        raise ValueError("device: expected a non-empty device-name substring, e.g. 'H200'")
    if callable(source) and not hasattr(source, "read_text"):
        load, where = source, getattr(source, "__qualname__", repr(source))
    elif hasattr(source, "read_text"):
        where = str(source)
        load = lambda: MeasuredTable.from_json(json.loads(source.read_text()), where=where)
    else:
        where = os.fspath(source)
        load = lambda: MeasuredTable.load(where)
    with _lock:
        _registered.append(_Registered(device, load, where))
    _changed()


def registered_tables() -> list[tuple[str, str]]:
    """(device substring, source) of every table plugins registered."""
    return [(r.device, r.where) for r in _registered]


def tables_for_device(device_name: str) -> list[MeasuredTable]:
    """The registered tables for a device (loaded on first use), in registration order."""
    out = []
    for r in list(_registered):
        if r.device not in device_name or r.failed:
            continue
        if r.table is None:
            with _lock:
                if r.table is None and not r.failed:
                    try:
                        r.table = r.load()
                    except Exception as exc:  # a broken shipped table must not break selection
                        r.failed = True
                        warnings.warn(
                            f"tokenspeed_kernel: measured table {r.where} failed to load and is not used: "
                            f"{type(exc).__name__}: {exc}",
                            RuntimeWarning,
                            stacklevel=3,
                        )
                        continue
        out.append(r.table)
    return out


def _forget_registered(where: Iterable[str]) -> None:
    """Drop the tables registered from these sources (a plugin whose registration failed)."""
    gone = set(where)
    with _lock:
        _registered[:] = [r for r in _registered if r.where not in gone]
    _changed()


_listeners: list[Callable[[], None]] = []


def _changed() -> None:
    for fn in _listeners:
        fn()

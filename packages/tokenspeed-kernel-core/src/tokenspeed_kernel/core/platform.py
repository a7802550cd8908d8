"""What machine a call runs on: vendor, arch, features.

Detection is lazy (first use, never at import) and cached per device. Tests and
tools can pretend to be any platform with :func:`fake_platform`, which is a
``contextvars`` override and therefore thread- and task-local.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import os
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch

__all__ = [
    "Platform",
    "current_platform",
    "platform_for_device",
    "fake_platform",
    "make_platform",
    "arch_version",
    "current_stream_id",
    "KNOWN_FEATURES",
]

#: Every feature name a platform may carry and a capability may require.
KNOWN_FEATURES = frozenset(
    {
        "bf16",
        "fp8",
        "mxfp4_mma",
        "tma",
        "wgmma",
        "tcgen05",
        "mfma",
        "mfma_scaled",
        "buffer_load",
        "async_copy",
        "cuda_graphs",
        "triton",
        "triton_interpret",
        "gluon",
    }
)


def arch_version(arch: str) -> tuple[int, ...]:
    """Ordered version of an arch name: ``sm90`` -> (9, 0), ``gfx942`` -> (9, 4, 2).

    Versions compare only within one vendor.
    """
    m = re.fullmatch(r"sm_?(\d+)(\d)a?", arch)
    if m:
        return (int(m.group(1)), int(m.group(2)))
    m = re.fullmatch(r"gfx(\d+)([0-9a-f])([0-9a-f])", arch)
    if m:
        return (int(m.group(1)), int(m.group(2), 16), int(m.group(3), 16))
    if arch == "cpu":
        return (0,)
    raise ValueError(f"arch: unknown arch name {arch!r}; expected 'smXY', 'gfxNNN' or 'cpu'")


def _vendor_of_arch(arch: str) -> str:
    if arch.startswith("sm"):
        return "nvidia"
    if arch.startswith("gfx"):
        return "amd"
    if arch == "cpu":
        return "cpu"
    raise ValueError(f"arch: unknown arch name {arch!r}")


def _default_features(vendor: str, version: tuple[int, ...]) -> set[str]:
    feats: set[str] = set()
    if vendor == "nvidia":
        feats |= {"cuda_graphs", "triton"}
        if version >= (8, 0):
            feats.add("bf16")
        if version >= (8, 9):
            feats.add("fp8")
        if version >= (9, 0):
            feats |= {"tma", "wgmma", "gluon"}
        if version >= (10, 0):
            feats |= {"tcgen05", "mxfp4_mma"}
            feats.discard("wgmma")
    elif vendor == "amd":
        feats |= {"cuda_graphs", "triton", "bf16", "buffer_load"}
        if version >= (9, 4, 0):
            feats |= {"mfma", "fp8", "gluon", "async_copy"}
        if version >= (9, 5, 0):
            feats |= {"mfma_scaled", "mxfp4_mma"}
    else:
        feats.add("bf16")
        if os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton"):
            # Triton's interpreter runs Triton kernels on CPU tensors: selection may
            # then pick them, which is how CI exercises the portable path.
            feats |= {"triton", "triton_interpret"}
    return feats


@dataclass(frozen=True)
class Platform:
    """One device's identity as far as kernel selection cares."""

    vendor: str
    arch: str
    features: frozenset[str]
    device_name: str = ""
    compute_units: int = 0
    device_type: str = "cpu"
    arch_version: tuple[int, ...] = field(default=(), compare=False)
    #: A short string naming everything that can change a selection; part of
    #: every selection cache key (cheaper to hash than the dataclass).
    cache_key: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "arch_version", arch_version(self.arch))
        key = f"{self.vendor}:{self.arch}:{','.join(sorted(self.features))}:{self.device_name}"
        object.__setattr__(self, "cache_key", key)

    def has(self, *features: str) -> bool:
        return all(f in self.features for f in features)

    def describe(self) -> str:
        units = f", {self.compute_units} compute units" if self.compute_units else ""
        name = self.device_name or self.arch
        return f"{name} ({self.vendor} {self.arch}{units}; features: {', '.join(sorted(self.features))})"


def make_platform(
    arch: str,
    *,
    features: Iterable[str] | None = None,
    extra_features: Iterable[str] = (),
    device_name: str = "",
    compute_units: int = 0,
) -> Platform:
    """Build a platform from an arch name with that arch's default feature set."""
    vendor = _vendor_of_arch(arch)
    feats = set(features) if features is not None else _default_features(vendor, arch_version(arch))
    feats |= set(extra_features)
    unknown = feats - KNOWN_FEATURES
    if unknown:
        raise ValueError(f"features: unknown feature(s) {sorted(unknown)}; known: {sorted(KNOWN_FEATURES)}")
    return Platform(
        vendor=vendor,
        arch=arch,
        features=frozenset(feats),
        device_name=device_name,
        compute_units=compute_units,
        device_type="cpu" if vendor == "cpu" else "cuda",
    )


_lock = threading.Lock()
_detected: dict[tuple[str, int], Platform] = {}
_fake: contextvars.ContextVar[Platform | None] = contextvars.ContextVar("tokenspeed_fake_platform", default=None)


def _detect(device_type: str, index: int) -> Platform:
    if device_type != "cuda":
        return make_platform("cpu", device_name="cpu", compute_units=os.cpu_count() or 1)
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip:
        arch = props.gcnArchName.split(":")[0]
    else:
        arch = f"sm{props.major}{props.minor}"
    return make_platform(arch, device_name=props.name, compute_units=props.multi_processor_count)


def platform_for_device(device: torch.device) -> Platform:
    """The platform of ``device`` (or the active fake one)."""
    fake = _fake.get()
    if fake is not None:
        return fake
    key = (device.type, device.index if device.index is not None else 0)
    plat = _detected.get(key)
    if plat is None:
        if device.type == "cuda" and device.index is None:
            key = (device.type, torch.cuda.current_device())
        with _lock:
            plat = _detected.get(key)
            if plat is None:
                plat = _detect(*key)
                _detected[key] = plat
    return plat


def current_platform() -> Platform:
    """The platform of the current accelerator if there is one, else the CPU."""
    fake = _fake.get()
    if fake is not None:
        return fake
    if torch.cuda.is_available():
        return platform_for_device(torch.device("cuda", torch.cuda.current_device()))
    return platform_for_device(torch.device("cpu"))


@contextlib.contextmanager
def fake_platform(platform: Platform | str, **kwargs) -> Iterator[Platform]:
    """Pretend every call in this context runs on ``platform``.

    ``platform`` is a :class:`Platform` or an arch name (``"sm90"``, ``"gfx950"``,
    ``"cpu"``); keyword arguments go to :func:`make_platform`.
    """
    plat = make_platform(platform, **kwargs) if isinstance(platform, str) else platform
    token = _fake.set(plat)
    try:
        yield plat
    finally:
        _fake.reset(token)


_CUDA_STREAM = getattr(torch._C, "_cuda_getCurrentStream", None)  # absent from CPU-only builds of torch


def current_stream_id(device: torch.device) -> int | None:
    """The id of ``device``'s current stream (None off CUDA), for state kept per stream: a kernel's
    constant inputs filled on one stream, a kernel's counters (``torch.cuda.current_stream`` builds a
    Stream object a call; this reads the id only)."""
    if device.type != "cuda":
        return None
    if _CUDA_STREAM is not None:
        return _CUDA_STREAM(device.index if device.index is not None else torch.cuda.current_device())[0]
    return torch.cuda.current_stream(device).stream_id

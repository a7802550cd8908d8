"""Importing FlashInfer, its JIT cache location, and first-use compile messages.

FlashInfer builds most of its kernels with nvcc the first time a module is used
(an attention module took about a minute on an H200; the SM90 fused-MoE module
takes more than nine minutes) and keeps the shared objects in a cache. Two
things here make that visible and controllable:

- ``TOKENSPEED_FLASHINFER_CACHE=/path`` sets FlashInfer's own
  ``FLASHINFER_WORKSPACE_BASE`` before FlashInfer is imported. FlashInfer reads
  that variable once, at import, and keeps its cache under
  ``<base>/.cache/flashinfer/<version>/<arch>/`` (compiled modules in
  ``cached_ops/``). If FlashInfer was already imported, the setting cannot take
  effect and a warning says so.
- :func:`first_use` logs ``FlashInfer is compiling <module> ...`` (logger
  ``tokenspeed_kernel.flashinfer``, level WARNING) before the first call of each
  module in this process, and how long that call took after it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import sys
import threading
import time
from collections.abc import Iterator
from types import ModuleType

__all__ = ["CACHE_ENV", "FLASHINFER_CACHE_ENV", "cache_dir", "first_use", "import_flashinfer"]

logger = logging.getLogger("tokenspeed_kernel.flashinfer")

#: Our variable: where FlashInfer keeps its JIT cache.
CACHE_ENV = "TOKENSPEED_FLASHINFER_CACHE"
#: FlashInfer 0.7.4's variable (``flashinfer/jit/env.py``) that it is mapped onto.
FLASHINFER_CACHE_ENV = "FLASHINFER_WORKSPACE_BASE"

_lock = threading.Lock()
_seen: set[str] = set()


def apply_cache_env() -> None:
    """Map ``TOKENSPEED_FLASHINFER_CACHE`` onto ``FLASHINFER_WORKSPACE_BASE`` (before FlashInfer's import)."""
    path = os.environ.get(CACHE_ENV)
    if not path:
        return
    if "flashinfer" in sys.modules:
        current = _imported_base()
        if current is not None and pathlib.Path(current) != pathlib.Path(path):
            logger.warning(
                "%s=%s is ignored: FlashInfer was imported before TokenSpeed-kernel could set %s "
                "(its cache stays under %s); set %s before importing FlashInfer",
                CACHE_ENV, path, FLASHINFER_CACHE_ENV, current, CACHE_ENV,
            )  # fmt: skip
        return
    previous = os.environ.get(FLASHINFER_CACHE_ENV)
    if previous and previous != path:
        logger.warning("%s=%s overrides %s=%s", CACHE_ENV, path, FLASHINFER_CACHE_ENV, previous)
    os.environ[FLASHINFER_CACHE_ENV] = path


def _imported_base() -> str | None:
    env = sys.modules.get("flashinfer.jit.env")
    base = getattr(env, "FLASHINFER_BASE_DIR", None)
    return None if base is None else str(base)


def import_flashinfer() -> ModuleType:
    """``import flashinfer`` after applying the cache setting (the only place this package imports it)."""
    apply_cache_env()
    import flashinfer

    return flashinfer


def cache_dir() -> str:
    """Where FlashInfer keeps its compiled modules (from FlashInfer once imported, else computed)."""
    env = sys.modules.get("flashinfer.jit.env")
    jit_dir = getattr(env, "FLASHINFER_JIT_DIR", None)
    if jit_dir is not None:
        return str(jit_dir)
    base = os.environ.get(CACHE_ENV) or os.environ.get(FLASHINFER_CACHE_ENV) or str(pathlib.Path.home())
    return str(pathlib.Path(base) / ".cache" / "flashinfer")


@contextlib.contextmanager
def first_use(module: str) -> Iterator[None]:
    """Wrap a call that may make FlashInfer compile ``module``; logs around its first call only.

    ``module`` names what gets built (e.g. ``"batch prefill bf16 head_dim=64
    sliding-window sinks"``); one message per name and process.
    """
    with _lock:
        first = module not in _seen
        _seen.add(module)
    if not first:
        yield
        return
    logger.warning(
        "FlashInfer is compiling %s (skipped if already cached); this can take minutes; cache at %s",
        module, cache_dir(),
    )  # fmt: skip
    start = time.perf_counter()
    yield
    took = time.perf_counter() - start
    # Loud only when it really compiled; a cache hit loads in well under a second.
    logger.log(logging.WARNING if took > 2.0 else logging.INFO, "FlashInfer %s ready after %.1f s", module, took)


def _reset_for_tests() -> None:
    with _lock:
        _seen.clear()

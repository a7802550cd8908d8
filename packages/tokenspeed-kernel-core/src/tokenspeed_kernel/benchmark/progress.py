"""A plain-text progress bar on stderr (no dependency): redrawn in place on a terminal,
one line per step otherwise (CI logs)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    def __init__(
        self, total: int, *, stream: TextIO | None = sys.stderr, width: int = 24, enabled: bool = True
    ) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream if enabled else None
        self.width = width
        self.tty = bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())
        self.t0 = time.perf_counter()

    def step(self, label: str) -> None:
        """Mark one more unit of work done; ``label`` says what it was."""
        self.done = min(self.done + 1, self.total)
        if self.stream is None:
            return
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {self.done}/{self.total} {time.perf_counter() - self.t0:5.0f}s {label}"
        if self.tty:
            self.stream.write("\r" + line[:160].ljust(160))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.tty:
            self.stream.write("\n")
            self.stream.flush()

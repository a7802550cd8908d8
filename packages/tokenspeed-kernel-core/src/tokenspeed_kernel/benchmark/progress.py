"""A plain-text progress bar on stderr (no dependency): redrawn in place on a terminal,
one line per step otherwise (CI logs).

On a terminal each redraw fits its width (``shutil.get_terminal_size``, read at each
step, so a resized window is followed): the label is cut, never wrapped, and the
rest of the previous line is cleared.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    def __init__(
        self,
        total: int,
        *,
        stream: TextIO | None = sys.stderr,
        width: int = 24,
        enabled: bool = True,
        columns: int | None = None,
    ) -> None:
        """``width``: the bar's cells; ``columns``: the terminal width (default: the terminal's, read per step)."""
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream if enabled else None
        self.width = width
        self.columns = columns
        self.tty = bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())
        self.t0 = time.perf_counter()
        self._drawn = 0

    def _terminal_columns(self) -> int:
        if self.columns is not None:
            return self.columns
        return shutil.get_terminal_size(fallback=(80, 24)).columns

    def step(self, label: str) -> None:
        """Mark one more unit of work done; ``label`` says what it was."""
        self.done = min(self.done + 1, self.total)
        if self.stream is None:
            return
        filled = self.width * self.done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        line = f"[{bar}] {self.done}/{self.total} {time.perf_counter() - self.t0:5.0f}s {label}"
        if self.tty:
            # One column short of the width: a full line would move the cursor to the next row on some terminals.
            room = max(self._terminal_columns() - 1, 1)
            line = line[:room]
            self.stream.write("\r" + line.ljust(min(self._drawn, room)))
            self._drawn = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.tty:
            self.stream.write("\n")
            self.stream.flush()

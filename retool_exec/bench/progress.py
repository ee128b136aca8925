"""A small progress bar on stderr (no dependency): calls done out of calls planned.

On a terminal it redraws one line in place, at most ten times a second; when
stderr is a file or a pipe it prints a plain line at each new phase instead,
so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]

_WIDTH = 30
_REDRAW_SECONDS = 0.1
_LINE = 100


class Progress:
    """Counts calls against a planned total and shows where the run is."""

    def __init__(self, total: int, *, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.label = ""
        self._started = time.monotonic()
        self._last_draw = 0.0
        self._tty = self.stream.isatty()

    def phase(self, label: str) -> None:
        """Name what runs now (shown next to the bar)."""
        self.label = label
        if not self.enabled:
            return
        if self._tty:
            self._draw(force=True)
        else:
            self.stream.write(f"[{self._elapsed()}] {self._percent():3.0f}%  {label}\n")
            self.stream.flush()

    def advance(self, calls: int = 1) -> None:
        self.done += calls
        if self.enabled and self._tty:
            self._draw()

    def close(self) -> None:
        if not self.enabled:
            return
        if self._tty:
            self._draw(force=True)
            self.stream.write("\n")
        else:
            self.stream.write(f"[{self._elapsed()}] done: {self.done} calls\n")
        self.stream.flush()

    def _percent(self) -> float:
        return min(100.0, 100.0 * self.done / self.total)

    def _elapsed(self) -> str:
        seconds = int(time.monotonic() - self._started)
        return f"{seconds // 60:02d}:{seconds % 60:02d}"

    def _draw(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_draw < _REDRAW_SECONDS:
            return
        self._last_draw = now
        filled = int(_WIDTH * min(self.done, self.total) / self.total)
        bar = "#" * filled + "." * (_WIDTH - filled)
        line = f"[{bar}] {self._percent():3.0f}% {self._elapsed()}  {self.label}"
        self.stream.write("\r" + line[:_LINE].ljust(_LINE))
        self.stream.flush()

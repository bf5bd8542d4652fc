"""A one-line progress bar on stderr (TTY only unless forced), without dependencies."""

from __future__ import annotations

import shutil
import sys
import time
from typing import TextIO


class Progress:
    """``[#####.....] 12/40  pp512 mlx-lm 3/5  0:42`` redrawn in place.

    Args:
        total: steps expected (the bar clamps if more arrive).
        enabled: draw at all; None = only when ``stream`` is a terminal.
        stream: where to draw (default stderr).
    """

    def __init__(self, total: int, enabled: bool | None = None, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.total = max(1, int(total))
        self.done = 0
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.started = time.monotonic()
        self.label = ""

    def show(self, label: str) -> None:
        """Say what runs now, without counting a step."""
        self.label = label
        self._draw()

    def step(self, label: str | None = None) -> None:
        """Count one finished step."""
        self.done += 1
        if label is not None:
            self.label = label
        self._draw()

    def close(self) -> None:
        """Erase the bar."""
        if self.enabled:
            width = shutil.get_terminal_size((80, 20)).columns
            self.stream.write("\r" + " " * (width - 1) + "\r")
            self.stream.flush()

    def _draw(self) -> None:
        if not self.enabled:
            return
        width = shutil.get_terminal_size((80, 20)).columns
        done = min(self.done, self.total)
        bar_w = 20
        fill = round(bar_w * done / self.total)
        secs = int(time.monotonic() - self.started)
        line = f"[{'#' * fill}{'.' * (bar_w - fill)}] {done}/{self.total}  {secs // 60}:{secs % 60:02d}  {self.label}"
        self.stream.write("\r" + line[: width - 1].ljust(width - 1))
        self.stream.flush()


__all__ = ["Progress"]

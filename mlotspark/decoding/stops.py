"""Stop strings: find them in streamed text, and hold back what might start one."""

from __future__ import annotations

from typing import Sequence

__all__ = ["StopMatcher"]


class StopMatcher:
    """Finds stop strings in streamed text and holds back what might start one."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.hold = max((len(s) - 1 for s in self.stops), default=0)

    def cut(self, text: str) -> int | None:
        """Index where the earliest stop string begins in ``text``, or None."""
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def safe_length(self, text: str) -> int:
        """How much of ``text`` can be emitted without risking a partial stop string."""
        if not self.hold:
            return len(text)
        for k in range(min(self.hold, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return len(text) - k
        return len(text)

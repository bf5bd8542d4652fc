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
        hit = self.find(text)
        return None if hit is None else hit[0]

    def find(self, text: str) -> tuple[int, str] | None:
        """Where the earliest stop string begins in ``text`` and which one it is (the first
        listed among those beginning there), or None."""
        hits = [(i, n, s) for n, s in enumerate(self.stops) if (i := text.find(s)) >= 0]
        if not hits:
            return None
        at, _, stop = min(hits)
        return at, stop

    def safe_length(self, text: str) -> int:
        """How much of ``text`` can be emitted without risking a partial stop string."""
        if not self.hold:
            return len(text)
        for k in range(min(self.hold, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return len(text) - k
        return len(text)

"""The one hold-back of streamed text: stop strings, reasoning tags and tool-call openings.

A reply streams piece by piece, and text that might begin a stop string, a ``</think>``
or a ``<tool_call>`` must not be shown until the next pieces tell. :class:`Holdback`
holds that rule for all of them: patterns (literal strings or regular expressions) are
found in the text, and ``safe_length`` says how much of it may be shown, up to where a
match the text's end may still complete begins. It rests on the ``regex`` package's
partial matching, so a pattern with optional parts (a fenced tool call's
```` ```json ````) is held back as exactly as a literal tag.

- :class:`StopMatcher`: the request's stop strings (``TextStream`` cuts at them).
- ``reasoning.ReasoningSplitter``: the think tags.
- ``tool_calls.find_opening`` / ``OpeningScanner`` / ``CallSplitter``: where a call opens.
"""

from __future__ import annotations

from typing import Sequence

import regex

__all__ = ["Holdback", "StopMatcher"]


class Holdback:
    """Named patterns found in streamed text, and what of the text may be shown.

    Args:
        patterns: ``(name, compiled regex.Pattern)`` pairs; at equal positions the first
            listed wins.
        window: the longest a partial match can be (literal patterns: the longest less
            one), so a hold-back reads only the text's tail; None reads from ``start``.
    """

    def __init__(self, patterns: Sequence[tuple[str, "regex.Pattern"]], window: int | None = None):
        self.patterns = tuple(patterns)
        self.window = window

    @classmethod
    def literal(cls, strings: Sequence[str]) -> "Holdback":
        """A hold-back of literal strings, each its own pattern (named by itself)."""
        strings = [s for s in strings if s]
        return cls([(s, regex.compile(regex.escape(s))) for s in strings],
                   window=max((len(s) - 1 for s in strings), default=0))

    def first(self, text: str, start: int = 0, partial: bool = False,
              anchored: bool = False) -> tuple[str, "regex.Match"] | None:
        """The earliest match at or after ``start``, as ``(name, match)``, or None.

        Args:
            partial: a match the text's end may still complete counts too
                (``match.partial`` is then True), when it holds at least one character.
            anchored: only a match that begins exactly at ``start``.
        """
        best: tuple[str, regex.Match] | None = None
        for name, pat in self.patterns:
            m = (pat.match if anchored else pat.search)(text, start, partial=partial)
            if m is not None and m.partial and m.start() == len(text):
                continue  # an empty partial match at the end holds nothing
            if m is not None and (best is None or m.start() < best[1].start()):
                best = (name, m)
        return best

    def safe_length(self, text: str, start: int = 0) -> int:
        """How much of ``text`` can be shown without risking a match cut by its end: where
        the earliest match that the end may still complete begins, at or after ``start``
        (``len(text)`` when nothing needs holding)."""
        if self.window is not None:
            start = max(start, len(text) - self.window)
        held = len(text)
        for _, pat in self.patterns:
            at = start
            while at < held:
                m = pat.search(text, at, partial=True)
                if m is None or m.start() >= held:
                    break
                if m.partial:
                    held = m.start()
                    break
                at = m.start() + 1  # a whole match: what may still follow it is asked next
        return held


class StopMatcher:
    """Finds a request's stop strings in streamed text; holds back (:class:`Holdback`)
    what might start one."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.hold = max((len(s) - 1 for s in self.stops), default=0)
        self._holdback = Holdback.literal(self.stops)

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
        return self._holdback.safe_length(text) if self.hold else len(text)

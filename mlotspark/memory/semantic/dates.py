"""When an entry was said: every entry is dated, and a retold one keeps each day it was said.

The memory section shows each entry with its day ("(today)", "(3 days ago)", "(on 2 March
2026)"), so the model can tell which of two statements is newer; ``said_at`` is the time
that orders entries about the same thing (the last time it was said).
"""

from __future__ import annotations

import time
from typing import Any

DAY = 86400.0


def occurrences(entry: Any) -> list[float]:
    """The Unix times an entry was said, oldest first (its creation time alone if said once)."""
    said = entry.meta.get("said") if isinstance(entry.meta, dict) else None
    if isinstance(said, list) and said and all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in said):
        return sorted(float(t) for t in said)
    return [float(entry.created)]


def said_at(entry: Any) -> float:
    """The last time an entry was said (what "newer" means between two entries)."""
    return occurrences(entry)[-1]


def _day(t: float) -> tuple[int, int, int]:
    lt = time.localtime(t)
    return lt.tm_year, lt.tm_mon, lt.tm_mday


def add_occurrence(entry: Any, when: float) -> dict[str, Any] | None:
    """The meta of an entry said again at ``when``, or None when it was already said that day."""
    said = occurrences(entry)
    if any(_day(t) == _day(when) for t in said):
        return None
    return {**entry.meta, "said": sorted([*said, float(when)])}


def ago(when: float, now: float) -> str:
    """"today", "yesterday", "3 days ago", or "on 2 March 2026" beyond a month."""
    days = (time.mktime(time.localtime(now)[:3] + (0, 0, 0, 0, 0, -1))
            - time.mktime(time.localtime(when)[:3] + (0, 0, 0, 0, 0, -1))) / DAY
    n = round(days)
    if n <= 0:
        return "today"
    if n == 1:
        return "yesterday"
    if n < 31:
        return f"{n} days ago"
    lt = time.localtime(when)
    return f"on {lt.tm_mday} {time.strftime('%B', lt)} {lt.tm_year}"


def describe(entry: Any, now: float | None = None) -> str:
    """The entry's text with the day it was last said: "(3 days ago) I moved to Porto."."""
    return f"({ago(said_at(entry), time.time() if now is None else now)}) {entry.text}"


__all__ = ["add_occurrence", "ago", "describe", "occurrences", "said_at"]

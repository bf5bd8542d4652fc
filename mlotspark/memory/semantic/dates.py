"""When an entry was said: every entry is dated, and a retold one keeps each day it was said.

The memory section shows each entry with its day ("… (said today)", "… (said 2 March
2026)"), so the model can tell which of two statements is newer and when something was
said; ``said_at`` is the time that orders entries about the same thing (the last time it was said).
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
    """"today", "yesterday", else the date ("4 March 2026"): a date answers "when did I tell you"."""
    days = (time.mktime(time.localtime(now)[:3] + (0, 0, 0, 0, 0, -1))
            - time.mktime(time.localtime(when)[:3] + (0, 0, 0, 0, 0, -1))) / DAY
    if round(days) <= 0:
        return "today"
    if round(days) == 1:
        return "yesterday"
    lt = time.localtime(when)
    return f"{lt.tm_mday} {time.strftime('%B', lt)} {lt.tm_year}"


def describe(entry: Any, now: float | None = None) -> str:
    """The entry's text with its day: "I moved to Porto. (said 4 March 2026)", or for one said on
    several days "I bought another plant today. (said 3 times, last today)" (the day after the
    text: the 135M default model reads a leading date as part of the fact)."""
    now = time.time() if now is None else now
    times = occurrences(entry)
    when = ago(times[-1], now)
    return f"{entry.text} (said {when})" if len(times) == 1 else f"{entry.text} (said {len(times)} times, last {when})"


__all__ = ["add_occurrence", "ago", "describe", "occurrences", "said_at"]

"""The memory section of the system prompt, and a fallback token counter."""

from __future__ import annotations

import math
import re

from mlotspark.memory.semantic.events import describe
from mlotspark.memory.semantic.records import Hit

MEMORY_HEADER = "Things you know about the user:"

_SPECIAL = re.compile(r"<\|[^|<>]{0,64}\|>")


def approx_tokens(text: str) -> int:
    """A conservative token count (UTF-8 bytes / 4) for when no tokenizer is given.

    Args:
        text: any text.

    Returns:
        Estimated tokens, at least 1 for non-empty text.
    """
    return math.ceil(len(text.encode("utf-8")) / 4)


def format_memory_section(hits: list[Hit], header: str = MEMORY_HEADER, *, days: bool = False) -> str:
    """The memory section for the system prompt, one entry per line.

    Entries are flattened to one line and stripped of chat-template markers such
    as ``<|im_start|>``, so a stored text cannot open a new turn in the prompt.
    An entry that says "today" or "last week" carries the days it was said
    (``events.describe``), and with ``days`` every entry does.

    Args:
        hits: entries to show, in order.
        header: first line.
        days: show every entry's day (the message asks when: ``events.asks_when``).

    Returns:
        ``"<header>\\n- text\\n- text"``, or "" when ``hits`` is empty.
    """
    lines = [" ".join(_SPECIAL.sub(" ", describe(h.entry, always=days)).split()) for h in hits]
    lines = [ln for ln in lines if ln]
    return "\n".join([header, *(f"- {ln}" for ln in lines)]) if lines else ""

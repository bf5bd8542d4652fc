"""The memory section of the system prompt, and a fallback token counter."""

from __future__ import annotations

import math
import re

from mlotspark.memory.semantic.dates import describe
from mlotspark.memory.semantic.records import Hit

MEMORY_HEADER = "Things you know about the user (a newer one replaces an older one):"

_SPECIAL = re.compile(r"<\|[^|<>]{0,64}\|>")


def approx_tokens(text: str) -> int:
    """A conservative token count (UTF-8 bytes / 4) for when no tokenizer is given.

    Args:
        text: any text.

    Returns:
        Estimated tokens, at least 1 for non-empty text.
    """
    return math.ceil(len(text.encode("utf-8")) / 4)


def format_memory_section(hits: list[Hit], header: str = MEMORY_HEADER, *, now: float | None = None) -> str:
    """The memory section for the system prompt, one dated entry per line ("- … (said today)").

    Entries are flattened to one line and stripped of chat-template markers such
    as ``<|im_start|>``, so a stored text cannot open a new turn in the prompt.

    Args:
        hits: entries to show, in order.
        header: first line.
        now: the time the days are counted from (default: now).

    Returns:
        ``"<header>\\n- text\\n- text"``, or "" when ``hits`` is empty.
    """
    lines = [" ".join(_SPECIAL.sub(" ", describe(h.entry, now)).split()) for h in hits]
    lines = [ln for ln in lines if ln]
    return "\n".join([header, *(f"- {ln}" for ln in lines)]) if lines else ""

"""Word-level text helpers of the store: symbols, the dedupe key, the FTS5 query (words are split
as the hashing embedder splits them, ``models.embedders``).
"""

from __future__ import annotations

import unicodedata

from mlotspark.models.embedders import content_words, normalize, words  # noqa: F401 (re-exported)


def symbols(text: str) -> list[str]:
    """The symbols of ``text`` (emoji, currency and maths signs: Unicode's S* categories), in order:
    they carry meaning ("I like 🍣" is not "I like 🍕") where punctuation does not."""
    return [c for c in normalize(text) if unicodedata.category(c)[0] == "S"]


def dedupe_key(text: str) -> str:
    """The key under which two texts count as the same entry.

    Case, punctuation, whitespace and Unicode forms are ignored, so "I live in
    Ghent." and "i live in ghent" share one key; symbols are not ("I like 🍣" and
    "I like 🍕", "🐱" and "😀😀" had shared one key, the second add lost).

    Args:
        text: an entry's text.

    Returns:
        The words of ``text``, then its symbols, joined by single spaces.
    """
    return " ".join(words(text) + symbols(text))  # a text without symbols keeps the key it had


def fts_query(text: str, max_terms: int = 32) -> list[str]:
    """FTS5 MATCH phrases for the content words of a user's query.

    Each term is a ``\\w+`` token wrapped in double quotes, so it can never be
    read as an FTS5 operator (AND, OR, NOT, NEAR, ``*``, ``^``, column filters)
    and quotes or parentheses in the query cannot make the MATCH raise.

    Args:
        text: the user's query, any characters.
        max_terms: most terms kept (first occurrences), to bound the query cost.

    Returns:
        Quoted terms, e.g. ``['"sister"', '"name"']``; empty when nothing is left.
    """
    seen: dict[str, None] = {}
    for w in content_words(text):
        if len(w) > 1 or w.isdigit():
            seen.setdefault(w, None)
    return [f'"{w}"' for w in list(seen)[:max_terms]]

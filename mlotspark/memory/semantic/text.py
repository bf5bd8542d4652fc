"""Word-level text helpers shared by the embedder, the store and the fact extractor.

Kept free of SQLite and NumPy so each user of it can be read on its own.
"""

from __future__ import annotations

import re
import unicodedata

# Function words and chat filler. They carry no fact, so dropping them keeps a
# question ("What is my sister's name?") and the fact that answers it ("My sister's
# name is Ilse.") close. Negations are *not* here: "I like tea" and "I don't like
# tea" must stay apart.
STOPWORDS: frozenset[str] = frozenset(
    """
    a an the and or but if then of at by for with about to from in into on onto off
    over under up down out as is am are was were be been being do does did doing
    have has had having i me my mine myself you your yours yourself we us our ours
    he him his she her hers it its they them their theirs this that these those
    what which who whom whose when where why how s t d ll re ve m o y ca wo
    can could would should will shall may might must so than too very just also
    there here please tell know remember recall again some any all each every
    yes ok okay hi hello hey thanks thank well oh really
    """.split()
)

_WORD = re.compile(r"\w+", re.UNICODE)
_NOT = re.compile(r"n['’]t\b", re.IGNORECASE)


def normalize(text: str) -> str:
    """NFKC, case-folded, with curly apostrophes made straight.

    Args:
        text: any text.

    Returns:
        The normalised text (same words, same order).
    """
    return unicodedata.normalize("NFKC", text).replace("’", "'").replace("‘", "'").casefold()


def words(text: str) -> list[str]:
    """All words of ``text``, normalised; "don't" becomes "do", "not".

    Args:
        text: any text.

    Returns:
        Word tokens in order.
    """
    return _WORD.findall(_NOT.sub(" not", normalize(text)))


def content_words(text: str) -> list[str]:
    """The words of ``text`` that are not stopwords, in order.

    Args:
        text: any text.

    Returns:
        Content-word tokens in order (duplicates kept).
    """
    return [w for w in words(text) if w not in STOPWORDS]


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

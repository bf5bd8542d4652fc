"""When a new text is already remembered: exact and near duplicates.

Exact: the same dedupe key (case, punctuation and spacing ignored, ``text.dedupe_key``).
Near: cosine at or above the store's ``near_duplicate`` with the same numbers,
negations and symbols and a content word in common, so "I am 34" and "I am 43",
"I like tea" and "I do not like tea", or "I like 🍣" and "I like 🍕" stay two entries.
"""

from __future__ import annotations

import sqlite3

import numpy as np

from mlotspark.memory.semantic.index import VectorIndex
from mlotspark.memory.semantic.text import content_words, dedupe_key, symbols, words


def signature(text: str) -> tuple[tuple[str, ...], int, tuple[str, ...]]:
    """The numbers, the count of negations and the symbols in ``text``, which near-duplicates must share."""
    # Near-duplicates must agree on numbers, negations and symbols: "I am 34" vs "I am 43",
    # "I like tea" vs "I do not like tea", "I like 🍣" vs "I like 🍕" (a sentence encoder may not
    # tell emoji apart) differ in exactly what matters.
    toks = words(text)
    numbers = tuple(sorted(t for t in toks if any(c.isdigit() for c in t)))
    return numbers, sum(t in ("not", "no", "never", "nor") for t in toks), tuple(sorted(symbols(text)))


def _share_a_word(a: str, b: str) -> bool:
    """Near-duplicates say the same in other words, so they share one: "zzz…" and "yyy…", which an
    encoder maps alike (one unknown token each), do not."""
    wa, wb = set(content_words(a)), set(content_words(b))
    return bool(wa & wb) or not (wa or wb)


def duplicate_of(
    conn: sqlite3.Connection, vectors: VectorIndex, text: str, vec: np.ndarray, near: float | None
) -> int | None:
    """The id of an entry ``text`` duplicates, or None.

    Args:
        conn: the store's connection.
        vectors: the current embedder's vectors.
        text: the new text.
        vec: its vector.
        near: cosine for a near duplicate (None: exact duplicates only).

    Returns:
        The existing entry's id, or None.
    """
    row = conn.execute("SELECT id FROM entries WHERE key = ?", (dedupe_key(text),)).fetchone()
    if row is not None:
        return int(row[0])
    if near is None or not vec.any():
        return None
    ids, sims = vectors.similarities(vec)
    close = np.flatnonzero(sims >= near - 1e-6)
    sig = signature(text)
    for j in close[np.argsort(-sims[close])]:
        other = conn.execute("SELECT text FROM entries WHERE id = ?", (int(ids[j]),)).fetchone()
        if other is not None and signature(other[0]) == sig and _share_a_word(text, other[0]):
            return int(ids[j])
    return None


__all__ = ["duplicate_of", "signature"]

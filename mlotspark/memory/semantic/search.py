"""How the store is searched: the hybrid score, and the hits chosen for a prompt.

Search score (each part in [0, 1]), combined as the embedder's calibration says
(``calibration.py``: a sum for the hashing embedder, ``max(cosine, sum)`` for
sentence embeddings)::

    score    = 0.5 * cosine + 0.5 * lexical

``cosine`` is between the query's and the entry's vectors (current embedder
only); ``lexical`` is FTS5 BM25 scaled by IDF-weighted coverage of the query's
words (``lexical.py``).

Hashing calibration (20 personal facts): unrelated pairs score < 0.2;
a question about a stored fact ("What's my dog called?" / "My dog is called
Rex.") 0.75–0.9; one shared word out of two ("What car do I drive?" / "I drive
a blue Volvo.", but also "What is my sister's name?" / "My name is Anna." when
no sister is stored) 0.3–0.4. ``DEFAULT_THRESHOLD`` = 0.35 leans to recall.
Sentence embedders' thresholds depend on whether the message is about the user
(see ``calibration.py``).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Callable

import numpy as np

from mlotspark.options import check_text
from mlotspark.memory.semantic.calibration import Calibration
from mlotspark.models.embedders import Embedder, checked_embed
from mlotspark.memory.semantic.index import VectorIndex
from mlotspark.memory.semantic.lexical import lexical_scores
from mlotspark.memory.semantic.prompt import format_memory_section
from mlotspark.memory.semantic.records import ENTRY_COLUMNS, Hit, entry_from_row
from mlotspark.memory.semantic.dates import said_at

DEFAULT_THRESHOLD = 0.35  # the hashing embedder's (calibration.HASHING)


def search_entries(
    conn: sqlite3.Connection,
    embedder: Embedder,
    calibration: Calibration,
    vectors: Callable[[], VectorIndex],
    query: str,
    k: int,
    threshold: float,
    replaced: dict[int, int | None] | None = None,
) -> list[Hit]:
    """The best ``k`` entries for ``query`` scoring at least ``threshold``, best first (ties: newer first).

    Args:
        conn: the store's connection.
        embedder: embeds the query.
        calibration: combines cosine and lexical scores.
        vectors: the current embedder's vector index (called only if the query has a vector).
        query: free text.
        k: at most this many hits.
        threshold: minimum combined score.
        replaced: superseded entry -> the current entry that replaced it (None: none
            left). Superseded entries are never returned; the score a query gives one
            is lent to its successor, so "I moved to Porto last month." answers "Which
            city do I live in?" as well as the "I live in Utrecht." it replaced.

    Returns:
        The hits.
    """
    check_text(query, "memory query")  # not a string, or a lone surrogate the embedder cannot take
    if k == 0 or not query.strip():
        return []
    replaced = replaced or {}
    lexical = lexical_scores(conn, query)
    vector: dict[int, float] = {}
    qvec = checked_embed(embedder, [query])[0]
    if qvec.any():
        ids, sims = vectors().similarities(qvec)
        # Top k by cosine plus every lexical match is exact: an entry outside both
        # has no lexical part, so it scores at most its cosine, below k others.
        top = np.argpartition(-sims, k - 1)[:k] if len(ids) > k else np.arange(len(ids))
        wanted = np.isin(ids, np.fromiter(lexical, dtype=np.int64, count=len(lexical)))
        wanted[top] = True
        vector = {int(i): max(0.0, float(s)) for i, s in zip(ids[wanted], sims[wanted])}
    best: dict[int, tuple[float, float, float]] = {}
    for entry_id in lexical.keys() | vector.keys():
        v, lx = vector.get(entry_id, 0.0), lexical.get(entry_id, 0.0)
        score = calibration.score(v, lx)
        if entry_id in replaced:  # lent to the entry that replaced it
            entry_id = replaced[entry_id]
            if entry_id is None:
                continue
        if score > best.get(entry_id, (-1.0,))[0]:
            best[entry_id] = (score, v, lx)
    scored = [(score, i, v, lx) for i, (score, v, lx) in best.items() if score > 0.0 and score >= threshold]
    scored.sort(key=lambda s: (-s[0], -s[1]))  # ties: newer first
    hits: list[Hit] = []
    for score, entry_id, v, lx in scored:
        row = conn.execute(f"SELECT {ENTRY_COLUMNS} FROM entries WHERE id = ?", (entry_id,)).fetchone()
        if row is not None:  # None: forgotten by another process since the index was read
            hits.append(Hit(entry_from_row(row), round(score, 6), round(v, 6), round(lx, 6)))
        if len(hits) == k:
            break
    return hits


def newest_of_alike(hits: list[Hit], cosine: Callable[[int, int], float], calibration: Calibration) -> list[Hit]:
    """``hits`` with an older entry given way to a newer hit about the same thing, which takes
    its place and score: "Got the keys to the Bristol house." answers "Which city is home?" in
    place of "I live in Leeds.", and the model sees only the newer.

    "About the same thing" is read off the question's scores: a newer entry close to the
    older one (cosine at least ``calibration.supersede``) that the question finds almost as
    relevant (its score within ``calibration.newer_gap`` of the older's). A question about
    one of two things of a kind ("What's my dog called?" beside "My cat is Miso.") scores
    the other clearly lower, so both stay. Entries a writer marked superseded never get here
    (``search_entries`` lends their score to their successor).

    Args:
        hits: one query's hits, best first.
        cosine: two entries' vectors' similarity, by id.
        calibration: the embedder's ``supersede`` and ``newer_gap``.
    """
    def successor(h: Hit) -> Hit | None:
        newer = [o for o in hits if said_at(o.entry) > said_at(h.entry) and h.score - o.score < calibration.newer_gap
                 and cosine(o.id, h.id) >= calibration.supersede]
        return max(newer, key=lambda o: said_at(o.entry)) if newer else None

    out: list[Hit] = []
    for h in hits:
        now, seen = h, {h.id}
        while (nxt := successor(now)) is not None and nxt.id not in seen:  # the newest of a chain
            now = nxt
            seen.add(now.id)
        if all(o.id != now.id for o in out):
            out.append(now if now is h else dataclasses.replace(now, score=max(now.score, h.score)))
    return out


def choose_for_prompt(
    hits: list[Hit], top_k: int, margin: float, token_budget: int, count: Callable[[str], int], header: str,
) -> list[Hit]:
    """The hits to inject: in score order, within ``margin`` of the best, while the section fits the budget.

    A hit that does not fit is skipped and a shorter one after it may still fit.

    Args:
        hits: candidates, best first.
        top_k: at most this many.
        margin: only hits within this of the best one's score.
        token_budget: most tokens the whole section (header included) may take.
        count: counts tokens.
        header: the section's first line.

    Returns:
        The chosen hits, best first.
    """
    chosen: list[Hit] = []
    if not top_k:
        return chosen
    for hit in hits:
        if chosen and hit.score < chosen[0].score - margin:
            break  # far below the best: another fact of the same kind, not the one asked
        if count(format_memory_section([*chosen, hit], header)) <= token_budget:
            chosen.append(hit)
            if len(chosen) == top_k:
                break
    return chosen


__all__ = ["DEFAULT_THRESHOLD", "choose_for_prompt", "newest_of_alike", "search_entries"]

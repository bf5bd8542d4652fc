"""The lexical half of the search score: FTS5 BM25 scaled by IDF-weighted coverage.

    lexical  = coverage * bm25 / best_bm25          (0 for entries FTS5 does not match)
    coverage = sum(idf(t) for query terms t in the entry) / sum(idf(t) for all t)
    idf(t)   = ln(1 + (N - n_t + 0.5) / (n_t + 0.5))

FTS5's BM25 ranks entries against each other but has no fixed scale, and it clamps
the IDF of a term found in half the rows or more to ~0, so on its own it vanishes
in a small store. Coverage supplies the scale, so a threshold means the same in a
5-entry and a 5000-entry store; query words found in no entry count in the
denominator, so an entry matching half of the question scores well below one
matching all of it.
"""

from __future__ import annotations

import math
import sqlite3

from mlotspark.memory.semantic.text import fts_query


def lexical_scores(conn: sqlite3.Connection, query: str) -> dict[int, float]:
    """Lexical score in [0, 1] per entry FTS5 matches (module docstring).

    Args:
        conn: the store's connection (tables ``entries`` and ``entries_fts``).
        query: free text; its words are quoted before they reach FTS5.

    Returns:
        ``{entry_id: score}`` for the matching entries (empty when none match).
    """
    terms = fts_query(query)
    if not terms:
        return {}
    bm25 = {
        int(r[0]): -float(r[1])  # FTS5's bm25() is negative, lower is better
        for r in conn.execute(
            "SELECT rowid, bm25(entries_fts) FROM entries_fts WHERE entries_fts MATCH ?",
            (" OR ".join(terms),),
        )
    }
    if not bm25:
        return {}
    total = int(conn.execute("SELECT count(*) FROM entries").fetchone()[0])
    covered = dict.fromkeys(bm25, 0.0)
    idf_sum = 0.0
    for term in terms:
        rows = {int(r[0]) for r in conn.execute("SELECT rowid FROM entries_fts WHERE entries_fts MATCH ?", (term,))}
        idf = math.log(1.0 + (total - len(rows) + 0.5) / (len(rows) + 0.5))  # always > 0
        idf_sum += idf
        for entry_id in rows & covered.keys():
            covered[entry_id] += idf
    best = max(bm25.values())
    return {i: (covered[i] / idf_sum) * (bm25[i] / best if best > 0 else 1.0) for i in bm25}


__all__ = ["lexical_scores"]

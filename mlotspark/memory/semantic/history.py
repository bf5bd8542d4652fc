"""Superseded entries in the database: marking, reviving, and which ones search leaves out.

The rules for *when* a fact replaces another are in ``updates.py``; this module
applies them to the store's rows, inside the caller's write transaction. An older
entry is never deleted by an update: ``superseded_by`` names the newer entry and
``superseded`` the time, so ``mlotspark memory list`` shows both with dates.
Forgetting the newer entry revives the older one (the update is undone).
"""

from __future__ import annotations

import sqlite3

import numpy as np

from mlotspark.memory.semantic.index import VectorIndex
from mlotspark.memory.semantic.updates import supersedes

CANDIDATES = 8  # current entries nearest the new one that are checked against the rules


def superseded_ids(conn: sqlite3.Connection) -> set[int]:
    """Ids of every superseded entry (left out of search)."""
    return {int(r[0]) for r in conn.execute("SELECT id FROM entries WHERE superseded_by IS NOT NULL")}


def replaced_by(
    conn: sqlite3.Connection, vectors: VectorIndex, new_id: int, text: str, vec: np.ndarray, threshold: float
) -> list[int]:
    """Current entries that the entry ``new_id`` (``text``, ``vec``) replaces.

    Args:
        conn: the store's connection.
        vectors: the current embedder's vectors.
        new_id: the new entry (never a candidate itself).
        text: its text.
        vec: its vector.
        threshold: the calibration's ``supersede`` cosine.

    Returns:
        The id of the older current entry it supersedes (the nearest that passes
        ``updates.supersedes``), as a list of at most one.
    """
    if not vec.any() or not len(vectors):
        return []
    ids, sims = vectors.similarities(vec)
    gone = superseded_ids(conn)
    for j in np.argsort(-sims)[: CANDIDATES + len(gone) + 1]:
        entry_id, cosine = int(ids[j]), float(sims[j])
        if entry_id == new_id or entry_id in gone or cosine < threshold:
            continue
        row = conn.execute("SELECT text FROM entries WHERE id = ?", (entry_id,)).fetchone()
        if row is not None and supersedes(text, row[0], cosine, threshold):
            return [entry_id]  # the nearest: one newer fact updates one older fact
    return []


def mark_superseded(conn: sqlite3.Connection, old_ids: list[int], new_id: int, when: float) -> None:
    """Mark ``old_ids`` as superseded by ``new_id`` at ``when`` (inside a write transaction)."""
    conn.executemany("UPDATE entries SET superseded_by = ?, superseded = ? WHERE id = ?",
                     [(new_id, when, i) for i in old_ids])


def revive(conn: sqlite3.Connection, newer_id: int) -> None:
    """Make current again the entries ``newer_id`` superseded (inside a write transaction)."""
    conn.execute("UPDATE entries SET superseded_by = NULL, superseded = NULL WHERE superseded_by = ?", (newer_id,))


__all__ = ["mark_superseded", "replaced_by", "revive", "superseded_ids"]

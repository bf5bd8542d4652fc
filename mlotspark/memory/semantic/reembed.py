"""Vectors in the store's ``vectors`` table: loading one embedder's, writing them, re-embedding.

Vectors of one embedder are never compared with another's: each row carries its
embedder's name and dimension. An entry without a (well-formed) vector from the
current embedder, e.g. a store written with the hashing fallback and opened once
MiniLM is pulled, is found by words only until ``reembed_missing`` gives it one:
lazily when ``SemanticStore`` opens, or on ``mlotspark memory reindex``. Other
embedders' vectors are kept, so switching back costs nothing.

The functions take the store's connection and run inside the caller's lock; the
writes go through the caller's ``write`` transaction (``SemanticStore._write``).
"""

from __future__ import annotations

import sqlite3
from typing import Callable, ContextManager

import numpy as np

from mlotspark import steps
from mlotspark.models.embedders import Embedder, checked_embed
from mlotspark.memory.semantic.index import VectorIndex

Write = Callable[[], ContextManager[sqlite3.Connection]]


def load_vectors(conn: sqlite3.Connection, embedder: Embedder) -> VectorIndex:
    """The vectors ``embedder`` wrote, as an in-memory index.

    Args:
        conn: the store's connection.
        embedder: whose vectors (by name and dimension; damaged blobs are left out).

    Returns:
        A ``VectorIndex`` of those entries.
    """
    dim = embedder.dim
    rows = conn.execute(
        "SELECT entry_id, vec FROM vectors WHERE embedder = ? AND dim = ? AND length(vec) = ?",
        (embedder.name, dim, 4 * dim),
    ).fetchall()
    return VectorIndex.from_rows(dim, [r[0] for r in rows], [r[1] for r in rows])


def insert_vector(conn: sqlite3.Connection, entry_id: int, embedder: Embedder, vec: np.ndarray) -> None:
    """Store ``vec`` as ``embedder``'s vector of a new entry (inside a write transaction)."""
    conn.execute(
        "INSERT INTO vectors (entry_id, embedder, dim, vec) VALUES (?, ?, ?, ?)",
        (entry_id, embedder.name, embedder.dim, vec.astype("<f4").tobytes()),
    )


def reembed_missing(conn: sqlite3.Connection, write: Write, embedder: Embedder, batch: int) -> int:
    """Give every entry without a vector from ``embedder`` one.

    Entries are embedded ``batch`` at a time, each batch in its own transaction, so
    a large store makes progress even if it is interrupted (the next open goes on);
    each batch advances a ``mlotspark.steps`` step (the CLI's status line shows it).

    Args:
        conn: the store's connection (for reading).
        write: opens one write transaction (``SemanticStore._write``).
        embedder: the embedder whose vectors are missing.
        batch: entries embedded per transaction (>= 1).

    Returns:
        How many entries were embedded.
    """
    name, dim = embedder.name, embedder.dim
    missing = """FROM entries e WHERE NOT EXISTS (
                   SELECT 1 FROM vectors v WHERE v.entry_id = e.id AND v.embedder = ?
                   AND v.dim = ? AND length(v.vec) = ?)"""
    todo = conn.execute(f"SELECT count(*) {missing}", (name, dim, 4 * dim)).fetchone()[0]
    if not todo:
        return 0
    done = 0
    # A store switched to a sentence embedder takes seconds per hundred entries: say so.
    with steps.step(f"re-embedding {todo} memory entries with {name}", total=todo, unit="entries") as s:
        while True:
            rows = conn.execute(
                f"SELECT e.id, e.text {missing} ORDER BY e.id LIMIT ?", (name, dim, 4 * dim, batch)
            ).fetchall()
            if not rows:
                return done
            vecs = checked_embed(embedder, [r[1] for r in rows])
            with write() as c:
                # An entry forgotten by another process meanwhile gets no orphan vector.
                c.executemany(
                    "INSERT OR REPLACE INTO vectors (entry_id, embedder, dim, vec) "
                    "SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM entries WHERE id = ?)",
                    [(r[0], name, dim, v.astype("<f4").tobytes(), r[0]) for r, v in zip(rows, vecs)],
                )
            done += len(rows)
            s.advance(len(rows))


__all__ = ["insert_vector", "load_vectors", "reembed_missing"]

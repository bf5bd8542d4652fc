"""Superseded entries in the database: marking, reviving, and which ones search leaves out.

A writer's ``supersede`` (``writer.py``) or an import's marks are applied here, inside
the caller's write transaction. An older entry is never deleted by an update:
``superseded_by`` names the newer entry and ``superseded`` the time, so
``mlotspark memory list --history`` shows both with dates. ``forget(id)`` of the newer
entry revives the older one (the update is undone); a request to forget deletes only the
entry it names and leaves the older one superseded.
"""

from __future__ import annotations

import json
import sqlite3

from mlotspark.memory.semantic.dates import add_occurrence
from mlotspark.memory.semantic.records import ENTRY_COLUMNS, NewEntry, entry_from_row



def superseded_ids(conn: sqlite3.Connection) -> set[int]:
    """Ids of every superseded entry (left out of search)."""
    return {int(r[0]) for r in conn.execute("SELECT id FROM entries WHERE superseded_by IS NOT NULL")}


def successors(conn: sqlite3.Connection) -> dict[int, int | None]:
    """Every superseded entry -> the current entry at the end of its chain (None if there is
    none: a loop, or an end a request to forget deleted, ``FORGOTTEN``)."""
    links, gone = {}, set()
    for a, b, there in conn.execute("SELECT e.id, e.superseded_by, n.id FROM entries e LEFT JOIN entries n "
                                    "ON n.id = e.superseded_by WHERE e.superseded_by IS NOT NULL"):
        links[int(a)] = int(b)
        if there is None:
            gone.add(int(b))
    out: dict[int, int | None] = {}
    for start in links:
        seen, cur = {start}, links[start]
        while cur in links and cur not in seen:  # Utrecht -> Porto -> Lisbon: Lisbon
            seen.add(cur)
            cur = links[cur]
        out[start] = None if cur in seen or cur in gone else cur
    return out


#: ``superseded_by`` of an entry whose successor was forgotten on request and is in no
#: file an import reads: it stays superseded (no entry has id 0).
FORGOTTEN = 0


def mark_superseded(conn: sqlite3.Connection, old_ids: list[int], new_id: int, when: float) -> None:
    """Mark ``old_ids`` as superseded by ``new_id`` at ``when`` (inside a write transaction)."""
    conn.executemany("UPDATE entries SET superseded_by = ?, superseded = ? WHERE id = ?",
                     [(new_id, when, i) for i in old_ids])


def revive(conn: sqlite3.Connection, newer_id: int) -> None:
    """Make current again the entries ``newer_id`` superseded (inside a write transaction)."""
    conn.execute("UPDATE entries SET superseded_by = NULL, superseded = NULL WHERE superseded_by = ?", (newer_id,))


def said_again(conn: sqlite3.Connection, entry_id: int, new: NewEntry) -> None:
    """``entry_id`` said again on another day: one more occurrence (``dates.py``), so it counts
    as newer than what was said in between; inside a write transaction."""
    row = conn.execute(f"SELECT {ENTRY_COLUMNS} FROM entries WHERE id = ?", (entry_id,)).fetchone()
    if row is None:
        return
    meta = add_occurrence(entry_from_row(row), new.created)
    if meta is not None:
        conn.execute("UPDATE entries SET meta = ? WHERE id = ?",
                     (json.dumps(meta, ensure_ascii=False, sort_keys=True), entry_id))


__all__ = ["FORGOTTEN", "mark_superseded", "revive", "said_again", "successors", "superseded_ids"]

"""Superseded entries in the database: marking, reviving, and which ones search leaves out.

The rules for *when* a fact replaces another are in ``updates.py``; this module
applies them to the store's rows, inside the caller's write transaction. An older
entry is never deleted by an update: ``superseded_by`` names the newer entry and
``superseded`` the time, so ``mlotspark memory list`` shows both with dates.
``forget(id)`` of the newer entry revives the older one (the update is undone); a
retraction deletes only the entry it names and leaves the older one superseded.
"""

from __future__ import annotations

import json
import sqlite3

import numpy as np

from mlotspark.memory.semantic.events import add_occurrence
from mlotspark.memory.semantic.facts import tells_event
from mlotspark.memory.semantic.index import VectorIndex
from mlotspark.memory.semantic.records import ENTRY_COLUMNS, NewEntry, entry_from_row
from mlotspark.memory.semantic.updates import CUE_SLACK, names_its_thing, restates, supersedes

CANDIDATES = 8  # current entries nearest the new one that are checked against the rules
NEAREST_MARGIN = 0.1  # besides the nearest passing entry, others this close to its cosine (one slot stated twice)


def superseded_ids(conn: sqlite3.Connection) -> set[int]:
    """Ids of every superseded entry (left out of search)."""
    return {int(r[0]) for r in conn.execute("SELECT id FROM entries WHERE superseded_by IS NOT NULL")}


def successors(conn: sqlite3.Connection) -> dict[int, int | None]:
    """Every superseded entry -> the current entry at the end of its chain (None if there is
    none: a loop, or an end a retraction deleted, ``FORGOTTEN``)."""
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


def update_chain(conn: sqlite3.Connection, entry_id: int) -> list[int]:
    """The entries of ``entry_id``'s slot: the current one at the end of its chain of updates
    first, then every older one superseded on the way to it (``retractions.named_entry``: a
    retraction that names an older value may mean the current one)."""
    ends = successors(conn)
    last = ends.get(entry_id, entry_id) or entry_id  # None: a chain with no current end
    return [last, *sorted(i for i, end in ends.items() if end == last and i != last)]


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
        The ids of the older current entries it supersedes (never an event, ``facts.tells_event``:
        "I went to the dentist today." stays true): the nearest that passes
        ``updates.supersedes``, and others that pass within ``NEAREST_MARGIN`` of its
        cosine ("I work at Philips." and "I'm an engineer at Philips." both replaced
        by "I changed jobs and now work at ASML."; but "I go to the gym on Mondays."
        at 0.51 is not replaced with "I take the train to work." at 0.68 by "I cycle
        to work now instead of taking the train.").
    """
    if not vec.any() or not len(vectors):
        return []
    ids, sims = vectors.similarities(vec)
    gone = superseded_ids(conn)
    out: list[int] = []
    under: list[int] = []  # passing under the threshold (``updates.CUE_SLACK``): kept only when alone
    nearest = None
    for j in np.argsort(-sims)[: CANDIDATES + len(gone) + 1]:
        entry_id, cosine = int(ids[j]), float(sims[j])
        if nearest is not None and cosine < nearest - NEAREST_MARGIN:
            break
        if entry_id == new_id or entry_id in gone or cosine < threshold - CUE_SLACK:
            continue
        row = conn.execute("SELECT text FROM entries WHERE id = ?", (entry_id,)).fetchone()
        if row is not None and not tells_event(row[0]) and supersedes(text, row[0], cosine, threshold):
            if cosine < threshold:
                under.append(entry_id)
                continue
            if out and not names_its_thing(text, row[0]):
                continue  # beside the nearest, only the same thing said again: not "my work phone"
            out.append(entry_id)
            if nearest is None and not restates(text, row[0]):
                nearest = cosine  # a restated entry goes too, but the window is the changed one's
    # Under the threshold a change is taken only when it picks out one entry: "Lately I can't get
    # enough of Ethiopian food, it's my new favourite." passes four favourites at 0.34-0.39.
    return out or (under if len(under) == 1 else [])


#: ``superseded_by`` of an entry whose successor was forgotten by a retraction and is in no
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
    """An event said again on another day: one more occurrence of ``entry_id`` (events.py),
    inside a write transaction.

    Only events: "I moved to Porto last week." retold is one move, not two. A dated
    text's duplicates are exact (``SemanticStore._duplicate_of``), so the entry is the same event.
    """
    if not tells_event(new.text):
        return
    row = conn.execute(f"SELECT {ENTRY_COLUMNS} FROM entries WHERE id = ?", (entry_id,)).fetchone()
    if row is None:
        return
    meta = add_occurrence(entry_from_row(row), new.created)
    if meta is not None:
        conn.execute("UPDATE entries SET meta = ? WHERE id = ?",
                     (json.dumps(meta, ensure_ascii=False, sort_keys=True), entry_id))


__all__ = ["FORGOTTEN", "mark_superseded", "replaced_by", "revive", "said_again", "successors", "superseded_ids",
           "update_chain"]

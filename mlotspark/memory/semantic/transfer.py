"""Export and import of the store's entries as JSON (vectors are rebuilt, never exported)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from mlotspark import steps
from mlotspark.errors import OptionError, StoreError
from mlotspark.memory.semantic.database import sidecar
from mlotspark.models.embedders import Embedder, checked_embed
from mlotspark.memory.semantic.history import FORGOTTEN
from mlotspark.memory.semantic.records import ENTRY_COLUMNS, NewEntry, entry_from_row, export_document, parse_import
from mlotspark.storage import read_json, write_json


def not_own_file(store_path: Path, path: Path, what: str) -> Path:
    """``path`` expanded, unless it is one of the store's own files (OptionError naming it)."""
    path = Path(path).expanduser()
    own = {sidecar(store_path, s).resolve() for s in ("", "-wal", "-shm", ".lock")}
    if path.resolve() in own:
        raise OptionError(f"cannot {what} {path}: it is the memory store's own file")
    return path


def export_entries(conn: sqlite3.Connection, path: Path) -> int:
    """Write every entry to ``path`` (atomically, mode 0600) from one snapshot of the database.

    Returns:
        How many entries were written.
    """
    conn.execute("BEGIN")  # one snapshot, whatever other processes write meanwhile
    try:
        rows = conn.execute(f"SELECT {ENTRY_COLUMNS} FROM entries ORDER BY id").fetchall()
    finally:
        conn.execute("COMMIT")
    entries = [entry_from_row(r) for r in rows]
    target = Path(path).resolve() if Path(path).is_symlink() else Path(path)  # a link's file, not the link
    if target.exists() and not target.is_file() and not target.is_dir():
        # A device or a pipe ("memory export /dev/stdout", a FIFO): written through. Replacing it by
        # rename, as a file is, had turned /dev/full and a FIFO into regular files.
        try:
            with open(target, "w", encoding="utf-8") as f:
                f.write(json.dumps(export_document(entries), indent=2, ensure_ascii=False) + "\n")
        except OSError as e:
            raise StoreError(f"cannot write {path}: {e.strerror or e}") from e
    else:
        write_json(target, export_document(entries))
    return len(entries)


def read_import(path: Path) -> list[NewEntry]:
    """The checked entries of an import file (``export_entries``' format or a JSON list of strings).

    Raises:
        StoreError: missing file, bad JSON, or a bad entry (its index is named).
    """
    doc = read_json(path)
    if doc is None:
        raise StoreError(f"cannot import {path}: no such file (or it holds null)")
    return parse_import(path, doc)


IMPORT_CHUNK = 64  # entries embedded between two progress events of an import


def embed_import(embedder: Embedder, items: list[NewEntry], name: str) -> list:
    """The vectors of an import's entries, in chunks: a sentence embedder takes seconds per
    hundred entries, so a long import shows where it is (``mlotspark.steps``)."""
    n, vecs = len(items), []
    with steps.step(f"embedding {n} entries from {name}", total=n, unit="entries") as s:
        for start in range(0, n, IMPORT_CHUNK):
            vecs.extend(checked_embed(embedder, [it.text for it in items[start : start + IMPORT_CHUNK]]))
            s.advance(min(IMPORT_CHUNK, n - start))
    return vecs


def restore_marks(conn: sqlite3.Connection, items: list[NewEntry], ids: list[int]) -> None:
    """The file's superseded marks, on the entries its items became (inside the import's transaction).

    An entry the file marks superseded by another of its entries is marked so (with the
    file's time); one the file has current loses a mark it had from another entry of the
    same file. An item without an id (a list of strings, a version 1 file) is current.

    Args:
        conn: the store's connection, in a write transaction.
        items: the checked items, in file order.
        ids: the store id each item became (a new entry or the duplicate it matched).
    """
    by_ref = {it.ref: i for it, i in zip(items, ids) if it.ref is not None}
    created = {i: it.created for it, i in zip(items, ids)}
    ours = sorted(set(by_ref.values()))
    for it, entry_id in zip(items, ids):
        if it.ref is None:
            continue
        newer = by_ref.get(it.superseded_by) if it.superseded_by is not None else None
        if newer is not None and newer != entry_id:
            when = it.superseded if it.superseded is not None else created[newer]
            conn.execute("UPDATE entries SET superseded_by = ?, superseded = ? WHERE id = ?", (newer, when, entry_id))
        elif it.superseded_by is not None and newer is None:  # its successor was forgotten: still superseded
            when = it.superseded if it.superseded is not None else created[entry_id]
            conn.execute("UPDATE entries SET superseded_by = ?, superseded = ? WHERE id = ?", (FORGOTTEN, when, entry_id))
        elif it.superseded_by is None:
            marks = ",".join("?" * len(ours))
            conn.execute(f"UPDATE entries SET superseded_by = NULL, superseded = NULL WHERE id = ? "
                         f"AND superseded_by IN ({marks})", (entry_id, *ours))


__all__ = ["export_entries", "not_own_file", "read_import", "restore_marks"]

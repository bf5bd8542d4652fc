"""Export and import of the store's entries as JSON (vectors are rebuilt, never exported)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from mlotspark.errors import OptionError, StoreError
from mlotspark.memory.semantic.database import sidecar
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
    write_json(path, export_document(entries))
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


__all__ = ["export_entries", "not_own_file", "read_import"]

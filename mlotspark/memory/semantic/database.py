"""The SQLite file behind the semantic store: schema, upgrades, pragmas, permissions.

Layout of ``semantic.db`` (schema version in ``PRAGMA user_version``):

- ``entries``: id (never reused), text, dedupe key, source, conversation, meta
  (JSON), created (Unix time); since version 2 ``superseded_by`` (the id of the
  newer entry about the same thing, NULL while current) and ``superseded`` (when).
- ``entries_fts``: FTS5 over ``entries.text`` (external content, kept in sync by
  triggers), porter-stemmed, diacritics folded.
- ``vectors``: one float32 blob per (entry, embedder), with the embedder's name
  and dimension, so vectors of two embedders are never compared.

Upgrades: ``_MIGRATIONS[v]`` brings a version v-1 file to v; opening runs the
missing ones in one transaction, and refuses (untouched) a file from a newer
version.

Durability: WAL, and ``synchronous=FULL``: memory writes are a few per turn and
off the token path, so an fsync per commit is invisible, while "remember this"
surviving a power cut is not (NORMAL survives a process crash but may lose the
last commits on power loss). ``busy_timeout`` makes a second process wait for the
write lock instead of failing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import time
from pathlib import Path

from typing import Any, Callable, TypeVar

from mlotspark.errors import OptionError, StoreError
from mlotspark.storage import ensure_dir, subdir

SCHEMA_VERSION = 2
BUSY_TIMEOUT_MS = 15000

# Each migration brings the schema from version-1 to version. Statements run one by
# one inside the caller's transaction (executescript would commit it).
_MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE entries (
            id INTEGER PRIMARY KEY AUTOINCREMENT,  -- no reuse: turn stats name ids
            text TEXT NOT NULL,
            key TEXT NOT NULL UNIQUE,              -- exact duplicates, across processes
            source TEXT NOT NULL,
            conversation TEXT,
            meta TEXT NOT NULL DEFAULT '{}',
            created REAL NOT NULL
        )""",
        """CREATE TABLE vectors (
            entry_id INTEGER NOT NULL REFERENCES entries(id) ON DELETE CASCADE,
            embedder TEXT NOT NULL,
            dim INTEGER NOT NULL,
            vec BLOB NOT NULL,                     -- float32, little-endian, dim values
            PRIMARY KEY (entry_id, embedder)
        )""",
        "CREATE INDEX vectors_by_embedder ON vectors(embedder, dim)",
        """CREATE VIRTUAL TABLE entries_fts USING fts5(
            text, content='entries', content_rowid='id',
            tokenize='porter unicode61 remove_diacritics 2'
        )""",
        """CREATE TRIGGER entries_ai AFTER INSERT ON entries BEGIN
            INSERT INTO entries_fts(rowid, text) VALUES (new.id, new.text);
        END""",
        """CREATE TRIGGER entries_ad AFTER DELETE ON entries BEGIN
            INSERT INTO entries_fts(entries_fts, rowid, text) VALUES ('delete', old.id, old.text);
        END""",
        """CREATE TRIGGER entries_au AFTER UPDATE OF text ON entries BEGIN
            INSERT INTO entries_fts(entries_fts, rowid, text) VALUES ('delete', old.id, old.text);
            INSERT INTO entries_fts(rowid, text) VALUES (new.id, new.text);
        END""",
    ],
    # Knowledge updates: an older fact is marked, not deleted, when a newer one replaces it.
    2: [
        "ALTER TABLE entries ADD COLUMN superseded_by INTEGER",
        "ALTER TABLE entries ADD COLUMN superseded REAL",
        "CREATE INDEX entries_superseded_by ON entries(superseded_by)",
    ],
}



@functools.lru_cache(maxsize=1)
def fts5_available() -> bool:
    """Whether this Python's SQLite has FTS5 (python.org, Homebrew and Apple builds do).

    Returns:
        True if an FTS5 table can be created.
    """
    try:
        with contextlib.closing(sqlite3.connect(":memory:")) as c:
            c.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
        return True
    except sqlite3.Error:
        return False


def secure(path: Path, mode: int = 0o600) -> None:
    """Take group/other permissions off ``path`` if we own it (DESIGN §6).

    Args:
        path: a file or directory; missing is fine.
        mode: the mode to set (0600 for files, 0700 for directories).
    """
    with contextlib.suppress(OSError):
        st = path.stat()
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            path.chmod(mode)


def sidecar(path: Path, suffix: str) -> Path:
    """``semantic.db`` → ``semantic.db-wal`` and the like."""
    return path.with_name(path.name + suffix)


def open_database(path: Path) -> sqlite3.Connection:
    """Open (creating or upgrading) the store at ``path``.

    The connection is in autocommit mode (``isolation_level=None``): callers open
    their own ``BEGIN IMMEDIATE`` transactions.

    Args:
        path: the database file.

    Returns:
        The connection, shareable between threads (callers serialise).

    Raises:
        StoreError: cannot be created or opened, not a database, no FTS5, or a
            newer schema; an existing file is never modified then.
    """
    if not fts5_available():
        raise StoreError(
            f"this Python's SQLite {sqlite3.sqlite_version} is built without FTS5, "
            "which the memory store needs; use a Python whose sqlite3 has FTS5"
        )
    ensure_dir(path.parent)
    try:
        # Create the file ourselves: SQLite gives -wal/-shm the database's mode.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    except OSError as e:
        raise StoreError(f"cannot open memory store {path}: {e.strerror or e}") from e
    secure(path)
    conn = None
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        mode = _wal(conn)
        if str(mode).lower() != "wal":
            raise StoreError(f"memory store {path}: cannot use WAL (journal mode {mode})")
        conn.execute("PRAGMA synchronous=FULL")
        # On macOS plain fsync() leaves data in the drive's cache; F_FULLFSYNC is what
        # makes FULL durable there (a no-op elsewhere).
        conn.execute("PRAGMA fullfsync=ON")
        # Truncate the WAL after checkpoints, so one big import does not leave it large.
        conn.execute("PRAGMA journal_size_limit=4194304")
        conn.execute("PRAGMA foreign_keys=ON")
        _migrate(conn, path)
    except BaseException as e:
        if conn is not None:
            conn.close()
        if isinstance(e, (sqlite3.Error, UnicodeError)):  # a damaged file: text that is not UTF-8
            hint = ""
            if "unable to open" in str(e):  # SQLite's own words say neither which file nor why
                hint = (f" (WAL needs {sidecar(path, '-wal').name} and {sidecar(path, '-shm').name} beside it: "
                        f"is {path.parent} writable, and are they plain files?)")
            raise StoreError(f"cannot open memory store {path}: {e}{hint}") from e
        raise
    for suffix in ("-wal", "-shm"):
        secure(sidecar(path, suffix))
    return conn


def _wal(conn: sqlite3.Connection) -> str:
    """Switch ``conn`` to WAL and return the journal mode now in force.

    The switch needs the file to itself and SQLite answers "database is locked" at once
    rather than waiting out the busy timeout: two processes opening a new store together
    had one fail (1 run in ~6 of ``test_two_processes_writing_at_once_keep_every_entry``).
    So it is retried until the same timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            return conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    conn.execute("BEGIN IMMEDIATE")  # two processes opening a new file at once: one creates it
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"memory store {path} has schema version {version}; this mlotspark "
                f"reads up to {SCHEMA_VERSION}: upgrade mlotspark (the file is left as is)"
            )
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in _MIGRATIONS[target]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version={target}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def default_path() -> Path:
    """``$MLOTSPARK_HOME/memory/semantic.db`` (the directory created 0700)."""
    directory = subdir("memory")
    secure(directory, 0o700)  # ours: tighten it even if something made it 0755
    return directory / "semantic.db"


F = TypeVar("F", bound=Callable[..., Any])


def guarded(method: F) -> F:
    """Serialise threads, refuse a closed store, turn SQLite errors into StoreError."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._conn is None:
                raise StoreError(f"memory store {self.path} is closed")
            try:
                return method(self, *args, **kwargs)
            except (OptionError, StoreError):
                raise
            except (sqlite3.Error, UnicodeError, ValueError) as e:
                # A damaged file can hold text that is not UTF-8 or JSON that does not parse.
                raise StoreError(f"memory store {self.path}: {type(e).__name__}: {e}") from e

    return wrapper  # type: ignore[return-value]

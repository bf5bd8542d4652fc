# Past 500 lines on purpose: these methods share the store's connection, lock and vector cache.
"""``SemanticStore``: the semantic tier on disk: it applies operations, searches, lists and keeps
history, and reads no language (what a turn changes is a writer's: ``writer.py``).

Here are the methods that share the store's connection, lock and vector cache; the schema is
``database.py``, scoring and the prompt's choice ``search.py`` (per embedder: ``calibration.py``),
duplicates ``duplicates.py``, export and import ``transfer.py``, re-embedding ``reembed.py``
(vectors of one embedder are never compared with another's). Writes are single ``BEGIN
IMMEDIATE`` transactions; ``FileLock`` serialises imports and exports between processes.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from mlotspark import steps
from mlotspark.errors import OptionError
from mlotspark.storage import FileLock
from mlotspark.options import check_text
from mlotspark.memory.semantic.database import SCHEMA_VERSION, default_path, guarded as _guarded, open_database, sidecar
from mlotspark.memory.semantic.calibration import Calibration, calibration_for
from mlotspark.memory.semantic.duplicates import duplicate_of
from mlotspark.models.embedders import Embedder, checked_embed
from mlotspark.memory.semantic.history import mark_superseded, revive, said_again, successors, superseded_ids
from mlotspark.memory.semantic.learning import Learned
from mlotspark.memory.semantic.writer import Operation
from mlotspark.memory.semantic.index import VectorIndex
from mlotspark.models.embedders import default_embedder
from mlotspark.memory.semantic.reembed import insert_vector, load_vectors, reembed_missing
from mlotspark.memory.semantic.prompt import MEMORY_HEADER, approx_tokens, format_memory_section
from mlotspark.memory.semantic.records import (
    ENTRY_COLUMNS,
    Entry,
    Hit,
    NewEntry,
    check_entry,
    check_int,
    check_unit,
    entry_from_row,
)
from mlotspark.memory.semantic.search import DEFAULT_THRESHOLD, choose_for_prompt, newest_of_alike, search_entries  # noqa: F401
from mlotspark.memory.semantic.text import dedupe_key
from mlotspark.memory.semantic.transfer import embed_import, export_entries, not_own_file, read_import, restore_marks


@dataclass(frozen=True)
class Told:
    """What remembering one text changed (``SemanticStore.tell``)."""

    id: int  # the entry: a new one, or the duplicate the text matched
    new: bool
    current_again: bool  # a superseded duplicate, current again (said again after an update)
    superseded: tuple[int, ...]  # entries this telling marked superseded


class SemanticStore:
    """Text entries that last across conversations, found by words and by meaning.

    Safe to share between threads (one lock) and between processes (SQLite WAL,
    ``BEGIN IMMEDIATE``, ``busy_timeout``). Usable as a context manager.

    Args:
        path: the database file; default ``$MLOTSPARK_HOME/memory/semantic.db``.
            Created 0600 (its -wal/-shm files too), a new directory 0700.
        embedder: vectors for similarity; default ``default_embedder()``: MiniLM
            when ``all-minilm-l6-v2`` is pulled, else ``HashingEmbedder()``.
        reembed: on open, embed entries that have no vector from ``embedder``
            (written under another embedder); if False they are found by words
            only until ``reembed()`` is called.
        near_duplicate: cosine at or above which a new text with the same numbers
            and negations as an existing entry counts as a duplicate (default
            0.95); None keeps only exact (case/punctuation-insensitive) dedupe.

    Attributes:
        clock: the time ``remember`` gives new entries (default ``time.time``);
            replaying past conversations (a benchmark's simulated days) sets it.

    Raises:
        StoreError: the file cannot be opened, is not a memory store, was written
            by a newer schema, or this Python's SQLite lacks FTS5.
    """

    def __init__(
        self,
        path: Path | None = None,
        embedder: Embedder | None = None,
        *,
        reembed: bool = True,
        near_duplicate: float | None = 0.95,
    ):
        self.path = Path(path).expanduser() if path is not None else default_path()
        self.embedder: Embedder = embedder if embedder is not None else default_embedder()
        if not isinstance(self.embedder, Embedder):
            raise OptionError(f"invalid embedder {embedder!r}: needs name, dim and embed(texts)")
        self.calibration: Calibration = calibration_for(self.embedder.name)
        self.near_duplicate = None if near_duplicate is None else check_unit(near_duplicate, "near_duplicate")
        self._lock = threading.RLock()
        self._file_lock = FileLock(sidecar(self.path, ".lock"))
        self._index: VectorIndex | None = None
        self._index_version: int | None = None
        self._searches = self._hits = self._deduplicated = self._superseded = 0
        self._last_retrieval: list[int] = []
        self.clock: Callable[[], float] = time.time
        self._conn: sqlite3.Connection | None = open_database(self.path)
        if reembed:
            try:
                self.reembed()
            except BaseException:
                self.close()
                raise

    # -- transactions and the vector cache ----------------------------------------------

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; the vector cache is dropped if it does not commit."""
        conn = self._conn
        assert conn is not None
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            self._index = None
            raise

    def _vectors(self) -> VectorIndex:
        """The current embedder's vectors, reloaded when another connection committed."""
        conn = self._conn
        assert conn is not None
        # data_version moves on other connections' commits only; ours update the index.
        version = conn.execute("PRAGMA data_version").fetchone()[0]
        if self._index is None or version != self._index_version:
            self._index = load_vectors(conn, self.embedder)
            self._index_version = version
        return self._index

    # -- writing ----------------------------------------------------------------------------

    def _duplicate_of(self, conn: sqlite3.Connection, text: str, vec: np.ndarray) -> int | None:
        return duplicate_of(conn, self._vectors(), text, vec, self.near_duplicate)

    def _insert(self, conn: sqlite3.Connection, new: NewEntry, vec: np.ndarray, told: bool = True) -> Told:
        """Insert unless a duplicate exists, inside ``_write``; says what it did.

        ``told``: the user says it now (``remember``), so a superseded duplicate is current
        again; an import adds entries without re-ordering what the store knows.
        """
        existing = self._duplicate_of(conn, new.text, vec)
        if existing is not None:
            said_again(conn, existing, new)
            marked = self._current_again(conn, existing, new) if told else None
            return Told(existing, False, marked is not None, tuple(marked or ()))
        cur = conn.execute(
            "INSERT INTO entries (text, key, source, conversation, meta, created) VALUES (?, ?, ?, ?, ?, ?)",
            (new.text, dedupe_key(new.text), new.source, new.conversation, new.meta_json, new.created),
        )
        entry_id = int(cur.lastrowid)
        insert_vector(conn, entry_id, self.embedder, vec)
        self._vectors().add(entry_id, vec)  # rolled back with the cache if the commit fails
        return Told(entry_id, True, False, ())

    def _current_again(self, conn: sqlite3.Connection, entry_id: int, new: NewEntry) -> list[int] | None:
        """A superseded fact said again is the newest word on its slot: "I live in Utrecht."
        after "I moved to Porto." (which had superseded it) makes Utrecht current and marks
        Porto superseded by it, as a new text saying so would have. Returns the entries it
        marked, or None when ``entry_id`` was current (nothing changed)."""
        if entry_id not in superseded_ids(conn):
            return None
        latest = successors(conn).get(entry_id)
        conn.execute("UPDATE entries SET superseded_by = NULL, superseded = NULL WHERE id = ?", (entry_id,))
        if latest is None or latest == entry_id:
            return []
        mark_superseded(conn, [latest], entry_id, new.created)
        self._superseded += 1
        return [latest]

    def embed(self, texts: list[str] | tuple[str, ...]) -> np.ndarray:
        """Sentence vectors of ``texts`` from this store's encoder (MiniLM when pulled, else word
        hashing): a float32 array (N, dim), rows L2-normalised.

        Raises:
            OptionError: a text that is not a string or not valid Unicode.
        """
        return self.embedder.embed([check_text(t, "input") for t in texts])

    def remember(
        self,
        text: str,
        *,
        source: str = "user",
        conversation: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> int:
        """Store ``text``, unless it duplicates an entry (then that entry is said again: dated anew).

        Which of two entries about the same thing is current is decided when a question
        is asked (``search.newest_of_alike``), or marked by a writer's ``supersede``.

        Args:
            text: the fact, at most ``records.MAX_TEXT_CHARS`` characters (stripped).
            source: who stated it (default "user"; the engine uses "turn").
            conversation: the conversation it came from, if any.
            meta: JSON-serialisable dict kept with the entry.

        Returns:
            The new entry's id, or the existing entry's id when ``text`` is an exact
            (ignoring case, punctuation, spacing) or near duplicate.

        Raises:
            OptionError: bad text, source, conversation or meta (the value is named).
        """
        return self.tell(text, source=source, conversation=conversation, meta=meta).id

    @_guarded
    def tell(
        self,
        text: str,
        *,
        source: str = "user",
        conversation: str | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Told:
        """``remember``, saying what it changed (for ``memory add`` and the chat's /remember).

        Returns:
            A ``Told``: the entry's id, whether it is new, whether a superseded duplicate
            became current again, and the entries marked superseded now.
        """
        new = check_entry(text, source, conversation, meta, self.clock())
        vec = checked_embed(self.embedder, [new.text])[0]
        with self._write() as conn:
            told = self._insert(conn, new, vec)
        self._deduplicated += not told.new
        return told

    @_guarded
    def forget(self, entry_id: int) -> bool:
        """Delete an entry, its vectors and its index terms.

        Entries it had superseded become current again: forgetting "I moved to
        Porto." undoes that update, and "I live in Utrecht." is found again.

        Args:
            entry_id: the entry's id.

        Returns:
            True if it existed; False for an unknown id (forgetting twice is harmless).
        """
        return self._delete(check_int(entry_id, "memory id"), revive_older=True)

    def _delete(self, entry_id: int, revive_older: bool) -> bool:
        with self._write() as conn:
            conn.execute("DELETE FROM vectors WHERE entry_id = ?", (entry_id,))
            deleted = conn.execute("DELETE FROM entries WHERE id = ?", (entry_id,)).rowcount > 0
            if revive_older:
                revive(conn, entry_id)
        if self._index is not None:
            self._index.remove(entry_id)
        return deleted

    @_guarded
    def apply(self, operations: list[Operation], *, source: str = "turn", conversation: str | None = None) -> Learned:
        """Apply a writer's operations (``writer.py``): deletions first, then additions and
        supersessions, each in its own transaction.

        Args:
            operations: what the writer proposed; ids that no longer exist are skipped.
            source: kept with new entries.
            conversation: the conversation they came from.

        Returns:
            What changed (``learning.Learned``).
        """
        out = Learned()
        for op in operations:
            if op.kind == "delete":
                for i in op.ids:
                    entry = self.get(i)
                    if entry is not None and self._delete(i, revive_older=False):
                        out.forgotten.append(entry)
            elif op.kind == "none" and op.explicit:
                out.not_forgotten += 1
        for op in operations:
            if op.kind not in ("add", "supersede"):
                continue
            try:
                told = self.tell(op.text, source=source, conversation=conversation)
            except OptionError:  # too long, or empty: an explicit request says so
                out.not_remembered += op.explicit
                continue
            out.remembered.append(told.id)
            out.updated += told.superseded
            older = [i for i in op.ids if i != told.id and self.get(i) is not None] if op.kind == "supersede" else []
            if older:
                with self._write() as conn:
                    mark_superseded(conn, older, told.id, self.clock())
                self._superseded += len(older)
                out.updated += older
        return out

    @_guarded
    def reembed(self, batch: int = 64) -> int:
        """Give every entry a vector from the current embedder.

        Entries written under another embedder (or with a damaged blob) have none;
        until they get one, search finds them by words only. Other embedders'
        vectors are kept, so switching back costs nothing.

        Args:
            batch: entries embedded per transaction (default 64: progress moves every few seconds).

        Returns:
            How many entries were embedded.
        """
        batch = check_int(batch, "batch", 1)
        conn = self._conn
        assert conn is not None
        done = reembed_missing(conn, self._write, self.embedder, batch)
        if done:
            self._index = None  # reloaded with the new vectors at the next search
        return done

    # -- reading ----------------------------------------------------------------------------

    @_guarded
    def get(self, entry_id: int) -> Entry | None:
        """One entry by id.

        Args:
            entry_id: the entry's id.

        Returns:
            The entry, or None if there is none with that id.
        """
        entry_id = check_int(entry_id, "memory id")
        row = self._conn.execute(  # type: ignore[union-attr]
            f"SELECT {ENTRY_COLUMNS} FROM entries WHERE id = ?", (entry_id,)
        ).fetchone()
        return None if row is None else entry_from_row(row)

    @_guarded
    def list(self, limit: int | None = None, *, current_only: bool = False) -> list[Entry]:
        """Entries, newest first, superseded ones included (``Entry.superseded_by``) unless ``current_only``.

        Args:
            limit: at most this many (default: all).
            current_only: leave out superseded entries.

        Returns:
            The entries.
        """
        limit = -1 if limit is None else check_int(limit, "limit")
        where = "WHERE superseded_by IS NULL " if current_only else ""
        rows = self._conn.execute(  # type: ignore[union-attr]
            f"SELECT {ENTRY_COLUMNS} FROM entries {where}ORDER BY id DESC LIMIT ?", (limit,)
        ).fetchall()
        return [entry_from_row(r) for r in rows]

    @_guarded
    def superseded_by(self, entry_id: int) -> list[Entry]:
        """The older entries that ``entry_id`` replaced (``Entry.superseded_by == entry_id``)."""
        entry_id = check_int(entry_id, "memory id")
        rows = self._conn.execute(  # type: ignore[union-attr]
            f"SELECT {ENTRY_COLUMNS} FROM entries WHERE superseded_by = ? ORDER BY id", (entry_id,)
        ).fetchall()
        return [entry_from_row(r) for r in rows]

    @_guarded
    def __len__(self) -> int:
        return int(self._conn.execute("SELECT count(*) FROM entries").fetchone()[0])  # type: ignore[union-attr]

    def _search(self, query: str, k: int, threshold: float, current_only: bool = True) -> list[Hit]:
        conn = self._conn
        assert conn is not None
        replaced = successors(conn) if current_only else {}
        return search_entries(conn, self.embedder, self.calibration, self._vectors, query, k, threshold, replaced)

    @_guarded
    def search(self, query: str, k: int = 5, threshold: float = 0.0) -> list[Hit]:
        """Current entries relevant to ``query``, best first (score: ``search.py``; superseded ones left out).

        Any text is a valid query: its words are quoted before they reach FTS5, so
        quotes, ``*``, ``AND``/``OR``/``NOT``, ``NEAR`` or parentheses never raise.

        Args:
            query: free text, e.g. the user's message.
            k: at most this many hits (default 5).
            threshold: minimum score in [0, 1] (default 0: anything sharing a
                word or a word piece with the query).

        Returns:
            Hits sorted by score, newest first on ties.
        """
        k = check_int(k, "k")
        threshold = check_unit(threshold, "threshold")
        hits = self._search(query, k, threshold)
        self._searches += 1
        self._hits += bool(hits)
        return hits

    @_guarded
    def retrieve_for_prompt(
        self,
        query: str,
        *,
        top_k: int = 3,
        threshold: float | None = None,
        token_budget: int = 200,
        count_tokens: Callable[[str], int] | None = None,
        header: str = MEMORY_HEADER,
    ) -> list[Hit]:
        """The entries to put into the prompt at the start of a turn.

        Takes hits in score order while the whole section (``format_memory_section``
        of the chosen hits, header included, with their days when ``query`` asks when)
        stays within ``token_budget``; a hit
        that does not fit is skipped and a shorter one after it may still fit; an older hit gives way
        to a newer one that replaces it (``search.newest_of_alike``). The chosen ids become ``stats()["last_retrieval"]``.

        Args:
            query: the user's new message.
            top_k: at most this many entries (default 3); only those within the
                calibration's margin of the best one (MiniLM: 0.05).
            threshold: minimum score; default: the embedder's calibration for this
                query (hashing: 0.35; MiniLM: 0.34 about the user, else 0.55).
            token_budget: most tokens the section may take (default 200).
            count_tokens: the model tokenizer's counter; default ``approx_tokens``.
            header: the section's first line, counted in the budget.

        Returns:
            The chosen hits, best first; pass them to ``format_memory_section``.
        """
        top_k = check_int(top_k, "top_k")
        check_text(query, "memory query")
        threshold = self.threshold_for(query) if threshold is None else check_unit(threshold, "threshold")
        token_budget = check_int(token_budget, "token_budget")
        count = count_tokens or approx_tokens
        # Candidates a little under the threshold too: a newer entry about the same thing may
        # score lower than the older one it replaces, and takes its score when it does.
        hits = self._search(query, 3 * top_k, max(0.0, threshold - max(0.0, self.calibration.newer_gap))) if top_k else []
        vecs = self._vectors().vectors_of([h.id for h in hits]) if len(hits) > 1 else {}
        alike = newest_of_alike(hits, lambda a, b: float(vecs[a] @ vecs[b]) if a in vecs and b in vecs else 0.0,
                                self.calibration)
        alike = [h for h in alike if h.score >= threshold]
        chosen = choose_for_prompt(alike, top_k, self.calibration.margin, token_budget, count, header)
        self._searches += 1
        self._hits += bool(chosen)
        self._last_retrieval = [h.id for h in chosen]
        return chosen

    def threshold_for(self, query: str) -> float:
        """The score an entry needs to be injected for ``query`` (``Calibration.threshold``)."""
        return self.calibration.threshold(query)

    format_memory_section = staticmethod(format_memory_section)

    # -- export / import ----------------------------------------------------------------------

    @_guarded
    def export_json(self, path: Path) -> int:
        """Write every entry to a JSON file (atomically, mode 0600).

        Vectors are not exported: they belong to an embedder and are rebuilt on import.

        Args:
            path: the file to write (replaced if it exists).

        Returns:
            How many entries were written.
        """
        path = not_own_file(self.path, path, "export to")
        conn = self._conn
        assert conn is not None
        with self._file_lock:
            return export_entries(conn, path)

    @_guarded
    def import_json(self, path: Path) -> int:
        """Add the entries of a file written by ``export_json`` (or a JSON list of strings).

        All or nothing: the file is checked first and added in one transaction.
        Duplicates of existing entries, and within the file, are skipped. Superseded
        marks in the file are kept (``transfer.restore_marks``). Progress is reported as
        ``mlotspark.steps`` (embedding, then adding).

        Args:
            path: the file to read.

        Returns:
            How many entries were added.

        Raises:
            StoreError: missing file, bad JSON, or a bad entry (its index is named);
                nothing is added then.
        """
        path = not_own_file(self.path, path, "import from")
        with self._file_lock:
            items = read_import(path)
            n = len(items)
            vecs = embed_import(self.embedder, items, path.name)
            added, ids = 0, []
            with steps.step(f"adding {n} entries from {path.name}", total=n, unit="entries") as s, \
                    self._write() as conn:
                for new, vec in zip(items, vecs):
                    done = self._insert(conn, new, vec, told=False)
                    ids.append(done.id)
                    added += done.new
                    s.advance()
                restore_marks(conn, items, ids)  # the file's history, whatever the rules made of it
        self._deduplicated += n - added
        return added

    # -- stats and lifetime ------------------------------------------------------------------

    @_guarded
    def stats(self) -> dict[str, Any]:
        """Counters for the UI and for a turn's stats.

        Returns:
            ``entries``; ``bytes`` (database + WAL + shared memory on disk);
            ``searches`` and ``hits`` (searches and retrievals by this object, and
            how many found at least one entry) and ``hit_rate``; ``last_retrieval``
            (ids put into the last prompt); ``deduplicated`` (remembers and imports
            that matched an existing entry); ``embedder``; ``stale_vectors``
            (entries without a vector from it); ``superseded`` (entries replaced by a
            newer one, kept) and ``superseded_now`` (marked by this object);
            ``schema_version``; ``path``.
        """
        conn = self._conn
        assert conn is not None
        entries = int(conn.execute("SELECT count(*) FROM entries").fetchone()[0])
        files = [sidecar(self.path, s) for s in ("", "-wal", "-shm")]
        return {
            "entries": entries,
            "bytes": sum(p.stat().st_size for p in files if p.exists()),
            "searches": self._searches,
            "hits": self._hits,
            "hit_rate": self._hits / self._searches if self._searches else 0.0,
            "last_retrieval": list(self._last_retrieval),
            "deduplicated": self._deduplicated,
            "embedder": self.embedder.name,
            "stale_vectors": max(0, entries - len(self._vectors())),
            "superseded": len(superseded_ids(conn)),
            "superseded_now": self._superseded,
            "schema_version": SCHEMA_VERSION,
            "path": str(self.path),
        }

    def close(self) -> None:
        """Close the database (idempotent)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                self._index = None

    def __enter__(self) -> "SemanticStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SemanticStore({str(self.path)!r}, embedder={self.embedder.name!r})"

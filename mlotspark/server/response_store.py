"""Stored responses of ``/v1/responses`` and the KV snapshots of their chains, on disk.

A stored response is one JSON record, ``responses/records/<id>.json`` under the
server's home: the response object ``GET`` returns, the chat messages its turn added
(input and reply) and the id of the response it continued. A chain of
``previous_response_id`` links is a persistent conversation: after each turn the KV of
everything the model consumed is saved as a snapshot
(:class:`~mlotspark.memory.snapshots.SnapshotStore`, ``responses/kv/<model>/<chain>/``),
a turn that continues the chain's last turn appends only its new tokens, and the next
turn restores it and prefills only what it adds, even after a restart. A turn that
forks from an earlier response starts a chain of its own (the restored KV is cut to
the prefix both share), so no branch overwrites another's snapshot.

Snapshots keep within ``budget_bytes`` on disk, all models together: past it the least
recently updated chains' snapshots are dropped first (their records stay; their next
turn prefills cold). Every write is atomic (``storage.atomic_path``: temp file, fsync,
rename) and runs on one writer thread, in order; a caller awaits its own write before
it answers, so a response the client has seen survives a crash.

Snapshot work that reads MLX arrays (``ChainKV.take``, ``ChainKV.keep``) runs on the
engine thread, as the runner calls it; file writes run on the writer thread.
"""

from __future__ import annotations

import concurrent.futures
import logging
import re
import secrets
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from mlotspark.errors import OptionError, SnapshotError, StoreError
from mlotspark.memory.kv_state import cache_kind, trim_to
from mlotspark.memory.snapshots import SnapshotStore, common_prefix
from mlotspark.storage import check_no_symlinks, ensure_dir, home, read_json, safe_name, write_json

log = logging.getLogger(__name__)

DEFAULT_STORE_BUDGET = 4 << 30  # bytes of KV snapshots (4GB): ~170k tokens of Qwen2.5-0.5B's float32 KV
MAX_CHAIN = 100_000  # links followed back from a previous_response_id (a guard against loops)
_ID = re.compile(r"^resp_[0-9a-f]{8,64}$")


def new_response_id() -> str:
    return "resp_" + secrets.token_hex(24)


@dataclass
class Record:
    """One stored response.

    Attributes:
        id: ``resp_...``.
        response: the response object, as ``GET`` returns it.
        messages: chat messages this turn added before the reply (instructions left out:
            a later turn gives its own).
        reply: the reply as chat messages (an assistant message, with ``tool_calls``).
        previous: the response this one continued, or None.
        chain: the snapshot directory name of its chain.
    """

    id: str
    response: dict
    messages: list[dict]
    reply: list[dict]
    previous: str | None = None
    chain: str = ""

    def to_json(self) -> dict:
        return {"id": self.id, "response": self.response, "messages": self.messages, "reply": self.reply,
                "previous": self.previous, "chain": self.chain}

    @classmethod
    def from_json(cls, doc: Any) -> "Record":
        if not isinstance(doc, dict) or not isinstance(doc.get("id"), str) or not isinstance(doc.get("response"), dict):
            raise StoreError("not a stored response")
        return cls(doc["id"], doc["response"], list(doc.get("messages") or []), list(doc.get("reply") or []),
                   doc.get("previous"), str(doc.get("chain") or ""))


class ResponseStore:
    """Stored responses and their chains' KV snapshots (see the module docstring).

    Args:
        directory: where they live (default ``$MLOTSPARK_HOME/responses``, made on first use).
        budget_bytes: disk the KV snapshots may take, all chains together (0 = keep none).
    """

    def __init__(self, directory: Path | None = None, budget_bytes: int = DEFAULT_STORE_BUDGET):
        if budget_bytes < 0:
            raise OptionError(f"invalid store budget {budget_bytes}: use bytes >= 0")
        self._directory = Path(directory) if directory is not None else None
        self.budget_bytes = int(budget_bytes)
        self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mlotspark-responses")
        self._lock = threading.Lock()
        self._sizes: dict[Path, tuple[int, float]] | None = None  # chain dir -> (bytes, updated)
        self.evicted = 0

    # ------------------------------------------------------------- places
    @property
    def base(self) -> Path:
        """The store's directory (not made here)."""
        if self._directory is None:
            self._directory = home() / "responses"
        return self._directory

    @property
    def root(self) -> Path:
        """The store's directory, made (0700) when missing."""
        return ensure_dir(self.base)

    def _record_path(self, rid: str) -> Path:
        if not isinstance(rid, str) or not _ID.match(rid):
            raise KeyError(rid)
        return self.root / "records" / f"{rid}.json"

    def chain_dir(self, engine: Any, chain: str) -> Path:
        """The snapshot directory of ``chain`` for ``engine``'s model and weight format."""
        loaded = engine.loaded
        model = safe_name(f"{loaded.fingerprint}-{loaded.weights}"[-120:].lstrip("-_. "), "model id")
        return self.root / "kv" / model / safe_name(chain, "chain")

    # ------------------------------------------------------------- records
    def get(self, rid: str) -> Record | None:
        """The stored response ``rid``, or None (unknown, deleted or unreadable)."""
        try:
            doc = read_json(self._record_path(rid))
        except (KeyError, StoreError):
            return None
        try:
            return None if doc is None else Record.from_json(doc)
        except StoreError:
            return None

    def history(self, rid: str) -> tuple[list[Record], str | None]:
        """The records of the chain that ends at ``rid``, oldest first.

        Returns:
            (records, None), or ([], why) when a link is missing.
        """
        out: list[Record] = []
        at: str | None = rid
        while at is not None:
            rec = self.get(at)
            if rec is None:
                why = "not found" if at == rid else f"its chain is broken: the earlier response {at} was deleted"
                return [], why
            out.append(rec)
            at = rec.previous
            if len(out) > MAX_CHAIN:
                return [], f"its chain is longer than {MAX_CHAIN} responses"
        out.reverse()
        return out, None

    def put(self, record: Record) -> concurrent.futures.Future:
        """Write ``record`` atomically on the writer thread (await the future before answering)."""
        doc = record.to_json()
        return self._writer.submit(lambda: write_json(self._record_path(record.id), doc))

    def delete(self, rid: str) -> bool:
        """Remove a stored response and its chain's KV snapshot (the snapshot holds its tokens:
        a deleted conversation leaves none of its text behind). Earlier responses of the
        chain stay; their next turn prefills cold.

        Returns:
            False when there was no such response.
        """
        rec = self.get(rid)
        if rec is None:
            return False

        def work() -> None:
            path = self._record_path(rid)
            check_no_symlinks(path)
            path.unlink(missing_ok=True)
            kv = self.root / "kv"
            if rec.chain and kv.is_dir():
                for d in kv.glob(f"*/{safe_name(rec.chain, 'chain')}"):  # the chain under every model
                    self._drop(d)

        self._writer.submit(work).result()
        return True

    # ------------------------------------------------------------- snapshots
    def write_snapshot(self, directory: Path, pending: Any, tokens: Sequence[int], engine: Any) -> concurrent.futures.Future:
        """Write a prepared snapshot (``SnapshotStore.prepare``) on the writer thread, then keep
        the budget; the future ends when both are done."""
        loaded = engine.loaded

        def work() -> None:
            store = SnapshotStore(directory)
            try:
                meta = store.write(pending.state, tokens, pending.keep, fingerprint=loaded.fingerprint,
                                   weights=loaded.weights, model=str(getattr(engine, "model_name", "")))
            except (SnapshotError, StoreError) as e:
                log.warning("responses: snapshot not saved in %s: %s", directory, e)
                return
            with self._lock:
                sizes = self._scan()
                sizes[directory] = (store.nbytes(), meta.updated)
            self._keep_budget()

        return self._writer.submit(work)

    def _scan(self) -> dict[Path, tuple[int, float]]:
        """Bytes and last update of every chain's snapshot on disk (read once, then kept up to date)."""
        if self._sizes is None:
            sizes: dict[Path, tuple[int, float]] = {}
            kv = self.base / "kv"
            for d in (kv.glob("*/*") if kv.is_dir() else ()):
                store = SnapshotStore(d)
                try:
                    meta = store.read_meta()
                except SnapshotError:
                    meta = None
                sizes[d] = (store.nbytes(), meta.updated if meta is not None else 0.0)
            self._sizes = sizes
        return self._sizes

    def _keep_budget(self) -> None:
        with self._lock:
            sizes = self._scan()
            total = sum(b for b, _ in sizes.values())
            victims = []
            for d, (b, _) in sorted(sizes.items(), key=lambda kv: kv[1][1]):  # oldest first
                if total <= self.budget_bytes:
                    break
                victims.append(d)
                total -= b
        for d in victims:
            self._drop(d)
            self.evicted += 1

    def _drop(self, directory: Path) -> None:
        try:
            SnapshotStore(directory).delete()
        except StoreError as e:
            log.warning("responses: %s", e)
            shutil.rmtree(directory, ignore_errors=True)
        with self._lock:
            if self._sizes is not None:
                self._sizes.pop(directory, None)

    def stats(self) -> dict[str, Any]:
        """Snapshot bytes on disk, chains, the budget, snapshots dropped for it (for /health)."""
        with self._lock:
            sizes = dict(self._scan())
        return {"snapshot_bytes": sum(b for b, _ in sizes.values()), "chains": len(sizes),
                "budget_bytes": self.budget_bytes, "evicted": self.evicted}

    def flush(self) -> None:
        """Wait for every write submitted so far."""
        self._writer.submit(lambda: None).result()

    def close(self) -> None:
        self._writer.shutdown(wait=True)


@dataclass
class ChainKV:
    """One request's KV source and sink in a stored chain (what the runner's ``kv`` hook calls).

    ``take`` restores the snapshot of ``source`` (the previous response's chain) cut to
    the prefix the new prompt shares with it; ``keep`` saves the turn's KV into the same
    chain when this turn continues its last one (the snapshot keeps its segments up to
    the shared prefix), else into ``chain`` (a fork, or a new chain). Both run on the
    engine thread.

    Attributes:
        saving: the snapshot write in flight after ``keep`` (await it before answering).
    """

    store: ResponseStore
    engine: Any
    chain: str  # this turn's own chain, when it does not continue ``source``
    source: str | None = None  # the previous response's chain
    #: The previous response's (prompt tokens, prompt + reply tokens): the source snapshot ends
    #: within that span while the previous response is its chain's last turn.
    span: tuple[int, int] | None = None
    save: bool = True  # False for a response not stored: its KV would change no later turn
    continues: bool = False
    saving: concurrent.futures.Future | None = None
    restored: int = 0
    errors: list[str] = field(default_factory=list)

    def take(self, ids: Sequence[int], options: Any, beyond: int = 0) -> tuple[list | None, int]:
        """[engine thread] A cache holding the longest prefix of ``ids`` the source chain's
        snapshot covers, when it covers more than ``beyond`` tokens (what the prompt cache
        already found); else (None, 0). At least the last prompt token is left to run."""
        if not self.source or self.store.budget_bytes == 0:
            return None, 0
        try:
            return self._take(ids, options, beyond)
        except Exception as e:  # noqa: BLE001  a snapshot that cannot be read (evicted meanwhile, a
            # read-only home, a corrupt file) is a miss: the turn prefills its whole prompt
            log.warning("responses: chain %s's snapshot not used: %s", self.source, e)
            self.errors.append(str(e))
            return None, 0

    def _take(self, ids: Sequence[int], options: Any, beyond: int) -> tuple[list | None, int]:
        snap = SnapshotStore(self.store.chain_dir(self.engine, self.source or ""))
        meta = snap.read_meta()
        if meta is None:
            return None, 0
        shared = common_prefix(meta.tokens, ids)
        # A reply re-rendered by the template may tokenize otherwise than it was generated: the
        # turn still continues the chain when it shares all before the previous reply, and that
        # reply is the chain's last (a fork from an earlier turn starts a chain of its own).
        last = self.span is not None and self.span[0] <= len(meta.tokens) <= self.span[1]
        self.continues = shared == len(meta.tokens) or (last and shared >= self.span[0])
        cascade = self.engine.caches.cascade_for(len(ids), options)
        upto = min(shared, len(ids) - 1)
        if cascade is not None and cascade.routing == "question":
            upto = min(upto, len(ids) - 1 - cascade.question_pass)
        if upto <= beyond or upto < 1:
            return None, 0
        loaded = self.engine.loaded
        _, cache = snap.load(fingerprint=loaded.fingerprint, weights=loaded.weights,
                             kind="kv" if cascade is None else "cascade", cascade=cascade)
        if not trim_to(cache, upto):
            return None, 0
        self.restored = upto
        return cache, upto

    def keep(self, tokens: Sequence[int], cache: list) -> None:
        """[engine thread] Capture the turn's KV (only what the chain's snapshot lacks) and
        hand the write to the writer thread."""
        if not self.save or self.store.budget_bytes == 0 or not cache:
            return
        name = self.source if self.continues and self.source else self.chain
        self.chain = name
        loaded = self.engine.loaded
        try:
            directory = self.store.chain_dir(self.engine, name)
            if cache_kind(cache) not in ("kv", "cascade"):
                return
            pending = SnapshotStore(directory).prepare(cache, tokens, fingerprint=loaded.fingerprint,
                                                       weights=loaded.weights)
        except Exception as e:  # noqa: BLE001  a snapshot not taken must not fail the reply
            # Some caches cannot be saved (a sliding window's): each turn of such a model says so.
            log.info("responses: snapshot not taken: %s", e)
            return
        self.saving = self.store.write_snapshot(directory, pending, list(tokens), self.engine)


__all__ = ["ChainKV", "DEFAULT_STORE_BUDGET", "Record", "ResponseStore", "new_response_id"]

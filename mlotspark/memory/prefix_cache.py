"""The prefix cache: token prefix -> KV state, shared across conversations (DESIGN §4).

Every new conversation starts with the same system prompt; its KV is computed once
and copied into each new conversation's cache, so a first turn prefills only the
user's message. Entries live in unified memory under a byte budget.

Eviction is LFU with dynamic aging (LFU-DA), i.e. LRU weighted by frequency: an
entry's priority is ``L + hits`` where ``L`` is the priority of the last entry
evicted; the lowest priority goes first (least recently used first on ties). A
prefix used by every conversation stays; one used once ages out as newer entries
raise ``L``, however recent it was when it was added.

A lookup matches the longest common prefix with any entry, not only whole
entries: a system prompt followed by a memory section shares all but the last
token or so with the bare system prompt's entry, and a ``kv`` state is cut to the
shared part (a cascade entry is used only where it can be trimmed).

The most used entries are saved under ``$MLOTSPARK_HOME/prefix_cache/<model>/``
(one safetensors file per entry and ``index.json``, written atomically under a
file lock shared by processes) and preloaded at start-up.

Methods that take or return caches touch MLX: call them on the engine's thread.
``save`` only writes evaluated arrays, so the conversation writer runs it beside
that thread (``memory/writer.py``).
"""

from __future__ import annotations

import logging
import secrets
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from mlotspark.memory.cascade import CascadeConfig
from mlotspark.memory.kv_state import CacheState, evaluate, restore, state_of_prefix
from mlotspark.errors import OptionError, SnapshotError, StoreError
from mlotspark.memory.snapshots import SnapshotWarning, common_prefix, read_state, write_state
from mlotspark.storage import FileLock, ensure_dir, read_json, safe_name, write_json

log = logging.getLogger(__name__)

INDEX_FORMAT = "mlotspark-prefix-cache"
DEFAULT_BUDGET_MB = 256.0
MIN_TOKENS = 8  # shorter shared prefixes save less than the copy costs


@dataclass
class PrefixEntry:
    """One cached prefix."""

    tokens: tuple[int, ...]
    state: CacheState
    hits: int = 0
    priority: float = 0.0
    last_used: float = 0.0
    file: str | None = None  # its file on disk, once saved

    @property
    def nbytes(self) -> int:
        return self.state.nbytes


@dataclass
class PrefixHit:
    """A lookup result: ``tokens`` of ``entry`` match the prompt."""

    entry: PrefixEntry
    tokens: int


@dataclass
class PrefixCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    tokens_saved: int = 0  # prefill tokens the hits skipped
    loaded: int = 0  # entries preloaded from disk
    refused: int = 0  # disk entries refused (corrupt, other model)


class PrefixCache:
    """Token prefix -> KV state, LFU-DA under a byte budget.

    Args:
        budget_mb: memory the entries may hold (default 256).
        directory: where entries are saved and preloaded from (None = memory only).
        fingerprint, weights: the model's; saved entries of another model are never loaded.
        min_tokens: shortest prefix worth a hit (default ``MIN_TOKENS``).
        keep_on_disk: how many of the most used entries are saved (default 8).
    """

    def __init__(
        self,
        *,
        budget_mb: float = DEFAULT_BUDGET_MB,
        directory: Path | None = None,
        fingerprint: str = "",
        weights: str = "",
        min_tokens: int = MIN_TOKENS,
        keep_on_disk: int = 8,
    ):
        self.budget_bytes = _budget(budget_mb)
        self.directory = Path(directory) if directory is not None else None
        self.fingerprint, self.weights = fingerprint, weights
        self.min_tokens = max(1, int(min_tokens))
        self.keep_on_disk = max(0, int(keep_on_disk))
        self.entries: dict[tuple[int, ...], PrefixEntry] = {}
        self.counters = PrefixCounters()
        self._age = 0.0  # L of LFU-DA
        self._dirty = False

    # -- memory -------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries.values())

    def set_budget(self, budget_mb: float) -> None:
        """Change the byte budget (evicts at once if over it)."""
        self.budget_bytes = _budget(budget_mb)
        self._evict()

    def lookup(self, ids: Sequence[int], kind: str | None = None) -> PrefixHit | None:
        """The entry sharing the longest prefix with ``ids`` (at least ``min_tokens``).

        Args:
            ids: the prompt's token ids.
            kind: only entries of this cache kind (``kv`` / ``cascade``); None = any.

        Counts a miss when nothing matches; ``take`` gives the cache and counts the hit.
        """
        best: PrefixHit | None = None
        for entry in self.entries.values():
            if kind is not None and entry.state.kind != kind:
                continue
            n = common_prefix(entry.tokens, ids)
            if n >= self.min_tokens and (best is None or n > best.tokens):
                best = PrefixHit(entry, n)
        if best is None:
            self.counters.misses += 1
        return best

    def take(self, hit: PrefixHit, cascade: CascadeConfig | None = None) -> list | None:
        """A fresh cache holding the hit's tokens (the entry itself is untouched).

        Args:
            hit: what ``lookup`` found.
            cascade: the config a cascade entry continues with (``kv_state.restore``;
                None = the one it was kept with).

        Returns:
            The per-layer caches, or None when the entry cannot be cut to the
            match (a cascade entry matched partly) or ``cascade`` cannot continue
            it (other sinks or block size): counted as a miss then.
        """
        state = state_of_prefix(hit.entry.state, hit.tokens)
        try:
            cache = None if state is None else restore([state], cascade=cascade)
        except SnapshotError:
            if cascade is None:
                raise
            cache = None
        if cache is None:
            self.counters.misses += 1
            return None
        e = hit.entry
        e.hits += 1
        e.priority = self._age + e.hits
        e.last_used = time.time()
        self.counters.hits += 1
        self.counters.tokens_saved += hit.tokens
        self._dirty = True
        return cache

    def add(self, tokens: Sequence[int], state: CacheState) -> bool:
        """Keep ``state`` (a whole-sequence state of ``tokens``) as a prefix entry.

        Returns:
            False when it is too short, already cached, or larger than the budget.
        """
        key = tuple(int(t) for t in tokens)
        if len(key) < self.min_tokens or key in self.entries or state.start != 0 or state.end != len(key):
            return False
        if state.nbytes > self.budget_bytes:
            return False
        evaluate(state)
        self.entries[key] = PrefixEntry(key, state, hits=0, priority=self._age + 1, last_used=time.time())
        self._dirty = True
        self._evict(protect=key)
        return key in self.entries

    def covers(self, tokens: Sequence[int]) -> bool:
        """True when an entry already holds all of ``tokens`` as its prefix."""
        n = len(tokens)
        return any(len(k) >= n and k[:n] == tuple(tokens) for k in self.entries)

    def _evict(self, protect: tuple[int, ...] | None = None) -> None:
        while self.nbytes > self.budget_bytes and self.entries:
            victims = [e for k, e in self.entries.items() if k != protect] or list(self.entries.values())
            victim = min(victims, key=lambda e: (e.priority, e.last_used))
            self._age = victim.priority
            del self.entries[victim.tokens]
            self.counters.evictions += 1

    def clear(self) -> None:
        """Drop every entry from memory (files on disk stay)."""
        self.entries.clear()

    def stats(self) -> dict[str, Any]:
        """Entries, bytes, budget, hits, misses, hit rate, evictions, tokens saved."""
        c = self.counters
        looked = c.hits + c.misses
        return {
            "entries": len(self.entries),
            "bytes": self.nbytes,
            "budget_bytes": self.budget_bytes,
            "hits": c.hits,
            "misses": c.misses,
            "hit_rate": c.hits / looked if looked else 0.0,
            "evictions": c.evictions,
            "tokens_saved": c.tokens_saved,
            "loaded_from_disk": c.loaded,
            "refused_from_disk": c.refused,
            "disk_bytes": self.disk_bytes(),
        }

    # -- disk ---------------------------------------------------------------------
    def _lock(self) -> FileLock:
        assert self.directory is not None
        return FileLock(self.directory / ".lock")

    def _read_index(self) -> list[dict]:
        assert self.directory is not None
        try:
            doc = read_json(self.directory / "index.json", default=None)
        except StoreError as e:
            log.warning("prefix cache index unreadable, starting empty: %s", e)
            return []
        if not isinstance(doc, dict) or doc.get("format") != INDEX_FORMAT or doc.get("fingerprint") != self.fingerprint:
            return []
        items = doc.get("entries")
        return [it for it in items if _well_formed(it)] if isinstance(items, list) else []

    def save(self) -> None:
        """Save the ``keep_on_disk`` most used entries (merged with other processes')."""
        if self.directory is None or not self._dirty:
            return
        ensure_dir(self.directory)
        self._dirty = False  # before the copy: a change made meanwhile is saved next time
        entries = list(self.entries.items())  # the engine thread may add or evict meanwhile
        try:
            self._write(entries)
        except BaseException:
            self._dirty = True
            raise

    def _write(self, entries: list[tuple[tuple[int, ...], PrefixEntry]]) -> None:
        assert self.directory is not None
        with self._lock():
            disk = {tuple(it.get("tokens", ())): it for it in self._read_index()}
            for key, e in entries:
                it = disk.get(key)
                if it is None or not (self.directory / str(it.get("file", ""))).is_file():
                    e.file = e.file or f"prefix-{len(key)}-{secrets.token_hex(4)}.safetensors"
                    size, digest = write_state(self.directory / e.file, e.state)
                    it = {"file": e.file, "tokens": list(key), "bytes": size, "sha256": digest, "hits": 0,
                          "kind": e.state.kind, "config": e.state.config, "n_layers": len(e.state.layers),
                          "layer_meta": [m for _, m in e.state.layers] if e.state.kind != "kv" else []}
                else:
                    e.file = it["file"]
                it["hits"] = max(int(it.get("hits", 0)), e.hits)
                disk[key] = it
            keep = sorted(disk.values(), key=lambda it: -int(it.get("hits", 0)))[: self.keep_on_disk]
            write_json(self.directory / "index.json", {
                "format": INDEX_FORMAT, "version": 1, "fingerprint": self.fingerprint,
                "weights": self.weights, "entries": keep,
            })
            live = {str(it["file"]) for it in keep} | {"index.json", ".lock"}
            for p in self.directory.iterdir():
                if p.name not in live:
                    p.unlink(missing_ok=True)

    def load(self) -> int:
        """Preload saved entries, most used first, within the budget. Returns how many."""
        if self.directory is None or not self.directory.is_dir():
            return 0
        with self._lock():
            items = sorted(self._read_index(), key=lambda it: -int(it.get("hits", 0)))
            loaded = 0
            for it in items:
                key = tuple(int(t) for t in it.get("tokens", ()))
                if key in self.entries or self.nbytes + int(it.get("bytes", 0)) > self.budget_bytes:
                    continue
                try:
                    state = read_state(
                        self.directory / safe_name(str(it["file"]), "prefix file"), kind=str(it["kind"]), start=0,
                        end=len(key), n_layers=int(it["n_layers"]), size=int(it["bytes"]), sha256=str(it["sha256"]),
                        config=it.get("config") or {}, layer_meta=it.get("layer_meta") or [],
                    )
                    restore([state])  # checks the arrays fit together before the entry is trusted
                except (SnapshotError, OptionError, KeyError, TypeError, ValueError) as e:
                    self.counters.refused += 1
                    warnings.warn(f"prefix cache entry refused: {e}", SnapshotWarning, stacklevel=2)
                    continue
                hits = int(it.get("hits", 0))
                self.entries[key] = PrefixEntry(key, state, hits=hits, priority=self._age + max(hits, 1), file=str(it["file"]))
                loaded += 1
        self.counters.loaded += loaded
        return loaded

    def disk_bytes(self) -> int:
        if self.directory is None or not self.directory.is_dir():
            return 0
        return sum(p.stat().st_size for p in self.directory.iterdir() if p.is_file())


def _well_formed(item: Any) -> bool:
    """An index entry with fields of the right types (a hand-edited or damaged index
    loses that entry, never the start-up)."""
    def whole(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    return (
        isinstance(item, dict)
        and isinstance(item.get("file"), str) and isinstance(item.get("sha256"), str)
        and isinstance(item.get("kind"), str) and whole(item.get("bytes")) and whole(item.get("n_layers"))
        and whole(item.get("hits", 0)) and isinstance(item.get("tokens"), list)
        and all(whole(t) for t in item["tokens"])
        and isinstance(item.get("config") or {}, dict) and isinstance(item.get("layer_meta") or [], list)
    )


def _budget(budget_mb: Any) -> int:
    if isinstance(budget_mb, bool) or not isinstance(budget_mb, (int, float)) or not budget_mb >= 0:
        raise OptionError(f"invalid prefix cache budget {budget_mb!r} MB: use a number >= 0")
    return int(budget_mb * 1e6)


__all__ = ["DEFAULT_BUDGET_MB", "MIN_TOKENS", "PrefixCache", "PrefixEntry", "PrefixHit"]

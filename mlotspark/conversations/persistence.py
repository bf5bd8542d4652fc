"""The engine's persistent memory: conversations, snapshots, prefix cache, semantic store.

``Persistence`` is ``engine.persistence``: what ``engine.conversation(...)`` and
``engine.memory`` reach, with ``stats()`` and ``set_budgets(...)``; it owns the pieces and their budgets:

| tier | here | budget | eviction |
|---|---|---|---|
| working | conversations' warm caches in memory | ``warm_mb`` | least recently used conversation first (its snapshot is on disk) |
| episodic | snapshots on disk | ``snapshot_disk_mb`` | least recently updated conversation's snapshot (its messages stay) |
| episodic | prefix cache in memory | ``prefix_cache_mb`` | LFU with aging (``prefix_cache.py``) |
| semantic | SQLite store | ``memory_token_budget`` per prompt | entries are kept until forgotten |

MLX work (restoring, trimming, copying caches) runs through ``run_exclusive`` so
that it is serialised with the engine's own requests (DESIGN §5); file and SQLite
writes of a finished turn run on the ``writer`` beside the engine thread.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections import Counter, OrderedDict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, TypeVar

from mlotspark.memory.kv_state import cache_kind, prefix_state
from mlotspark.conversations.conversation import Conversation
from mlotspark.conversations.record import ConversationFiles, ConversationInfo
from mlotspark.errors import OptionError, SnapshotError, StoreError
from mlotspark.memory.prefix_cache import PrefixCache
from mlotspark.memory.snapshots import PendingSave, common_prefix
from mlotspark.conversations.writer import Writer
from mlotspark.memory.semantic import Hit, SemanticStore, default_embedder, format_memory_section, learn_turn
from mlotspark.memory.semantic.learning import Learned
from mlotspark.memory.semantic.model_writer import REPLY_TOKENS, ModelWriter
from mlotspark.memory.semantic.writer import MemoryWriter, SimpleWriter
from mlotspark.runtime.engine_api import EngineProtocol
from mlotspark.storage import ReadOnlyWarning, home_path, safe_name, subdir, writable

log = logging.getLogger(__name__)
T = TypeVar("T")

# No system prompt of our own: the model's chat template puts its default (SmolLM2's
# names itself), exactly as ``generate`` and ``Engine.generate`` do, so the same
# messages give the same tokens in a conversation, the TUI, the API and the CLI.
DEFAULT_SYSTEM_PROMPT = ""


MEMORY_WRITERS = ("auto", "model", "simple")
MEMORY_PRIORITY = 100  # the model writer's requests queue behind any user's (lower runs first)


def model_writer(engine: Any) -> ModelWriter:
    """The ``ModelWriter`` whose calls run on ``engine`` at ``MEMORY_PRIORITY`` (a reply a user
    submits meanwhile is served first), greedy, JSON-schema constrained."""
    def generate(messages: list[dict], schema: dict) -> str:
        # think=False: a reasoning model answers the JSON at once (its thinking is never learned from)
        return engine.generate(messages, temperature=0.0, max_tokens=REPLY_TOKENS, priority=MEMORY_PRIORITY, think=False,
                               response_format={"type": "json_schema",
                                                "json_schema": {"name": "memory", "schema": schema}}).text

    return ModelWriter(generate)


@dataclass(frozen=True)
class PersistenceConfig:
    """Budgets and switches of the persistent tiers.

    Args:
        system_prompt: system prompt of new conversations (default "": the model's
            template default, as ``generate`` and the API use; shared, so its KV is
            a prefix-cache hit for every new conversation).
        snapshots: save a KV snapshot after each turn (default True).
        warm_mb: conversation caches kept in memory (default 512).
        snapshot_disk_mb: snapshots on disk, all conversations (default 4096).
        prefix_cache_mb: prefix cache in memory (default 256).
        prefix_keep_on_disk: most used prefixes saved for the next start (default 8).
        memory: put relevant semantic memory into prompts (default True).
        learn: remember what the user states about themselves (default True).
        memory_writer: who decides what a turn changes in memory: ``simple`` (keep what
            the turn says, act on "remember that" / "forget"), ``model`` (the chat model
            proposes the operations, ``semantic.model_writer``) or ``auto`` (default: the
            model writer only where the conformance matrix measured it beating the simple one).
        memory_top_k: entries per prompt at most (default 3).
        memory_threshold: minimum score of an entry (default None: the calibration of
            the store's embedder, see ``semantic/calibration.py``).
        memory_token_budget: tokens the memory section may take (default 200).
    """

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    snapshots: bool = True
    warm_mb: float = 512.0
    snapshot_disk_mb: float = 4096.0
    prefix_cache_mb: float = 256.0
    prefix_keep_on_disk: int = 8
    memory: bool = True
    learn: bool = True
    memory_writer: str = "auto"
    memory_top_k: int = 3
    memory_threshold: float | None = None
    memory_token_budget: int = 200

    def __post_init__(self) -> None:
        for name in ("warm_mb", "snapshot_disk_mb", "prefix_cache_mb"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise OptionError(f"invalid {name} {v!r}: use a number of MB >= 0")
        for name in ("prefix_keep_on_disk", "memory_top_k", "memory_token_budget"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise OptionError(f"invalid {name} {v!r}: use an integer >= 0")
        for name in ("memory", "learn"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(f"invalid {name} {getattr(self, name)!r}: use True or False")
        if self.memory_writer not in MEMORY_WRITERS:
            raise OptionError(f"invalid memory_writer {self.memory_writer!r}: choose from {', '.join(MEMORY_WRITERS)}")
        if not isinstance(self.system_prompt, str):
            raise OptionError(f"invalid system_prompt {self.system_prompt!r}: use a string")


class Persistence:
    """Conversations, snapshots, the prefix cache and semantic memory of one engine.

    Args:
        engine: the loaded engine.
        config: budgets and switches (default ``PersistenceConfig()``).
    """

    def __init__(self, engine: EngineProtocol, config: PersistenceConfig | None = None):
        self.engine = engine
        self.config = config or PersistenceConfig()
        self.counters: Counter = Counter()
        self._lock = threading.RLock()
        self._conversations: dict[str, Conversation] = {}
        self._warm: OrderedDict[str, Conversation] = OrderedDict()
        self._prefix: PrefixCache | None = None
        self._memory: SemanticStore | None = None
        self._system_ids: dict[str, list[int]] = {}
        self._read_only: bool | None = None
        #: Stores finished turns beside the engine thread (``writer.py``).
        self.writer = Writer()

    # -- plumbing ---------------------------------------------------------------------
    def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run MLX work ``fn`` on the engine thread (``engine.scheduler.call``) and return its result."""
        return self.engine.scheduler.call(fn)

    @property
    def opened(self) -> bool:
        """True once a conversation, the prefix cache or the memory store was opened: until
        then ``stats`` would open them, so a scrape asks this first."""
        return bool(self._conversations) or self._prefix is not None or self._memory is not None

    def model_identity(self) -> tuple[str, str]:
        """(fingerprint, weight format): what a snapshot must match."""
        loaded = self.engine.loaded
        return loaded.fingerprint, loaded.weights

    @property
    def n_layers(self) -> int:
        return len(self.engine.loaded.model.layers)

    @property
    def read_only(self) -> bool:
        """True when ``$MLOTSPARK_HOME`` cannot be written (checked once, warned once):
        turns then run and keep their messages in memory, and nothing is saved."""
        if self._read_only is None:
            self._read_only = not writable()
            if self._read_only:
                msg = (f"{home_path()} is read-only: conversations, snapshots and memory will not be "
                       "saved this session (replies still work)")
                warnings.warn(msg, ReadOnlyWarning, stacklevel=3)
                log.warning("%s", msg)
        return self._read_only

    @property
    def root(self) -> Path:
        return home_path() / "conversations" if self.read_only else subdir("conversations")

    # -- conversations ------------------------------------------------------------------
    def conversation(self, name: str, *, system: str | None = None) -> Conversation:
        """The conversation called ``name``, created on its first turn if new.

        Args:
            name: 1-128 letters, digits, spaces, '_', '-', '.' (cannot leave the data directory).
            system: system prompt for a new conversation (default ``config.system_prompt``);
                for an existing one, a different value replaces its system prompt.

        Raises:
            OptionError: an invalid name. StoreError: its file is unreadable.
        """
        name = safe_name(name, "conversation name")
        with self._lock:
            conv = self._conversations.get(name)
            if conv is None:
                conv = Conversation(self, name, self.root / name, self.config.system_prompt if system is None else system)
                self._conversations[name] = conv
        if system is not None and conv.system != system:
            conv.system = system
        return conv

    def conversations(self) -> list[ConversationInfo]:
        """Stored conversations, most recently updated first."""
        out = []
        if not self.root.is_dir():
            return out
        for d in sorted(self.root.iterdir()):
            if not (d / "conversation.json").is_file():
                continue
            try:
                record = ConversationFiles(d).load()
            except StoreError as e:
                log.warning("skipping unreadable conversation: %s", e)
                continue
            if record is not None:
                out.append(record.info())
        return sorted(out, key=lambda c: -c.updated)

    def forget_conversation(self, name: str) -> None:
        with self._lock:
            self._conversations.pop(name, None)
            self._warm.pop(name, None)

    def note_warm(self, conv: Conversation) -> None:
        """Record ``conv``'s warm cache; drop the least recently used ones past ``warm_mb``."""
        with self._lock:
            self._warm.pop(conv.name, None)
            self._warm[conv.name] = conv
            budget = self.config.warm_mb * 1e6
            for name in list(self._warm):
                if sum(c.warm_bytes for c in self._warm.values()) <= budget:
                    break
                other = self._warm[name]
                if other is conv and len(self._warm) > 1:
                    continue
                if other.release_warm():
                    self.counters["warm_evictions"] += 1
                    del self._warm[name]

    # -- snapshots ----------------------------------------------------------------------
    def prepare_snapshot(self, conv: Conversation, cache: list, tokens: list[int]) -> PendingSave | dict:
        """[engine thread] Capture ``conv``'s snapshot for ``write_snapshot``; a dict says
        why there is nothing to write (off, read-only, or the cache cannot be saved)."""
        if not self.config.snapshots or self.read_only:
            return {"saved": False}
        fp, weights = self.model_identity()
        try:
            return conv.files.snapshots.prepare(cache, tokens, fingerprint=fp, weights=weights)
        except (SnapshotError, StoreError) as e:
            return self._snapshot_failed(conv, e)

    def write_snapshot(self, conv: Conversation, pending: PendingSave | dict, tokens: list[int]) -> dict:
        """[writer] Write what ``prepare_snapshot`` captured; a failure is a warning, never lost messages."""
        if not isinstance(pending, PendingSave):
            return pending
        fp, weights = self.model_identity()
        try:
            meta = conv.files.snapshots.write(pending.state, tokens, pending.keep, fingerprint=fp, weights=weights,
                                              model=self.engine.model_name)
        except (SnapshotError, StoreError) as e:
            return self._snapshot_failed(conv, e)
        self.counters["snapshots_saved"] += 1
        self._enforce_snapshot_budget(keep=conv.name)
        return {"saved": True, "tokens": len(meta.tokens), "segments": len(meta.segments), "revision": meta.revision}

    def _snapshot_failed(self, conv: Conversation, error: Exception) -> dict:
        log.warning("conversation %r: snapshot not saved: %s", conv.name, error)
        self.counters["snapshot_failures"] += 1
        return {"saved": False, "error": str(error)}

    def _snapshot_sizes(self) -> list[tuple[float, str, int]]:
        sizes = []
        if not self.root.is_dir():
            return sizes
        for d in self.root.iterdir():
            store = ConversationFiles(d).snapshots
            if store.exists():
                with contextlib.suppress(OSError):
                    sizes.append((store.meta_path.stat().st_mtime, d.name, store.nbytes()))
        return sizes

    def _enforce_snapshot_budget(self, keep: str) -> None:
        budget = self.config.snapshot_disk_mb * 1e6
        sizes = sorted(self._snapshot_sizes())
        total = sum(s for _, _, s in sizes)
        for _, name, size in sizes:
            if total <= budget:
                break
            live = self._conversations.get(name)
            if name == keep or (live is not None and live.busy):
                continue
            with contextlib.suppress(StoreError):
                ConversationFiles(self.root / name).snapshots.delete()
                total -= size
                self.counters["snapshot_evictions"] += 1

    # -- prefix cache -------------------------------------------------------------------
    @property
    def prefix_cache(self) -> PrefixCache:
        """The shared prefix cache, preloaded from disk on first use."""
        if self._prefix is None:
            fp, weights = self.model_identity()
            pc = PrefixCache(
                budget_mb=self.config.prefix_cache_mb, fingerprint=fp, weights=weights,
                directory=None if self.read_only else subdir("prefix_cache") / safe_name(f"{fp}-{weights}", "model id"),
                keep_on_disk=self.config.prefix_keep_on_disk,
            )
            # Not under self._lock: the engine thread may need it meanwhile (no deadlock).
            self.run_exclusive(pc.load)
            with self._lock:
                if self._prefix is None:
                    self._prefix = pc
        return self._prefix

    def system_ids(self, system: str) -> list[int]:
        """Token ids every conversation with this system prompt starts with (the shared
        prefix): its system block, or for "" what the template puts first by default."""
        if system not in self._system_ids:
            if system:
                ids = self.engine.encode([{"role": "system", "content": system}])
                # encode adds the assistant opener; keep what every conversation shares.
                gen = self.engine.encode([{"role": "system", "content": system}, {"role": "user", "content": "x"}])
            else:  # the template's default system block (if any) and the user opener
                ids = self.engine.encode([{"role": "user", "content": "x"}])
                gen = self.engine.encode([{"role": "user", "content": "y"}])
            self._system_ids[system] = ids[: common_prefix(ids, gen)]
        return self._system_ids[system]

    def keep_prefix(self, conv: Conversation, cache: list, tokens: list[int]) -> None:
        """[engine thread] Keep the conversation's shared system-prompt prefix in memory,
        if not cached yet (``save_prefix`` writes it)."""
        pc = self.prefix_cache
        if pc.budget_bytes == 0:
            return
        try:
            n = common_prefix(self.system_ids(conv.record.system), tokens)
            if n >= pc.min_tokens and not pc.covers(tokens[:n]):
                state = prefix_state(cache, n)
                if state is not None and pc.add(tokens[:n], state):
                    self.counters["prefixes_added"] += 1
        except (SnapshotError, StoreError) as e:
            log.warning("prefix cache not updated: %s", e)

    def save_prefix(self) -> None:
        """[writer] Save the prefix cache's most used entries (their arrays are evaluated)."""
        try:
            self.prefix_cache.save()
        except (SnapshotError, StoreError) as e:
            log.warning("prefix cache not saved: %s", e)

    # -- semantic memory ----------------------------------------------------------------
    @property
    def memory(self) -> SemanticStore:
        """The semantic store (``$MLOTSPARK_HOME/memory/semantic.db``), opened on first use."""
        with self._lock:
            if self._memory is None:
                # MiniLM runs on MLX: through the engine thread, like all MLX work here.
                self._memory = SemanticStore(embedder=default_embedder(runner=self.run_exclusive))
            return self._memory

    def _count_tokens(self, text: str) -> int:
        return len(self.engine.tokenizer.encode(text, add_special_tokens=False))

    def retrieve(self, text: str) -> list[Hit]:
        """Entries relevant to ``text`` for the prompt ([] when memory is off or broken)."""
        c = self.config
        if not c.memory or c.memory_top_k == 0 or self.read_only:  # SQLite's WAL needs a writable directory
            return []
        try:
            return self.memory.retrieve_for_prompt(
                text, top_k=c.memory_top_k, threshold=c.memory_threshold,
                token_budget=c.memory_token_budget, count_tokens=self._count_tokens,
            )
        except StoreError as e:  # a broken store must not stop the conversation
            log.warning("semantic memory not used: %s", e)
            return []

    @staticmethod
    def memory_section(hits: list[Hit], query: str = "") -> str:
        """The prompt's memory section for ``hits``, each entry with its day."""
        return format_memory_section(hits)

    def memory_writer(self) -> MemoryWriter:
        """The writer ``config.memory_writer`` names (``auto``: the model's measured choice)."""
        choice = self.config.memory_writer
        if choice == "auto":
            from mlotspark.models.hub.capabilities import capabilities
            from mlotspark.models.hub.catalogue import alias_name

            source = getattr(self.engine.loaded, "source", None)
            name = (alias_name(source) if source is not None else None) or self.engine.model_name
            choice = "model" if "memory_writer" in capabilities(name).features else "simple"
        return SimpleWriter() if choice == "simple" else model_writer(self.engine)

    def learn(self, user_text: str, conversation: str) -> Learned:
        """Apply a turn to semantic memory through the configured writer."""
        if not self.config.learn or self.read_only:
            return Learned()
        try:
            return learn_turn(self.memory, user_text, conversation, self.memory_writer())
        except (StoreError, OptionError) as e:
            log.warning("semantic memory not updated: %s", e)
            return Learned()

    # -- budgets and stats ----------------------------------------------------------------
    def set_budgets(self, **budgets: Any) -> PersistenceConfig:
        """Change budgets or switches (names of ``PersistenceConfig``); returns the new config.

        Raises:
            OptionError: an unknown name or a bad value.
        """
        unknown = set(budgets) - set(asdict(self.config))
        if unknown:
            raise OptionError(f"unknown persistence setting(s): {', '.join(sorted(unknown))}")
        self.config = replace(self.config, **budgets)
        if self._prefix is not None:
            self._prefix.set_budget(self.config.prefix_cache_mb)
        return self.config

    def stats(self) -> dict[str, Any]:
        """Bytes, entries, hit rates and evictions of every tier (see the module table)."""
        c = self.counters
        turns = sum(c[k] for k in ("warm", "snapshot", "prefix", "cold"))
        sizes = self._snapshot_sizes()
        working: dict[str, Any] = {
            "conversations_warm": sum(1 for v in self._warm.values() if v.warm_bytes),
            "bytes": sum(v.warm_bytes for v in self._warm.values()),
            "budget_bytes": int(self.config.warm_mb * 1e6),
            "evictions": c["warm_evictions"],
            "hit_rate": c["warm"] / turns if turns else 0.0,  # turns continued from memory
        }
        for conv in reversed(self._warm.values()):
            cache = conv.warm_cache
            if cache:
                with contextlib.suppress(SnapshotError):
                    if cache_kind(cache) == "cascade":
                        from mlotspark.memory.cascade import cascade_stats

                        working["cascade"] = cascade_stats(cache)
                break
        semantic: dict[str, Any] = {}
        with contextlib.suppress(StoreError):
            semantic = self.memory.stats()
        semantic.update(top_k=self.config.memory_top_k, threshold=self.config.memory_threshold,
                        token_budget=self.config.memory_token_budget)
        return {
            "working": working,
            "episodic": {
                "snapshots": len(sizes),
                "bytes": sum(s for _, _, s in sizes),
                "budget_bytes": int(self.config.snapshot_disk_mb * 1e6),
                "evictions": c["snapshot_evictions"],
                "saved": c["snapshots_saved"],
                "save_failures": c["snapshot_failures"],
                "restored": c["restored"],
                "refused": c["refused"],
                "turns": {k: c[k] for k in ("warm", "snapshot", "prefix", "cold")},
                "hit_rate": c["snapshot"] / turns if turns else 0.0,  # turns continued from disk
            },
            "prefix_cache": self.prefix_cache.stats(),
            "semantic": semantic,
        }

    def close(self) -> None:
        """Store the turns handed over, save the prefix cache and close the memory store."""
        self.writer.close()
        if self._prefix is not None:
            with contextlib.suppress(StoreError, SnapshotError):
                self.run_exclusive(self._prefix.save)
        if self._memory is not None:
            self._memory.close()
            self._memory = None


__all__ = ["DEFAULT_SYSTEM_PROMPT", "MEMORY_PRIORITY", "MEMORY_WRITERS", "Persistence", "PersistenceConfig", "model_writer"]

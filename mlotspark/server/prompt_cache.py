"""The server's prompt cache: resent chat history is matched by token prefix.

OpenAI-style clients send the whole conversation with every request and keep no
id. After each request the KV of everything the model consumed (prompt + reply) is
kept in a :class:`~mlotspark.memory.prefix_cache.PrefixCache` keyed by those
tokens; the next request that starts with the same tokens (the same history plus a
new user message) takes the longest matching prefix and prefills only the rest.
An entry that another entry extends is dropped, so a long chat holds one entry,
not one per turn. The most used entries are saved under
``$MLOTSPARK_HOME/prefix_cache/<model>-server/`` when the server stops (and, if
asked, every ``save_every`` new entries: a save runs on the engine thread and
stalls decoding meanwhile, so by default only at shutdown) and preloaded at start,
so a restart keeps them. It is a cache: a server that is killed loses what it
added since its last save, never anything else.

Every method touches MLX: call them on the engine thread (``engine.scheduler.call``,
or an ``on_finish`` callback).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from mlotspark.errors import SnapshotError, StoreError
from mlotspark.memory.kv_state import cache_kind, cache_offset, prefix_state
from mlotspark.memory.prefix_cache import PrefixCache
from mlotspark.options import GenerationOptions
from mlotspark.storage import safe_name, subdir

log = logging.getLogger(__name__)

DEFAULT_BUDGET_MB = 1024.0  # ~10 histories of 2k tokens for the default model (float32 KV)
DEFAULT_KEEP_ON_DISK = 16


class PromptCache:
    """Token prefix -> KV for the server's stateless requests.

    Args:
        engine: the loaded Engine (its model fingerprint keys the files on disk).
        budget_mb: memory the entries may hold (0 turns the cache off).
        keep_on_disk: most used entries saved for the next start.
        persist: save to / load from disk (False: memory only).
        save_every: also save after this many new entries (default 0 = only at close).
    """

    def __init__(self, engine: Any, *, budget_mb: float = DEFAULT_BUDGET_MB,
                 keep_on_disk: int = DEFAULT_KEEP_ON_DISK, persist: bool = True, save_every: int = 0):
        loaded = engine.loaded
        directory = None
        if persist:
            name = safe_name(f"{loaded.fingerprint}-{loaded.weights}-server"[-120:].lstrip("-_. "), "model id")
            directory = subdir("prefix_cache") / name
        self.engine = engine
        self.cache = PrefixCache(budget_mb=budget_mb, directory=directory, fingerprint=loaded.fingerprint,
                                 weights=loaded.weights, keep_on_disk=keep_on_disk)
        self.save_every = save_every
        self._added = 0

    @property
    def enabled(self) -> bool:
        return self.cache.budget_bytes > 0

    def load(self) -> int:
        """[engine thread] Preload saved entries; returns how many."""
        try:
            return self.cache.load()
        except (StoreError, SnapshotError) as e:
            log.warning("server prompt cache not loaded: %s", e)
            return 0

    def take(self, ids: Sequence[int], options: GenerationOptions) -> tuple[list | None, int]:
        """[engine thread] A cache holding the longest cached prefix of ``ids``.

        At least the last prompt token is left to run (its logits start the reply).
        Only an entry of the cache this request runs under is used (``engine.caches.cascade_for``):
        a KV entry for a request that fits the context, a cascade entry, continued with
        the engine's own cascade config, for one that runs the cascade. So a restarted
        server's ``--cascade`` and ``--window`` hold for entries an earlier one saved.
        A cascade request leaves its prompt's last ``question_pass`` tokens to prefill:
        the question pass re-reads them (an exact repeat would otherwise skip it).

        Args:
            ids: the request's prompt tokens.
            options: its generation options.

        Returns:
            (cache, tokens it holds), or (None, 0) on a miss.
        """
        if not self.enabled or len(ids) < 2:
            return None, 0
        cascade = self.engine.caches.cascade_for(len(ids), options)  # the request's options: its max_tokens counts
        upto = len(ids) - 1
        if cascade is not None and cascade.routing == "question":
            upto -= cascade.question_pass
        if upto < 1:
            return None, 0
        hit = self.cache.lookup(ids[:upto], kind="kv" if cascade is None else "cascade")
        if hit is None:
            return None, 0
        cache = self.cache.take(hit, cascade=cascade)
        if cache is None or cache_offset(cache) != hit.tokens:
            return None, 0
        return cache, hit.tokens

    def add(self, tokens: Sequence[int], cache: list) -> bool:
        """[engine thread] Keep the KV of ``tokens`` (what ``cache`` holds) for later requests.

        Returns:
            True when an entry was added.
        """
        if not self.enabled or not cache or cache_offset(cache) != len(tokens):
            return False
        key = tuple(int(t) for t in tokens)
        try:
            if cache_kind(cache) != "kv" and not all(getattr(c, "is_trimmable", lambda: False)() for c in cache):
                return False  # an untrimmable cascade can only be reused whole: rarely worth its bytes
            state = prefix_state(cache, len(key))
            if state is None or not self.cache.add(key, state):
                return False
        except SnapshotError as e:
            log.warning("server prompt cache: entry not kept: %s", e)
            return False
        # Entries this one extends are covered by it now.
        for other in [k for k in self.cache.entries if len(k) < len(key) and key[: len(k)] == k]:
            del self.cache.entries[other]
        self._added += 1
        if self.save_every and self._added % self.save_every == 0:
            self.save()
        return True

    def save(self) -> None:
        """[engine thread] Write the most used entries to disk (a failure is logged)."""
        try:
            self.cache.save()
        except (StoreError, SnapshotError, OSError) as e:
            log.warning("server prompt cache not saved: %s", e)

    def stats(self) -> dict[str, Any]:
        """Entries, bytes, budget, hits, misses, hit rate, tokens saved (``PrefixCache.stats``)."""
        return self.cache.stats()


__all__ = ["DEFAULT_BUDGET_MB", "PromptCache"]

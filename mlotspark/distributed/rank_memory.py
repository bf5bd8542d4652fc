"""A follower rank's memory of conversations: the KV cache or cascade of its own layers.

In a pipeline run every rank holds the caches of its own layers only, so a conversation
lives in pieces: rank 0 keeps its share (and the messages) through the ordinary
``Conversation`` code; every other rank keeps its share here, under the key rank 0 sends
with each turn (the conversation's name). Between turns a follower keeps the cache in
memory (a few keys, least recently used dropped first); after each turn it saves it to its
own snapshot file, ``conversations/<name>/snapshot.layers-<start>-<end>`` under its own
``$MLOTSPARK_HOME``, with the same fingerprint and weight-format checks as rank 0's snapshot.
The layer range in the name keeps a snapshot of another split from being mistaken for this one.
"""

from __future__ import annotations

from collections import OrderedDict

from mlotspark.errors import MlotsparkError, SnapshotError
from mlotspark.memory.kv_state import cache_kind, cache_offset, trim_to
from mlotspark.memory.snapshots import SnapshotStore
from mlotspark.storage import safe_name, subdir, writable

#: conversations whose caches a follower keeps in memory between turns.
HELD_KEYS = 8


class RankMemory:
    """The caches a follower rank keeps for rank 0's conversations.

    Args:
        layers: this rank's ``(start, end)`` layer range.
        fingerprint: the model's fingerprint (``LoadedModel.fingerprint``).
        weights: the weight format the rank runs.
        model: the model's name, written into snapshots.
        held: how many conversations' caches stay in memory.
    """

    def __init__(self, layers: tuple[int, int], fingerprint: str, weights: str, model: str = "",
                 held: int = HELD_KEYS):
        self.layers, self.fingerprint, self.weights, self.model = tuple(layers), fingerprint, weights, model
        self.held_max = held
        self._held: OrderedDict[str, tuple[list[int], list]] = OrderedDict()

    def store(self, key: str) -> SnapshotStore:
        """This rank's snapshot of conversation ``key``.

        Raises:
            OptionError: a key that could leave the data directory.
        """
        name = safe_name(key, "conversation name")  # it came over the network: checked again
        start, end = self.layers
        return SnapshotStore(subdir("conversations") / name / f"snapshot.layers-{start}-{end}")

    def take(self, key: str, cached: int, kind: str) -> tuple[list[int], list]:
        """The cache of ``key`` cut to its first ``cached`` tokens, and those tokens.

        The one held in memory if it is long enough, else this rank's snapshot.

        Args:
            key: the conversation's name.
            cached: how many tokens rank 0's share of the cache holds.
            kind: ``kv`` or ``cascade``: the kind rank 0 runs.

        Raises:
            SnapshotError: neither holds ``cached`` tokens of this model (the message names
                what was found), or the cache cannot be cut back that far.
        """
        held = self._held.pop(key, None)
        if held is not None and len(held[0]) >= cached and cache_kind(held[1]) == kind and trim_to(held[1], cached):
            return held[0][:cached], held[1]
        try:
            store = self.store(key)
            meta, cache = store.load(fingerprint=self.fingerprint, weights=self.weights,
                                     n_layers=self.layers[1] - self.layers[0], kind=kind)
        except MlotsparkError as e:
            raise SnapshotError(f"no cache of {cached} tokens for conversation {key!r} on layers "
                                f"{self.layers[0]}-{self.layers[1]} ({e})") from e
        if len(meta.tokens) < cached or not trim_to(cache, cached):
            raise SnapshotError(f"the snapshot {store.meta_path} holds {len(meta.tokens)} tokens of conversation "
                                f"{key!r}; rank 0 continues from {cached}")
        return list(meta.tokens[:cached]), cache

    def keep(self, key: str, tokens: list[int], cache: list, save: bool) -> dict:
        """Hold ``cache`` (which holds ``tokens``) for ``key``'s next turn; save it if asked.

        Returns:
            What happened to the snapshot: ``{"saved": bool, ...}`` (a failed save is
            reported, not raised: the cache in memory still serves the next turn).
        """
        if cache_offset(cache) != len(tokens):
            self._held.pop(key, None)
            return {"saved": False, "error": f"cache holds {cache_offset(cache)} tokens, expected {len(tokens)}"}
        self._held[key] = (list(tokens), cache)
        while len(self._held) > self.held_max:
            self._held.popitem(last=False)
        if not save or not writable():
            return {"saved": False}
        try:
            meta = self.store(key).save(cache, tokens, fingerprint=self.fingerprint, weights=self.weights,
                                        model=self.model)
        except MlotsparkError as e:
            return {"saved": False, "error": str(e)}
        return {"saved": True, "tokens": len(meta.tokens)}

    def forget(self, key: str) -> None:
        """Drop ``key``'s cache from memory (its snapshot stays)."""
        self._held.pop(key, None)

    def held(self) -> list[str]:
        """The keys held in memory, least recently used first."""
        return list(self._held)

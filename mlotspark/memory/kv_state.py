"""One state interface for every kind of per-layer cache, so storing needs no special cases.

Here, not in ``caches``: it serialises the memory cascade's caches too, and ``caches`` sits below ``memory``.

A model's cache is a list of per-layer objects. Snapshots and the prefix cache see
it only as a ``CacheState``: a kind, a JSON-able config, and per layer a pair
``(arrays: dict[str, mx.array], meta: dict)``. Two kinds exist:

- ``kv``: the plain full-attention cache (``caches.kv.KVCache``, or mlx-lm's). Its
  state is the first ``offset`` keys and values; a state may cover only tokens
  ``[start, end)`` (a *segment*), so a snapshot can append the new turn's tokens
  instead of rewriting the whole conversation. Trimmable, sliceable.
- ``cascade``: the memory cascade's layers, which serialise themselves with
  ``to_state() -> (arrays, meta)`` and ``from_state(arrays, meta, config)``. A
  state always covers the whole sequence. They are trimmed through mlx-lm's duck
  typing (``is_trimmable()``, ``trim(n) -> trimmed``) when they support it; when
  they do not, callers fall back to a longer prefill.

Every function here touches MLX: call them on the engine's thread (DESIGN §5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import mlx.core as mx

from mlotspark.errors import SnapshotError
from mlotspark.memory.cascade import CascadeConfig, is_cascade, restore_cascade_cache
from mlotspark.caches.kv import KVCache

LayerState = tuple[dict[str, mx.array], dict]
KINDS = ("kv", "cascade")


@dataclass
class CacheState:
    """A cache (or a segment of a ``kv`` cache) as arrays + JSON-able metadata.

    Attributes:
        kind: ``kv`` or ``cascade``.
        layers: per layer ``(arrays, meta)``.
        start: first token covered (``kv`` segments; 0 otherwise).
        end: one past the last token covered.
        config: the cache's configuration (the cascade's ``to_dict()``; {} for kv).
    """

    kind: str
    layers: list[LayerState]
    start: int
    end: int
    config: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for arrays, _ in self.layers for a in arrays.values())

    @property
    def tokens(self) -> int:
        return self.end - self.start


def cache_kind(cache: Sequence[Any]) -> str:
    """``kv`` or ``cascade``.

    Raises:
        SnapshotError: a cache this module cannot serialise (e.g. mlx-lm's rotating one).
    """
    if not cache:
        raise SnapshotError("empty cache: nothing to save")
    first = cache[0]
    if is_cascade(cache):
        return "cascade"
    if isinstance(first, KVCache) or type(first).__name__ == "KVCache":
        return "kv"
    raise SnapshotError(f"cannot save a cache of type {type(first).__name__}")


def cache_offset(cache: Sequence[Any]) -> int:
    """Tokens the cache holds (the first layer's offset)."""
    return int(getattr(cache[0], "offset", 0)) if cache else 0


def cache_nbytes(cache: Sequence[Any] | None) -> int:
    """Bytes the cache holds in memory."""
    return sum(int(getattr(c, "nbytes", 0) or 0) for c in cache or ())


def cache_block_bytes(cache: Sequence[Any] | None) -> tuple[int, int]:
    """(resident, spilled) payload bytes of a cascade cache's episodic blocks; (0, 0)
    for a plain KV cache. The layers share one block store."""
    stores = {id(s): s for c in cache or () if (s := getattr(c, "store", None)) is not None}
    resident = spilled = 0
    for store in stores.values():
        for b in getattr(store, "blocks", {}).values():
            if b.payload is None:
                spilled += b.nbytes
            else:
                resident += b.nbytes
    return resident, spilled


def _kv_arrays(c: Any, start: int, end: int, detach: bool = False) -> dict[str, mx.array]:
    if c.keys is None:
        raise SnapshotError("kv cache layer is empty")
    # (B, H, T, D): slicing makes new arrays, so later in-place cache writes never reach
    # them; ``detach`` copies too, so a kept prefix does not pin the whole cache buffer.
    k, v = c.keys[..., start:end, :], c.values[..., start:end, :]
    return {"keys": mx.contiguous(k), "values": mx.contiguous(v)} if detach else {"keys": k, "values": v}


def capture(cache: Sequence[Any], start: int = 0) -> CacheState:
    """The cache's state, lazily (arrays are evaluated when written or used).

    Args:
        cache: per-layer caches.
        start: first token to include; only a ``kv`` cache can start past 0.

    Raises:
        SnapshotError: an unknown cache kind, or ``start`` past 0 for a cascade.
    """
    kind = cache_kind(cache)
    end = cache_offset(cache)
    if kind == "kv":
        if not 0 <= start <= end:
            raise SnapshotError(f"segment start {start} outside the cache's {end} tokens")
        return CacheState("kv", [(_kv_arrays(c, start, end), {}) for c in cache], start, end)
    if start:
        raise SnapshotError("a cascade state always covers the whole sequence (start must be 0)")
    layers = [c.to_state() for c in cache]
    return CacheState("cascade", layers, 0, end, dict(layers[0][1].get("config", {})))


def restore(segments: Sequence[CacheState], cascade: CascadeConfig | None = None) -> list:
    """Per-layer caches holding the tokens of ``segments`` (consecutive, from token 0).

    The arrays are copied by slicing, so the states can be restored again later
    (the prefix cache keeps one state and restores it many times).

    Args:
        segments: the states, in token order.
        cascade: the config a ``cascade`` state runs with from now on (the engine's for
            this request; its sinks, block size and summaries must match the saved
            ones); None = the saved config.

    Raises:
        SnapshotError: segments that do not fit together, an incomplete state, or a
            cascade state that ``cascade`` cannot continue.
    """
    if not segments:
        raise SnapshotError("no cache state to restore")
    kind = segments[0].kind
    if kind not in KINDS or any(s.kind != kind for s in segments):
        raise SnapshotError(f"cannot restore cache kind(s) {sorted({s.kind for s in segments})}")
    pos = 0
    for s in segments:
        if s.start != pos or s.end < s.start:
            raise SnapshotError(f"cache segments do not join: expected start {pos}, got {s.start}")
        pos = s.end
    if kind == "cascade":
        if len(segments) != 1:
            raise SnapshotError("a cascade state is one segment")
        config = cascade
        if config is None:
            try:
                config = CascadeConfig.from_dict(segments[0].config)
            except ValueError as e:
                raise SnapshotError(f"bad cascade config in state: {e}") from e
        return restore_cascade_cache(segments[0].layers, config)
    n_layers = len(segments[0].layers)
    if any(len(s.layers) != n_layers for s in segments):
        raise SnapshotError("cache segments have different layer counts")
    caches = []
    for i in range(n_layers):
        try:
            ks = [s.layers[i][0]["keys"] for s in segments if s.tokens]
            vs = [s.layers[i][0]["values"] for s in segments if s.tokens]
        except KeyError as e:
            raise SnapshotError(f"kv state of layer {i} lacks {e}") from e
        c = KVCache()
        if ks:
            keys = mx.concatenate(ks, axis=2) if len(ks) > 1 else ks[0][..., :, :]
            values = mx.concatenate(vs, axis=2) if len(vs) > 1 else vs[0][..., :, :]
            if keys.ndim != 4 or keys.shape[2] != pos or values.shape[2] != pos:
                raise SnapshotError(
                    f"kv state of layer {i} holds {keys.shape[2] if keys.ndim == 4 else '?'} tokens, expected {pos}"
                )
            c.keys, c.values, c.offset = keys, values, pos
        caches.append(c)
    return caches


def trim_to(cache: Sequence[Any], n: int) -> bool:
    """Cut the cache back to its first ``n`` tokens, in place.

    Returns:
        True on success. False when a layer cannot trim that far: the cache may
        then be partly trimmed and must be discarded (fall back to a prefill).
    """
    drop = cache_offset(cache) - n
    if drop < 0:
        return False
    if drop == 0:
        return True
    if not all(getattr(c, "is_trimmable", lambda: False)() for c in cache):
        return False
    return all(c.trim(drop) == drop for c in cache)


def prefix_state(cache: Sequence[Any], n: int) -> CacheState | None:
    """The state of the cache's first ``n`` tokens, leaving the cache as it is.

    Returns:
        The state, or None when this cache cannot give a prefix (a cascade that
        cannot be trimmed that far).
    """
    kind = cache_kind(cache)
    if not 0 < n <= cache_offset(cache):
        return None
    if kind == "kv":
        return CacheState("kv", [(_kv_arrays(c, 0, n, detach=True), {}) for c in cache], 0, n)
    if n != cache_offset(cache) and not all(getattr(c, "is_trimmable", lambda: False)() for c in cache):
        return None  # cheap refusal before copying a whole cascade
    state = capture(cache)
    if n == state.end:
        return state
    copy = restore([state])
    return capture(copy) if trim_to(copy, n) else None


def state_of_prefix(state: CacheState, n: int) -> CacheState | None:
    """The first ``n`` tokens of a whole-sequence ``state`` (None if it cannot be cut)."""
    if state.start != 0 or not 0 < n <= state.end:
        return None
    if n == state.end:
        return state
    if state.kind == "kv":
        layers = [({k: mx.contiguous(a[..., :n, :]) for k, a in arrays.items()}, meta) for arrays, meta in state.layers]
        return CacheState("kv", layers, 0, n, state.config)
    copy = restore([state])
    return capture(copy) if trim_to(copy, n) else None


def evaluate(state: CacheState) -> None:
    """Compute the state's arrays now (before writing them or keeping them)."""
    mx.eval([a for arrays, _ in state.layers for a in arrays.values()])

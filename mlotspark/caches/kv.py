"""The plain KV cache: full attention, RoPE applied at the cache offset.

It is mlx-lm's ``KVCache`` (so its state, trimming and prompt-cache files work
unchanged) plus ``attend``, the one method our attention calls, and the lifecycle of
``caches/interface.py`` (nothing to prepare). Any object with that interface can
stand in for it: the memory cascade is such an object.
"""

from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx
from mlx_lm.models.cache import KVCache as _MlxKVCache

from mlotspark.models.cpu import prefill_ops
from mlotspark.caches.interface import NothingToPrepare


class KVCache(NothingToPrepare, _MlxKVCache):
    """Full-attention KV cache; stores keys *after* RoPE, like mlx-lm."""

    def attend(
        self,
        q: mx.array,
        k: mx.array,
        v: mx.array,
        *,
        rope: Callable[..., mx.array],
        scale: float,
        mask: Any = None,
    ) -> mx.array:
        """Attend new queries (B, H, L, D) to everything cached plus the new keys."""
        q = rope(q, offset=self.offset)
        k = rope(k, offset=self.offset)
        keys, values = self.keep(k, v, q.dtype)
        return prefill_ops.attention(q, keys, values, scale=scale, mask=mask)

    def keep(self, k: mx.array, v: mx.array, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        """Store rotated ``k, v`` and return every cached key and value for attention in
        ``dtype`` (a subclass changes the stored form: ``Float16KVCache``)."""
        return self.update_and_fetch(k, v)

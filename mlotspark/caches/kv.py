"""The plain KV cache: full attention, RoPE applied at the cache offset.

It is mlx-lm's ``KVCache`` (so its state, trimming and prompt-cache files work
unchanged) plus ``attend``, the one method our attention calls, and the lifecycle of
``caches/interface.py`` (nothing to prepare). Its attention function is given when
it is made (the model's runner's ``attention``, ``models/execution.py``), MLX's own else. Any object with that interface can
stand in for it: the memory cascade is such an object.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import mlx.core as mx
from mlx_lm.models.cache import KVCache as _MlxKVCache

from mlotspark.models.cpu import prefill_ops
from mlotspark.caches.interface import NothingToPrepare


class KVCache(NothingToPrepare, _MlxKVCache):
    """Full-attention KV cache; stores keys *after* RoPE, like mlx-lm.

    Args:
        attention: the attention function (``prefill_ops.attention``'s signature; default
            that one). A cache loaded by mlx-lm's ``from_state`` keeps the default.
    """

    attention: Callable[..., mx.array] = staticmethod(prefill_ops.attention)

    def __init__(self, attention: Optional[Callable[..., mx.array]] = None) -> None:
        super().__init__()
        if attention is not None:
            self.attention = attention

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
        return self.attention(q, keys, values, scale=scale, mask=mask)

    def keep(self, k: mx.array, v: mx.array, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        """Store rotated ``k, v`` and return every cached key and value for attention in
        ``dtype`` (a subclass changes the stored form: ``Float16KVCache``)."""
        return self.update_and_fetch(k, v)


def give_attention(caches: Sequence[Any], attention: Callable[..., mx.array]) -> list:
    """Set ``attention`` on every cache of ``caches`` that attends through one (ours: this
    class and its kinds, the cascade); mlx-lm's own classes have none. Returns the caches."""
    for c in caches:
        if callable(getattr(c, "attention", None)):
            c.attention = attention
    return list(caches)

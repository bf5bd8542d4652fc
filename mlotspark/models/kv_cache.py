"""The plain KV cache: full attention, RoPE applied at the cache offset.

It is mlx-lm's ``KVCache`` (so its state, trimming and prompt-cache files work
unchanged) plus ``attend``, the one method our attention calls. Any object with
``attend(q, k, v, rope=, scale=, mask=)`` and ``offset`` can stand in for it: the
memory cascade is such an object.
"""

from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx
from mlx_lm.models.cache import KVCache as _MlxKVCache

from mlotspark.models import prefill_ops


class KVCache(_MlxKVCache):
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
        keys, values = self.update_and_fetch(k, v)
        if isinstance(mask, str) and mask == "causal" and prefill_ops.use_cpu_prefill_ops():
            # A prefill chunk on the CPU: skip the masked triangle (prefill_ops.py).
            return prefill_ops.causal_attention(q, keys, values, scale=scale)
        return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=mask)

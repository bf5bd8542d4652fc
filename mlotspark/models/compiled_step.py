"""One decode step of the whole llama model as one compiled call, over the KV cache's own buffers.

Op by op, a decode step of the 135M model is ~600 small ops that Python builds into a graph
each token (2.3-2.7 ms on a GPU, ~5.5 ms on this CPU; benchmarks/RESULTS.md "Issue 12")
before any arithmetic. Compiled whole, the step is traced once per buffer size and replayed:
Python does one call a token and MLX fuses the elementwise work between the matmuls.

What makes the step's shapes fixed is mlx-lm's own ``KVCache`` layout: keys and values live
in a buffer grown 256 positions at a time, and the live part is ``[:offset]``. The step
writes the new position with ``mx.slice_update`` at an offset that is an *array* (so the
offset is data, not a traced constant), rotates with ``mx.fast.rope`` at that offset, and
attends over the whole buffer with a mask hiding the positions past it. A new trace happens
only when the buffer grows (every 256 tokens). Caches of any other kind (the cascade,
quantized KV, batched caches with per-row offsets) take the per-layer compiled pieces.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import mlx.core as mx

from mlotspark.models.kv_cache import KVCache


def fits(cache: list) -> bool:
    """Whether the whole-step path can run on ``cache``: our plain KV cache in every layer,
    already holding a prompt (the buffers exist), one offset for the whole batch."""
    return all(type(c) is KVCache and c.keys is not None for c in cache) and len({c.offset for c in cache}) == 1


def _make_room(c: KVCache) -> None:
    # What mlx-lm's update_and_fetch does when the buffer is full: grow it by one step.
    if c.offset < c.keys.shape[2]:
        return
    B, H, _, Dk = c.keys.shape
    Dv = c.values.shape[3]
    c.keys = mx.concatenate([c.keys[..., : c.offset, :], mx.zeros((B, H, c.step, Dk), c.keys.dtype)], axis=2)
    c.values = mx.concatenate([c.values[..., : c.offset, :], mx.zeros((B, H, c.step, Dv), c.values.dtype)], axis=2)


class CompiledStep:
    """The whole decode step of a ``LlamaModel``: ``step(h, cache) -> hidden``.

    Args:
        model: the ``LlamaModel`` (embedding to final norm); its modules are implicit inputs
            of the compiled function, so a later weight update is seen, not frozen in.
    """

    def __init__(self, model: Any):
        self.model = model
        self._fn: Optional[Callable] = None

    def _compiled(self) -> Callable:
        if self._fn is None:
            layers, norm = self.model.layers, self.model.norm

            def step(h: mx.array, offset: mx.array, *kv: mx.array):
                cap = kv[0].shape[2]
                # Additive mask over the buffer: positions past the new token are not there yet.
                hide = mx.where(mx.arange(cap) <= offset, 0.0, -mx.inf).astype(h.dtype)
                out = []
                for i, layer in enumerate(layers):
                    attn_mod = layer.self_attn
                    q, k, v = layer.begin(h)
                    q = attn_mod.rope(q, offset=offset)
                    k = attn_mod.rope(k, offset=offset)
                    keys = mx.slice_update(kv[2 * i], k.astype(kv[2 * i].dtype), offset.reshape(1), axes=(2,))
                    values = mx.slice_update(kv[2 * i + 1], v.astype(kv[2 * i + 1].dtype), offset.reshape(1), axes=(2,))
                    attn = mx.fast.scaled_dot_product_attention(q, keys, values, scale=attn_mod.scale, mask=hide)
                    h = layer.end(h, attn)
                    out += [keys, values]
                return (norm(h), *out)

            self._fn = mx.compile(step, inputs=[self.model])
        return self._fn

    def __call__(self, h: mx.array, cache: list) -> mx.array:
        """Run one token's hidden state ``h`` (B, 1, dim) through every layer; the caches
        advance by one position, as the op-by-op path would leave them."""
        for c in cache:
            _make_room(c)
        offset = mx.array(cache[0].offset, dtype=mx.int32)
        kv = [a for c in cache for a in (c.keys, c.values)]
        out = self._compiled()(h, offset, *kv)
        del kv  # the cache's old buffers: dropped before evaluation, so the updates can run in place
        for i, c in enumerate(cache):
            c.keys, c.values = out[1 + 2 * i], out[2 + 2 * i]
            c.offset += 1
        return out[0]


__all__ = ["CompiledStep", "fits"]

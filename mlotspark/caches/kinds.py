"""KV cache kinds for the working memory: ``float16``, ``q8`` and ``q4``.

Each kind is a cache class with ``attend`` (the one method our attention calls, see
``caches/kv.py``), built on mlx-lm's caches so trimming, ``state`` and the scheduler's
row-by-row batching work unchanged:

- ``float16``: keys and values stored in float16 (half of a float32 model's KV);
  attention runs in the query's dtype.
- ``q8`` / ``q4``: mlx-lm's ``QuantizedKVCache`` (``mx.quantize`` per group of the
  head dimension) and its quantized attention; every key, the new ones included, is
  read back quantized.

``None`` (the default) is the model's own cache in the model's dtype.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import mlx.core as mx
from mlx_lm.models.base import quantized_scaled_dot_product_attention
from mlx_lm.models.cache import KVCache as _MlxKVCache
from mlx_lm.models.cache import QuantizedKVCache as _MlxQuantizedKVCache

from mlotspark.errors import OptionError
from mlotspark.caches.interface import NothingToPrepare
from mlotspark.caches.kv import KVCache

__all__ = [
    "KINDS",
    "Float16KVCache",
    "QuantizedKVCache",
    "make_cache",
    "cache_kind_of",
    "runnable_kinds",
    "kv_bytes",
    "kv_bytes_per_token",
    "tile_cache",
    "reorder_cache",
]

#: Cache kinds a user can ask for by name (``auto`` is resolved by ``caches.policy``).
KINDS = ("float16", "q8", "q4")
_BITS = {"q8": 8, "q4": 4}
_STEP = 256  # mlx-lm caches grow in steps of this many tokens


class Float16KVCache(KVCache):
    """Full-attention KV cache that stores keys and values in float16."""

    kind = "float16"

    def keep(self, k: mx.array, v: mx.array, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        """Store in float16; attend in the query's dtype (float32 reaches BLAS on the CPU, f16 does not)."""
        keys, values = self.update_and_fetch(k.astype(mx.float16), v.astype(mx.float16))
        if dtype != mx.float16:
            keys, values = keys.astype(dtype), values.astype(dtype)
        return keys, values


class QuantizedKVCache(NothingToPrepare, _MlxQuantizedKVCache):
    """mlx-lm's quantized KV cache plus ``attend`` (keys after RoPE, like the plain cache).

    Args:
        group_size: elements per quantization group along the head dimension.
        bits: 8 or 4.
    """

    def __init__(self, group_size: int = 64, bits: int = 8):
        super().__init__(group_size=group_size, bits=bits)

    @property
    def kind(self) -> str:
        return f"q{self.bits}"

    @property
    def nbytes(self) -> int:
        # mlx-lm's reads .nbytes of keys that are None until the first token (AttributeError).
        return 0 if self.keys is None else super().nbytes

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
        """Attend queries (B, H, L, D) to the quantized keys and values, new ones included."""
        q = rope(q, offset=self.offset)
        k = rope(k, offset=self.offset)
        q_keys, q_values = self.update_and_fetch(k, v)
        out = quantized_scaled_dot_product_attention(
            q, q_keys, q_values, scale=scale, mask=mask, group_size=self.group_size, bits=self.bits
        )
        return out.astype(q.dtype)


def _geometry(model: Any) -> tuple[int, int, int, Any]:
    """(layers, kv heads, head dim, KV dtype) of a llama-family model."""
    args = model.args
    heads = args.num_key_value_heads or args.num_attention_heads
    head_dim = args.head_dim or args.hidden_size // args.num_attention_heads
    dtype = model.model.embed_tokens.weight.dtype
    if not mx.issubdtype(dtype, mx.floating):  # quantized embeddings: activations are f16/f32
        dtype = getattr(model.model.embed_tokens, "scales", mx.zeros(1, mx.float16)).dtype
    return len(model.layers), heads, head_dim, dtype


def group_size_for(head_dim: int) -> int:
    """The largest quantization group (64 or 32) that divides ``head_dim``.

    Raises:
        OptionError: no supported group size divides it.
    """
    for g in (64, 32):
        if head_dim % g == 0:
            return g
    raise OptionError(f"invalid cache_kind for head dimension {head_dim}: q8/q4 need a multiple of 32")


def make_cache(model: Any, kind: str | None) -> list:
    """One cache per layer of the given kind, with the attention of the model's runner.

    Args:
        model: a loaded model's runner (``models/execution.py``), or a bare model (its
            caches get MLX's own attention); ``models.llama.Model`` for float16, any for q8/q4.
        kind: None (the model's own cache), ``float16``, ``q8`` or ``q4``.

    Raises:
        OptionError: an unknown kind, or one this model cannot run.
    """
    from mlotspark.models.execution import runner_for

    runner = runner_for(model)
    return runner.adopt(_make(runner.model, kind)) if kind is not None else runner.make_cache()


def _make(model: Any, kind: str) -> list:
    if kind not in KINDS:
        raise OptionError(f"invalid cache_kind {kind!r}: choose one of {', '.join(KINDS)} (or auto)")
    from mlotspark.models import llama

    n = len(model.layers)
    if kind == "float16":
        if isinstance(model, llama.Model):
            return [Float16KVCache() for _ in range(n)]
        if _geometry(model)[3] == mx.float16:
            return [_MlxKVCache() for _ in range(n)]
        raise OptionError(f"invalid cache_kind {kind!r} for {type(model).__module__}: a float16 KV "
                          "cache needs a float16 model or a llama-family one")
    head_dim = model.args.head_dim or model.args.hidden_size // model.args.num_attention_heads
    return [QuantizedKVCache(group_size=group_size_for(head_dim), bits=_BITS[kind]) for _ in range(n)]


def runnable_kinds(model: Any) -> tuple[tuple[str, ...], dict[str, str]]:
    """The cache kinds ``model`` can run, and why each other kind cannot.

    Args:
        model: a loaded model.

    Returns:
        (runnable kinds in ``KINDS`` order, {kind: reason} for the others).
    """
    from mlotspark.models import llama

    unavailable: dict[str, str] = {}
    if not isinstance(model, llama.Model) and _geometry(model)[3] != mx.float16:
        unavailable["float16"] = "a float16 KV cache needs a float16 model or a llama-family one"
    head_dim = model.args.head_dim or model.args.hidden_size // model.args.num_attention_heads
    try:
        group_size_for(head_dim)
    except OptionError:
        for k in _BITS:
            unavailable[k] = f"head dimension {head_dim} is not a multiple of 32 (quantization groups)"
    return tuple(k for k in KINDS if k not in unavailable), unavailable


def cache_kind_of(cache: list) -> str | None:
    """The kind of a cache made by ``make_cache`` (None for the model's own)."""
    return getattr(cache[0], "kind", None) if cache else None


def kv_bytes_per_token(model: Any, kind: str | None) -> float:
    """Bytes one token of context costs in a cache of ``kind`` (all layers, K and V)."""
    layers, heads, head_dim, dtype = _geometry(model)
    if kind is None:
        per = head_dim * dtype.size
    elif kind == "float16":
        per = head_dim * 2
    else:
        g = group_size_for(head_dim)
        per = head_dim * _BITS[kind] / 8 + 2 * (head_dim // g) * dtype.size  # packed + scales, biases
    return 2 * layers * heads * per


def kv_bytes(model: Any, kind: str | None, tokens: int) -> int:
    """Bytes a cache of ``kind`` allocates for ``tokens`` tokens (grown in steps of 256)."""
    return int(kv_bytes_per_token(model, kind) * math.ceil(max(tokens, 1) / _STEP) * _STEP)


# ----------------------------------------------------------- batched beams
def _rows(x: mx.array, offset: int) -> mx.array:
    return x[..., :offset, :]


def tile_cache(cache: list, n: int) -> list:
    """New caches holding ``n`` copies of a one-row cache's content (for beams, samples).

    Raises:
        OptionError: a cache kind that cannot be copied row-wise (e.g. the cascade).
    """
    out = []
    for c in cache:
        if isinstance(c, _MlxQuantizedKVCache):
            new = type(c)(group_size=c.group_size, bits=c.bits)
            if c.keys is not None:
                new.keys = tuple(mx.repeat(_rows(x, c.offset), n, axis=0) for x in c.keys)
                new.values = tuple(mx.repeat(_rows(x, c.offset), n, axis=0) for x in c.values)
        elif isinstance(c, _MlxKVCache):
            new = type(c)()
            if c.keys is not None:
                new.keys = mx.repeat(_rows(c.keys, c.offset), n, axis=0)
                new.values = mx.repeat(_rows(c.values, c.offset), n, axis=0)
        else:
            why = (" (the memory cascade holds this request: it was turned on, or its prompt plus max_tokens "
                   "passes the model's context)") if "Cascade" in type(c).__name__ else ""
            raise OptionError(f"beam search and multiple returns need a plain or quantized KV cache, "
                              f"not {type(c).__name__}{why}")
        new.offset = c.offset
        out.append(new)
    return out


def reorder_cache(cache: list, index: mx.array) -> None:
    """Select rows ``index`` (B',) of every layer's cache, in place (beam reordering)."""
    for c in cache:
        if c.keys is None:
            continue
        if isinstance(c.keys, tuple):
            c.keys = tuple(x[index] for x in c.keys)
            c.values = tuple(x[index] for x in c.values)
        else:
            c.keys, c.values = c.keys[index], c.values[index]

"""What a cache must provide: the one declared interface between attention and KV memory.

Our attention (``models/llama.py``) hands un-rotated queries, keys and values to
``cache.attend``; the cache decides where RoPE goes and what the context is. The rest
of the interface is mlx-lm's (``mlx_lm/models/cache.py``: ``update_and_fetch``,
``offset``, ``state``, ``is_trimmable``, ``trim``, ``make_mask``, ``empty``, ``nbytes``;
mlx-lm 0.32 has no ``meta_state`` any more), so mlx-lm's prompt-cache files, trimming
and ``generate_step`` keep working on our caches.

Lifecycle steps are called by the *runtime*, never from inside the model's forward:

- ``prepare_decode(model, caches, prompt)`` — once per request, after its prompt's
  prefill and before its first decode step, on every layer's cache, batched or not,
  on every path (solo, batch, conversation, server, distributed ranks). The memory
  cascade runs its question pass here (``memory/cascade/question.py``); a plain cache
  has nothing to do.

Who implements it: ``caches.kv.KVCache`` (full attention), the KV kinds of
``caches/kinds.py`` (float16, q8, q4), ``memory.cascade.CascadeCache``, and the
runtime's per-step views (``runtime.batching.BatchCache``, ``runtime.prefill.PrefillCache``)
— checked in ``tests/test_cache_interface.py``. mlx-lm's own cache classes (which models
such as gemma3 make for themselves) have no ``attend`` and no lifecycle: ``prepare_decode``
below skips them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import mlx.core as mx

__all__ = ["AttentionContext", "Cache", "NothingToPrepare", "ScoreReducer", "prepare_decode"]


@runtime_checkable
class AttentionContext(Protocol):
    """What attention calls: a request's cache, or a step's view over several requests'
    caches (``BatchCache``, ``PrefillCache``), which store nothing of their own."""

    def attend(self, q: mx.array, k: mx.array, v: mx.array, *, rope: Callable[..., mx.array],
               scale: float, mask: Any = None) -> mx.array:
        """Attention output (B, Hq, L, D) of un-rotated ``q`` (B, Hq, L, D) over the context and
        ``k, v`` (B, Hkv, L, D), which the cache keeps."""
        ...

    def make_mask(self, N: int, return_array: bool = False, window_size: Any = None) -> Any:
        """The model-level mask for ``N`` new tokens (None: ``attend`` builds its own)."""
        ...


@runtime_checkable
class Cache(AttentionContext, Protocol):
    """One layer's KV memory for one request."""

    offset: int  # tokens seen

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> Any:
        """mlx-lm's step: keep ``keys, values`` and return everything cached."""
        ...

    @property
    def state(self) -> Any:
        """Arrays to evaluate after a step, or save (mlx-lm's prompt-cache files)."""
        ...

    def is_trimmable(self) -> bool: ...

    def trim(self, n: int) -> int:
        """Drop the newest ``n`` tokens; returns how many went."""
        ...

    def empty(self) -> bool:
        """True while the cache holds no token."""
        ...

    @property
    def nbytes(self) -> int: ...

    def prepare_decode(self, model: Any, caches: Sequence[Any], prompt: Sequence[int]) -> None:
        """The lifecycle step after a prompt's prefill, before its first decode step.

        Args:
            model: the model (or a rank's share of it) that ran the prefill.
            caches: every layer's cache of this request, this one included.
            prompt: the prompt tokens prefilled by this request (its last token, the
                first decode input, is not among them).
        """
        ...


class NothingToPrepare:
    """Mixin for caches with no lifecycle work (full attention over what they hold)."""

    def prepare_decode(self, model: Any, caches: Sequence[Any], prompt: Sequence[int]) -> None:
        return None


class ScoreReducer(Protocol):
    """A model split across ranks (``distributed/pipeline.py``) sums per-block scores over
    them, so a decision every rank takes (the question pass's consensus) is the same
    as in one process."""

    def reduce_scores(self, scores: mx.array) -> mx.array: ...


def prepare_decode(model: Any, caches: Sequence[Any], prompt: Sequence[int]) -> None:
    """Run every layer cache's ``prepare_decode`` (the runtime calls this once per request
    between prefill and the first decode step). Nothing when ``prompt`` is empty (no prefill
    ran) or for mlx-lm's own cache classes, which have no lifecycle."""
    if not prompt or not caches:
        return
    for c in caches:
        step = getattr(c, "prepare_decode", None)  # mlx-lm's classes: none (nothing to prepare)
        if step is not None:
            step(model, caches, prompt)

"""``Precomputed``: an embedder that embeds a benchmark's texts in batches once, then answers from memory.

The store embeds one text per ``remember`` or search; on 2 shared cores that is
the slow part of an eval with all-mpnet-base-v2. Batches of 32 give the same
vectors (padding and length sorting change none: ``tests/test_semantic_minilm.py``)
for a fraction of the time. Same ``name`` and ``dim`` as the wrapped embedder, so
the store's calibration and stored vectors are exactly the wrapped one's.
"""

from __future__ import annotations

import numpy as np


class Precomputed:
    """Wraps an ``Embedder``; ``prime(texts)`` embeds them in one batched call."""

    def __init__(self, inner):
        self.inner = inner
        self.name, self.dim = inner.name, inner.dim
        self._cache: dict[str, np.ndarray] = {}

    def prime(self, texts: list[str]) -> None:
        todo = sorted({t for t in texts if t not in self._cache})
        for t, v in zip(todo, self.inner.embed(todo)):
            self._cache[t] = v

    def embed(self, texts: list[str]) -> np.ndarray:
        self.prime(texts)
        return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

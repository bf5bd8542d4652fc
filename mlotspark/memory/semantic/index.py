"""An in-memory copy of the store's vectors for one embedder, for brute-force cosine.

A desktop memory holds thousands of entries, not millions: one (N, dim) @ (dim,)
product per query takes well under a millisecond, so no ANN index is needed.
"""

from __future__ import annotations

import numpy as np


class VectorIndex:
    """Entry ids and their unit vectors, grown in place (amortised doubling).

    Args:
        dim: vector dimension.
    """

    def __init__(self, dim: int):
        self.dim = dim
        self._ids = np.zeros(0, dtype=np.int64)
        self._mat = np.zeros((0, dim), dtype=np.float32)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    @classmethod
    def from_rows(cls, dim: int, ids: list[int], blobs: list[bytes]) -> "VectorIndex":
        """Build from ``vectors`` rows (float32 blobs of exactly ``dim`` values).

        Args:
            dim: vector dimension.
            ids: entry ids.
            blobs: one float32 blob per id.

        Returns:
            The index.
        """
        index = cls(dim)
        if ids:
            index._ids = np.asarray(ids, dtype=np.int64)
            index._mat = np.frombuffer(b"".join(blobs), dtype=np.float32).reshape(len(ids), dim).copy()
            index._n = len(ids)
        return index

    def add(self, entry_id: int, vec: np.ndarray) -> None:
        """Append one vector.

        Args:
            entry_id: the entry's id.
            vec: (dim,) unit vector.
        """
        if self._n == len(self._ids):
            cap = max(64, 2 * len(self._ids))
            ids = np.zeros(cap, dtype=np.int64)
            mat = np.zeros((cap, self.dim), dtype=np.float32)
            ids[: self._n], mat[: self._n] = self._ids[: self._n], self._mat[: self._n]
            self._ids, self._mat = ids, mat
        self._ids[self._n], self._mat[self._n] = entry_id, vec
        self._n += 1

    def remove(self, entry_id: int) -> None:
        """Drop ``entry_id`` if present.

        Args:
            entry_id: the entry's id.
        """
        keep = self._ids[: self._n] != entry_id
        kept = int(keep.sum())
        if kept != self._n:
            self._ids = self._ids[: self._n][keep].copy()
            self._mat = self._mat[: self._n][keep].copy()
            self._n = kept

    def vectors_of(self, entry_ids: list[int]) -> dict[int, np.ndarray]:
        """The stored unit vectors of ``entry_ids`` (those that have one).

        Args:
            entry_ids: entry ids.

        Returns:
            id -> (dim,) vector.
        """
        where = np.flatnonzero(np.isin(self._ids[: self._n], np.asarray(entry_ids, dtype=np.int64)))
        return {int(self._ids[j]): self._mat[j] for j in where}

    def similarities(self, vec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Cosine similarity of ``vec`` to every stored vector.

        Args:
            vec: (dim,) unit vector.

        Returns:
            (ids (N,), similarities (N,)).
        """
        return self._ids[: self._n], self._mat[: self._n] @ vec  # (N, dim) @ (dim,) -> (N,)

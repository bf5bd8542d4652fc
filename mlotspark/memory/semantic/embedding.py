"""Sentence vectors for semantic memory: the protocol and the hashing fallback.

The embedder in use is a sentence-transformers model once one is pulled
(``choice.py``; the models are ``mlotspark.models.sentence_embedders``); until then,
and whenever none can be had, it is ``HashingEmbedder`` — never the loaded chat
model's hidden states:

- It ties memory to no model. Vectors from a model live in that model's space;
  switching models would orphan every stored vector. Hashed features depend only
  on the text, so memory survives model switches and upgrades.
- It is better at this job than what we have. The default model is a 135M causal
  LM: its mean-pooled hidden states are weak sentence vectors (dominated by
  frequent tokens and position, never trained for similarity), and computing them
  costs a forward pass on the engine thread for every entry and every turn.
- It is deterministic, fast (~0.1 ms per sentence in Python), needs no download, and the
  matching it gives — shared content words, shared word pairs, shared word pieces
  ("sister"/"sisters", "allergic"/"allergy") — is what recalling a user's own
  statements needs; BM25 in the store covers exact terms on top.

An engine may inject any object satisfying ``Embedder`` (for example one built
from a dedicated embedding model). The store records each vector's embedder name
and dimension and never compares vectors of different embedders.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import Counter
from typing import Protocol, runtime_checkable

import numpy as np

from mlotspark.errors import OptionError, StoreError
from mlotspark.memory.semantic.text import content_words


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised vectors.

    Attributes:
        name: identifies the vector space; two embedders with the same name must
            produce comparable vectors (include the version and settings in it).
        dim: vector dimension.
    """

    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts``.

        Args:
            texts: N strings.

        Returns:
            float32 array of shape (N, dim), each row L2-normalised (or all zero).
        """
        ...


@functools.lru_cache(maxsize=1 << 16)
def _bucket(feature: str, dim: int) -> tuple[int, float]:
    # blake2b, not hash(): Python salts str hashes per process, and vectors are
    # compared across processes and restarts.
    h = int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "little")
    return h % dim, (1.0 if h >> 63 else -1.0)


class HashingEmbedder:
    """Feature hashing of content words, word pairs and character n-grams.

    Features per text (stopwords dropped first, see ``text.STOPWORDS``):
    word unigrams (weight 1.0), adjacent content-word bigrams (0.7), and
    character 3–5-grams of each word with boundary marks, ``<sister>`` →
    ``<si``, ``sis``, … (0.25 each, so a word's pieces weigh about as much as the
    word). Counts are damped as 1 + log(tf); each feature goes to one of ``dim``
    buckets with a ±1 sign (signed hashing keeps collisions unbiased); rows are
    L2-normalised.

    Args:
        dim: vector dimension (default 1024: collisions stay rare for sentences
            of a few dozen features, and a vector is 4 KiB on disk).
    """

    UNIGRAM, BIGRAM, CHARGRAM = 1.0, 0.7, 0.25
    NGRAMS = (3, 4, 5)

    def __init__(self, dim: int = 1024):
        if not isinstance(dim, int) or isinstance(dim, bool) or not 16 <= dim <= 65536:
            raise OptionError(f"invalid embedding dim {dim!r}: use an integer in 16..65536")
        self.dim = dim
        # The name carries the feature recipe: change it and stored vectors are re-embedded.
        self.name = f"hashing-v1-{dim}"

    def features(self, text: str) -> Counter[str]:
        """Weighted features of ``text`` before hashing (for tests and debugging).

        Args:
            text: any text.

        Returns:
            Counter feature → summed weight (already tf-damped).
        """
        toks = content_words(text)
        raw: Counter[str] = Counter()
        for w in toks:
            raw["w:" + w] += 1
            marked = f"<{w}>"
            for n in self.NGRAMS:
                for i in range(len(marked) - n + 1):
                    raw["c:" + marked[i : i + n]] += 1
        for a, b in zip(toks, toks[1:]):
            raw[f"b:{a} {b}"] += 1
        weight = {"w": self.UNIGRAM, "b": self.BIGRAM, "c": self.CHARGRAM}
        return Counter({f: weight[f[0]] * (1.0 + math.log(c)) for f, c in raw.items()})

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts``; see the class docstring for the features.

        Args:
            texts: N strings (an empty or stopword-only text gives a zero row).

        Returns:
            float32 array (N, dim), rows L2-normalised.
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for feature, weight in self.features(text).items():
                idx, sign = _bucket(feature, self.dim)
                out[row, idx] += sign * weight
        return normalize_rows(out)


def normalize_rows(mat: np.ndarray) -> np.ndarray:
    """L2-normalise the rows of ``mat``; zero rows stay zero.

    Args:
        mat: (N, D) array.

    Returns:
        float32 (N, D) array.
    """
    mat = np.asarray(mat, dtype=np.float32)
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    return np.divide(mat, norms, out=np.zeros_like(mat), where=norms > 0)


def checked_embed(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """Call ``embedder.embed`` and check what comes back.

    An injected embedder that returns the wrong shape, NaNs, or unnormalised rows
    would silently poison the store, so it is caught here.

    Args:
        embedder: any ``Embedder``.
        texts: N strings.

    Returns:
        float32 (N, embedder.dim), rows re-normalised.

    Raises:
        StoreError: wrong shape or non-finite values, naming the embedder.
    """
    if not texts:
        return np.zeros((0, embedder.dim), dtype=np.float32)
    vecs = np.asarray(embedder.embed(list(texts)))
    if vecs.shape != (len(texts), embedder.dim):
        raise StoreError(
            f"embedder {embedder.name!r} returned shape {vecs.shape}, "
            f"expected ({len(texts)}, {embedder.dim})"
        )
    if not np.all(np.isfinite(vecs)):
        raise StoreError(f"embedder {embedder.name!r} returned non-finite values")
    return normalize_rows(vecs)

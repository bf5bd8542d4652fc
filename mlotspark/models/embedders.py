"""Sentence vectors: the ``Embedder`` protocol, the hashing fallback, and which embedder is used.

The embedder in use is a sentence-transformers model once one is pulled (MPNet, else
MiniLM: ``sentence_embedders``); until then, and whenever none can be had, it is
``HashingEmbedder`` — never the loaded chat model's hidden states:

- It ties memory to no model. Vectors from a model live in that model's space;
  switching models would orphan every stored vector. Hashed features depend only
  on the text, so memory survives model switches and upgrades.
- A 135M causal LM's mean-pooled hidden states are weak sentence vectors (never
  trained for similarity), and computing them costs a forward pass on the engine
  thread for every entry and every turn.
- It is deterministic, fast (~0.1 ms per sentence in Python), needs no download, and the
  matching it gives — shared content words, shared word pairs, shared word pieces
  ("sister"/"sisters", "allergic"/"allergy") — is what recalling a user's own
  statements needs; BM25 in the store covers exact terms on top.

An engine may inject any object satisfying ``Embedder``. The store records each vector's
embedder name and dimension and never compares vectors of different embedders; a store
opened with a new embedder re-embeds its entries.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import unicodedata
from collections import Counter
from typing import Any, Protocol, runtime_checkable

import numpy as np

from mlotspark.errors import OptionError, StoreError
from mlotspark.models.sentence_embedders import MiniLMEmbedder, MPNetEmbedder, Runner, SentenceEmbedder

# Function words and chat filler. They carry no fact, so dropping them keeps a
# question ("What is my sister's name?") and the fact that answers it ("My sister's
# name is Ilse.") close. Negations are *not* here: "I like tea" and "I don't like
# tea" must stay apart.
STOPWORDS: frozenset[str] = frozenset(
    """
    a an the and or but if then of at by for with about to from in into on onto off
    over under up down out as is am are was were be been being do does did doing
    have has had having i me my mine myself you your yours yourself we us our ours
    he him his she her hers it its they them their theirs this that these those
    what which who whom whose when where why how s t d ll re ve m o y ca wo
    can could would should will shall may might must so than too very just also
    there here please tell know remember recall again some any all each every
    yes ok okay hi hello hey thanks thank well oh really
    """.split()
)

_WORD = re.compile(r"\w+", re.UNICODE)
_NOT = re.compile(r"n['’]t\b", re.IGNORECASE)


def normalize(text: str) -> str:
    """NFKC, case-folded, with curly apostrophes made straight.

    Args:
        text: any text.

    Returns:
        The normalised text (same words, same order).
    """
    return unicodedata.normalize("NFKC", text).replace("’", "'").replace("‘", "'").casefold()


def words(text: str) -> list[str]:
    """All words of ``text``, normalised; "don't" becomes "do", "not".

    Args:
        text: any text.

    Returns:
        Word tokens in order.
    """
    return _WORD.findall(_NOT.sub(" not", normalize(text)))


def content_words(text: str) -> list[str]:
    """The words of ``text`` that are not stopwords, in order.

    Args:
        text: any text.

    Returns:
        Content-word tokens in order (duplicates kept).
    """
    return [w for w in words(text) if w not in STOPWORDS]



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


CHOICES = ("auto", "hashing", "minilm", "mpnet")


def default_embedder(runner: Runner | None = None) -> Any:
    """The embedder semantic memory uses: MPNet when pulled, else MiniLM when pulled, else hashing.

    ``$MLOTSPARK_EMBEDDER`` overrides the choice: ``hashing``, ``minilm``, ``mpnet``
    (an error at first use if that model is not pulled) or ``auto`` (the default).
    Choosing costs a few ``stat`` calls: nothing is loaded until the first ``embed``.

    Args:
        runner: how MLX work is run (see ``SentenceEmbedder``).

    Returns:
        An ``MPNetEmbedder``, a ``MiniLMEmbedder`` or a ``HashingEmbedder``.

    Raises:
        OptionError: ``$MLOTSPARK_EMBEDDER`` has another value.
    """
    from mlotspark.models.hub import bundles  # zip and wheel handling: only when an embedder is chosen

    choice = os.environ.get("MLOTSPARK_EMBEDDER", "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise OptionError(f"invalid MLOTSPARK_EMBEDDER {choice!r}: use auto, hashing, minilm or mpnet")
    auto = choice == "auto"
    if choice == "mpnet" or (auto and bundles.is_pulled(bundles.MPNET_MODEL)):
        return MPNetEmbedder(bundles.bundle_dir(bundles.MPNET_MODEL), runner)
    if choice == "minilm" or (auto and bundles.is_pulled(bundles.EMBEDDER_MODEL)):
        return MiniLMEmbedder(bundles.bundle_dir(bundles.EMBEDDER_MODEL), runner)
    return HashingEmbedder()


def describe_embedder(embedder: Any) -> str:
    """One line for ``mlotspark info``: which embedder is active and why.

    Args:
        embedder: what ``default_embedder`` returned.

    Returns:
        e.g. ``"mpnet-base-v2-st384 (all-mpnet-base-v2 sentence embeddings, /home/.../all-mpnet-base-v2)"``.
    """
    if isinstance(embedder, SentenceEmbedder):
        return f"{embedder.name} ({embedder.title} sentence embeddings, {embedder.model_dir})"
    return (f"{embedder.name} (word hashing fallback; `mlotspark pull all-mpnet-base-v2` "
            "(or all-minilm-l6-v2) for sentence embeddings)")


__all__ = ["CHOICES", "STOPWORDS", "Embedder", "HashingEmbedder", "checked_embed", "content_words", "default_embedder",
           "describe_embedder", "normalize", "normalize_rows", "words"]

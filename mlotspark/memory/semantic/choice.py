"""Which embedder semantic memory uses: all-mpnet-base-v2, all-MiniLM-L6-v2, or hashing.

The strongest one pulled wins: MPNet (``mlotspark pull all-mpnet-base-v2``), else
MiniLM (``mlotspark pull all-minilm-l6-v2``), else the hashing fallback, which needs
no download. A store opened with a new embedder re-embeds its entries
(``reembed.py``): vectors of two embedders are never compared.
"""

from __future__ import annotations

import os
from typing import Any

from mlotspark.errors import OptionError
from mlotspark.memory.semantic.embedding import HashingEmbedder
from mlotspark.models.sentence_embedders import MiniLMEmbedder, MPNetEmbedder, Runner, SentenceEmbedder

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
    from mlotspark.models import bundles  # zip and wheel handling: only when an embedder is chosen

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


__all__ = ["CHOICES", "default_embedder", "describe_embedder"]

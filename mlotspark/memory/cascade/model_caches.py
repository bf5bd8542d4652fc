"""A model's cascade caches as one: the check that a model can run a cascade, the
per-layer caches sharing one episodic store, and their snapshot and restore.

Apart from ``cache.py`` (one layer's cache) because these speak of the model (its
class, layers, trained context and parameters), which one layer's cache never needs.
"""

from __future__ import annotations

from typing import Any, Sequence

import mlx.core as mx
from mlx.utils import tree_flatten

from mlotspark.errors import OptionError
from mlotspark.memory.cascade.block_codec import quant_group
from mlotspark.memory.cascade.blocks import EpisodicStore
from mlotspark.memory.cascade.cache import CascadeCache
from mlotspark.memory.cascade.config import CascadeConfig
from mlotspark.memory.cascade.question import QuestionPass
from mlotspark.models.llama import Model, TransformerBlock

__all__ = ["cascade_state", "check_cascade", "is_cascade", "make_cascade_cache", "restore_cascade_cache"]


def check_cascade(model: Any, config: CascadeConfig, name: str = "") -> None:
    """Check that ``model`` can run the cascade ``config``: the one check shared by
    ``Engine.load`` (to fail at load, not at the first request) and ``make_cascade_cache``.

    Args:
        model: the model that would run it.
        config: the cascade configuration.
        name: the model's name, for the message.

    Raises:
        OptionError: not our llama-family model (its attention must call ``cache.attend``),
            a span past the trained context, or a block kind the block size cannot hold.
    """
    arch = getattr(getattr(model, "args", None), "model_type", None) or type(model).__name__  # names the architecture
    who = f"{name} ({arch})" if name else arch
    # A share of our model (a pipeline rank's layers) runs the cascade as the whole does:
    # what matters is that every layer's attention calls ``cache.attend``.
    layers = list(getattr(model, "layers", None) or [])
    ours = isinstance(model, Model) or (layers and all(isinstance(l, TransformerBlock) for l in layers))
    if not ours or not hasattr(model, "args"):
        raise OptionError(
            f"the memory cascade needs mlotspark's llama-family model; {who} runs on mlx-lm's "
            "classes: use cascade=None (--no-cascade)"
        )
    trained = model.args.max_position_embeddings
    if trained and config.span > trained:
        raise OptionError(
            f"cascade span {config.span} (sinks + top_k x block_size + window + chunk) exceeds "
            f"{name or 'the model'}'s trained context of {trained} tokens: lower window or top_k "
            "(--window, --top-k-blocks)"
        )
    head_dim = model.args.head_dim
    if config.block_kind in ("q8", "q4") and quant_group(config.block_size * head_dim) is None:
        raise OptionError(
            f"invalid cascade block_kind {config.block_kind!r} for block_size {config.block_size} "
            f"x head_dim {head_dim}: quantized blocks need a multiple of 32 values per head"
        )


def is_cascade(cache: Sequence[Any] | None) -> bool:
    """True when ``cache`` (per-layer caches) is the memory cascade: the one test for it."""
    return bool(cache) and isinstance(cache[0], CascadeCache)


def make_cascade_cache(model: Any, config: CascadeConfig, *, weights_bytes: int | None = None,
                       memory_limit: int | None = None, attention: Any = None) -> list[CascadeCache]:
    """One cascade cache per layer of ``model``, sharing one episodic store.

    Args:
        model: our llama-family model (``mlotspark.models.llama.Model``): its
            attention calls ``cache.attend``.
        config: the cascade configuration.
        weights_bytes: the model's bytes, for an episodic budget taken from the
            machine's (``episodic_budget_mb=None``); default: its parameters' bytes.
        memory_limit: the engine's memory limit (bytes), if any.
        attention: the attention function of the model's runner (``Runner.attention``;
            default MLX's own).

    Returns:
        The per-layer caches, for the model's runner and ``generate_step``.

    Raises:
        OptionError: see ``check_cascade``.
    """
    check_cascade(model, config)
    if weights_bytes is None and config.episodic_budget_mb is None:
        weights_bytes = sum(a.nbytes for _, a in tree_flatten(model.parameters()))
    store = EpisodicStore.from_config(config, weights_bytes or 0, memory_limit)
    question = _question_pass(config)
    return [CascadeCache(config, i, store, question=question, attention=attention) for i in range(len(model.layers))]


def _question_pass(config: CascadeConfig) -> QuestionPass | None:
    """One sequence's question pass: with the ``question`` router, when ``question_pass`` > 0."""
    return QuestionPass(config.question_pass) if config.routing == "question" and config.question_pass else None


def cascade_state(caches: list[CascadeCache]) -> list[tuple[dict[str, mx.array], dict]]:
    """``to_state()`` of every layer, in order."""
    return [c.to_state() for c in caches]


def restore_cascade_cache(states: list[tuple[dict[str, mx.array], dict]], config: CascadeConfig) -> list[CascadeCache]:
    """Inverse of ``cascade_state``: per-layer caches sharing one new store, whose
    budget is the saved store's when the config leaves it to the machine.

    Raises:
        SnapshotError: a state that does not fit ``config``.
    """
    store = EpisodicStore.from_config(config)
    saved = states[0][1].get("episodic_budget") if states else None
    if config.episodic_budget_mb is None and isinstance(saved, int) and saved >= 0:
        # The budget the engine gave the store it was saved from: here neither the weights
        # nor the memory limit are at hand, and the machine's budget without the weights
        # would let a restored conversation keep the weights' bytes more (older states: that).
        store.budget_bytes = saved
    caches = [CascadeCache.from_state(arrays, meta, config, store, settle=False) for arrays, meta in states]
    store.settle()
    question = _question_pass(config)
    for c in caches:
        c.question = question
    return caches

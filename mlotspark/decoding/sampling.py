"""Samplers and logits processors: mlx-lm's, configured from our options, and the one
loop that runs each row's processors over its own history (batched rows, beams,
speculative verify positions)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import mlx.core as mx
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from mlotspark.decoding.constrained import JsonConstraint
from mlotspark.decoding.processors import constraint_for
from mlotspark.decoding.reasoning import ReasoningBudget, budget_of, reasoning_format
from mlotspark.options import GenerationOptions

# Tokens the repetition penalty looks back over.
REPETITION_CONTEXT = 64

Sampler = Callable[[mx.array], mx.array]
#: mlx-lm's logits-processor contract: (tokens seen (T,), logits (1, V)) -> logits (1, V).
Processor = Callable[[mx.array, mx.array], mx.array]


def build_sampler(options: GenerationOptions) -> Sampler:
    """A sampler over log-probabilities (B, V) -> token ids (B,).

    A ``top_k`` of the vocabulary size or more keeps every token (mlx-lm's
    ``apply_top_k`` would fail with ``std::bad_cast`` on it), so it is off then.
    """
    by_vocab: dict[int, Sampler] = {}

    def sampler(logprobs: mx.array) -> mx.array:
        vocab = logprobs.shape[-1]
        inner = by_vocab.get(vocab)
        if inner is None:
            inner = by_vocab[vocab] = make_sampler(
                temp=options.temperature,
                top_p=options.top_p if options.top_p < 1.0 else 0.0,
                min_p=options.min_p,
                top_k=options.top_k if options.top_k < vocab else 0,
            )
        return inner(logprobs)

    return sampler


def build_logits_processors(options: GenerationOptions, tokenizer: Any = None,
                            constraint: JsonConstraint | None = None) -> list:
    """Processors (tokens, logits) -> logits; empty when none is enabled.

    Args:
        options: the request's options.
        tokenizer: the engine's tokenizer; needed for ``response_format`` (the
            grammar mask runs last, so no other processor can revive a masked token).
        constraint: the request's ``JsonConstraint`` when one was built already
            (``Engine.submit`` compiles the grammar once, to check it early); it is
            used as is, not compiled again. It keeps the request's parse state, so
            it serves one generation only.
    """
    out = []
    if options.repetition_penalty != 1.0:
        out += make_logits_processors(
            repetition_penalty=options.repetition_penalty,
            repetition_context_size=REPETITION_CONTEXT,
        )
    fmt = reasoning_format(tokenizer) if tokenizer is not None else None
    budget = budget_of(options, fmt)
    if budget is not None:  # before the grammar: it forces the close tag; the grammar still masks last
        out.append(ReasoningBudget(fmt, budget))
    if constraint is None and (options.response_format is not None or options.tools is not None
                               or options.logprobs is not None):
        if tokenizer is None:
            raise ValueError("response_format and tools need the tokenizer: build_logits_processors(options, tokenizer)")
        constraint = constraint_for(tokenizer, options)
    if constraint is not None:
        out.append(constraint)
    return out


def process_logits(logits: mx.array, histories: Sequence[Any], processors: Sequence[Sequence[Processor] | None]) -> mx.array:
    """Each row's logits through its own processors, over its own token history.

    mlx-lm's ``generate_step`` runs its processors on one row; a batch, a beam set or a
    speculative verify pass has a row per sequence (or per draft position), each with
    its own history, so the loop goes over rows here.

    Args:
        logits: (B, V) logits, one row per sequence or position.
        histories: per row, the tokens seen before it (a list of ids or an (T,) array).
        processors: per row, its processors in order (None or empty: left as is).

    Returns:
        (B, V) processed logits (``logits`` itself when no row has a processor).
    """
    if not any(processors):
        return logits
    rows = []
    for i, (hist, procs) in enumerate(zip(histories, processors, strict=True)):
        row = logits[i : i + 1]  # (1, V)
        if procs:
            h = hist if isinstance(hist, mx.array) else mx.array(hist)
            for proc in procs:
                row = proc(h, row)
        rows.append(row)
    return rows[0] if len(rows) == 1 else mx.concatenate(rows, axis=0)


def to_logprobs(logits: mx.array) -> mx.array:
    """Log-probabilities (B, V) of logits (B, V), as mlx-lm's ``generate_step`` makes them."""
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)

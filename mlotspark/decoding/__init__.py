"""How each next token is chosen: sampling, stop strings, and strategies beyond one
sampled token per step.

- ``sampling``: samplers and logits processors (*how a token is sampled*), and the
  one loop running each row's processors (``process_logits``).
- ``acceptance``: what a sampled token does (EOS, stop string, cancel, length): the
  one rule of the solo, batched, beam and speculative paths.
- ``text_stream``: ``TextStream``, a sequence's text (mlx-lm's streaming detokenizer,
  cut at stop strings, held back while a stop may be starting); ``stops``: ``StopMatcher``.
- ``beam``: beam search and multiple returns (``num_beams``, ``num_return_sequences``).
- ``speculative`` + ``drafters``: exact speculative decoding (prompt lookup, draft model).
- ``constrained``: JSON-schema replies (llguidance); ``tools``: the grammar that keeps tool
  calls valid; ``tool_calls``: call formats, where a call opens, one splitter for every API.

``Generation`` asks ``own_loop(options)`` whether a request needs its own decode loop
(the scheduler then runs it alone), and ``select_step`` for the token-step function
(mlx-lm's ``generate_step`` after our prefill and lifecycle step, ``prepared_step``, or
speculative decoding; same contract).

May import: ``errors``, ``options``, ``results``, ``storage``, ``platform``, ``models``, ``caches``,
``memory`` (to tell a cascade cache). Never ``runtime``: a ``Generation`` is passed in,
as a ``request.DecodeRequest``.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from mlotspark.memory.cascade import is_cascade
from mlotspark.options import GenerationOptions
from mlotspark.decoding.beam import Hypothesis, beam_search, run_sequences, sample_sequences
from mlotspark.decoding.drafters import DraftModelDrafter, PromptLookupDrafter
from mlotspark.decoding.request import DecodeRequest
from mlotspark.decoding.prepared_step import prepared_generate_step
from mlotspark.decoding.speculative import SpeculativeConfig, speculative_generate_step

__all__ = [
    "DecodeRequest",
    "own_loop",
    "select_step",
    "run_sequences",
    "Hypothesis",
    "beam_search",
    "sample_sequences",
    "PromptLookupDrafter",
    "DraftModelDrafter",
    "SpeculativeConfig",
    "speculative_generate_step",
]


def own_loop(options: GenerationOptions) -> bool:
    """True when a request cannot join a batched one-token decode step: speculative
    decoding, beam search or several returned sequences."""
    return bool(options.speculative) or options.num_beams > 1 or options.num_return_sequences > 1


def select_step(gen: DecodeRequest) -> Callable[..., Any]:
    """The token-step function for a Generation: ``generate_step``'s signature and
    contract (yield ``(token, logprobs)``), chosen from ``gen.options``.

    Speculative decoding on a cache that cannot be trimmed (the memory cascade) falls
    back to plain decoding, noted in ``stats.extra["speculative"]``.
    """
    generate_step = prepared_generate_step  # mlx-lm's, with the caches' prepare_decode step

    opts = gen.options
    if not opts.speculative:
        return generate_step
    if not all(getattr(c, "is_trimmable", lambda: False)() for c in gen.cache):
        gen.stats.extra["speculative"] = {"drafter": opts.speculative, "fallback": "cache cannot be trimmed"}
        return generate_step
    if is_cascade(gen.cache):
        # The cascade routes a multi-token verify pass by sequence, not per token, so
        # speculation would not reproduce its own plain decode exactly: decode plainly.
        gen.stats.extra["speculative"] = {"drafter": opts.speculative, "fallback": "memory cascade"}
        return generate_step
    if opts.speculative == "draft":
        from mlotspark.decoding.drafters import load_draft_model

        draft = load_draft_model(opts.draft_model, gen.model, gen.tokenizer)
        drafter: Any = DraftModelDrafter(draft, prefill_step_size=opts.prefill_chunk)
    else:
        drafter = PromptLookupDrafter()
    return partial(speculative_generate_step, drafter=drafter, options=opts, stats=gen.stats.extra)

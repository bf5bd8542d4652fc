"""Whether a request needs its own decode loop, and which token-step function it runs (plain or speculative)."""

from __future__ import annotations

from functools import partial
from typing import Any, Callable

from mlotspark.memory.cascade import is_cascade
from mlotspark.options import GenerationOptions
from mlotspark.decoding.drafters import DraftModelDrafter, PromptLookupDrafter
from mlotspark.decoding.request import DecodeRequest
from mlotspark.decoding.prepared_step import prepared_generate_step
from mlotspark.decoding.speculative import speculative_generate_step

__all__ = ["own_loop", "select_step"]


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

"""Whether a request needs its own decode loop, and which token-step function it runs (plain
or speculative), each from a prompt the runtime prefilled (``runtime/prefill.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any, Callable

import mlx.core as mx

from mlotspark.memory.cascade import is_cascade
from mlotspark.options import GenerationOptions
from mlotspark.decoding.drafters import DraftModelDrafter, PromptLookupDrafter
from mlotspark.decoding.request import DecodeRequest
from mlotspark.decoding.speculative import speculative_generate_step

__all__ = ["decode_step", "own_loop", "select_step"]


def own_loop(options: GenerationOptions) -> bool:
    """True when a request cannot join a batched one-token decode step: speculative
    decoding, beam search or several returned sequences."""
    return bool(options.speculative) or options.num_beams > 1 or options.num_return_sequences > 1


def decode_step(
    prompt: mx.array,
    model: Any,
    *,
    logits_processors: list | None = None,
    prompt_progress_callback: Callable[[int, int], None] | None = None,
    **kwargs: Any,
) -> Iterator[tuple[mx.array, mx.array]]:
    """mlx-lm's ``generate_step`` over a prompt whose tokens but the last are in the cache.

    Args:
        prompt: (L,) the prompt; ``prompt[:-1]`` is prefilled already (``runtime/prefill.py``).
        model: the model's runner.
        logits_processors: each sees the whole history, prompt included, as in ``generate_step``.
        prompt_progress_callback: unused (the prefill reported its progress).
        kwargs: passed to ``generate_step`` (``max_tokens``, ``sampler``, ``prompt_cache``, ...).
    """
    from mlx_lm.generate import generate_step

    before = prompt[:-1]
    if logits_processors and before.size:
        # generate_step sees the prompt's last token only: give the processors the rest.
        logits_processors = [_with_history(p, before) for p in logits_processors]
    yield from generate_step(prompt[-1:], model, logits_processors=logits_processors, **kwargs)


def _with_history(processor: Callable[[mx.array, mx.array], mx.array], before: mx.array) -> Callable:
    def run(tokens: mx.array, logits: mx.array) -> mx.array:
        return processor(mx.concatenate([before, tokens]), logits)

    return run


def select_step(gen: DecodeRequest, on_round: Callable[[int], None] | None = None) -> Callable[..., Any]:
    """The token-step function for a request (the runtime's ``Sequence``): ``generate_step``'s signature and
    contract (yield ``(token, logprobs)``), chosen from ``gen.options``.

    Speculative decoding on a cache that cannot be trimmed (the memory cascade) falls
    back to plain decoding, noted in ``stats.extra["speculative"]``.

    Args:
        gen: the request.
        on_round: speculative decoding calls it after each target pass with how many tokens
            it yields before the next one (``speculative_generate_step``); plain steps yield
            one token per pass and never call it.
    """
    generate_step = decode_step  # mlx-lm's, from the prompt's last token

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
    return partial(speculative_generate_step, drafter=drafter, options=opts, stats=gen.stats.extra,
                   on_round=on_round)

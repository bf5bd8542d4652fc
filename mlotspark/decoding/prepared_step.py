"""mlx-lm's ``generate_step`` with the caches' lifecycle step between prefill and decode.

A request that decodes in its own loop (``own_loop``: speculative decoding falling back
to plain decoding, for instance) runs through mlx-lm's ``generate_step``, which knows no
lifecycle: it prefills and decodes in one go. Here the prompt's prefill runs first (as
``generate_step`` would: all tokens but the last, in ``prefill_step_size`` chunks), then
``prepare_decode`` (``caches/interface.py``: the cascade's question pass), then
``generate_step`` takes over from the last prompt token — so this path runs the step
like the batched one (``runtime/prefill.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx

from mlotspark.caches.interface import prepare_decode

__all__ = ["prepared_generate_step"]


def prepared_generate_step(
    prompt: mx.array,
    model: Any,
    *,
    prompt_cache: list,
    prefill_step_size: int = 2048,
    prompt_progress_callback: Callable[[int, int], None] | None = None,
    logits_processors: list | None = None,
    **kwargs: Any,
) -> Iterator[tuple[mx.array, mx.array]]:
    """``generate_step``'s signature and contract (yields ``(token, logprobs)``).

    Args:
        prompt: (L,) prompt tokens; prompt_cache: the request's caches (required).
        prefill_step_size: tokens per prefill forward pass.
        prompt_progress_callback: ``(done, total)`` as ``generate_step`` reports it.
        logits_processors: each sees the whole history, prompt included, as in ``generate_step``.
        kwargs: passed to ``generate_step`` (``max_tokens``, ``sampler``, ...).
    """
    from mlx_lm.generate import generate_step

    total = prompt.shape[0]
    report = prompt_progress_callback or (lambda *_: None)
    report(0, total)
    done = 0
    while total - done > 1:
        n = min(prefill_step_size, total - 1 - done)
        model(prompt[done : done + n][None], cache=prompt_cache)
        mx.eval([c.state for c in prompt_cache])
        done += n
        report(done, total)
        mx.clear_cache()
    prepare_decode(model, prompt_cache, prompt[:done].tolist())
    if logits_processors and done:
        before = prompt[:done]
        # generate_step now sees the prompt's last token only: give the processors the rest.
        logits_processors = [_with_history(p, before) for p in logits_processors]
    yield from generate_step(
        prompt[done:],
        model,
        prompt_cache=prompt_cache,
        prefill_step_size=prefill_step_size,
        prompt_progress_callback=lambda d, _t: report(done + d, total) if d else None,
        logits_processors=logits_processors,
        **kwargs,
    )


def _with_history(processor: Callable[[mx.array, mx.array], mx.array], before: mx.array) -> Callable:
    def run(tokens: mx.array, logits: mx.array) -> mx.array:
        return processor(mx.concatenate([before, tokens]), logits)

    return run

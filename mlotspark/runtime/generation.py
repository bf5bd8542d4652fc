"""A request as its caller made it: a plain record, and its result once it ends.

The caller (``Engine.submit``, a conversation, the server) builds a :class:`Generation`:
model, tokenizer, prompt, cache, options. The engine thread makes the request's one
engine-side state from it (``runtime.sequence.Sequence``: prefill, ``prepare_decode``,
steps, acceptance, stats), which writes back here once, when the request ends
(``done``): the result and the tokens its cache then holds. The caller only reads.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from mlotspark.decoding.strategy import own_loop
from mlotspark.errors import PromptTooLongError
from mlotspark.memory.cascade import is_cascade
from mlotspark.models.execution import runner_for
from mlotspark.options import GenerationOptions
from mlotspark.results import GenerationResult


class Generation:
    """One request: what to run, and (``result``, ``fed_tokens``) what came of it.

    Args:
        model: the model's runner (``LoadedModel.runner``: it takes (tokens (1, L), cache) and
            returns logits); a bare model runs plainly.
        tokenizer: mlx-lm TokenizerWrapper (``detokenizer``, ``eos_token_ids``).
        prompt: the prompt token ids *not yet in* ``cache``.
        cache: per-layer caches; filled in place (pass a restored one to skip a prefix).
        options: validated generation options.
        cached_tokens: how many prompt tokens the cache already holds.
        context_limit: the model's context for a non-cascade cache, else None.
        cancel: set it to stop the generation at the next token.
        stats_base: model / device / weights fields to copy into the stats.
        extra_stats: called with the cache at the end; its dict goes to
            ``stats.extra["cascade"]`` (the memory cascade's tier figures).
        constraint: the ``response_format``'s compiled ``JsonConstraint``, if the
            caller built it (else it is built when decoding starts).

    Raises:
        PromptTooLongError: an empty prompt, or one past ``context_limit``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        prompt: list[int],
        cache: list,
        options: GenerationOptions,
        *,
        cached_tokens: int = 0,
        context_limit: int | None = None,
        cancel: threading.Event | None = None,
        stats_base: dict | None = None,
        extra_stats: Callable[[list], dict] | None = None,
        constraint: Any = None,
    ):
        if not prompt:
            raise PromptTooLongError("empty prompt: nothing to generate from") from None
        total = cached_tokens + len(prompt)
        if context_limit is not None and total >= context_limit:
            raise PromptTooLongError(
                f"prompt of {total} tokens does not fit the model's context of "
                f"{context_limit} tokens (use the memory cascade, or shorten the prompt)"
            )
        self.model, self.tokenizer, self.prompt, self.cache = runner_for(model), tokenizer, prompt, cache
        self.options = options
        self.cached_tokens = cached_tokens
        self.context_limit = context_limit
        self.cancel = cancel or threading.Event()
        self.stats_base = stats_base
        self.extra_stats = extra_stats
        self.constraint = constraint
        #: The result, once the request ended (None before, or when it failed).
        self.result: GenerationResult | None = None
        #: Every token the model consumed, in order (prompt, then sampled tokens): what the
        #: cache holds once the request ended. The prompt until then.
        self.fed_tokens: list[int] = list(prompt)

    @property
    def cascaded(self) -> bool:
        """True when the memory cascade holds this request's context."""
        return is_cascade(self.cache)

    @property
    def own_loop(self) -> bool:
        """True when this request decodes in its own loop (speculative, beams, several
        returns) rather than in a batched one-token step."""
        return own_loop(self.options)

    @property
    def tokens(self) -> list[int]:
        """The reply's tokens (empty until the request ended)."""
        return self.result.tokens if self.result is not None else []

    @property
    def text(self) -> str:
        """The reply's text (empty until the request ended)."""
        return self.result.text if self.result is not None else ""

    def max_new_tokens(self) -> int:
        """Tokens this request may generate: ``max_tokens``, cut to what the context leaves."""
        n = self.options.max_tokens
        if self.context_limit is not None:
            n = min(n, self.context_limit - self.cached_tokens - len(self.prompt))
        return n

    def done(self, result: GenerationResult, fed_tokens: list[int]) -> None:
        """[engine thread] The request ended: its result, and the tokens its cache holds."""
        self.result = result
        self.fed_tokens = list(fed_tokens)

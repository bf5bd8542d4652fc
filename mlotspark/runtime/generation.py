"""One sequence's generation: prefill, decode, stop rules, streaming text, stats.

The token loop is mlx-lm's ``generate_step`` (chunked prefill, async-eval decode
pipeline, its samplers); around it we add what an engine reports and enforces: stop
strings that never leak into the text, cancellation, the context limit, and stats.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator, Sequence

import mlx.core as mx
from mlx_lm.generate import generate_step

from mlotspark.errors import PromptTooLongError
from mlotspark.options import GenerationOptions
from mlotspark.decoding.sampling import build_logits_processors, build_sampler

FINISH_REASONS = ("stop", "length", "cancelled")


@dataclass
class GenerationStats:
    """What one request did; the ``--json`` fields of ``mlotspark generate``."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finish_reason: str = "stop"
    ttft_s: float = 0.0
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    peak_memory_mb: float = 0.0
    model: str = ""
    device: str = ""
    weights: str = ""
    prefilled_tokens: int = 0  # prompt tokens actually run through the model
    cached_tokens: int = 0  # prompt tokens whose KV came from a cache or snapshot
    extra: dict = field(default_factory=dict)  # cascade / memory / scheduler figures

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class GenerationResult:
    """A finished generation: ``text``, generated ``tokens`` and ``stats``; with beams or
    ``num_return_sequences`` > 1, every sequence in ``sequences`` (best first, as
    ``decoding.beam.Hypothesis``: ``text``, ``tokens``, ``score``, ``logprob``)."""

    text: str
    tokens: list[int]
    stats: GenerationStats
    sequences: list = field(default_factory=list)

    def __str__(self) -> str:
        return self.text


class StopMatcher:
    """Finds stop strings in streamed text and holds back what might start one."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self.hold = max((len(s) - 1 for s in self.stops), default=0)

    def cut(self, text: str) -> int | None:
        """Index where the earliest stop string begins in ``text``, or None."""
        hits = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def safe_length(self, text: str) -> int:
        """How much of ``text`` can be emitted without risking a partial stop string."""
        if not self.hold:
            return len(text)
        for k in range(min(self.hold, len(text)), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return len(text) - k
        return len(text)


def peak_memory_mb() -> float:
    try:
        return mx.get_peak_memory() / 1e6
    except AttributeError:  # older MLX
        return 0.0


class Generation:
    """Iterate to get text pieces as they decode; ``result`` is set when done.

    Args:
        model: a model taking (tokens (1, L), cache) and returning logits.
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
    ):
        if not prompt:
            raise PromptTooLongError("empty prompt: nothing to generate from") from None
        total = cached_tokens + len(prompt)
        if context_limit is not None and total >= context_limit:
            raise PromptTooLongError(
                f"prompt of {total} tokens does not fit the model's context of "
                f"{context_limit} tokens (use the memory cascade, or shorten the prompt)"
            )
        self.model, self.tokenizer, self.prompt, self.cache = model, tokenizer, prompt, cache
        self.options = options
        self.cached_tokens = cached_tokens
        self.context_limit = context_limit
        self.cancel = cancel or threading.Event()
        self.stats = GenerationStats(**(stats_base or {}))
        self.extra_stats = extra_stats
        self.tokens: list[int] = []
        # Every token the model has consumed, in order: the prompt, then each sampled
        # token; exactly what the cache holds when the request ends. Usually the last
        # token too (EOS included): generate_step and the scheduler feed a token
        # before reading it back, unless the scheduler had drained its batch.
        self.fed_tokens: list[int] = list(prompt)
        self.text = ""
        self.result: GenerationResult | None = None

    def _max_tokens(self) -> int:
        n = self.options.max_tokens
        if self.context_limit is not None:
            n = min(n, self.context_limit - self.cached_tokens - len(self.prompt))
        return n

    @property
    def own_loop(self) -> bool:
        """True when this request decodes in its own loop (speculative, beams, several
        returns) rather than in a batched one-token step."""
        from mlotspark.decoding import own_loop

        return own_loop(self.options)

    def __iter__(self) -> Iterator[str]:
        opts = self.options
        if opts.num_beams > 1 or opts.num_return_sequences > 1:
            from mlotspark.decoding import run_sequences

            yield from run_sequences(self)
            return
        if opts.seed is not None:
            mx.random.seed(opts.seed)
        eos = set(self.tokenizer.eos_token_ids or ())
        detok = self.tokenizer.detokenizer
        detok.reset()
        stops = StopMatcher(opts.stop)
        emitted = 0
        finish = "length"
        max_tokens = self._max_tokens()
        mx.reset_peak_memory()
        t0 = time.perf_counter()
        t_first = None
        from mlotspark.decoding import select_step  # generate_step, or speculative decoding

        steps = select_step(self)(
            mx.array(self.prompt),
            self.model,
            max_tokens=max_tokens,
            sampler=build_sampler(opts),
            logits_processors=build_logits_processors(opts) or None,
            prompt_cache=self.cache,
            prefill_step_size=opts.prefill_chunk,
        )
        try:
            for token, _ in steps:
                if t_first is None:
                    t_first = time.perf_counter()
                self.fed_tokens.append(token)
                if self.cancel.is_set():
                    finish = "cancelled"
                    break
                if token in eos:
                    finish = "stop"
                    break
                self.tokens.append(token)
                detok.add_token(token)
                self.text = detok.text
                cut = stops.cut(self.text) if stops.stops else None
                if cut is not None:
                    self.text = self.text[:cut]
                    finish = "stop"
                    break
                safe = stops.safe_length(self.text)
                if safe > emitted:
                    yield self.text[emitted:safe]
                    emitted = safe
            else:
                finish = "length"
            # Flush bytes the detokenizer held back (a split UTF-8 character).
            detok.finalize()
            cut = stops.cut(detok.text) if stops.stops else None
            self.text = detok.text[:cut] if cut is not None else detok.text
        finally:
            steps.close()
        if len(self.text) > emitted:
            yield self.text[emitted:]
        t_end = time.perf_counter()
        t_first = t_first or t_end
        s = self.stats
        s.prompt_tokens = self.cached_tokens + len(self.prompt)
        s.prefilled_tokens = len(self.prompt)
        s.cached_tokens = self.cached_tokens
        s.generation_tokens = len(self.tokens)
        s.finish_reason = finish
        s.ttft_s = t_first - t0
        s.prefill_tps = len(self.prompt) / s.ttft_s if s.ttft_s > 0 else 0.0
        n_decode = max(len(self.tokens) - 1, 0)
        s.decode_tps = n_decode / (t_end - t_first) if t_end > t_first and n_decode else 0.0
        s.peak_memory_mb = peak_memory_mb()
        if self.extra_stats is not None:
            s.extra["cascade"] = self.extra_stats(self.cache)
        self.result = GenerationResult(text=self.text, tokens=list(self.tokens), stats=s)

    def run(self) -> GenerationResult:
        """Run to the end and return the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

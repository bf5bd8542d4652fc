"""One sequence's generation: prefill, decode, stop rules, streaming text, stats.

The prompt goes through the one prefill (``runtime/prefill.py``: chunks, then the caches'
``prepare_decode``); the token loop is then mlx-lm's ``generate_step`` from the prompt's
last token (async-eval decode pipeline), speculative decoding or beams; around it we add what an engine reports and enforces: each
token goes through ``decoding.acceptance`` (EOS, stop strings that never leak into the
text, cancellation, the length), the context limit, and stats.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterator

import mlx.core as mx

from mlotspark.decoding.beam import run_sequences
from mlotspark.decoding.strategy import own_loop, select_step
from mlotspark.decoding.sampling import build_logits_processors, build_sampler
from mlotspark.decoding.acceptance import Acceptance
from mlotspark.errors import PromptTooLongError
from mlotspark.memory.cascade import is_cascade
from mlotspark.models.execution import runner_for
from mlotspark.options import GenerationOptions
from mlotspark.platform.device import peak_memory_mb
from mlotspark.results import GenerationResult, GenerationStats
from mlotspark.runtime.prefill import prefill_prompt
from mlotspark.runtime.progress import ProgressListener

class Generation:
    """Iterate to get text pieces as they decode; ``result`` is set when done.

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
        self.constraint = constraint
        self._sampling: tuple[Callable, list] | None = None

    @property
    def cascaded(self) -> bool:
        """True when the memory cascade holds this sequence's context."""
        return is_cascade(self.cache)

    def feed(self, token: int) -> None:
        """Note that the model consumed ``token`` after what ``fed_tokens`` lists (its KV is in
        the cache, or goes there in the step in flight): with ``fed_prompt``, the only writer
        of ``fed_tokens`` once the request is made."""
        self.fed_tokens.append(token)

    def fed_prompt(self, n: int) -> None:
        """Only the first ``n`` prompt tokens reached the cache (a request that ended in its prefill)."""
        self.fed_tokens[:] = self.prompt[:n]

    def sampling(self) -> tuple[Callable[[mx.array], mx.array], list]:
        """The request's sampler and logits processors (grammar included), built once here:
        the one place either is built, whichever path decodes it (batched, own loop, beams).
        """
        if self._sampling is None:
            opts = self.options
            self._sampling = (build_sampler(opts), build_logits_processors(opts, self.tokenizer, self.constraint))
        return self._sampling

    def max_new_tokens(self) -> int:
        """Tokens this request may generate: ``max_tokens``, cut to what the context leaves."""
        n = self.options.max_tokens
        if self.context_limit is not None:
            n = min(n, self.context_limit - self.cached_tokens - len(self.prompt))
        return n

    @property
    def own_loop(self) -> bool:
        """True when this request decodes in its own loop (speculative, beams, several
        returns) rather than in a batched one-token step."""
        return own_loop(self.options)

    def __iter__(self) -> Iterator[str]:
        return self.pieces()

    def pieces(self, on_progress: ProgressListener | None = None) -> Iterator[str]:
        """Run the request in its own loop: prefill, then decode, yielding text pieces.

        Args:
            on_progress: takes each ``PrefillProgress`` of the prompt (on the engine thread:
                keep it quick); None: nobody listens.
        """
        opts = self.options
        mx.reset_peak_memory()
        t0 = time.perf_counter()
        prefill_prompt(self.model, self, on_progress)  # the one prefill (runtime/prefill.py), prepare_decode included
        if opts.num_beams > 1 or opts.num_return_sequences > 1:
            yield from run_sequences(self, t_start=t0)
            return
        if opts.seed is not None:
            mx.random.seed(opts.seed)
        max_tokens = self.max_new_tokens()
        acc = Acceptance.of(self.tokenizer, opts.stop, max_tokens=max_tokens, cancel=self.cancel,
                            tokens=self.tokens)
        t_first = None
        sampler, processors = self.sampling()
        steps = select_step(self)(  # generate_step, or speculative decoding
            mx.array(self.prompt),
            self.model,
            max_tokens=max_tokens,
            sampler=sampler,
            logits_processors=processors or None,
            prompt_cache=self.cache,
            prefill_step_size=opts.prefill_chunk,
        )
        try:
            for token, _ in steps:
                if t_first is None:
                    t_first = time.perf_counter()
                self.feed(token)
                piece = acc.accept(token)
                self.text = acc.text
                if piece:
                    yield piece
                if acc.finish is not None:
                    break
            tail = acc.close()  # steps ran out: length
            self.text = acc.text
        finally:
            steps.close()
        if tail:
            yield tail
        self.finalize(acc.finish or "length", t0, t_first, stop_sequence=acc.stop_sequence)

    def finalize(
        self,
        finish: str,
        t_start: float,
        t_first: float | None,
        t_end: float | None = None,
        *,
        decoded: int | None = None,
        decode_s: float | None = None,
        sequences: list | None = None,
        stop_sequence: str | None = None,
    ) -> GenerationResult:
        """Fill ``stats`` and set ``result``: the one place a request's figures are made,
        whether it ran in its own loop, in a batch or as beams.

        Args:
            finish: the finish reason (``stop``, ``length``, ``cancelled``).
            t_start: when the request started (``time.perf_counter``).
            t_first: when its first token arrived (None: no token; taken as ``t_end``).
            t_end: when it ended (default now).
            decoded: tokens decoded after the first (default ``len(tokens) - 1``).
            decode_s: seconds those took (default ``t_end - t_first``).
            sequences: every returned sequence, best first (beams, several returns).
            stop_sequence: the stop string that ended the text, if one did.

        Returns:
            The ``GenerationResult``, also kept in ``result``.
        """
        t_end = time.perf_counter() if t_end is None else t_end
        t_first = t_end if t_first is None else t_first
        s = self.stats
        s.prompt_tokens = self.cached_tokens + len(self.prompt)
        s.prefilled_tokens = len(self.prompt)
        s.cached_tokens = self.cached_tokens
        s.generation_tokens = len(self.tokens)
        s.finish_reason = finish
        s.stop_sequence = stop_sequence if finish == "stop" else None
        s.ttft_s = t_first - t_start
        s.prefill_tps = len(self.prompt) / s.ttft_s if s.ttft_s > 0 else 0.0
        n_decode = max(len(self.tokens) - 1, 0) if decoded is None else decoded
        span = t_end - t_first if decode_s is None else decode_s
        s.decode_tps = n_decode / span if span > 0 and n_decode else 0.0
        s.peak_memory_mb = peak_memory_mb()
        if self.extra_stats is not None:
            s.extra["cascade"] = self.extra_stats(self.cache)
        self.result = GenerationResult(text=self.text, tokens=list(self.tokens), stats=s,
                                       sequences=list(sequences or []))
        return self.result

    def run(self) -> GenerationResult:
        """Run to the end and return the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

"""One running request on the engine thread: the one type that holds its state.

A caller's request is a plain record (``runtime.generation.Generation``: prompt, cache,
options; its ``result`` once it ends). The engine thread makes a :class:`Sequence` from it
when it admits the request, and the Sequence holds everything that changes while the
request runs: the tokens, the text stream and its acceptance (EOS, stop strings, length,
cancellation: ``decoding.acceptance``), the sampler and logits processors, the prefill and
decode counters, the stats and the cache. Every request prefills through ``prefill.py``
(the scheduler's chunks, ``prepare_decode`` at the end); then the batch
(``batching.DecodeBatch``) steps it one token at a time, or, for beams, speculation and
several returns, ``pieces`` steps its own loop, one step per turn of the engine thread.
Either way its tokens pass the one ``Acceptance`` (a beam's is a fork of it), and
``finalize`` makes the result and hands it to the record, the one write the caller sees.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import mlx.core as mx

from mlotspark.decoding.acceptance import Acceptance
from mlotspark.decoding.beam import run_sequences
from mlotspark.decoding.reasoning import splitter_of
from mlotspark.decoding.sampling import build_logits_processors, build_sampler
from mlotspark.decoding.strategy import select_step
from mlotspark.memory.cascade import is_cascade
from mlotspark.platform.device import peak_memory_mb
from mlotspark.results import GenerationResult, GenerationStats
from mlotspark.runtime.batching import is_plain_kv
from mlotspark.runtime.progress import ProgressListener, meter_for

__all__ = ["Sequence"]


class Sequence:
    """A request's state while it runs; made on the engine thread from the caller's record.

    Args:
        request: the caller's record (``Generation``): model runner, tokenizer, prompt (the
            tokens not yet in ``cache``), cache, options, cancel event, cached tokens, context
            limit, stats base, constraint. Only ``end`` (``finalize``, ``cut``) and ``drop_cache``
            write to it.
        eos: end-of-sequence token ids (default the tokenizer's).
        on_progress: takes each ``PrefillProgress`` of the prompt (the request handle's
            ``progressed``); None: nobody listens.
    """

    def __init__(self, request: Any, eos: set[int] | None = None, on_progress: ProgressListener | None = None):
        self.request = request
        self.model, self.tokenizer = request.model, request.tokenizer
        self.prompt: list[int] = request.prompt
        self.cache: list = request.cache
        self.options = request.options
        self.cached_tokens: int = request.cached_tokens
        self.context_limit: int | None = request.context_limit
        self.cancel = request.cancel
        self.constraint = request.constraint
        self.extra_stats: Callable[[list], dict] | None = request.extra_stats
        self.stats = GenerationStats(**(request.stats_base or {}))
        self.tokens: list[int] = []
        # Every token the model has consumed, in order: the prompt, then each sampled
        # token; exactly what the cache holds when the request ends. Usually the last
        # token too (EOS included): generate_step and the batch feed a token before
        # reading it back, unless the scheduler had drained its batch.
        self.fed_tokens: list[int] = list(self.prompt)
        self.text = ""
        self.result: GenerationResult | None = None
        self._sampling: tuple[Callable, list] | None = None
        if eos is None:
            eos = set(getattr(self.tokenizer, "eos_token_ids", None) or ())
        self.eos = eos
        self.sampler, self.processors = self.sampling()
        self.greedy = self.options.temperature == 0
        self.max_tokens = self.max_new_tokens()
        self.acceptance = Acceptance.of(self.tokenizer, self.options.stop, eos=eos, max_tokens=self.max_tokens,
                                        cancel=self.cancel, tokens=self.tokens)
        self.prefilled = 0  # prompt tokens run so far (all but the last: it starts decode)
        self.decoded = False  # True once the whole prompt is in the cache
        self.plain = is_plain_kv(self.cache)  # may be packed with other plain rows
        self.lazy_input: mx.array | None = None  # (1,) this step's input, fed unread
        self.finish: str | None = None
        self.t_start = time.perf_counter()
        self.t_first: float | None = None
        self.steps = 0  # decode steps taken
        self.batch_sizes = 0  # sum of the batch sizes over those steps
        self.meter = meter_for(self, on_progress)  # None when nobody listens to prefill progress

    # ------------------------------------------------------------ the request
    @property
    def cascaded(self) -> bool:
        """True when the memory cascade holds this sequence's context."""
        return is_cascade(self.cache)

    def max_new_tokens(self) -> int:
        """Tokens this request may generate: ``max_tokens``, cut to what the context leaves."""
        return self.request.max_new_tokens()

    def sampling(self) -> tuple[Callable[[mx.array], mx.array], list]:
        """The request's sampler and logits processors (grammar included), built once here:
        the one place either is built, whichever path decodes it (batched, own loop, beams).
        """
        if self._sampling is None:
            opts = self.options
            self._sampling = (build_sampler(opts), build_logits_processors(opts, self.tokenizer, self.constraint))
        return self._sampling

    def feed(self, token: int) -> None:
        """Note that the model consumed ``token`` after what ``fed_tokens`` lists (its KV is in
        the cache, or goes there in the step in flight): with ``fed_prompt``, the only writer
        of ``fed_tokens``."""
        self.fed_tokens.append(token)

    def fed_prompt(self, n: int) -> None:
        """Only the first ``n`` prompt tokens reached the cache (a request that ended in its prefill)."""
        self.fed_tokens[:] = self.prompt[:n]

    def drop_cache(self) -> None:
        """Let go of the KV (a cancelled or failed request whose cache the engine made)."""
        self.cache = []
        self.request.cache = []

    # ---------------------------------------------------------------- prefill
    @property
    def prefill_left(self) -> int:
        """Prompt tokens still to prefill before the sequence can join the batch."""
        return max(len(self.prompt) - 1 - self.prefilled, 0)

    @property
    def next_token(self) -> int:
        """The token this sequence feeds at its next decode step."""
        return self.tokens[-1] if self.tokens else self.prompt[-1]

    def history(self) -> mx.array:
        """Tokens the logits processors look back over (prompt + generated, fed)."""
        known = mx.array(self.fed_tokens)
        return known if self.lazy_input is None else mx.concatenate([known, self.lazy_input])

    # ---------------------------------------------------------------- decode
    def accept(self, token: int) -> str:
        """Take a sampled token; return the text that may be emitted now.

        Sets ``finish`` when the sequence is done (stop, length or cancelled).
        """
        if self.t_first is None:
            self.t_first = time.perf_counter()
        piece = self.acceptance.accept(token)
        self.text = self.acceptance.text
        self.finish = self.acceptance.finish
        return piece

    def adopt(self, acceptance: Acceptance) -> None:
        """Take ``acceptance`` (a fork of this one's that ran on: the best beam) as the
        request's own: its tokens, text, finish and stop string become the reply's."""
        self.tokens[:] = acceptance.tokens
        acceptance.tokens = self.tokens
        self.acceptance = acceptance
        self.text, self.finish = acceptance.text, acceptance.finish

    def close(self, reason: str | None = None) -> str:
        """Finish a batched sequence: flush held-back text, fill stats and ``result``.

        Args:
            reason: overrides ``finish`` (e.g. "cancelled" before any token).

        Returns:
            The last text piece to emit (may be empty).
        """
        piece = self.acceptance.close(reason)
        self.finish = self.acceptance.finish
        self.text = self.acceptance.text
        self.stats.extra["mean_batch"] = round(self.batch_sizes / self.steps, 2) if self.steps else 0.0
        self.finalize(self.finish, self.t_start, self.t_first, stop_sequence=self.acceptance.stop_sequence)
        return piece

    def pieces(self) -> Iterator[str]:
        """Decode the prefilled request in its own loop (speculative, beams, several returns),
        one step per ``next``: a forward pass's tokens (one, or a speculative round's verified
        run) or a decode step of every beam. Yields the text that step lets out (often
        ``""``), so the engine thread steps it in the same turns as the batch."""
        opts = self.options
        t0 = self.t_start  # the prefill ran since (the scheduler's chunks): it counts in TTFT
        if opts.num_beams > 1 or opts.num_return_sequences > 1:
            yield from run_sequences(self, t_start=t0)
            return
        if opts.seed is not None:
            mx.random.seed(opts.seed)
        sampler, processors = self.sampling()
        left = [0]  # tokens this pass still hands out (speculation says; else one per pass)

        def on_round(n: int) -> None:
            left[0] = n

        steps = select_step(self, on_round)(  # generate_step, or speculative decoding
            mx.array(self.prompt),
            self.model,
            max_tokens=self.max_tokens,
            sampler=sampler,
            logits_processors=processors or None,
            prompt_cache=self.cache,
            prefill_step_size=opts.prefill_chunk,
        )
        out, cut = "", None
        try:
            for token, _ in steps:  # each token through the acceptance the batched path uses
                self.feed(token)
                out += self.accept(token)
                if self.finish is not None:
                    break
                left[0] -= 1
                if left[0] <= 0:  # the next token needs a forward pass: this step is done
                    yield out
                    out = ""
                    if self.cancel.is_set():  # cancelled between steps: no pass for a token it drops
                        cut = "cancelled"
                        break
            out += self.acceptance.close(cut)  # else: steps ran out (length), or it had finished
            self.text, self.finish = self.acceptance.text, self.acceptance.finish
        finally:
            steps.close()
        self.finalize(self.finish or "length", t0, self.t_first, stop_sequence=self.acceptance.stop_sequence)
        yield out

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
        """Fill ``stats``, make the result and hand it to the caller's record: the one place
        a request's figures are made, whether it ran in its own loop, in a batch or as beams.

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
        text, reasoning = self.split_reasoning()
        for h in sequences or ():
            h.text, h.reasoning = self.split_reasoning(h.text)
        return self.end(GenerationResult(text=text, tokens=list(self.tokens), stats=s,
                                         sequences=list(sequences or []), reasoning=reasoning))

    def split_reasoning(self, text: str | None = None) -> tuple[str, str]:
        """The reply's (or ``text``'s) ``(answer, reasoning)``: a reasoning model's thinking
        taken out (``decoding.reasoning``, the splitter the streamed pieces go through too)."""
        text = self.text if text is None else text
        splitter = splitter_of(self.tokenizer, self.prompt) if self.tokenizer is not None else None
        if splitter is None:
            return text, ""
        reasoning, answer = splitter.split(text)
        return answer, reasoning

    def cut(self) -> GenerationResult:
        """End a request's own loop at once (cancelled): the text so far is the result."""
        if self.result is not None:
            return self.result
        self.stats.prompt_tokens = self.cached_tokens + len(self.prompt)
        self.stats.generation_tokens = len(self.tokens)
        self.stats.finish_reason = "cancelled"
        text, reasoning = self.split_reasoning()
        return self.end(GenerationResult(text=text, tokens=list(self.tokens), stats=self.stats, reasoning=reasoning))

    def end(self, result: GenerationResult) -> GenerationResult:
        """Keep ``result`` and hand it, with what the cache holds, to the caller's record."""
        self.result = result
        self.request.done(result, self.fed_tokens)
        return result

"""Beam search and multiple returns (``num_beams``, ``num_return_sequences``).

Both decode B rows in one batched cache (mlx-lm's caches hold B rows; beams are
reordered by indexing the rows), after one prefill of the prompt:

- **beam search** keeps the ``num_beams`` best partial sequences by summed logprob.
  A finished hypothesis (EOS, or the length limit) is scored
  ``sum of logprobs / length ** length_penalty``, the length counting the EOS.
  Early stopping as in Hugging Face's default (``early_stopping=False``): stop once
  ``num_beams`` hypotheses are finished and the best running beam, scored at its
  current length, cannot beat the worst of them. With one beam this is greedy.
- **multiple returns with sampling** draws ``num_return_sequences`` independent
  samples with the request's sampler.

Each beam or sample takes its tokens through ``decoding.acceptance`` like every other
path: an EOS or a stop string in its text ends it (``stop``), and its text comes from
the same ``TextStream``.

Returned sequences come best first, so the best is the request's result.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import mlx.core as mx

from mlotspark.decoding.acceptance import Acceptance
from mlotspark.caches.kinds import reorder_cache, tile_cache
from mlotspark.decoding.request import DecodeRequest
from mlotspark.decoding.sampling import process_logits, to_logprobs
from mlotspark.errors import OptionError

__all__ = ["BeamSearch", "Hypothesis", "SampledSequences", "beam_search", "sample_sequences", "run_sequences"]


@dataclass
class Hypothesis:
    """One returned sequence.

    Attributes:
        tokens: generated token ids (the EOS not included; the token that completed a
            stop string included).
        logprob: sum of the tokens' logprobs under the model (EOS included).
        score: ``logprob / length ** length_penalty`` (length counts the EOS).
        finish_reason: ``stop`` (EOS or a stop string), ``length`` or ``cancelled``.
        text: the decoded text, cut before a stop string (empty without a tokenizer); a
            reasoning model's thinking is taken out into ``reasoning``.
    """

    tokens: list[int]
    logprob: float
    score: float
    finish_reason: str
    text: str = ""
    reasoning: str = ""


def _score(logprob: float, length: int, length_penalty: float) -> float:
    return logprob / max(length, 1) ** length_penalty


def _logprobs(logits: mx.array, prompt: list[int], rows: list[Acceptance], processors: list | None) -> mx.array:
    """(B, V) logprobs after the processors, each row over its own history."""
    if processors:
        logits = process_logits(logits, [prompt + a.tokens for a in rows], [processors] * len(rows))
    return to_logprobs(logits)


Ended = tuple[Hypothesis, Acceptance]  # a finished sequence and its acceptance record


def _hypothesis(acc: Acceptance, logprob: float, length: int, length_penalty: float, reason: str) -> Ended:
    """A finished sequence from its acceptance record (its text flushed), with the record."""
    acc.close(reason)
    return Hypothesis(list(acc.tokens), logprob, _score(logprob, length, length_penalty), reason, acc.text), acc


def _best_first(ended: list[Ended]) -> None:
    ended.sort(key=lambda e: e[0].score, reverse=True)


class BeamSearch:
    """Beam search, one decode step per ``step()``, so the engine thread interleaves it
    with the other requests' steps; ``hypotheses()`` gives the result once it is done.

    Args:
        model: ``model(tokens (B, L), cache) -> logits (B, L, V)``.
        prompt: the prompt (at least one token); every token but the last is in ``cache``
            already (``runtime/prefill.py`` ran them, and the caches' ``prepare_decode``).
        cache: a one-row cache (plain or quantized); the beams run in copies.
        root: the request's acceptance (EOS ids, stop strings, ``max_tokens``, text
            stream), empty; every beam is a fork of it, so a beam ends exactly as the
            request itself would.
        num_beams: beam width (>= 1).
        length_penalty: exponent of the length normalisation (default 1.0; > 0
            favours longer sequences, < 0 shorter ones).
        num_return: hypotheses to return (<= num_beams).
        logits_processors: applied per beam over its own history.
        early_stopping: True stops as soon as ``num_beams`` hypotheses are finished.
        cancel: set it to stop; the best so far are returned as ``cancelled``.

    Raises:
        OptionError: ``num_return`` > ``num_beams``.
    """

    def __init__(self, model: Any, prompt: list[int], cache: list, *, root: Acceptance, num_beams: int,
                 length_penalty: float = 1.0, num_return: int = 1, logits_processors: list | None = None,
                 early_stopping: bool = False, cancel: threading.Event | None = None):
        if num_return > num_beams:
            raise OptionError(
                f"invalid num_return_sequences {num_return}: at most num_beams ({num_beams}) with beam search")
        B = self.B = num_beams
        self.model, self.prompt, self.processors = model, prompt, logits_processors
        self.length_penalty, self.num_return, self.early_stopping, self.cancel = (
            length_penalty, num_return, early_stopping, cancel)
        self.max_tokens = root.max_tokens
        self.beams = tile_cache(cache, B)
        self.accs = [root.fork()] * B  # a child is a copy
        self.sums = mx.array([0.0] + [-float("inf")] * (B - 1))  # only beam 0 is live at first
        self.sum_list = [0.0] * B
        self.finished: list[Ended] = []
        self.y = mx.array([[prompt[-1]]] * B)  # (B, 1)
        self.steps = 0
        self.reason: str | None = None  # set once the search ended
        self.first_token_at: float | None = None  # when the first step's tokens were read back

    def step(self) -> bool:
        """Run one decode step over the beams; returns False once the search has ended."""
        if self.reason is not None:
            return False
        if self.steps >= self.max_tokens:
            return self._end("length")
        if self.cancel is not None and self.cancel.is_set():
            return self._end("cancelled")
        B, lp = self.B, self.length_penalty
        logits = self.model(self.y, cache=self.beams)[:, -1, :]  # (B, V)
        logprobs = _logprobs(logits, self.prompt, self.accs, self.processors)
        V = logprobs.shape[-1]
        cand = (self.sums[:, None] + logprobs).reshape(-1)  # (B * V,)
        top = mx.argpartition(-cand, kth=2 * B - 1)[: 2 * B] if 2 * B < cand.size else mx.arange(cand.size)
        top_scores = cand[top]
        order = mx.argsort(-top_scores)
        top, top_scores = top[order].tolist(), top_scores[order].tolist()
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.steps += 1
        length = self.steps
        keep: list[tuple[int, int, float, Acceptance]] = []  # (beam, token, summed logprob, its record)
        for rank, (flat, s) in enumerate(zip(top, top_scores)):
            if s == -float("inf"):
                break
            b, tok = divmod(flat, V)
            child = self.accs[b].child(tok)
            if child.finish == "stop":  # an EOS, or a stop string in the text
                if rank < B:  # only an end among the top B ends a hypothesis (as Hugging Face)
                    self.finished.append(_hypothesis(child, s, length, lp, "stop"))
                continue
            keep.append((b, tok, s, child))
            if len(keep) == B:
                break
        _best_first(self.finished)
        del self.finished[B:]
        if not keep:
            return self._end("stop")
        while len(keep) < B:  # fewer live candidates than beams (tiny vocabularies)
            keep.append((*keep[0][:2], -float("inf"), keep[0][3]))
        reorder_cache(self.beams, mx.array([b for b, _, _, _ in keep]))
        self.accs = [a for _, _, _, a in keep]
        self.sum_list = [s for _, _, s, _ in keep]
        self.sums = mx.array(self.sum_list)
        self.y = mx.array([[tok] for _, tok, _, _ in keep])
        if len(self.finished) >= B:
            best_running = max(self.sum_list) / length**lp
            if self.early_stopping or best_running <= min(h.score for h, _ in self.finished):
                return self._end("stop")
        if self.steps >= self.max_tokens:
            return self._end("length")
        return True

    def _end(self, reason: str) -> bool:
        self.reason = reason
        if reason != "stop":  # running beams compete with the finished ones
            for a, total in zip(self.accs, self.sum_list):
                if total > -float("inf"):
                    self.finished.append(_hypothesis(a.fork(), total, len(a.tokens), self.length_penalty, reason))
        _best_first(self.finished)
        self.beams = []  # the copies' KV goes now, not when the request is collected
        return False

    def hypotheses(self) -> list[Hypothesis]:
        """The ``num_return`` best hypotheses, best first (the search ended)."""
        return [h for h, _ in self.finished[: self.num_return]]

    def best_record(self) -> Acceptance:
        """The best hypothesis' acceptance record (its text, finish and stop string)."""
        return self.finished[0][1]


class SampledSequences:
    """``n`` independent samples decoded as one batch, one step per ``step()``;
    ``hypotheses()`` returns them best score first. Args as in ``BeamSearch``; ``sampler``
    maps logprobs (n, V) to tokens (n,), one independent draw per row."""

    def __init__(self, model: Any, prompt: list[int], cache: list, *, root: Acceptance, n: int,
                 sampler: Callable[[mx.array], mx.array], length_penalty: float = 1.0,
                 logits_processors: list | None = None, cancel: threading.Event | None = None):
        self.model, self.prompt, self.sampler, self.processors = model, prompt, sampler, logits_processors
        self.length_penalty, self.cancel, self.max_tokens = length_penalty, cancel, root.max_tokens
        self.rows = tile_cache(cache, n)
        self.accs = [root.fork() for _ in range(n)]
        self.sums = [0.0] * n
        self.y = mx.array([[prompt[-1]]] * n)
        self.steps = 0
        self.done = False
        self.ended: list[Ended] | None = None  # the samples, best first, once made
        self.first_token_at: float | None = None

    def step(self) -> bool:
        """Run one decode step over the rows; returns False once every row has ended."""
        if self.done:
            return False
        if self.steps >= self.max_tokens or (self.cancel is not None and self.cancel.is_set()):
            return self._end()
        logits = self.model(self.y, cache=self.rows)[:, -1, :]
        logprobs = _logprobs(logits, self.prompt, self.accs, self.processors)
        toks = self.sampler(logprobs)
        picked = mx.take_along_axis(logprobs, toks[:, None], axis=-1)[:, 0]
        toks_l, picked_l = toks.tolist(), picked.tolist()
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        self.steps += 1
        for i, (t, lp) in enumerate(zip(toks_l, picked_l)):
            if self.accs[i].finish is None:
                self.sums[i] += lp
                self.accs[i].accept(t)
        if all(a.finish is not None for a in self.accs) or self.steps >= self.max_tokens:
            return self._end()
        self.y = mx.array([[t] for t in toks_l])
        return True

    def _end(self) -> bool:
        self.done, self.rows = True, []
        return False

    def hypotheses(self) -> list[Hypothesis]:
        """Every sample, best score first (the rows ended)."""
        return [h for h, _ in self._ended()]

    def best_record(self) -> Acceptance:
        """The best sample's acceptance record (its text, finish and stop string)."""
        return self._ended()[0][1]

    def _ended(self) -> list[Ended]:
        if self.ended is None:
            reason = "cancelled" if self.cancel is not None and self.cancel.is_set() else "length"
            self.ended = []
            for a, total in zip(self.accs, self.sums):
                length = len(a.tokens) + a.ended_on_eos
                self.ended.append(_hypothesis(a, total, length, self.length_penalty, a.finish or reason))
            _best_first(self.ended)
        return self.ended


def beam_search(
    model: Any,
    prompt: list[int],
    cache: list,
    *,
    num_beams: int,
    max_tokens: int,
    eos: set[int],
    length_penalty: float = 1.0,
    num_return: int = 1,
    logits_processors: list | None = None,
    early_stopping: bool = False,
    cancel: threading.Event | None = None,
    tokenizer: Any = None,
    stop: Sequence[str] = (),
) -> list[Hypothesis]:
    """Beam search run to its end (``BeamSearch``); returns the ``num_return`` best
    hypotheses, best first.

    Args as in ``BeamSearch``, with the acceptance given by its parts: ``max_tokens`` (most
    tokens per hypothesis), ``eos`` (end-of-sequence ids), ``tokenizer`` (makes each
    hypothesis' text; None: texts stay empty) and ``stop`` (stop strings; one in a beam's
    text ends it as an EOS would; needs ``tokenizer``).
    """
    search = BeamSearch(model, prompt, cache, root=Acceptance.of(tokenizer, stop, eos=eos, max_tokens=max_tokens),
                        num_beams=num_beams, length_penalty=length_penalty, num_return=num_return,
                        logits_processors=logits_processors, early_stopping=early_stopping, cancel=cancel)
    while search.step():
        pass
    return search.hypotheses()


def sample_sequences(
    model: Any,
    prompt: list[int],
    cache: list,
    *,
    n: int,
    sampler: Callable[[mx.array], mx.array],
    max_tokens: int,
    eos: set[int],
    length_penalty: float = 1.0,
    logits_processors: list | None = None,
    cancel: threading.Event | None = None,
    tokenizer: Any = None,
    stop: Sequence[str] = (),
) -> list[Hypothesis]:
    """``n`` independent samples run to their end (``SampledSequences``); best score first.

    Args as in ``beam_search``.
    """
    rows = SampledSequences(model, prompt, cache, root=Acceptance.of(tokenizer, stop, eos=eos, max_tokens=max_tokens),
                            n=n, sampler=sampler, length_penalty=length_penalty,
                            logits_processors=logits_processors, cancel=cancel)
    while rows.step():
        pass
    return rows.hypotheses()


def run_sequences(gen: DecodeRequest, t_start: float | None = None) -> Iterator[str]:
    """Run a request (the runtime's ``Sequence``) whose options ask for beams or several
    returns, its prompt prefilled (all but the last token) since ``t_start`` (default now):
    one decode step per ``next``, yielding ``""`` until the last, which yields the best text.

    Every beam or sample is a fork of the request's own acceptance (``gen.acceptance``:
    its EOS ids, stop strings, ``max_tokens``), and the best one's becomes the request's
    (``gen.adopt``), so the reply ends and reports its stop string as any other does.
    Fills ``gen.stats`` and ``gen.result`` (with every sequence in ``result.sequences``,
    best first).
    """
    opts = gen.options
    if opts.seed is not None:
        mx.random.seed(opts.seed)
    sampler, processors = gen.sampling()
    common = dict(root=gen.acceptance, length_penalty=opts.length_penalty, logits_processors=processors or None,
                  cancel=gen.cancel)
    t0 = time.perf_counter() if t_start is None else t_start
    run: BeamSearch | SampledSequences
    if opts.num_beams > 1:
        run = BeamSearch(gen.model, gen.prompt, gen.cache, num_beams=opts.num_beams,
                         num_return=opts.num_return_sequences, **common)
    else:
        run = SampledSequences(gen.model, gen.prompt, gen.cache, n=opts.num_return_sequences, sampler=sampler,
                               **common)
    while run.step():  # a cancel is seen by the next step, which ends it with the best so far
        yield ""  # one decode step done: the engine thread's turn goes to the others
    hyps = run.hypotheses()
    end = time.perf_counter()
    best = hyps[0]
    record = run.best_record()
    gen.adopt(record)
    gen.stats.extra["sequences"] = {
        "mode": "beam" if opts.num_beams > 1 else "sample",
        "num_beams": opts.num_beams,
        "returned": len(hyps),
        "scores": [round(h.score, 4) for h in hyps],
    }
    # TTFT: when the first decode step's tokens were read back (the reply itself is
    # shown whole, at the end). The cache holds the prompt only: the beams ran in copies.
    first = run.first_token_at or end
    gen.finalize(best.finish_reason, t0, first, end, decoded=sum(len(h.tokens) for h in hyps),
                 decode_s=end - first, sequences=hyps, stop_sequence=record.stop_sequence)
    yield best.text

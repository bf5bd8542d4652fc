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

__all__ = ["Hypothesis", "beam_search", "sample_sequences", "run_sequences"]


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


def _first_token(timings: dict | None) -> None:
    """Note when the first decode step's tokens were read back (the reply's TTFT)."""
    if timings is not None and "first_token_at" not in timings:
        timings["first_token_at"] = time.perf_counter()


def _logprobs(logits: mx.array, prompt: list[int], rows: list[Acceptance], processors: list | None) -> mx.array:
    """(B, V) logprobs after the processors, each row over its own history."""
    if processors:
        logits = process_logits(logits, [prompt + a.tokens for a in rows], [processors] * len(rows))
    return to_logprobs(logits)


def _hypothesis(acc: Acceptance, logprob: float, length: int, length_penalty: float, reason: str) -> Hypothesis:
    """A finished sequence from its acceptance record (its text flushed)."""
    acc.close(reason)
    return Hypothesis(list(acc.tokens), logprob, _score(logprob, length, length_penalty), reason, acc.text)


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
    timings: dict | None = None,
    tokenizer: Any = None,
    stop: Sequence[str] = (),
) -> list[Hypothesis]:
    """Beam search; returns the ``num_return`` best hypotheses, best first.

    Args:
        model: ``model(tokens (B, L), cache) -> logits (B, L, V)``.
        prompt: the prompt (at least one token); every token but the last is in ``cache``
            already (``runtime/prefill.py`` ran them, and the caches' ``prepare_decode``).
        cache: a one-row cache (plain or quantized); the beams run in copies.
        num_beams: beam width (>= 1).
        max_tokens: most tokens per hypothesis.
        eos: end-of-sequence ids.
        length_penalty: exponent of the length normalisation (default 1.0; > 0
            favours longer sequences, < 0 shorter ones).
        num_return: hypotheses to return (<= num_beams).
        logits_processors: applied per beam over its own history.
        early_stopping: True stops as soon as ``num_beams`` hypotheses are finished.
        cancel: set it to stop; the best so far are returned as ``cancelled``.
        timings: filled with ``first_token_at`` (``time.perf_counter()`` when the first
            decode step's tokens were read back).
        tokenizer: makes each hypothesis' text (None: texts stay empty).
        stop: stop strings; one in a beam's text ends it as an EOS would (needs ``tokenizer``).

    Raises:
        OptionError: ``num_return`` > ``num_beams``.
    """
    if num_return > num_beams:
        raise OptionError(f"invalid num_return_sequences {num_return}: at most num_beams ({num_beams}) with beam search")
    B = num_beams
    beams = tile_cache(cache, B)
    accs = [Acceptance.of(tokenizer, stop, eos=eos, max_tokens=max_tokens)] * B  # a child is a copy
    sums = mx.array([0.0] + [-float("inf")] * (B - 1))  # only beam 0 is live at first
    sum_list = [0.0] * B
    finished: list[Hypothesis] = []
    y = mx.array([[prompt[-1]]] * B)  # (B, 1)
    reason = "length"

    def worst_finished() -> float:
        return min(h.score for h in finished)

    for step in range(max_tokens):
        if cancel is not None and cancel.is_set():
            reason = "cancelled"
            break
        logits = model(y, cache=beams)[:, -1, :]  # (B, V)
        logprobs = _logprobs(logits, prompt, accs, logits_processors)
        V = logprobs.shape[-1]
        cand = (sums[:, None] + logprobs).reshape(-1)  # (B * V,)
        top = mx.argpartition(-cand, kth=2 * B - 1)[: 2 * B] if 2 * B < cand.size else mx.arange(cand.size)
        top_scores = cand[top]
        order = mx.argsort(-top_scores)
        top, top_scores = top[order].tolist(), top_scores[order].tolist()
        _first_token(timings)
        length = step + 1
        keep: list[tuple[int, int, float, Acceptance]] = []  # (beam, token, summed logprob, its record)
        for rank, (flat, s) in enumerate(zip(top, top_scores)):
            if s == -float("inf"):
                break
            b, tok = divmod(flat, V)
            child = accs[b].child(tok)
            if child.finish == "stop":  # an EOS, or a stop string in the text
                if rank < B:  # only an end among the top B ends a hypothesis (as Hugging Face)
                    finished.append(_hypothesis(child, s, length, length_penalty, "stop"))
                continue
            keep.append((b, tok, s, child))
            if len(keep) == B:
                break
        finished.sort(key=lambda h: h.score, reverse=True)
        del finished[B:]
        if not keep:
            reason = "stop"
            break
        while len(keep) < B:  # fewer live candidates than beams (tiny vocabularies)
            keep.append((*keep[0][:2], -float("inf"), keep[0][3]))
        reorder_cache(beams, mx.array([b for b, _, _, _ in keep]))
        accs = [a for _, _, _, a in keep]
        sum_list = [s for _, _, s, _ in keep]
        sums = mx.array(sum_list)
        y = mx.array([[tok] for _, tok, _, _ in keep])
        if len(finished) >= B:
            best_running = max(sum_list) / length**length_penalty
            if early_stopping or best_running <= worst_finished():
                reason = "stop"
                break
    if reason != "stop":  # running beams compete with the finished ones
        for a, total in zip(accs, sum_list):
            if total > -float("inf"):
                finished.append(_hypothesis(a, total, len(a.tokens), length_penalty, reason))
    finished.sort(key=lambda h: h.score, reverse=True)
    return finished[:num_return]


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
    timings: dict | None = None,
    tokenizer: Any = None,
    stop: Sequence[str] = (),
) -> list[Hypothesis]:
    """``n`` independent samples decoded as one batch; returned best score first.

    Args as in ``beam_search``; ``sampler`` maps logprobs (n, V) to tokens (n,),
    one independent draw per row.
    """
    rows = tile_cache(cache, n)
    accs = [Acceptance.of(tokenizer, stop, eos=eos, max_tokens=max_tokens) for _ in range(n)]
    sums = [0.0] * n
    y = mx.array([[prompt[-1]]] * n)
    for _ in range(max_tokens):
        if cancel is not None and cancel.is_set():
            break
        logits = model(y, cache=rows)[:, -1, :]
        logprobs = _logprobs(logits, prompt, accs, logits_processors)
        toks = sampler(logprobs)
        picked = mx.take_along_axis(logprobs, toks[:, None], axis=-1)[:, 0]
        toks_l, picked_l = toks.tolist(), picked.tolist()
        _first_token(timings)
        for i, (t, lp) in enumerate(zip(toks_l, picked_l)):
            if accs[i].finish is None:
                sums[i] += lp
                accs[i].accept(t)
        if all(a.finish is not None for a in accs):
            break
        y = mx.array([[t] for t in toks_l])
    reason = "cancelled" if cancel is not None and cancel.is_set() else "length"
    out = []
    for a, total in zip(accs, sums):
        length = len(a.tokens) + a.ended_on_eos
        out.append(_hypothesis(a, total, length, length_penalty, a.finish or reason))
    out.sort(key=lambda h: h.score, reverse=True)
    return out


def run_sequences(gen: DecodeRequest, t_start: float | None = None) -> Iterator[str]:
    """Run a request (the runtime's ``Sequence``) whose options ask for beams or several returns, its prompt
    prefilled (all but the last token) since ``t_start`` (default now).

    Fills ``gen.tokens``, ``gen.text``, ``gen.stats`` and ``gen.result`` (with every
    sequence in ``result.sequences``, best first) and yields the best text once.
    A stop string ends a sequence as an EOS does.
    """
    opts = gen.options
    if opts.seed is not None:
        mx.random.seed(opts.seed)
    eos = set(gen.tokenizer.eos_token_ids or ())
    sampler, processors = gen.sampling()
    timings: dict = {}  # first_token_at: beams report TTFT and prefill speed too
    common = dict(
        max_tokens=gen.max_new_tokens(),
        eos=eos,
        length_penalty=opts.length_penalty,
        logits_processors=processors or None,
        cancel=gen.cancel,
        timings=timings,
        tokenizer=gen.tokenizer,
        stop=opts.stop,
    )
    t0 = time.perf_counter() if t_start is None else t_start
    if opts.num_beams > 1:
        hyps = beam_search(gen.model, gen.prompt, gen.cache, num_beams=opts.num_beams,
                           num_return=opts.num_return_sequences, **common)
    else:
        hyps = sample_sequences(gen.model, gen.prompt, gen.cache, n=opts.num_return_sequences,
                                sampler=sampler, **common)
    end = time.perf_counter()
    best = hyps[0]
    gen.tokens[:] = best.tokens
    gen.text = best.text
    gen.stats.extra["sequences"] = {
        "mode": "beam" if opts.num_beams > 1 else "sample",
        "num_beams": opts.num_beams,
        "returned": len(hyps),
        "scores": [round(h.score, 4) for h in hyps],
    }
    # TTFT: when the first decode step's tokens were read back (the reply itself is
    # shown whole, at the end). The cache holds the prompt only: the beams ran in copies.
    first = timings.get("first_token_at", end)
    gen.finalize(best.finish_reason, t0, first, end, decoded=sum(len(h.tokens) for h in hyps),
                 decode_s=end - first, sequences=hyps)
    yield best.text

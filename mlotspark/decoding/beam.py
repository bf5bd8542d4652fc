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

Returned sequences come best first, so the best is the request's result.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import mlx.core as mx

from mlotspark.decoding.cache_kinds import reorder_cache, tile_cache
from mlotspark.models.cache_interface import prepare_decode
from mlotspark.decoding.sampling import build_logits_processors, build_sampler
from mlotspark.decoding.stops import StopMatcher
from mlotspark.errors import OptionError

__all__ = ["Hypothesis", "beam_search", "sample_sequences", "run_sequences"]


@dataclass
class Hypothesis:
    """One returned sequence.

    Attributes:
        tokens: generated token ids (the EOS not included).
        logprob: sum of the tokens' logprobs under the model (EOS included).
        score: ``logprob / length ** length_penalty`` (length counts the EOS).
        finish_reason: ``stop`` (EOS), ``length`` or ``cancelled``.
        text: the decoded text (set by ``run_sequences``).
    """

    tokens: list[int]
    logprob: float
    score: float
    finish_reason: str
    text: str = ""


def _score(logprob: float, length: int, length_penalty: float) -> float:
    return logprob / max(length, 1) ** length_penalty


def _prefill(model: Any, prompt: list[int], cache: list, chunk: int,
             progress: Callable[[int, int], None] | None = None, timings: dict | None = None) -> None:
    """Run all prompt tokens but the last into the one-row ``cache``.

    ``progress(done, total)`` hears of each chunk (the last call has done == total);
    ``timings["prefill_s"]`` gets the seconds it took.
    """
    t0 = time.perf_counter()
    report = progress or (lambda *_: None)
    report(0, len(prompt))
    i = 0
    while len(prompt) - 1 - i > 0:
        n = min(chunk, len(prompt) - 1 - i)
        model(mx.array(prompt[i : i + n])[None], cache=cache)
        mx.eval([c.state for c in cache])
        i += n
        report(i, len(prompt))
    prepare_decode(model, cache, prompt[:i])  # the lifecycle step before the first decode step
    report(len(prompt), len(prompt))
    if timings is not None:
        timings["prefill_s"] = time.perf_counter() - t0


def _first_token(timings: dict | None, t0: float) -> None:
    """Note when the first decode step's tokens were read back (the reply's TTFT)."""
    if timings is not None and "first_token_s" not in timings:
        timings["first_token_s"] = time.perf_counter() - t0


def _processed_logprobs(logits: mx.array, histories: list[list[int]], processors: list | None) -> mx.array:
    """(B, V) logprobs after each row's logits processors."""
    if processors:
        rows = []
        for i, hist in enumerate(histories):
            row = logits[i : i + 1]
            h = mx.array(hist)
            for p in processors:
                row = p(h, row)
            rows.append(row)
        logits = mx.concatenate(rows, axis=0)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


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
    prefill_chunk: int = 512,
    early_stopping: bool = False,
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
    timings: dict | None = None,
) -> list[Hypothesis]:
    """Beam search; returns the ``num_return`` best hypotheses, best first.

    Args:
        model: ``model(tokens (B, L), cache) -> logits (B, L, V)``.
        prompt: prompt tokens not yet in ``cache`` (at least one).
        cache: a one-row cache (plain or quantized) holding what precedes ``prompt``;
            the prompt is prefilled into it, the beams run in copies.
        num_beams: beam width (>= 1).
        max_tokens: most tokens per hypothesis.
        eos: end-of-sequence ids.
        length_penalty: exponent of the length normalisation (default 1.0; > 0
            favours longer sequences, < 0 shorter ones).
        num_return: hypotheses to return (<= num_beams).
        logits_processors: applied per beam over its own history.
        prefill_chunk: prompt tokens per forward pass.
        early_stopping: True stops as soon as ``num_beams`` hypotheses are finished.
        cancel: set it to stop; the best so far are returned as ``cancelled``.
        progress: hears ``(prompt tokens prefilled, prompt tokens)`` per chunk.
        timings: filled with ``prefill_s`` and ``first_token_s`` (seconds from the start).

    Raises:
        OptionError: ``num_return`` > ``num_beams``.
    """
    if num_return > num_beams:
        raise OptionError(f"invalid num_return_sequences {num_return}: at most num_beams ({num_beams}) with beam search")
    B = num_beams
    t0 = time.perf_counter()
    _prefill(model, prompt, cache, prefill_chunk, progress, timings)
    beams = tile_cache(cache, B)
    seqs: list[list[int]] = [[] for _ in range(B)]
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
        logprobs = _processed_logprobs(logits, [prompt + s for s in seqs], logits_processors)
        V = logprobs.shape[-1]
        cand = (sums[:, None] + logprobs).reshape(-1)  # (B * V,)
        top = mx.argpartition(-cand, kth=2 * B - 1)[: 2 * B] if 2 * B < cand.size else mx.arange(cand.size)
        top_scores = cand[top]
        order = mx.argsort(-top_scores)
        top, top_scores = top[order].tolist(), top_scores[order].tolist()
        _first_token(timings, t0)
        length = step + 1
        keep: list[tuple[int, int, float]] = []  # (beam, token, summed logprob)
        for rank, (flat, s) in enumerate(zip(top, top_scores)):
            if s == -float("inf"):
                break
            b, tok = divmod(flat, V)
            if tok in eos:
                if rank < B:  # only EOS among the top B ends a hypothesis (as Hugging Face)
                    finished.append(Hypothesis(list(seqs[b]), s, _score(s, length, length_penalty), "stop"))
                continue
            keep.append((b, tok, s))
            if len(keep) == B:
                break
        finished.sort(key=lambda h: h.score, reverse=True)
        del finished[B:]
        if not keep:
            reason = "stop"
            break
        while len(keep) < B:  # fewer live candidates than beams (tiny vocabularies)
            keep.append((keep[0][0], keep[0][1], -float("inf")))
        idx = mx.array([b for b, _, _ in keep])
        reorder_cache(beams, idx)
        seqs = [seqs[b] + [tok] for b, tok, _ in keep]
        sum_list = [s for _, _, s in keep]
        sums = mx.array(sum_list)
        y = mx.array([[tok] for _, tok, _ in keep])
        if len(finished) >= B:
            best_running = max(sum_list) / length**length_penalty
            if early_stopping or best_running <= worst_finished():
                reason = "stop"
                break
    if reason != "stop":  # running beams compete with the finished ones
        length = len(seqs[0])
        for s, total in zip(seqs, sum_list):
            if total > -float("inf"):
                finished.append(Hypothesis(list(s), total, _score(total, length, length_penalty), reason))
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
    prefill_chunk: int = 512,
    cancel: threading.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
    timings: dict | None = None,
) -> list[Hypothesis]:
    """``n`` independent samples decoded as one batch; returned best score first.

    Args as in ``beam_search``; ``sampler`` maps logprobs (n, V) to tokens (n,),
    one independent draw per row.
    """
    t0 = time.perf_counter()
    _prefill(model, prompt, cache, prefill_chunk, progress, timings)
    rows = tile_cache(cache, n)
    seqs: list[list[int]] = [[] for _ in range(n)]
    sums = [0.0] * n
    done: list[str | None] = [None] * n
    y = mx.array([[prompt[-1]]] * n)
    for _ in range(max_tokens):
        if cancel is not None and cancel.is_set():
            break
        logits = model(y, cache=rows)[:, -1, :]
        logprobs = _processed_logprobs(logits, [prompt + s for s in seqs], logits_processors)
        toks = sampler(logprobs)
        picked = mx.take_along_axis(logprobs, toks[:, None], axis=-1)[:, 0]
        toks_l, picked_l = toks.tolist(), picked.tolist()
        _first_token(timings, t0)
        for i, (t, lp) in enumerate(zip(toks_l, picked_l)):
            if done[i] is not None:
                continue
            sums[i] += lp
            if t in eos:
                done[i] = "stop"
            else:
                seqs[i].append(t)
        if all(d is not None for d in done):
            break
        y = mx.array([[t] for t in toks_l])
    reason = "cancelled" if cancel is not None and cancel.is_set() else "length"
    out = []
    for s, total, d in zip(seqs, sums, done):
        length = len(s) + (1 if d == "stop" else 0)
        out.append(Hypothesis(s, total, _score(total, length, length_penalty), d or reason))
    out.sort(key=lambda h: h.score, reverse=True)
    return out


def run_sequences(gen: Any) -> Iterator[str]:
    """Run a Generation whose options ask for beams or several returns.

    Fills ``gen.tokens``, ``gen.text``, ``gen.stats`` and ``gen.result`` (with every
    sequence in ``result.sequences``, best first) and yields the best text once.
    Stop strings cut each sequence's text after decoding.
    """
    opts = gen.options
    if opts.seed is not None:
        mx.random.seed(opts.seed)
    eos = set(gen.tokenizer.eos_token_ids or ())
    timings: dict = {}  # prefill_s, first_token_s: beams report TTFT and prefill speed too
    common = dict(
        max_tokens=gen._max_tokens(),
        eos=eos,
        length_penalty=opts.length_penalty,
        logits_processors=build_logits_processors(opts) or None,
        prefill_chunk=opts.prefill_chunk,
        cancel=gen.cancel,
        progress=gen.prefill_meter(),
        timings=timings,
    )
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    if opts.num_beams > 1:
        hyps = beam_search(gen.model, gen.prompt, gen.cache, num_beams=opts.num_beams,
                           num_return=opts.num_return_sequences, **common)
    else:
        hyps = sample_sequences(gen.model, gen.prompt, gen.cache, n=opts.num_return_sequences,
                                sampler=build_sampler(opts), **common)
    elapsed = time.perf_counter() - t0
    stops = StopMatcher(opts.stop)
    for h in hyps:
        detok = gen.tokenizer.detokenizer
        detok.reset()
        for t in h.tokens:
            detok.add_token(t)
        detok.finalize()
        h.text = detok.text
        cut = stops.cut(h.text) if stops.stops else None
        if cut is not None:
            h.text, h.finish_reason = h.text[:cut], "stop"
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
    end = t0 + elapsed
    first = t0 + timings.get("first_token_s", elapsed)
    gen.finalize(best.finish_reason, t0, first, end, decoded=sum(len(h.tokens) for h in hyps),
                 decode_s=end - first, sequences=hyps)
    yield best.text

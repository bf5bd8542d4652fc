"""Exact speculative decoding: a drafter proposes, the target verifies in one pass.

``speculative_generate_step`` keeps mlx-lm's ``generate_step`` contract (yield
``(token, logprobs)`` one token at a time, each token already fed to the cache when
it is yielded), so the runtime's ``Sequence`` runs it in place of ``generate_step``. One target
forward pass over ``[y, d1 .. dk]`` scores k drafts; the cache is trimmed back past
the rejected ones.

Exactness (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"): greedy keeps drafts while they equal the target's argmax, so the output is
plain greedy's. Sampling accepts draft d with probability min(1, p(d) / q(d)) and on a
rejection samples the residual max(p - q, 0) renormalised, where p is the target's
*sampling* distribution (after repetition penalty, top-p, min-p, top-k, temperature)
and q the drafter's (a point mass for prompt lookup); every emitted token is then
distributed exactly as plain sampling would draw it.

The draft length adapts to the running acceptance rate; when acceptance stays low,
drafting pauses for a while (plain decoding) and then tries again.

Not mlx-lm's ``speculative_generate_step``: it takes only a draft model, with a fixed
draft length, and keeps a draft when the sampler draws the same token (exact for
greedy only). Tokens it yields go through ``decoding.acceptance`` like any other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Generator

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from mlotspark.options import GenerationOptions
from mlotspark.decoding.drafters import Drafter
from mlotspark.decoding.sampling import process_logits, to_logprobs

__all__ = [
    "SpeculativeConfig",
    "DraftLength",
    "sampling_distribution",
    "verify",
    "speculative_generate_step",
]


@dataclass(frozen=True)
class SpeculativeConfig:
    """How many tokens to draft and when to stop drafting.

    Args:
        k_init: draft length to start with (default 4).
        k_min, k_max: bounds of the adaptive draft length (default 1, 12).
        min_acceptance: running acceptance below which drafting pauses (default 0.3).
        warmup: rounds before the acceptance rate can pause drafting (default 4).
        cooldown: plain tokens decoded during a pause; doubles at each new pause
            (default 8).
        ema: weight of the newest round in the running acceptance rate (default 0.3).
    """

    k_init: int = 4
    k_min: int = 1
    k_max: int = 12
    min_acceptance: float = 0.3
    warmup: int = 4
    cooldown: int = 8
    ema: float = 0.3


@dataclass
class DraftLength:
    """Adaptive draft length: +2 after a fully accepted round, -1 after a rejection
    (the schedule of Hugging Face's assisted generation), and pauses when the running
    acceptance rate falls under ``min_acceptance``."""

    config: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    k: int = 0
    acceptance: float = 1.0
    rounds: int = 0
    pause_left: int = 0
    pauses: int = 0

    def __post_init__(self) -> None:
        self.k = self.config.k_init

    def next_k(self) -> int:
        """Draft length for the next round (0 while paused)."""
        if self.pause_left > 0:
            self.pause_left -= 1
            return 0
        return self.k

    def update(self, drafted: int, accepted: int) -> None:
        """Record a verified round of ``drafted`` tokens, ``accepted`` of them kept."""
        if drafted <= 0:
            return
        c = self.config
        self.rounds += 1
        self.acceptance = (1 - c.ema) * self.acceptance + c.ema * (accepted / drafted)
        self.k = min(self.k + 2, c.k_max) if accepted == drafted else max(self.k - 1, c.k_min)
        if self.rounds >= c.warmup and self.acceptance < c.min_acceptance:
            self.pause_left = c.cooldown * 2**self.pauses
            self.pauses += 1
            self.acceptance = c.min_acceptance  # start over gently after the pause
            self.k = c.k_min


def sampling_distribution(options: GenerationOptions) -> Callable[[mx.array], mx.array] | None:
    """The distribution plain sampling draws from, as a function of logprobs (N, V).

    The same filters as ``sampling.build_sampler`` (mlx-lm's, in its order), then the
    temperature; None for greedy.
    """
    if options.temperature == 0:
        return None
    top_p = options.top_p if options.top_p < 1.0 else 0.0
    inv_temp = 1.0 / options.temperature

    def dist(logprobs: mx.array) -> mx.array:
        x = logprobs
        if 0 < top_p < 1.0:
            x = apply_top_p(x, top_p)
        if options.min_p != 0.0:
            x = apply_min_p(x, options.min_p)
        if 0 < options.top_k < x.shape[-1]:
            x = apply_top_k(x, options.top_k)
        return mx.softmax(x * inv_temp, axis=-1)

    return dist


def verify(
    target_logprobs: mx.array,
    drafts: list[int],
    q: mx.array | None,
    dist: Callable[[mx.array], mx.array] | None,
) -> tuple[int, int]:
    """Accept a prefix of ``drafts`` and pick the token after it.

    Args:
        target_logprobs: (k + 1, V) target logprobs after ``[y, d1 .. dk]``.
        drafts: the k draft tokens.
        q: (k, V) draft distributions, or None for point masses (deterministic drafts).
        dist: the sampling distribution (None = greedy).

    Returns:
        (accepted, token): how many drafts were kept, and the correction (or bonus)
        token that follows them.
    """
    k = len(drafts)
    if dist is None:
        best = mx.argmax(target_logprobs, axis=-1).tolist()
        m = 0
        while m < k and drafts[m] == best[m]:
            m += 1
        return m, best[m]
    p = dist(target_logprobs)  # (k + 1, V)
    if k == 0:
        return 0, int(mx.random.categorical(mx.log(p[0])).item())
    d = mx.array(drafts)
    p_d = mx.take_along_axis(p[:k], d[:, None], axis=-1)[:, 0]  # (k,)
    q_d = mx.ones((k,)) if q is None else mx.take_along_axis(q, d[:, None], axis=-1)[:, 0]
    u = mx.random.uniform(shape=(k,))
    accept = (u * q_d < p_d).tolist()  # u < p/q without dividing by a zero q
    m = 0
    while m < k and accept[m]:
        m += 1
    if m == k:  # every draft kept: a bonus token from the last position
        row = p[k]
    else:  # residual distribution max(p - q, 0), renormalised
        q_row = mx.zeros_like(p[m]).at[d[m]].add(1.0) if q is None else q[m]
        row = mx.maximum(p[m] - q_row, 0.0)
        total = row.sum()
        row = mx.where(total > 0, row / mx.maximum(total, 1e-30), p[m])
    return m, int(mx.random.categorical(mx.log(row)).item())


def _logprobs(logits: mx.array, history: list[int], inputs: list[int], processors: list | None) -> mx.array:
    """Target logprobs (L, V) for positions of ``inputs``, with each position's history."""
    if processors:  # position i has seen the history, then inputs[1 .. i]
        histories = [history + inputs[1 : i + 1] for i in range(logits.shape[0])]
        logits = process_logits(logits, histories, [processors] * len(histories))
    return to_logprobs(logits)


def speculative_generate_step(
    prompt: mx.array,
    model: Any,
    *,
    drafter: Drafter,
    options: GenerationOptions,
    max_tokens: int = 256,
    sampler: Any = None,  # unused: the distribution comes from ``options`` (see module doc)
    logits_processors: list | None = None,
    prompt_cache: list,
    prefill_step_size: int = 512,
    stats: dict | None = None,
    config: SpeculativeConfig | None = None,
    prompt_progress_callback: Callable[[int, int], None] | None = None,
    on_round: Callable[[int], None] | None = None,
) -> Generator[tuple[int, mx.array], None, None]:
    """Speculative decoding with ``generate_step``'s contract.

    Args:
        prompt: the prompt (P,); every token but the last is in ``prompt_cache`` already
            (``runtime/prefill.py`` ran them and the caches' ``prepare_decode``); all of it
            is the drafter's context.
        model: the target model's runner.
        drafter: proposes draft tokens (``PromptLookupDrafter``, ``DraftModelDrafter``).
        options: sampling options (temperature 0 = greedy).
        max_tokens: most tokens to yield.
        logits_processors: processors (history, logits) -> logits, as in mlx-lm.
        prompt_cache: per-layer caches; must be trimmable.
        prefill_step_size: unused (``generate_step``'s signature).
        stats: a dict to fill with ``drafter``, ``drafted``, ``accepted``,
            ``acceptance_rate``, ``target_calls``, ``tokens_per_call``, ``draft_len``,
            ``pauses`` and ``speedup_est`` (updated as decoding goes).
        config: draft-length policy (default ``SpeculativeConfig()``).
        prompt_progress_callback: unused (the prefill reports its own progress).
        on_round: called after each target pass, before its tokens are yielded, with how
            many it yields before the next pass (the engine thread hands out a round per turn).

    Yields:
        (token, logprobs (V,)) one token at a time.
    """
    ids = prompt.tolist()
    dist = sampling_distribution(options)
    length = DraftLength(config or SpeculativeConfig())
    stats = stats if stats is not None else {}
    counters = {"drafted": 0, "accepted": 0, "target_calls": 0, "tokens": 0}
    t_plain: list[float] = []  # seconds of rounds without drafts: a plain step's cost
    t_spec = [0.0, 0]  # seconds and tokens of rounds with drafts

    def report() -> None:
        d, a, calls, n = counters["drafted"], counters["accepted"], counters["target_calls"], counters["tokens"]
        est = None
        if t_plain and t_spec[1]:  # tokens per second over both kinds of rounds, vs plain steps
            plain = sorted(t_plain)[len(t_plain) // 2]
            est = round(plain * (t_spec[1] + len(t_plain)) / (t_spec[0] + sum(t_plain)), 3)
        stats["speculative"] = {
            "drafter": drafter.name,
            "drafted": d,
            "accepted": a,
            "acceptance_rate": round(a / d, 4) if d else 0.0,
            "target_calls": calls,
            "tokens_per_call": round(n / calls, 3) if calls else 0.0,
            "draft_len": length.k,
            "pauses": length.pauses,
            "speedup_est": est,
        }

    context = list(ids)  # every token fed or being fed, in order
    y, last_row = context[-1], None
    pending = False  # y was chosen by the last round and is not yielded yet
    unyielded = 0  # tokens in the cache past the last one handed out
    n_out = 0
    try:
        while n_out < max_tokens:
            room = max_tokens - n_out - (1 if pending else 0)  # tokens yieldable after y
            t0 = time.perf_counter()
            k = min(length.next_k(), room - 1) if room > 0 else 0
            drafts, q = drafter.propose(context, k, dist) if k > 0 else ([], None)
            drafts = drafts[:k]
            q = q[: len(drafts)] if q is not None else None
            inputs = [y] + drafts
            logits = model(mx.array(inputs)[None], cache=prompt_cache)[0]  # (1 + k, V)
            unyielded = len(drafts)  # fed, not verified: dropped if the caller stops now
            logprobs = _logprobs(logits, context, inputs, logits_processors)
            mx.async_eval(logprobs)
            counters["target_calls"] += 1
            dt = time.perf_counter() - t0
            if room <= 0:  # y alone was fed: the last token
                if on_round is not None:
                    on_round(1)
                yield y, last_row
                break
            t0 = time.perf_counter()
            m, token = verify(logprobs, drafts, q, dist)
            # Keep y and the accepted drafts in the cache; drop the rejected ones.
            if len(drafts) > m and trim_prompt_cache(prompt_cache, len(drafts) - m) != len(drafts) - m:
                raise RuntimeError("the cache could not drop the rejected drafts")  # a cascade window shorter than a draft
            dt += time.perf_counter() - t0
            if drafts:
                t_spec[0] += dt
                t_spec[1] += m + 1
            else:
                t_plain.append(dt)
            counters["drafted"] += len(drafts)
            counters["accepted"] += m
            counters["tokens"] += m + 1
            length.update(len(drafts), m)
            report()
            unyielded = m
            if on_round is not None:
                on_round(m + pending)
            if pending:  # y is in the cache now: hand it out (as generate_step does)
                yield y, last_row
                n_out += 1
            for i in range(m):
                context.append(drafts[i])
                unyielded -= 1
                yield drafts[i], logprobs[i]
                n_out += 1
            context.append(token)
            y, last_row, pending = token, logprobs[m], True
            if counters["target_calls"] % 256 == 0:
                mx.clear_cache()
    finally:
        if unyielded:  # the caller stopped early: the cache holds only what it was given
            trim_prompt_cache(prompt_cache, unyielded)
        report()

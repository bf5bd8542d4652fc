"""End to end on the real default model (SmolLM2-135M-Instruct, Q4_1 GGUF)."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlotspark.cli.entry import main
from mlotspark.engine import Engine
from mlotspark.errors import PromptTooLongError
from mlotspark.models.mlx_lm_twin import mlx_lm_twin

pytestmark = pytest.mark.slow

JSON_FIELDS = {
    "text", "tokens", "prompt_tokens", "generation_tokens", "finish_reason", "ttft_s",
    "prefill_tps", "decode_tps", "peak_memory_mb", "model", "device",
}


@pytest.fixture(scope="module")
def engine(default_gguf):
    return Engine.load(str(default_gguf))


def test_capital_of_france(engine):
    result = engine.generate("What is the capital of France?", temperature=0)
    assert "Paris" in result.text
    s = result.stats
    assert s.finish_reason == "stop"
    assert s.prompt_tokens == 37 and s.generation_tokens == len(result.tokens) > 0
    assert s.ttft_s > 0 and s.decode_tps > 0 and s.peak_memory_mb > 0


@pytest.mark.parametrize(
    ("prompt", "n"),
    [
        # A long greedy reply: any drift between the two implementations grows over the steps.
        ("Dear diary, today I", 64),
        # Past 64 tokens: the CPU prefill attends in query blocks (models/cpu/prefill_ops.py);
        # the reply checks the cache that prefill left (the long decode is the case above).
        (" ".join(f"Day {d}: the caravan left the {town} at dawn, crossed the river and camped by the old mill."
                  for d, town in enumerate(["harbour", "market", "castle", "abbey", "village", "forest"] * 3))
         + " On the last day, the caravan", 24),
    ],
    ids=["short", "past_64_tokens"],
)
def test_greedy_tokens_match_mlx_lm_on_the_same_weights(engine, prompt, n):
    ids = engine.encode(prompt, raw=True)
    steps = engine.loaded.execution.numpy_steps
    ours = engine.generate(prompt, raw=True, temperature=0, max_tokens=n).tokens
    steps = engine.loaded.execution.numpy_steps - steps
    twin = mlx_lm_twin(engine.loaded)
    eos = set(engine.tokenizer.eos_token_ids)
    theirs = []
    for tok, _ in generate_step(mx.array(ids), twin, max_tokens=n):
        if tok in eos:
            break
        theirs.append(tok)
    assert len(ours) == n
    assert ours == theirs
    # On the CPU backend the engine decoded through the NumPy step (models/execution.py).
    if mx.default_device().type == mx.DeviceType.cpu:
        assert engine.loaded.execution.name == "cpu" and steps >= n - 1


def test_stream_pieces_join_to_the_text_then_stats(engine):
    items = list(engine.stream("Name three colours.", temperature=0, max_tokens=40))
    *pieces, stats = items
    assert all(isinstance(p, str) for p in pieces) and len(pieces) > 3
    again = engine.generate("Name three colours.", temperature=0, max_tokens=40)
    assert "".join(pieces) == again.text
    assert stats.generation_tokens == len(again.tokens)


def test_stop_string_ends_the_reply_before_it(engine):
    r = engine.generate("Count from 1 to 10: 1, 2, 3,", raw=True, temperature=0, max_tokens=30, stop=["7"])
    assert r.stats.finish_reason == "stop"
    assert "7" not in r.text and "6" in r.text


def test_max_tokens_and_seeded_sampling(engine):
    a = engine.generate("Tell me a story.", temperature=0.9, seed=7, max_tokens=12)
    b = engine.generate("Tell me a story.", temperature=0.9, seed=7, max_tokens=12)
    assert a.tokens == b.tokens and a.stats.finish_reason in ("length", "stop")
    assert len(a.tokens) <= 12


def test_prompt_too_long_without_the_cascade(default_gguf):
    plain = Engine.load(str(default_gguf), cascade=None)
    try:
        with pytest.raises(PromptTooLongError, match="8200 tokens"):
            plain.submit(prompt_ids=[100] * 8200).result()
    finally:
        plain.close()


def test_cli_generate_json(default_gguf, capsys):
    # the prompt as an argument, as `mlotspark generate "..."` gives it
    assert main(["generate", "-m", str(default_gguf), "What is the capital of France?",
                 "--temp", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert JSON_FIELDS <= out.keys()
    assert "Paris" in out["text"] and out["finish_reason"] == "stop"

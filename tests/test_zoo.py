"""The model zoo through the public entry points, on the engine thread.

Every (variant, container) pair of ``zoo.py`` loads with ``Engine.load(path)`` and
generates; on one container per architecture (GGUF) a user's other paths run too:
stream, three concurrent requests, a conversation turn restored in a new engine, the
cascade forced (or its one-line refusal), speculative prompt lookup and one ``serve``
request. Llama 3 (``rope_freqs`` / ``rope_scaling: llama3``) and Phi-3 failed their
first request before the loader evaluated every array a model holds and caches were
made as mlx-lm's ``make_prompt_cache`` makes them.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import mlx.core as mx
import pytest

import zoo
from mlotspark import Engine
from mlotspark.errors import OptionError

DOCS = Path(__file__).resolve().parent.parent / "docs" / "models.md"
OURS = {"llama", "llama3", "qwen2", "qwen3"}  # our llama-family model: the cascade runs
PROMPT = "hi there, hi"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    return zoo.write_zoo(tmp_path_factory.mktemp("zoo"))


def _load(path: Path, **kw) -> Engine:
    return Engine.load(str(path), progress=False, temperature=0.0, max_tokens=4, **kw)


@pytest.mark.parametrize("container", zoo.CONTAINERS)
@pytest.mark.parametrize("variant", list(zoo.VARIANTS))
def test_generate(models, variant, container):
    engine = _load(models[variant, container], cascade=None)
    try:
        out = engine.generate(PROMPT)
    finally:
        engine.close()
    assert out.stats.generation_tokens >= 1
    assert isinstance(out.text, str)


@pytest.mark.parametrize("variant", list(zoo.VARIANTS))
def test_every_path(models, variant, tmp_path):
    path = models[variant, "gguf"]
    engine = _load(path, cascade=None)
    try:
        pieces = list(engine.stream(PROMPT))
        assert pieces[-1].generation_tokens >= 1
        assert "".join(p for p in pieces[:-1] if isinstance(p, str)) == engine.generate(PROMPT).text
        handles = [engine.submit(f"{PROMPT} {i}", max_tokens=3) for i in range(3)]
        assert all(h.result().stats.generation_tokens >= 1 for h in handles)
        looked_up = engine.generate("hi hi hi hi hi hi hi hi", speculative="prompt_lookup", max_tokens=6)
        assert looked_up.text == engine.generate("hi hi hi hi hi hi hi hi", max_tokens=6).text
        chat = engine.conversation("zoo")
        first = chat.send("hello", max_tokens=3)
        assert first.stats.generation_tokens >= 1
    finally:
        engine.close()
    again = _load(path, cascade=None)
    try:
        chat = again.conversation("zoo")
        assert [m["role"] for m in chat.messages] == ["user", "assistant"]
        second = chat.send("and again", max_tokens=3)
        assert second.stats.generation_tokens >= 1
        if variant == "gemma3":  # snapshots do not hold mlx-lm's RotatingKVCache yet: the turn is re-read
            assert second.stats.prompt_tokens > first.stats.prompt_tokens
        else:
            assert second.stats.cached_tokens > 0  # the first turn came back from its snapshot
    finally:
        again.close()


@pytest.mark.parametrize("variant", list(zoo.VARIANTS))
def test_cascade_forced(models, variant):
    path = models[variant, "gguf"]
    if variant not in OURS:
        with pytest.raises(OptionError) as err:
            _load(path, cascade={"window": 16, "sinks": 4, "block_size": 8})
        message = str(err.value)
        assert "\n" not in message and "cascade" in message
        assert zoo.VARIANTS[variant] in message  # names the architecture
        return
    engine = _load(path, cascade={"window": 16, "sinks": 4, "block_size": 8})
    try:
        out = engine.generate("hi " * 60, raw=True, max_tokens=4)  # past sinks + window
    finally:
        engine.close()
    assert out.stats.generation_tokens >= 1
    assert out.stats.extra.get("cascade")


@pytest.mark.parametrize("variant", list(zoo.VARIANTS))
def test_serve_request(models, variant):
    from starlette.testclient import TestClient

    from mlotspark.server import ServerState, create_app

    engine = _load(models[variant, "gguf"], cascade=None)
    try:
        client = TestClient(create_app(ServerState(engine)))
        reply = client.post("/v1/chat/completions", json={
            "model": engine.model_name, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 3, "temperature": 0})
    finally:
        engine.close()
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 3


def test_a_model_built_on_one_thread_runs_on_another(models):
    """The class of bug, not one instance: mlx-lm's Llama3RoPE keeps its frequencies in a
    private array, which ``parameters()`` leaves out; ``materialize`` computes it."""
    from mlx_lm.models.rope_utils import initialize_rope

    from mlotspark.models.materialize import materialize

    import mlx.nn as nn

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.rope = initialize_rope(64, 10000.0, False, dict(zoo._LLAMA3_SCALING), 512)

    holder = Holder()
    materialize(holder)
    out: list = []

    def run() -> None:
        try:
            out.append(holder.rope(mx.ones((1, 1, 2, 64))).sum().item())
        except Exception as e:  # noqa: BLE001 - reported below
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert isinstance(out[0], float), out[0]


def test_the_documented_architectures_are_all_in_the_zoo():
    text = DOCS.read_text(encoding="utf-8")
    block = re.search(r"<!-- zoo:architectures -->(.*?)<!-- /zoo -->", text, re.S)
    assert block, f"{DOCS} lacks its architecture table"
    documented = set(re.findall(r"^\| `([a-z0-9\-]+)` \|", block.group(1), re.M))
    assert documented, "no architecture rows in the table"
    assert documented <= set(zoo.VARIANTS), f"documented but not in the zoo: {documented - set(zoo.VARIANTS)}"
    assert set(zoo.VARIANTS) <= documented, f"in the zoo but not documented: {set(zoo.VARIANTS) - documented}"
    containers = set(re.findall(r"`container:([a-z0-9]+)`", text))
    assert containers == set(zoo.CONTAINERS)

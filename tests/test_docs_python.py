"""docs/python.md works as written: every ``engine.…``, ``Engine.…`` and ``chat.…``
spelling it shows resolves, and each call it documents runs (on a tiny model with the
default model's tokenizer and chat template)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import mlotspark
from mlotspark import Engine, GenerationStats, PrefillProgress, listen_steps
from mlotspark.errors import DistributedError, OptionError

from persist_helpers import engines, tiny_dirs, tiny_loaded  # noqa: F401  (fixtures)
from test_scheduler import tiny_engine

DOC = Path(__file__).resolve().parent.parent / "docs" / "python.md"
SHORT = {"max_tokens": 4}


def spellings(name: str) -> list[str]:
    """Attribute chains after ``name.`` in the document (``engine.memory.search`` -> ``memory.search``)."""
    return sorted(set(re.findall(rf"(?<![\w./]){name}\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)", DOC.read_text())))


def unresolved(obj: object, chains: list[str]) -> list[str]:
    out = []
    for chain in chains:
        here = obj
        for part in chain.split("."):
            if not hasattr(here, part):
                out.append(chain)
                break
            here = getattr(here, part)
    return out


def test_every_spelling_in_the_python_api_doc_resolves(_isolated_home):
    assert len(spellings("engine")) >= 20  # the parser still finds the document's calls
    engine = tiny_engine()
    try:
        assert unresolved(engine, spellings("engine")) == []
        assert unresolved(Engine, spellings("Engine")) == []
        assert unresolved(mlotspark.Conversation, spellings("chat")) == []
        assert unresolved(mlotspark.RequestHandle, ["result", "cancel"]) == []
    finally:
        engine.close()


def test_the_documented_calls_run(engines, tiny_loaded, _isolated_home):
    engine = engines(tiny_loaded)
    # Generating
    result = engine.generate("What is the capital of France?", temperature=0, **SHORT)
    assert result.text and result.tokens and result.stats.decode_tps > 0
    *pieces, stats = engine.stream([{"role": "user", "content": "Tell me a joke."}], **SHORT)
    assert isinstance(stats, GenerationStats) and all(isinstance(p, str) for p in pieces)
    assert len(engine.generate_batch(["Hi", "Bonjour"], temperature=0, **SHORT)) == 2
    assert engine.defaults.merged(top_k=5).top_k == 5
    with pytest.raises(OptionError, match="temperature"):
        engine.defaults.merged(temperature=-1)
    handle = engine.submit("Hi", priority=1, max_tokens=8)
    text = "".join(p for p in handle if isinstance(p, str))
    assert handle.result().text == text and handle.result().stats.finish_reason in ("stop", "length")
    # Progress
    items = list(engine.stream("many words " * 40, progress=True, **SHORT))
    events = [i for i in items if isinstance(i, PrefillProgress)]
    assert events and events[-1].done == events[-1].total and events[-1].describe()
    seen: list = []
    h = engine.submit("Hi", on_progress=seen.append, **SHORT)
    h.result()
    assert seen and h.progress is seen[-1]
    listen_steps(lambda step: None)()  # subscribe, then stop listening
    # Conversations and memory
    chat = engine.conversation("work", system="You are terse.")
    assert chat.send("My sister's name is Ilse.", **SHORT).text
    for piece in chat.stream("What is her name?", **SHORT):
        assert isinstance(piece, (str, GenerationStats))
    assert len(chat.messages) == 4 and chat.system == "You are terse."
    assert [c.name for c in engine.conversations()] == ["work"]
    chat.memory = False
    entry_id = engine.memory.remember("I live in Utrecht.")
    assert [h.entry.id for h in engine.memory.search("where do I live", k=3)] == [entry_id]
    assert engine.memory.list(current_only=True)[0].id == entry_id  # newest first (the sister learned before)
    assert engine.memory.forget(entry_id) is True and engine.memory.forget(entry_id) is False
    assert engine.memory.embed(["some text"]).shape[0] == 1
    assert set(engine.persistence.stats()) >= {"working", "episodic", "prefix_cache", "semantic"}
    config = engine.persistence.set_budgets(warm_mb=256, snapshots=False)
    assert (config.warm_mb, config.snapshots) == (256, False)
    chat.reset()
    assert chat.messages == []
    chat.delete()
    assert engine.conversations() == []
    # The engine itself
    assert {"state", "cap", "batch_size", "queued", "memory"} <= set(engine.status())
    assert engine.info()["model"] == engine.model_name
    assert engine.caches.cascade == "auto"
    assert engine.caches.kind_for(9000, engine.defaults) == "cascade"  # past the tiny model's 4,096
    assert engine.caches.kind_for(10, engine.defaults) == "kv"
    assert engine.caches.decision is None  # no cache_kind="auto" request yet
    assert engine.scheduler.call(lambda: 7) == 7
    assert engine.encode("Hi") and engine.tokenizer is tiny_loaded.tokenizer and engine.rank == 0
    with pytest.raises(DistributedError):
        engine.follow()
    engine.close()
    engine.close()  # a second close does nothing

"""The declared cache interface (``caches/interface.py``) and its lifecycle step.

Every cache class provides the interface; the runtime calls ``prepare_decode`` between a
prompt's prefill and its first decode step on every path a user takes, so the memory
cascade's question pass runs through ``Engine`` (solo, batched, own-loop, conversation,
server), not only through a side path.
"""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache

from test_scheduler import CharTokenizer, FakeClock  # noqa: F401  (a char tokenizer, a scripted clock)
from tiny import prefilled

from mlotspark.caches.kinds import Float16KVCache, QuantizedKVCache
from mlotspark.decoding.strategy import decode_step
from mlotspark.engine import Engine
from mlotspark.memory.cascade import CascadeCache, CascadeConfig, EpisodicStore, make_cascade_cache
from mlotspark.models import llama
from mlotspark.caches.interface import AttentionContext, Cache, prepare_decode
from mlotspark.caches.kv import KVCache
from mlotspark.models.loader import LoadedModel
from mlotspark.options import GenerationOptions
from mlotspark.runtime.batching import BatchCache
from mlotspark.runtime.prefill import PrefillCache
from mlotspark.runtime.scheduler import SchedulerConfig
from mlotspark.thermal.governor import ThermalGovernor
from mlotspark.thermal.probes import Reading, ScriptedProbe

#: Small enough that a ~150-token prompt leaves many blocks behind the window, with
#: top_k below their count: the question pass has something to choose.
CASCADE = dict(window=24, sinks=4, block_size=8, top_k=2, chunk=16, question_pass=8)
CHUNK = 32  # prefill tokens per forward pass, the same on the engine and the reference


def test_every_cache_class_provides_the_interface():
    cfg = CascadeConfig(**CASCADE)
    for cache in (KVCache(), Float16KVCache(), QuantizedKVCache(bits=8), QuantizedKVCache(group_size=32, bits=4),
                  CascadeCache(cfg, 0, EpisodicStore.from_config(cfg))):
        assert isinstance(cache, Cache), type(cache).__name__
    kv = BatchKVCache([0])
    for view in (BatchCache([KVCache()]), PrefillCache(kv, mx.array(True))):
        assert isinstance(view, AttentionContext) and not isinstance(view, Cache), type(view).__name__


def _model() -> llama.Model:
    mx.random.seed(3)
    args = llama.ModelArgs(hidden_size=64, num_hidden_layers=2, intermediate_size=96, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=128, max_position_embeddings=4096)
    model = llama.Model(args)
    model.update({"model": {"embed_tokens": {"weight": model.model.embed_tokens.weight * 8}}})
    mx.eval(model.parameters())
    return model


def _cascade_engine() -> Engine:
    loaded = LoadedModel(model=_model(), tokenizer=CharTokenizer(), config={},
                         source=SimpleNamespace(name="tiny", path="tiny"), weights="float32",
                         fingerprint="tiny", context_length=4096, supports_cascade=True)
    gov = ThermalGovernor([ScriptedProbe([Reading()])], clock=FakeClock(), min_interval_s=0)
    engine = Engine(loaded, GenerationOptions(temperature=0.0, prefill_chunk=CHUNK), SchedulerConfig(governor=gov),
                    cascade=CASCADE)
    engine.scheduler.pause_wait_s = 0.001
    return engine


@pytest.fixture(scope="module")
def cascade_engine():
    engine = _cascade_engine()
    yield engine
    engine.close()


def _prompt(n: int, seed: int) -> list[int]:
    return mx.random.randint(1, 127, (n,), key=mx.random.key(seed)).tolist()


def _reference(engine: Engine, prompt: list[int], n: int) -> list[int]:
    """Greedy tokens of the same cascade on the own-loop path, called directly."""
    runner = engine.loaded.runner
    cache = make_cascade_cache(runner.model, engine.caches.cascade, attention=runner.attention)
    out = []
    prefilled(runner, prompt, cache, CHUNK)
    for tok, _ in decode_step(mx.array(prompt), runner, max_tokens=n, prompt_cache=cache,
                                         prefill_step_size=CHUNK):
        out.append(int(tok))
    assert cache[0].question.passes == 1
    return out


def _passes(result) -> int:
    return result.stats.extra["cascade"]["question_passes"]


def test_the_question_pass_runs_through_engine_generate(cascade_engine):
    prompt = _prompt(150, seed=1)
    result = cascade_engine.submit(prompt_ids=prompt, max_tokens=8).result()
    assert _passes(result) == 1
    assert result.tokens == _reference(cascade_engine, prompt, 8)[: len(result.tokens)]


def test_the_question_pass_runs_for_each_of_several_batched_requests(cascade_engine):
    prompts = [_prompt(150, seed=s) for s in (2, 3, 4)]
    handles = [cascade_engine.submit(prompt_ids=p, max_tokens=6) for p in prompts]
    results = [h.result() for h in handles]
    assert [_passes(r) for r in results] == [1, 1, 1]
    for p, r in zip(prompts, results):
        assert r.tokens == _reference(cascade_engine, p, 6)[: len(r.tokens)]


def test_the_question_pass_runs_on_the_own_loop_path(cascade_engine):
    # Speculative decoding cannot trim the cascade: the request decodes in its own loop
    # (mlx-lm's generate_step after our prefill), which must run the step too.
    prompt = _prompt(150, seed=5)
    result = cascade_engine.submit(prompt_ids=prompt, max_tokens=6, speculative="prompt_lookup").result()
    assert result.stats.extra["speculative"]["fallback"] == "memory cascade"
    assert _passes(result) == 1
    assert result.tokens == _reference(cascade_engine, prompt, 6)[: len(result.tokens)]


def test_no_pass_for_a_prompt_the_window_holds(cascade_engine):
    result = cascade_engine.submit(prompt_ids=_prompt(20, seed=6), max_tokens=4).result()
    assert _passes(result) == 0


def test_prepare_decode_skips_caches_without_a_lifecycle():
    from mlx_lm.models.cache import KVCache as MlxKVCache

    class Model:  # never called: nothing to prepare
        def __call__(self, *a, **k):
            raise AssertionError("no forward pass expected")

    prepare_decode(Model(), [MlxKVCache(), KVCache()], [1, 2, 3])
    prepare_decode(Model(), [KVCache()], [])


def test_the_question_pass_runs_through_serve():
    from starlette.testclient import TestClient

    from mlotspark.server.app import ServerState, create_app

    prompt = "".join(chr(40 + (7 * i) % 80) for i in range(150))
    with TestClient(create_app(ServerState(_cascade_engine()))) as http:  # closes the engine at exit
        name = http.get("/v1/models").json()["data"][0]["id"]
        reply = http.post("/v1/completions", json={"model": name, "prompt": prompt, "max_tokens": 4,
                                                   "temperature": 0})
    assert reply.status_code == 200, reply.text
    assert reply.json()["mlotspark"]["cascade"]["question_passes"] == 1

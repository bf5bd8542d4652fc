"""The quantized path through the engine: ``weights="quantized"`` on the CPU, with the
GPU dtype rule forced (``MLOTSPARK_GPU_DTYPES=1``: half-precision activations and KV,
as on Metal) on a tiny model, and as the CPU runs it (float32 activations) on the real
default model. Greedy tokens are compared with mlx-lm's loop on the same quantized
weights; the scheduler's batch, the cascade and conversation snapshots carry them.

The real model is not run with the forced rule: MLX's CPU ``quantized_matmul`` in
float16 is 10-36x slower than in float32 here (one 8-token forward ~130 s;
benchmarks/figures/mac.md), which is
also why the rule applies on a GPU only.
"""

from __future__ import annotations

import mlotspark  # noqa: F401  (OpenBLAS before MLX)
import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from mlotspark import Engine
from mlotspark.platform import dtypes
from mlotspark.runtime.scheduler_config import activation_dtype, kv_bytes_per_token

# tests/distributed_ranks.py, imported at collection: benchmarks/ has a module of that name,
# which a test run before these may have put first on sys.path.
from distributed_ranks import QUANT_MESSAGE, QUANT_TEXTS, free_port_pair, rank_facts, spawn_ranks
from tiny import tiny_model, write_tiny_gguf

TEXTS = ["the harbour at dawn", "three ships and a lighthouse keeper", "x", "a long quiet road"]
N = 8


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("quant") / "tiny.gguf", tiny_model(seed=5))


@pytest.fixture
def gpu_rule(monkeypatch):
    monkeypatch.setenv(dtypes.FORCE_ENV, "1")


@pytest.fixture
def cpu_rule(monkeypatch):
    monkeypatch.setenv(dtypes.FORCE_ENV, "0")


def load(path, **kw) -> Engine:
    return Engine.load(str(path), weights="quantized", progress=False, temperature=0.0, **kw)


def mlx_lm_greedy(engine: Engine, ids: list[int], n: int) -> list[int]:
    """mlx-lm's own loop and KV cache over the engine's model (the same quantized weights)."""
    model = engine.loaded.model
    out = []
    for tok, _ in generate_step(mx.array(ids), model, max_tokens=n, sampler=lambda lp: mx.argmax(lp, axis=-1),
                                prompt_cache=make_prompt_cache(model)):
        out.append(int(tok))
    return out


def float_dtypes(engine: Engine) -> set:
    return {v.dtype for _, v in tree_flatten(engine.loaded.model.parameters()) if v.dtype != mx.uint32}


def test_gpu_rule_makes_activations_and_kv_half_precision(tiny_path, gpu_rule, monkeypatch):
    half = load(tiny_path, cascade=None)
    monkeypatch.setenv(dtypes.FORCE_ENV, "0")
    full = load(tiny_path, cascade=None)
    try:
        assert half.loaded.weights == full.loaded.weights == "quantized"
        assert float_dtypes(half) == {mx.float16}  # norms and scales cast; packed weights stay uint32
        assert activation_dtype(half.loaded.model) == mx.float16
        assert activation_dtype(full.loaded.model) == mx.float32  # the CPU keeps float32
        # KV is projected at the activation dtype, not the embedding's uint32
        assert kv_bytes_per_token(half.loaded.model) * 2 == kv_bytes_per_token(full.loaded.model)
        r = half.generate("hello harbour", raw=True, max_tokens=4)
        assert r.tokens
        cache = half.caches.make(16, half.defaults)
        half.scheduler.call(lambda: half.loaded.model(mx.array([half.encode("hi", raw=True)]), cache=cache))
        assert cache[0].keys.dtype == mx.float16  # the KV itself is half precision
    finally:
        half.close()
        full.close()


def test_bfloat16_models_keep_bfloat16():
    model = tiny_model(seed=1)
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, group_size=64, bits=4)
    assert dtypes.settle_quantized_activations(model, gpu=True) == mx.bfloat16
    assert activation_dtype(model) == mx.bfloat16
    assert dtypes.settle_quantized_activations(tiny_model(seed=1), gpu=False) is None


@pytest.mark.parametrize("rule", ["gpu_rule", "cpu_rule"])
def test_engine_greedy_equals_mlx_lm_and_a_batch_equals_each_alone(tiny_path, rule, request):
    request.getfixturevalue(rule)
    engine = load(tiny_path, cascade=None)
    try:
        alone = [engine.generate(t, raw=True, max_tokens=N).tokens for t in TEXTS]
        for t, toks in zip(TEXTS, alone):
            ref = mlx_lm_greedy(engine, engine.encode(t, raw=True), N)
            assert toks == ref[: len(toks)] and toks
        handles = [engine.submit(t, raw=True, max_tokens=N) for t in TEXTS]
        together = [h.result() for h in handles]
        assert [r.tokens for r in together] == alone
        assert max(r.stats.extra["mean_batch"] for r in together) > 1  # they really shared steps
    finally:
        engine.close()


def test_cascade_on_quantized_half_precision_weights(tiny_path, gpu_rule):
    """Everything inside sinks + window: the cascade gives full attention's tokens;
    past the window it still runs (blocks stored, routed) in half precision."""
    text = " ".join(["the harbour and its ships"] * 6)
    full = load(tiny_path, cascade=None)
    wide = load(tiny_path, cascade={"window": 192, "top_k": 2, "chunk": 0})
    narrow = load(tiny_path, cascade={"window": 32, "sinks": 4, "top_k": 2, "chunk": 0})
    try:
        assert len(full.encode(text, raw=True)) > 64  # past the narrow window
        ref = full.generate(text, raw=True, max_tokens=N).tokens
        assert wide.generate(text, raw=True, max_tokens=N).tokens == ref
        r = narrow.generate(text, raw=True, max_tokens=N)
        assert r.stats.extra["cache"]["kind"] == "cascade" and len(r.tokens) == N
    finally:
        for e in (full, wide, narrow):
            e.close()


def test_conversation_snapshots_continue_after_a_restart(tiny_path, gpu_rule):
    opts = dict(max_tokens=6)
    e1 = load(tiny_path, cascade=None)
    try:
        c = e1.conversation("q")
        c.send("Tell me about the sea.", **opts)
        c.send("And the mountains?", **opts)
        held = c.info().tokens
    finally:
        e1.close()
    e2 = load(tiny_path, cascade=None)
    try:
        c2 = e2.conversation("q")
        text = "What about rivers?"
        cold = e2.generate(c2.render(text), **opts)
        r = c2.send(text, **opts)
        assert r.stats.extra["cache_source"] == "snapshot" and r.stats.cached_tokens == held
        assert r.tokens == cold.tokens
    finally:
        e2.close()


@pytest.fixture(scope="module")
def quantized_default(default_gguf):
    """The default model's stored quantized weights as the CPU runs them (the CPU dtype
    rule: float32 activations), and its greedy reply to QUANT_MESSAGE (N tokens): the
    engine test's and the two-rank test's single-process reply, computed once."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(dtypes.FORCE_ENV, "0")  # read at load
        engine = load(default_gguf, cascade=None)
    try:
        yield engine, engine.generate(QUANT_MESSAGE, max_tokens=N)
    finally:
        engine.close()


@pytest.mark.slow
def test_real_model_quantized_through_the_engine_equals_mlx_lm(quantized_default):
    """The default model's stored Q4_1/Q8_0 weights, kept quantized on the CPU: the engine's
    greedy reply, alone and in a batch, is mlx-lm's on the same weights."""
    msg = QUANT_MESSAGE
    engine, r = quantized_default
    assert engine.loaded.weights == "quantized"
    assert "Paris" in r.text
    assert r.tokens == mlx_lm_greedy(engine, engine.encode(msg), N)[: len(r.tokens)]
    handles = [engine.submit(m, max_tokens=6) for m in (msg, "Name a colour.")]
    got = [h.result().tokens for h in handles]
    assert got[0] == r.tokens[:6]
    assert got[1] == engine.generate("Name a colour.", max_tokens=6).tokens


@pytest.mark.slow
def test_a_two_rank_pipeline_over_quantized_weights_gives_the_single_process_tokens(tmp_path, tiny_path,
                                                                                    default_gguf, quantized_default,
                                                                                    monkeypatch):
    import json
    import subprocess

    out = tmp_path / "rank0.json"
    procs = spawn_ranks(["quantized", str(out), f"{tiny_path},{default_gguf}"], 2, free_port_pair(),
                        tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for p in procs:
        p.wait(timeout=540)
    assert all(p.returncode == 0 for p in procs), [p.stderr.read()[-2000:] for p in procs]
    ranks = json.loads(out.read_text())
    monkeypatch.setenv(dtypes.FORCE_ENV, "1")
    tiny = load(tiny_path, cascade=None)
    try:
        assert ranks["tiny"] == [tiny.generate(t, raw=True, max_tokens=8).tokens for t in QUANT_TEXTS]
    finally:
        tiny.close()
    assert [r["dtype"] for r in rank_facts(out)] == ["mlx.core.float16", "mlx.core.float16"]  # each rank's share, half precision
    assert ranks["weights"] == "quantized"
    assert ranks["model"] == quantized_default[1].tokens  # the CPU's float32 activations, as the ranks ran them

"""The ``question`` router: the prompt's last queries keep choosing the blocks for the whole answer."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from test_cascade import greedy, model, tokens  # noqa: F401  (the tiny model fixture)

from mlotspark.memory.cascade import CascadeCache, CascadeConfig, EpisodicStore, cascade_stats, make_cascade_cache
from mlotspark.memory.cascade.routing import QuestionRouter, make_router


def test_equals_full_attention_while_it_fits(model):  # noqa: F811
    cfg = CascadeConfig(window=180, sinks=8, block_size=8, top_k=4, chunk=24, routing="question")
    assert isinstance(make_router(cfg), QuestionRouter)
    prompt = tokens(90, seed=1)
    ref_toks, ref_lp = greedy(model, model.make_cache(), prompt, 60, chunk=32)
    cas = make_cascade_cache(model, cfg)
    toks, lp = greedy(model, cas, prompt, 60, chunk=32)
    assert toks == ref_toks
    np.testing.assert_allclose(np.array(mx.stack(lp)), np.array(mx.stack(ref_lp)), atol=1e-4)
    assert cascade_stats(cas)["tokens"]["episodic"] == 0


def test_the_question_picks_the_block_and_the_answer_keeps_it():
    Hq, Hkv, D, B = 4, 2, 16, 4
    cfg = CascadeConfig(window=8, sinks=2, block_size=B, top_k=2, routing="question", rolling_window=4, chunk=64)
    cache = CascadeCache(cfg, 0, EpisodicStore.from_config(cfg))
    rope = nn.RoPE(D, traditional=True)
    rng = np.random.default_rng(0)
    u = rng.standard_normal(D).astype(np.float32)
    u /= np.linalg.norm(u)
    n = cfg.sinks + 12 * B + cfg.window
    k = 0.3 * rng.standard_normal((1, Hkv, n, D)).astype(np.float32)
    k[0, :, cfg.sinks + 5 * B + 1] = 4.0 * u  # one token of block 5 holds the answer
    q = 0.3 * rng.standard_normal((1, Hq, n, D)).astype(np.float32)
    q[0, :, -4:] = 3.0 * u  # the prompt ends with a question about it
    v = rng.standard_normal((1, Hkv, n, D)).astype(np.float32)
    cache.attend(mx.array(q), mx.array(k), mx.array(v), rope=rope, scale=D**-0.5)
    cache.settle()
    chosen = []
    for _ in range(6):  # answer tokens: queries about anything else
        qd = 0.5 * rng.standard_normal((1, Hq, 1, D)).astype(np.float32)
        kd = 0.3 * rng.standard_normal((1, Hkv, 1, D)).astype(np.float32)
        cache.attend(mx.array(qd), mx.array(kd), mx.array(kd), rope=rope, scale=D**-0.5)
        chosen.append(cache.selection)
    assert all(5 in head for head in chosen[0])
    assert all(c == chosen[0] for c in chosen)  # stable for the whole answer

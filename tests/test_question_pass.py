"""The question pass: the prompt's tail re-read with the blocks all layers' question queries agree on."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from test_cascade import greedy, model, tokens  # noqa: F401  (the tiny model fixture)

from mlotspark.memory.cascade import CascadeCache, CascadeConfig, EpisodicStore, make_cascade_cache
from mlotspark.memory.cascade.question import consensus


def test_equals_full_attention_while_every_block_is_attended(model):  # noqa: F811
    # Blocks leave the window, but all of them fit in top_k: the pass has nothing to
    # choose, so it must not run, and the cascade stays exact attention.
    cfg = CascadeConfig(window=32, sinks=4, block_size=8, top_k=16, chunk=24, question_pass=8)
    prompt = tokens(120, seed=4)
    ref_toks, ref_lp = greedy(model, model.make_cache(), prompt, 20, chunk=32)
    cas = make_cascade_cache(model, cfg)
    toks, lp = greedy(model, cas, prompt, 20, chunk=32)
    assert cas[0].n_blocks > 0 and cas[0].question.passes == 0
    assert toks == ref_toks
    # float32 sums over a longer assembled context than test_cascade's: a little more rounding
    np.testing.assert_allclose(np.array(mx.stack(lp)), np.array(mx.stack(ref_lp)), atol=1e-3)


def test_the_tail_is_reread_once_per_prompt_with_one_pinned_choice(model):  # noqa: F811
    cfg = CascadeConfig(window=24, sinks=4, block_size=8, top_k=2, chunk=16, question_pass=8)
    cas = make_cascade_cache(model, cfg)
    calls = []
    inner = model.model
    original = type(inner).__call__

    def spy(self, inputs, cache=None):
        calls.append(inputs.shape[1])
        return original(self, inputs, cache)

    type(inner).__call__ = spy
    try:
        prompt = tokens(120, seed=5)
        toks, _ = greedy(model, cas, prompt, 6, chunk=32)
        assert cas[0].question.passes == 1
        assert calls.count(cfg.question_pass) == 1  # the re-read: the prompt's last 8 tokens but one
        chosen = cas[0].pinned
        assert chosen is not None and len(chosen) == cfg.top_k
        for c in cas:  # every layer and KV head attends the one choice, for the whole answer
            assert c.pinned == chosen and all(head == chosen for head in c.selection)
            assert c.offset == len(prompt) + len(toks)  # the re-read replaced tokens, added none
        # The next prompt (a conversation's next turn) unpins, chooses and re-reads again.
        more = tokens(40, seed=6)
        greedy(model, cas, more, 3, chunk=32)
        assert cas[0].question.passes == 2
    finally:
        type(inner).__call__ = original


def test_no_pass_without_question_routing_or_when_off(model):  # noqa: F811
    for cfg in (CascadeConfig(window=24, sinks=4, block_size=8, top_k=2, routing="hybrid"),
                CascadeConfig(window=24, sinks=4, block_size=8, top_k=2, question_pass=0)):
        cas = make_cascade_cache(model, cfg)
        greedy(model, cas, tokens(120, seed=5), 3, chunk=32)
        assert cas[0].question is None and cas[0].pinned is None


def test_consensus_follows_the_layers_whose_question_points_at_one_block():
    Hq, Hkv, D, B = 4, 2, 16, 4
    cfg = CascadeConfig(window=8, sinks=2, block_size=B, top_k=2, rolling_window=4, chunk=64, follow=0)
    store = EpisodicStore.from_config(cfg)
    rope = nn.RoPE(D, traditional=True)
    rng = np.random.default_rng(0)
    u = rng.standard_normal(D).astype(np.float32)
    u /= np.linalg.norm(u)
    n = cfg.sinks + 12 * B + cfg.window
    caches = []
    for layer, sharp in enumerate((0.0, 0.0, 3.0)):  # two layers see nothing, one sees block 7
        c = CascadeCache(cfg, layer, store)
        k = 0.3 * rng.standard_normal((1, Hkv, n, D)).astype(np.float32)
        k[0, :, cfg.sinks + 7 * B + 2] = 4.0 * u
        q = 0.3 * rng.standard_normal((1, Hq, n, D)).astype(np.float32)
        q[0, :, -4:] += sharp * u  # the question's queries (the router keeps the last 4)
        v = rng.standard_normal((1, Hkv, n, D)).astype(np.float32)
        c.attend(mx.array(q), mx.array(k), mx.array(v), rope=rope, scale=D**-0.5)
        c.settle()
        caches.append(c)
    chosen = consensus(caches, cfg.top_k, cfg.follow)
    assert len(chosen) == cfg.top_k and 7 in chosen

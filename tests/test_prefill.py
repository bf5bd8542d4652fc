"""Batched prefill (runtime/prefill.py): several requests' chunks in one forward pass.

Tiny random llama model; no test measures time.
"""

from __future__ import annotations

import mlotspark  # noqa: F401  (BLAS before MLX)
import mlx.core as mx
import numpy as np
import pytest

from mlotspark.caches.kv import KVCache
from mlotspark.runtime.sequence import Sequence
from mlotspark.runtime.prefill import prefill_batch, prefill_chunk
from test_scheduler import EOS, PROMPTS, RowKV, tiny_engine

# (cached prefix, new prompt tokens): prompt-cache hits of different lengths, none,
# and prompts shorter and longer than one chunk.
CASES = [
    ([], list(range(10, 31))),
    (list(range(40, 53)), [60, 61, 62]),
    ([], [7, 8]),
    (list(range(70, 75)), list(range(80, 97))),
]


def _state(engine, prefix, prompt, chunk):
    cache = None
    if prefix:  # a cache that already holds ``prefix`` (what a prompt-cache hit hands over)
        cache = engine.loaded.runner.make_cache()
        engine.loaded.runner(mx.array(prefix)[None], cache=cache)
        mx.eval([c.state for c in cache])
    gen = engine._new_generation(list(prompt), engine.defaults.merged(max_tokens=4, prefill_chunk=chunk),
                                cache=cache, cached_tokens=len(prefix))
    return Sequence(gen, {EOS})


def _next_logits(model, s):
    return model(mx.array([[s.next_token]]), cache=s.cache)[0, -1]


@pytest.mark.parametrize("chunk", [512, 5])
def test_batched_prefill_fills_each_cache_as_a_solo_prefill_does(chunk):
    engine = tiny_engine()
    model = engine.loaded.runner
    solo = [_state(engine, p, q, chunk) for p, q in CASES]
    for s in solo:
        while prefill_chunk(model, s):
            pass
    batched = [_state(engine, p, q, chunk) for p, q in CASES]
    passes = 0
    while prefill_batch(model, batched):
        passes += 1
    longest = max(len(q) - 1 for _, q in CASES)
    assert passes == -(-longest // chunk)  # one pass per chunk, not one per request and chunk
    for a, b in zip(solo, batched):
        assert b.prefill_left == 0 and b.prefilled == a.prefilled
        for ca, cb in zip(a.cache, b.cache):
            assert cb.offset == ca.offset and type(cb) is KVCache
            n = ca.offset
            np.testing.assert_allclose(np.array(cb.keys[..., :n, :]), np.array(ca.keys[..., :n, :]), atol=1e-5)
            np.testing.assert_allclose(np.array(cb.values[..., :n, :]), np.array(ca.values[..., :n, :]), atol=1e-5)
        # The caches go on decoding alike.
        la, lb = _next_logits(model, a), _next_logits(model, b)
        np.testing.assert_allclose(np.array(lb), np.array(la), atol=1e-4)
        assert int(mx.argmax(la)) == int(mx.argmax(lb))


def test_batched_prefill_refuses_a_cache_that_is_not_plain_kv():
    engine = tiny_engine()
    rows = [_state(engine, [], [3, 4, 5], 512), _state(engine, [], [6, 7, 8], 512)]
    rows[1].cache = [RowKV() for _ in engine.loaded.model.layers]
    rows[1].plain = False
    with pytest.raises(ValueError, match="plain KV"):
        prefill_batch(engine.loaded.runner, rows)


class _Recorder:
    """Stands in for the scheduler's runner's ``forward``: notes the shape of every call."""

    def __init__(self, forward):
        self.forward, self.shapes = forward, []

    def __call__(self, tokens, caches=None):
        self.shapes.append(tuple(tokens.shape))
        return self.forward(tokens, caches)


def test_requests_admitted_together_prefill_in_one_pass_and_equal_solo():
    engine = tiny_engine()
    solo = [engine.submit(prompt_ids=p, max_tokens=16).result().tokens for p in PROMPTS]
    sched = engine.scheduler
    rec = sched.runner.forward = _Recorder(sched.runner.forward)
    with sched.lock:  # the engine thread waits: all four are queued before its next turn
        handles = [engine.submit(prompt_ids=p, max_tokens=16) for p in PROMPTS]
    assert [h.result().tokens for h in handles] == solo
    prefills = [s for s in rec.shapes if s[1] > 1]
    assert prefills and prefills[0][0] == sum(len(p) > 1 for p in PROMPTS)  # one (B, L) pass
    # A request with a cache of another kind is prefilled alone, and still equals solo.
    rec.shapes.clear()
    with sched.lock:
        mixed = [engine.submit(prompt_ids=PROMPTS[1], max_tokens=16, cache=[RowKV(), RowKV()]),
                 engine.submit(prompt_ids=PROMPTS[3], max_tokens=16)]
    assert [h.result().tokens for h in mixed] == [solo[1], solo[3]]
    assert all(s[0] == 1 for s in rec.shapes if s[1] > 1)

"""Eviction of a prefill chunk's blocks in one batch (``CascadeCache._evict``).

The batched path (one ``EpisodicStore.add_many``, one ``summarize_blocks``, one
``SummaryIndex.add_many`` per call) must leave exactly the cache the per-block path
left (one ``add`` + ``summarize`` + ``index.add`` per block, kept here as the
reference): the same logits, stored blocks, summaries, spills and counters.
"""

from __future__ import annotations

import gc

import mlx.core as mx
import numpy as np
import pytest

from mlotspark.memory.cascade import CascadeCache, CascadeConfig, EpisodicStore, cascade_state, cascade_stats, make_cascade_cache
from mlotspark.memory.cascade.block_codec import encode, split_blocks
from mlotspark.memory.cascade.routing import SummaryIndex, summarize, summarize_blocks
from mlotspark.models.llama import Model, ModelArgs


@pytest.fixture(scope="module")
def model() -> Model:
    mx.random.seed(5)
    m = Model(ModelArgs(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, rope_traditional=True))
    mx.eval(m.parameters())
    return m


def per_block_evict(self: CascadeCache) -> None:
    """The eviction as it was before batching: store, summarise and index one block at a time."""
    B, W = self.config.block_size, self.config.window
    n_out = -(-(self.n_window - W) // B)
    start = self.offset - self.n_window
    sealed = []
    for j in range(n_out):
        bk = self.win_k[0, :, j * B : (j + 1) * B, :]
        bv = self.win_v[0, :, j * B : (j + 1) * B, :]
        block = self.store.add(self.layer, self.n_blocks, start + j * B, bk, bv)
        self.index.add(summarize(bk, self.config.representation))
        self.n_blocks += 1
        if block.payload is not None:
            sealed += list(block.payload.values())
    if sealed:
        mx.async_eval(sealed)
    self._drop_from_window(n_out * B)


def run(model: Model, cfg: CascadeConfig, chunks: list[int], seed: int = 0) -> tuple[np.ndarray, list]:
    toks = mx.array(np.random.default_rng(seed).integers(0, 256, sum(chunks)))
    cache = make_cascade_cache(model, cfg)
    outs, i = [], 0
    for c in chunks:
        outs.append(model(toks[None, i : i + c], cache=cache))
        mx.eval([x.state for x in cache])
        i += c
    return np.array(mx.concatenate(outs, axis=1)), cache


def store_view(store: EpisodicStore) -> tuple:
    """Everything the store's behaviour depends on, payloads included (spilled ones read back)."""
    blocks = []
    for key, b in sorted(store.blocks.items()):
        payload = {n: np.array(a) for n, a in store.payload_of(b).items()}
        blocks.append((key, b.start, b.shape, b.nbytes, b.last_used, b.hits, b.loads, b.payload is None,
                       b.path.name if b.path else None, {n: (a.dtype, a.shape, a.tobytes()) for n, a in payload.items()}))
    return (blocks, list(store._lru), store.resident_bytes, store.clock, vars(store.counters))


CASES = [
    # (config overrides, prefill chunks then decode steps): blocks sealed 1..24 at a time,
    # chunks that end inside a block, across the sinks, and the multi-level split (> 10 blocks)
    (dict(window=24, sinks=4, block_size=8, top_k=2, chunk=16), [37, 64, 5, 1, 1, 50] + [1] * 12),
    (dict(window=24, sinks=4, block_size=8, top_k=2, chunk=0), [3, 61, 100, 9, 1, 1, 1]),
    (dict(window=96, sinks=4, block_size=4, top_k=3, chunk=0, representation="mean"), [120, 96, 96, 7, 1, 1]),
    (dict(window=96, sinks=0, block_size=4, top_k=3, chunk=96, representation="keys", block_kind="q8"), [200, 40, 1, 1]),
    (dict(window=32, sinks=4, block_size=8, top_k=2, chunk=0, block_kind="q4", routing="hybrid"), [90, 33, 1, 1, 64]),
]


@pytest.mark.parametrize("overrides, chunks", CASES)
@pytest.mark.parametrize("budget", [512.0, 0.006])
def test_batched_eviction_leaves_the_cache_the_per_block_path_left(model, tmp_path, monkeypatch, overrides, chunks, budget):
    """Same logits bit for bit, same blocks (payloads, starts, LRU clock, spills, files),
    same summaries, routing selections and counters; with a small budget blocks spill
    mid-call, some of them sealed by that very call."""
    # ``auto`` re-stores blocks 8-bit when they would spill, at times the batching changes: float16 here
    # (its own tests: tests/test_block_kind_auto.py)
    overrides = {"block_kind": "float16", **overrides}
    cfg = CascadeConfig(**overrides, episodic_budget_mb=budget, spill_dir=str(tmp_path))  # a directory each
    out, cache = run(model, cfg, chunks)
    with monkeypatch.context() as m:
        m.setattr(CascadeCache, "_evict", per_block_evict)
        ref_out, ref = run(model, cfg, chunks)
    assert np.array_equal(out, ref_out)
    assert cache[0].n_blocks > 0
    for a, b in zip(cache, ref):
        assert a.n_blocks == b.n_blocks and a.selection == b.selection and a.counters == b.counters
        assert a.index.buf.shape == b.index.buf.shape
        assert np.array_equal(np.array(a.index.view()), np.array(b.index.view()))
    assert store_view(cache[0].store) == store_view(ref[0].store)
    if budget < 1:
        assert cache[0].store.counters.spills > 0
    for (a_arrays, a_meta), (b_arrays, b_meta) in zip(cascade_state(cache), cascade_state(ref)):
        assert a_meta == b_meta and a_arrays.keys() == b_arrays.keys()
        for name in a_arrays:
            assert np.array_equal(np.array(a_arrays[name]), np.array(b_arrays[name])), name
    assert cascade_stats(cache) == cascade_stats(ref)


@pytest.mark.parametrize("kind", ["float16", "q8", "q4"])
def test_add_many_stores_what_adding_one_by_one_stores(tmp_path, kind):
    k, v = mx.random.normal((13, 2, 8, 64)), mx.random.normal((13, 2, 8, 64))
    budget = 5 * 2 * sum(a.nbytes for a in encode(k[0], kind).values())  # 5 of the 13 blocks
    one, many = EpisodicStore(kind, budget, str(tmp_path / "one")), EpisodicStore(kind, budget, str(tmp_path / "many"))
    for j in range(13):
        one.add(3, 7 + j, 100 + 8 * j, k[j], v[j])
    blocks = many.add_many(3, 7, 100, k, v)
    assert [(b.layer, b.index, b.start) for b in blocks] == [(3, 7 + j, 100 + 8 * j) for j in range(13)]
    assert store_view(many) == store_view(one)
    assert many.counters.spills > 0


def test_summaries_of_many_blocks_are_each_blocks_summary():
    k = mx.random.normal((2, 12, 8, 16))  # (Hkv, n, B, D)
    for kind in ("minmax", "mean", "keys"):
        one, many = SummaryIndex(kind), SummaryIndex(kind)
        for j in range(12):
            one.add(summarize(k[:, j], kind))
        many.add_many(summarize_blocks(k[:, :5], kind))
        many.add_many(summarize_blocks(k[:, 5:], kind))
        assert many.buf.shape == one.buf.shape
        assert np.array_equal(np.array(many.view()), np.array(one.view())), kind
    big = SummaryIndex("minmax")
    big.add_many(summarize_blocks(mx.random.normal((2, 200, 4, 8)), "minmax"))  # grows past 64, 128
    assert big.n == 200 and big.buf.shape[2] == 256


@pytest.mark.parametrize("n", [1, 2, 10, 11, 16, 37, 128])
def test_split_blocks_cuts_equal_groups_in_order(n):
    a = mx.arange(n * 3 * 2).reshape(n * 3, 2)
    parts = split_blocks(a, n)
    assert len(parts) == n
    for j, p in enumerate(parts):
        assert np.array_equal(np.array(p), np.array(a[3 * j : 3 * j + 3]))


def test_a_spilled_block_frees_the_buffer_it_shared(tmp_path):
    """Blocks stored together are views of one buffer; when one leaves memory the rest get
    their own copies, so memory held is what ``resident_bytes`` counts, not the group's."""
    gc.collect()
    base = mx.get_active_memory()
    k = mx.random.normal((16, 2, 64, 64))
    store = EpisodicStore("float16", 10**9, str(tmp_path))
    store.add_many(0, 0, 0, k, -k)
    mx.eval([a for b in store.blocks.values() for a in b.payload.values()])
    del k
    gc.collect()
    group = 16 * 2 * 2 * 64 * 64 * 2  # bytes of the 16 blocks' keys and values
    assert store.resident_bytes == group
    store.fetch(0, [5], mx.float32)  # block 5 becomes the most recently used
    store.set_budget(group / 16 / 1e6)  # room for one block: the other 15 spill
    gc.collect()
    assert [i for (_, i), b in store.blocks.items() if b.payload is not None] == [5]
    assert store.resident_bytes == group // 16
    assert mx.get_active_memory() - base < group // 4  # not the whole group pinned by block 5
    stored = encode(store.unpack(store.blocks[(0, 5)], store.blocks[(0, 5)].payload, mx.float32)[0], "float16")
    assert stored["w"].shape == (2, 64, 64)

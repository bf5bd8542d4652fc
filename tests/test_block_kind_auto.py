"""Block kind ``auto`` (the default): episodic blocks are stored float16 and, past the
in-memory budget, the least recently retrieved are re-stored 8-bit before any spills.

Why: a 1M-token prompt's float16 blocks (~12.9 GB on Qwen2.5-0.5B) would spill ~3 GB
on a 16 GB Mac, one file per block, while its 8-bit blocks (~6.8 GB) fit; the 1M figure
in RESULTS ran with 8-bit blocks, and ``auto`` makes that what a user's defaults do.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
from test_cache_interface import CASCADE, _prompt
from test_cascade import forward, model, tokens  # noqa: F401  (model: the fixture)
from test_episodic_budget import _engine

from mlotspark.memory.cascade import CascadeCache, CascadeConfig, EpisodicStore, make_cascade_cache
from mlotspark.memory.cascade.block_codec import decode, encode

SHAPE = (2, 8, 64)  # (Hkv, B, D) of one block
F16_BLOCK = 2 * 2 * 8 * 64 * 2  # keys and values, float16


def _kv(i: int) -> tuple[mx.array, mx.array]:
    k = mx.random.normal(SHAPE, key=mx.random.key(i))
    return k, -k * 0.5 + i


def _as_q8(x: mx.array) -> np.ndarray:
    """What a block stored float16, then re-stored 8-bit, reads back as."""
    return np.array(decode(encode(x.astype(mx.float16), "q8"), "q8", mx.float32, SHAPE))


def _resident(store: EpisodicStore) -> int:
    return sum(b.nbytes for b in store.blocks.values() if b.payload is not None)


def test_past_the_budget_the_least_recently_used_blocks_go_8_bit_before_any_spills(tmp_path):
    store = EpisodicStore("auto", 10 * F16_BLOCK, str(tmp_path))
    for i in range(10):
        store.add(0, i, 8 * i, *_kv(i))
    assert store.counters.compressed == 0 and all(b.kind == "float16" for b in store.blocks.values())
    store.fetch(0, [0, 1], mx.float32)  # now the most recently retrieved
    for i in range(10, 13):  # 13 blocks in a budget of 10 float16 ones: 7 go 8-bit
        store.add(0, i, 8 * i, *_kv(i))
    kinds = {i: store.blocks[(0, i)].kind for i in range(13)}
    assert store.counters.spills == 0 and store.counters.compressed > 0
    assert store.resident_bytes == _resident(store) <= store.budget_bytes
    assert kinds[0] == kinds[1] == "float16"  # retrieved lately: kept as they were
    assert [i for i in range(13) if kinds[i] == "q8"] == list(range(2, 9))  # least recently used first
    keys, values = store.fetch(0, list(range(13)), mx.float32)  # runs of both kinds, in order
    for i in range(13):
        k, v = _kv(i)
        got_k, got_v = np.array(keys[:, 8 * i : 8 * i + 8]), np.array(values[:, 8 * i : 8 * i + 8])
        if kinds[i] == "float16":
            np.testing.assert_array_equal(got_k, np.array(k.astype(mx.float16).astype(mx.float32)))
        else:
            np.testing.assert_array_equal(got_k, _as_q8(k))
            np.testing.assert_array_equal(got_v, _as_q8(v))
            assert np.abs(got_k - np.array(k)).max() < 0.05  # 8 bits over a few units of range
    peeked = store.peek_keys(0, list(range(13)), mx.float32)
    np.testing.assert_array_equal(np.array(peeked), np.array(keys))


def test_past_what_8_bit_holds_blocks_spill_and_read_back_as_stored(tmp_path):
    store = EpisodicStore("auto", 6 * F16_BLOCK, str(tmp_path))
    for i in range(30):
        store.add(0, i, 8 * i, *_kv(i))
    assert store.counters.spills > 0 and store.counters.compressed > 0
    assert store.resident_bytes == _resident(store) <= store.budget_bytes
    spilled = [i for i in range(30) if store.blocks[(0, i)].payload is None]
    assert spilled and all(store.blocks[(0, i)].kind == "q8" for i in spilled)  # compressed before spilling
    keys, _ = store.fetch(0, spilled, mx.float32)
    for j, i in enumerate(spilled):
        np.testing.assert_array_equal(np.array(keys[:, 8 * j : 8 * j + 8]), _as_q8(_kv(i)[0]))


def test_a_zero_budget_spills_float16_blocks_as_they_are(tmp_path):
    store = EpisodicStore("auto", 0, str(tmp_path))
    for i in range(4):
        store.add(0, i, 8 * i, *_kv(i))
    assert store.counters.compressed == 0 and store.counters.spills == 4
    assert {b.kind for b in store.blocks.values()} == {"float16"}


def test_blocks_added_together_can_be_compressed_apart_and_their_bytes_stay_counted(tmp_path):
    """``add_many`` blocks share one buffer; re-storing some of them (the others retrieved
    lately) gives the rest copies of their own, so what the store counts is what it holds."""
    store = EpisodicStore("auto", 100 * F16_BLOCK, str(tmp_path))
    ks = mx.stack([_kv(i)[0] for i in range(8)])
    vs = mx.stack([_kv(i)[1] for i in range(8)])
    store.add_many(0, 0, 0, ks, vs)
    store.add_many(0, 8, 64, ks + 1, vs + 1)
    store.fetch(0, [2, 3], mx.float32)  # now the most recently retrieved: they stay float16
    store.set_budget(13.5 * F16_BLOCK / 1e6)  # 2.5 blocks over: the first group's other 6 go 8-bit
    kinds = [store.blocks[(0, i)].kind for i in range(16)]
    assert kinds == ["q8", "q8", "float16", "float16", "q8", "q8", "q8", "q8"] + ["float16"] * 8
    assert store.counters.spills == 0 and store.counters.compressed == 6
    assert store.resident_bytes == _resident(store) <= store.budget_bytes
    keys, _ = store.fetch(0, list(range(16)), mx.float32)
    for i in range(16):
        k = _kv(i % 8)[0] + (i >= 8)
        want = (_as_q8(k) if store.blocks[(0, i)].kind == "q8"
                else np.array(k.astype(mx.float16).astype(mx.float32)))
        np.testing.assert_allclose(np.array(keys[:, 8 * i : 8 * i + 8]), want, atol=1e-6)


def test_blocks_added_together_go_8_bit_together_when_next_in_line(tmp_path):
    """A re-store batch ends where an ``add_many`` group does: stopping inside one would copy
    the group's other blocks out of the shared buffer, a copy per array per block, only for
    them to be re-stored soon after (at 64k tokens a fifth of the blocks were copied first)."""
    store = EpisodicStore("auto", 100 * F16_BLOCK, str(tmp_path))
    ks = mx.stack([_kv(i)[0] for i in range(8)])
    store.add_many(0, 0, 0, ks, -ks)
    store.add_many(0, 8, 64, ks + 1, -ks - 1)
    store.set_budget(13 * F16_BLOCK / 1e6)  # 3 blocks over: 7 would do, the whole first group goes
    assert [store.blocks[(0, i)].kind for i in range(16)] == ["q8"] * 8 + ["float16"] * 8
    assert store.counters.compressed == 8 and store.counters.spills == 0
    assert len({store.blocks[(0, i)].slab for i in range(8)}) == 1  # one new buffer for the group
    second = {store.blocks[(0, i)].slab for i in range(8, 16)}
    assert len(second) == 1 and None not in second  # the other group still shares its buffer
    assert store.resident_bytes == _resident(store) <= store.budget_bytes


def test_a_batch_past_its_size_runs_on_to_its_groups_end(tmp_path, monkeypatch):
    """The cap on a batch's size gives way to the group's end (the case a long prompt meets:
    groups of a prefill piece's blocks, batches of ``COMPRESS_BATCH``)."""
    from mlotspark.memory.cascade import blocks

    monkeypatch.setattr(blocks, "COMPRESS_BATCH", 3)
    store = EpisodicStore("auto", 100 * F16_BLOCK, str(tmp_path))
    ks = mx.stack([_kv(i)[0] for i in range(8)])
    store.add_many(0, 0, 0, ks, -ks)
    store.add_many(0, 8, 64, ks + 1, -ks - 1)
    store.set_budget(15 * F16_BLOCK / 1e6)  # one block over: 3 would do, the first group goes whole
    assert [store.blocks[(0, i)].kind for i in range(16)] == ["q8"] * 8 + ["float16"] * 8
    assert len({store.blocks[(0, i)].slab for i in range(8)}) == 1
    second = {store.blocks[(0, i)].slab for i in range(8, 16)}
    assert len(second) == 1 and None not in second
    assert store.resident_bytes == _resident(store) <= store.budget_bytes


def test_blocks_8_bit_cannot_group_stay_float16_and_spill(tmp_path):
    """``auto`` never stores 8-bit what 8-bit cannot group (B x D not a multiple of 32):
    such blocks stay float16 and spill past the budget, no error."""
    store = EpisodicStore("auto", 3 * 2 * 2 * 3 * 10 * 2, str(tmp_path))  # three blocks of (2, 3, 10)
    for i in range(6):
        k = mx.random.normal((2, 3, 10), key=mx.random.key(i))
        store.add(0, i, 3 * i, k, -k)
    assert all(b.kind == "float16" for b in store.blocks.values())
    assert store.counters.compressed == 0 and store.counters.spills == 3
    keys, _ = store.fetch(0, list(range(6)), mx.float32)
    assert keys.shape == (2, 18, 10)


def test_a_cache_with_blocks_of_both_kinds_round_trips_and_old_states_restore(model):
    cfg = CascadeConfig(window=24, sinks=4, block_size=8, top_k=2, chunk=16, episodic_budget_mb=0.045)
    cas = make_cascade_cache(model, cfg)
    forward(model, cas, tokens(200, seed=5), [60, 60, 80])
    kinds = [b.kind for b in cas[0].store.layer_blocks(0)]
    assert "q8" in kinds and "float16" in kinds
    arrays, meta = cas[0].to_state()
    back = CascadeCache.from_state(arrays, meta, cfg)
    assert [b.kind for b in back.store.layer_blocks(0)] == kinds
    n = cas[0].n_blocks
    a, _ = cas[0].store.fetch(0, list(range(n)), mx.float32)
    b, _ = back.store.fetch(0, list(range(n)), mx.float32)
    np.testing.assert_array_equal(np.array(a), np.array(b))
    # A state written before blocks recorded their kind holds float16 blocks (its config's kind),
    # and restores under today's default.
    old = make_cascade_cache(model, CascadeConfig(**{**cfg.to_dict(), "block_kind": "float16",
                                                     "episodic_budget_mb": 512}))
    forward(model, old, tokens(120, seed=6), [60, 60])
    arrays, meta = old[0].to_state()
    for info in meta["blocks"]:
        del info["kind"]
    back = CascadeCache.from_state(arrays, meta, cfg)
    assert {b.kind for b in back.store.blocks.values()} == {"float16"}


def test_through_the_engine_auto_keeps_in_memory_what_float16_spills(tmp_path):
    """The same prompt through ``Engine.submit``: with a budget of ~70% of its float16 blocks,
    float16 spills and the default (auto) keeps every block in memory, some 8-bit."""

    def store_stats(cascade: dict) -> dict:
        engine = _engine({**CASCADE, **cascade, "spill_dir": str(tmp_path)}, above_weights=None)
        try:
            result = engine.submit(prompt_ids=_prompt(400, seed=4), max_tokens=4).result()
        finally:
            engine.close()
        return result.stats.extra["cascade"]

    whole = store_stats({"episodic_budget_mb": 512})
    assert whole["config"]["block_kind"] == "auto" and whole["store"]["compressed"] == 0
    # the budget bounds the blocks' payloads and their routing summaries
    budget_mb = (whole["bytes"]["episodic_memory"] * 0.7 + whole["bytes"]["summaries"]) / 1e6
    f16 = store_stats({"episodic_budget_mb": budget_mb, "block_kind": "float16"})
    auto = store_stats({"episodic_budget_mb": budget_mb})
    assert f16["bytes"]["episodic_disk"] > 0 and f16["store"]["compressed"] == 0
    assert auto["bytes"]["episodic_disk"] == 0 and auto["store"]["spills"] == 0
    assert auto["store"]["compressed"] > 0
    assert auto["bytes"]["episodic_memory"] + auto["bytes"]["summaries"] <= budget_mb * 1e6


def test_cli_block_kind_choices_are_the_configs():
    """``--block-kind`` spells its choices out (the CLI stays MLX-free); they must be ``BLOCK_KINDS``."""
    from mlotspark.cli.entry import build_parser
    from mlotspark.memory.cascade.config import BLOCK_KINDS

    sub = next(a for a in build_parser()._subparsers._group_actions[0].choices["generate"]._actions
               if a.dest == "block_kind")
    assert tuple(sub.choices) == BLOCK_KINDS and "auto" in sub.help


def test_the_float16_order_it_compresses_from_is_the_stores_lru_order(tmp_path):
    """``_compress`` reads its own list of resident float16 blocks (a scan of every resident
    block per call would be quadratic in a long prompt); it must stay the LRU order's."""
    rng = np.random.default_rng(0)
    store = EpisodicStore("auto", 9 * F16_BLOCK, str(tmp_path))
    for step in range(60):
        n = len(store.blocks)
        if n < 5 or rng.random() < 0.5:
            store.add(0, n, 8 * n, *_kv(n))
        else:
            store.fetch(0, sorted(rng.choice(n, size=3, replace=False).tolist()), mx.float32)
        assert list(store._f16) == [k for k in store._lru if store.blocks[k].kind == "float16"], step
        assert store.resident_bytes == _resident(store) <= store.budget_bytes
    assert store.counters.compressed > 0 and store.counters.spills > 0 and store.counters.loads > 0


def test_memory_held_is_what_the_store_counts_after_blocks_added_together_go_8_bit(tmp_path):
    """Re-storing part of an ``add_many`` group must free the float16 buffer the group
    shared (the rest get copies of their own), or memory holds more than it counts."""
    import gc

    gc.collect()
    base = mx.get_active_memory()
    ks = [mx.random.normal((16, *SHAPE), key=mx.random.key(100 + j)) for j in range(4)]
    mx.eval(ks)
    store = EpisodicStore("auto", 100 * F16_BLOCK, str(tmp_path))
    for j, k in enumerate(ks):
        store.add_many(0, 16 * j, 8 * 16 * j, k, k * 0.5)
    del ks, k
    store.fetch(0, [16 * j + i for j in range(4) for i in range(8, 16)], mx.float32)  # each group's second half
    store.set_budget(49 * F16_BLOCK / 1e6)  # the first halves go 8-bit: 32 + 32 * 17 / 32 = 49
    mx.eval([a for b in store.blocks.values() if b.payload is not None for a in b.payload.values()])
    gc.collect()
    assert [store.blocks[(0, i)].kind for i in range(16)] == ["q8"] * 8 + ["float16"] * 8
    assert store.counters.compressed == 32 and store.counters.spills == 0
    # The least of a few readings: MLX's count is the process's, and a thread another test
    # left (an engine finishing a conversation's writes) may hold a buffer for a moment;
    # memory this store keeps but does not count stays in every reading.
    held = min(_active_after(i * 0.05) - base for i in range(10))
    assert held <= 1.1 * store.resident_bytes, (held, store.resident_bytes)


def _active_after(seconds: float) -> int:
    import time

    time.sleep(seconds)
    return mx.get_active_memory()


def test_a_block_spilled_float16_then_re_stored_8_bit_spills_its_new_form(tmp_path):
    store = EpisodicStore("auto", 0, str(tmp_path))
    k, v = _kv(0)
    store.add(0, 0, 0, k, v)  # a zero budget: spilled as it was, float16
    b = store.blocks[(0, 0)]
    assert b.payload is None and b.kind == "float16" and b.path.exists()
    store.set_budget(1.0)
    store.fetch(0, [0], mx.float32)  # read back; its file stays valid
    store.add(0, 1, 8, *_kv(1))
    store.set_budget(1.5 * F16_BLOCK / 1e6)  # room for one float16 block and one 8-bit: block 0 goes 8-bit
    assert b.kind == "q8" and b.payload is not None and b.path is None
    store.set_budget(0)  # spilled again: its 8-bit form
    assert b.payload is None
    keys, values = store.fetch(0, [0], mx.float32)
    np.testing.assert_array_equal(np.array(keys), _as_q8(k))
    np.testing.assert_array_equal(np.array(values), _as_q8(v))


def test_restored_blocks_compress_in_their_recorded_lru_order(tmp_path):
    import dataclasses

    store = EpisodicStore("auto", 100 * F16_BLOCK, str(tmp_path))
    for i in range(8):
        store.add(0, i, 8 * i, *_kv(i))
    store.fetch(0, [5, 1], mx.float32)
    store.fetch(0, [3], mx.float32)
    again = EpisodicStore("auto", 100 * F16_BLOCK, str(tmp_path))
    for i in range(8):  # a snapshot restores blocks in index order, then settles
        again.restore(dataclasses.replace(store.blocks[(0, i)]))
    again.settle()
    # by last retrieval; blocks retrieved together (5 and 1) tie and keep their index order
    assert list(again._f16) == list(again._lru) == [(0, i) for i in (0, 2, 4, 6, 7, 1, 5, 3)]
    again.set_budget(7 * F16_BLOCK / 1e6)
    assert [i for i in range(8) if again.blocks[(0, i)].kind == "q8"] == [0, 2, 4]


def test_once_no_older_float16_block_is_left_new_blocks_are_stored_8_bit_at_once(tmp_path):
    store = EpisodicStore("auto", 6 * F16_BLOCK, str(tmp_path))
    for i in range(12):
        store.add(0, i, 8 * i, *_kv(i))
    assert not store._f16  # every resident block went 8-bit
    before = store.counters.compressed
    store.add(0, 12, 96, *_kv(12))
    assert store.blocks[(0, 12)].kind == "q8" and store.counters.compressed == before


def test_a_restored_cache_applies_its_budget_to_every_layers_blocks_at_once(model, monkeypatch):
    """``restore_cascade_cache`` settles the shared store once (one sort of every block, not
    one per layer: 24 at 1M tokens): which blocks go 8-bit is decided over all layers'
    blocks by their last retrieval."""
    from mlotspark.memory.cascade import cascade_state, restore_cascade_cache

    cfg = CascadeConfig(window=24, sinks=4, block_size=8, top_k=2, chunk=16, episodic_budget_mb=512)
    cas = make_cascade_cache(model, cfg)
    forward(model, cas, tokens(200, seed=8), [60, 60, 80])
    states = cascade_state(cas)
    small = CascadeConfig(**{**cfg.to_dict(), "episodic_budget_mb": 0.04})
    settles = []
    real_settle = EpisodicStore.settle
    monkeypatch.setattr(EpisodicStore, "settle", lambda self: (settles.append(1), real_settle(self))[1])
    restored = restore_cascade_cache(states, small)
    assert len(settles) == 1
    got = {k for k, b in restored[0].store.blocks.items() if b.kind == "q8"}
    whole = restore_cascade_cache(states, cfg)[0].store  # every block float16, then the same budget at once
    whole.set_budget(0.04)
    want = {k for k, b in whole.blocks.items() if b.kind == "q8"}
    assert got == want and {layer for layer, _ in got} == {0, 1}

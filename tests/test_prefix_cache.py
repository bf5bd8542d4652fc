"""The prefix cache: longest-prefix hits, LFU-with-aging eviction, budgets, save and preload."""

from __future__ import annotations

import pytest

import mlotspark  # noqa: F401
from mlotspark.memory.kv_state import capture, prefix_state, restore
from mlotspark.errors import OptionError
from mlotspark.memory.prefix_cache import PrefixCache
from mlotspark.memory.snapshots import SnapshotWarning

from persist_helpers import extend, kv_cache, kv_equal

FP, W = "0123456789abcdef", "float32"


def entry(tokens: list[int], seed: int = 0):
    cache = kv_cache(len(tokens), seed=seed)
    return cache, capture(cache)


def test_longest_common_prefix_hit_gives_an_independent_cut_copy():
    pc = PrefixCache(budget_mb=10, min_tokens=4)
    system = list(range(20))
    cache, state = entry(system)
    assert pc.add(system, state)
    assert not pc.add(system, state)  # already there
    # A prompt that shares 15 tokens (a memory section changed the system message's end).
    prompt = system[:15] + [99, 98, 97]
    hit = pc.lookup(prompt)
    assert hit is not None and hit.tokens == 15
    got = pc.take(hit)
    assert got[0].offset == 15
    assert kv_equal(got, [_cut(c, 15) for c in cache])
    extend(got, 5)  # the conversation goes on; the entry must not change
    again = pc.take(pc.lookup(system + [1]))
    assert again[0].offset == 20 and kv_equal(again, cache)
    assert pc.lookup([5, 4, 3, 2, 1]) is None
    s = pc.stats()
    assert (s["hits"], s["misses"], s["tokens_saved"], s["entries"]) == (2, 1, 35, 1)
    assert s["bytes"] == state.nbytes


def _cut(layer, n):
    """One layer's cache holding its first ``n`` tokens."""
    return restore([prefix_state([layer], n)])[0]


def test_lfu_with_aging_keeps_the_frequently_used_prefix():
    a, b, c = list(range(10)), list(range(100, 110)), list(range(200, 210))
    _, sa = entry(a)
    budget_mb = 2.5 * sa.nbytes / 1e6  # room for two entries
    pc = PrefixCache(budget_mb=budget_mb, min_tokens=4)
    assert pc.add(a, sa)
    assert pc.add(b, entry(b, 1)[1])
    for _ in range(3):
        pc.take(pc.lookup(a + [1]))  # a is used often, b was added later (more recent)
    assert pc.add(c, entry(c, 2)[1])
    assert set(pc.entries) == {tuple(a), tuple(c)}
    assert pc.stats()["evictions"] == 1
    # Aging: after the eviction, a new entry starts above the evicted one's priority.
    pc.set_budget(0)
    assert pc.stats()["entries"] == 0
    with pytest.raises(OptionError, match="budget"):
        pc.set_budget(-1)


def test_most_used_prefixes_are_saved_and_preloaded(tmp_path):
    d = tmp_path / "pc"
    pc = PrefixCache(budget_mb=10, directory=d, fingerprint=FP, weights=W, min_tokens=4, keep_on_disk=2)
    prefixes = [list(range(k * 100, k * 100 + 12)) for k in range(3)]
    caches = []
    for k, p in enumerate(prefixes):
        cache, state = entry(p, k)
        caches.append(cache)
        pc.add(p, state)
    for k, uses in enumerate([1, 3, 2]):
        for _ in range(uses):
            pc.take(pc.lookup(prefixes[k] + [7]))
    pc.save()
    fresh = PrefixCache(budget_mb=10, directory=d, fingerprint=FP, weights=W, min_tokens=4)
    assert fresh.load() == 2
    assert set(fresh.entries) == {tuple(prefixes[1]), tuple(prefixes[2])}
    assert kv_equal(fresh.take(fresh.lookup(prefixes[1] + [0])), caches[1])
    assert fresh.stats()["loaded_from_disk"] == 2
    # Another model's entries are never loaded.
    assert PrefixCache(budget_mb=10, directory=d, fingerprint="ffffffffffffffff", weights=W).load() == 0
    # A corrupt entry file is refused with a warning; the others still load.
    victim = d / fresh.entries[tuple(prefixes[1])].file
    victim.write_bytes(victim.read_bytes()[:-8])
    other = PrefixCache(budget_mb=10, directory=d, fingerprint=FP, weights=W)
    with pytest.warns(SnapshotWarning, match="truncated"):
        assert other.load() == 1
    assert other.stats()["refused_from_disk"] == 1


def test_budget_bounds_preload(tmp_path):
    d = tmp_path / "pc"
    pc = PrefixCache(budget_mb=10, directory=d, fingerprint=FP, weights=W, min_tokens=4)
    for k in range(3):
        pc.add(list(range(k * 50, k * 50 + 16)), entry(list(range(16)), k)[1])
        pc.take(pc.lookup(list(range(k * 50, k * 50 + 16))))
    pc.save()
    small = PrefixCache(budget_mb=1.5 * pc.entries[next(iter(pc.entries))].nbytes / 1e6, directory=d, fingerprint=FP, weights=W)
    assert small.load() == 1

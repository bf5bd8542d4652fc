"""The cascade's episodic tier takes its in-memory budget from the machine's memory budget.

With ``episodic_budget_mb=None`` (the default) a cascade request's episodic store may keep
as many bytes in memory as one request's KV budget (``platform.memory.memory_budget``):
a memory limit less the weights, on Metal the recommended working set less the weights
(from a fixed pool less a tenth of it too, for what runs beside the store), elsewhere half
of what is available; a number in the config still wins.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from test_cache_interface import CASCADE, CHUNK, _model, _prompt
from test_cascade import model  # noqa: F401  (the fixture)
from test_scheduler import CharTokenizer, FakeClock

from mlotspark.engine import Engine
from mlotspark.memory.cascade import CascadeConfig
from mlotspark.memory.cascade.blocks import episodic_budget_bytes
from mlotspark.models.loader import LoadedModel
from mlotspark.options import GenerationOptions
from mlotspark.platform import memory as platform_memory
from mlotspark.runtime.scheduler import SchedulerConfig
from mlotspark.thermal.governor import ThermalGovernor
from mlotspark.thermal.probes import Reading, ScriptedProbe

MB = 1_000_000


def _engine(cascade: dict, above_weights: int | None) -> Engine:
    """An engine of the tiny model; its memory limit ``above_weights`` bytes past the weights."""
    loaded = LoadedModel(model=_model(), tokenizer=CharTokenizer(), config={},
                         source=SimpleNamespace(name="tiny", path="tiny"), weights="float32",
                         fingerprint="tiny", context_length=4096, supports_cascade=True)
    limit = None if above_weights is None else loaded.nbytes() + above_weights
    gov = ThermalGovernor([ScriptedProbe([Reading()])], clock=FakeClock(), min_interval_s=0)
    engine = Engine(loaded, GenerationOptions(temperature=0.0, prefill_chunk=CHUNK),
                    SchedulerConfig(governor=gov, memory_limit=limit), cascade=cascade)
    engine.scheduler.pause_wait_s = 0.001
    return engine


def _bytes(engine: Engine) -> dict:
    result = engine.submit(prompt_ids=_prompt(150, seed=4), max_tokens=4).result()
    return result.stats.extra["cascade"]["bytes"]


def test_the_default_budget_is_the_memory_limit_less_the_weights_and_a_headroom():
    engine = _engine(CASCADE, above_weights=3 * MB)
    try:
        limit = engine.loaded.nbytes() + 3 * MB
        got = _bytes(engine)
    finally:
        engine.close()
    assert got["episodic_budget"] == 3 * MB - min(int(0.10 * limit), 3 * MB // 2)
    assert got["episodic_memory"] > 0 and got["episodic_disk"] == 0


def test_a_budget_in_the_config_wins_and_blocks_past_it_spill(tmp_path):
    engine = _engine({**CASCADE, "episodic_budget_mb": 0, "spill_dir": str(tmp_path)}, above_weights=None)
    try:
        got = _bytes(engine)
    finally:
        engine.close()
    assert got["episodic_budget"] == 0
    assert got["episodic_disk"] > got["episodic_memory"]  # only the blocks attended now stay


def test_the_spill_files_of_a_killed_process_go_when_the_next_one_spills(tmp_path):
    """A process killed mid-request left its spill directory for good (only the store's
    close deleted it): the next request that spills there deletes it, and not the
    directory of a store still alive."""
    import subprocess
    import sys
    from pathlib import Path

    from mlotspark.memory.cascade.blocks import EpisodicStore

    code = ("import os, sys; from mlotspark.memory.cascade.blocks import EpisodicStore; "
            "s = EpisodicStore('float16', 0, sys.argv[1]); d = s.directory(); (d / '0.safetensors').write_bytes(b'kv'); "
            "print(d, flush=True); os.kill(os.getpid(), 9)")
    dead = Path(subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                               text=True).stdout.strip())
    assert (dead / "0.safetensors").is_file()
    living = EpisodicStore("float16", 0, str(tmp_path))
    alive = living.directory()
    engine = _engine({**CASCADE, "episodic_budget_mb": 0, "spill_dir": str(tmp_path)}, above_weights=None)
    try:
        assert _bytes(engine)["episodic_disk"] > 0  # this request spilled
    finally:
        engine.close()
    assert not dead.exists() and alive.is_dir()
    living.close()


def test_on_metal_the_budget_is_the_working_set_less_the_weights_and_a_headroom(monkeypatch):
    """A store filling working set - weights would push the process past the working set
    by what runs beside it (0.66 GB at 1M tokens on Qwen2.5-0.5B): 10% of the pool is left."""
    monkeypatch.setattr(platform_memory, "metal_available", lambda: True)
    monkeypatch.setattr(platform_memory, "metal_working_set", lambda: 12_000 * MB)
    cfg = CascadeConfig(**CASCADE)
    assert cfg.episodic_budget_mb is None
    assert episodic_budget_bytes(cfg, weights_bytes=2_000 * MB) == 10_000 * MB - 1_200 * MB
    assert episodic_budget_bytes(cfg, weights_bytes=2_000 * MB, memory_limit=3_000 * MB) == 1_000 * MB - 300 * MB
    assert episodic_budget_bytes(cfg, weights_bytes=11_500 * MB) == 250 * MB  # at most half of the KV budget
    assert episodic_budget_bytes(CascadeConfig(**CASCADE, episodic_budget_mb=64)) == 64 * MB


def test_elsewhere_it_is_half_the_available_memory(monkeypatch):
    monkeypatch.setattr(platform_memory, "metal_available", lambda: False)
    psutil = pytest.importorskip("psutil")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=8_000 * MB))
    assert episodic_budget_bytes(CascadeConfig(**CASCADE), weights_bytes=500 * MB) == 4_000 * MB


@pytest.mark.parametrize("representation, rows", [("minmax", 2), ("mean", 1), ("keys", 8)])
def test_the_budget_counts_every_blocks_routing_summary(tmp_path, representation, rows):
    """Summaries stay in memory when their blocks spill (0.8 GB at 1M tokens on Qwen2.5-0.5B):
    the budget bounds payloads and summaries together."""
    import mlx.core as mx

    from mlotspark.memory.cascade import EpisodicStore

    cfg = CascadeConfig(**{**CASCADE, "representation": representation, "block_kind": "float16",
                           "episodic_budget_mb": 0.06, "spill_dir": str(tmp_path)})
    store = EpisodicStore.from_config(cfg)
    assert store.summary_rows == rows
    k = mx.random.normal((2, 8, 16))
    for i in range(50):
        store.add(0, i, 8 * i, k, k)
    assert store.summary_bytes == 50 * 2 * rows * 16 * 4
    assert store.memory_bytes == store.resident_bytes + store.summary_bytes <= 60_000
    fits = (60_000 - store.summary_bytes) // (2 * 2 * 8 * 16 * 2)  # float16 blocks beside the summaries
    assert store.counters.spills == max(0, 50 - fits)


def test_mlotspark_info_states_the_headroom_the_store_leaves():
    """``platform`` may not import the cascade, so ``mlotspark info`` writes the share out:
    this keeps the two from drifting."""
    from mlotspark.memory.cascade.blocks import EPISODIC_HEADROOM
    from mlotspark.platform.device import device_info

    assert f"less {EPISODIC_HEADROOM:.0%} of a fixed pool" in device_info()["cascade_episodic_budget"]


def test_a_restored_conversation_keeps_the_budget_its_store_had(model, monkeypatch):  # noqa: F811
    """A snapshot restores without the weights or the memory limit at hand; the machine's
    budget without the weights would let the restored store keep the weights' bytes more
    (4 GB for a 7B model at 4 bits): it takes the saved store's budget instead."""
    from test_cascade import forward, tokens

    from mlotspark.memory.cascade import cascade_state, make_cascade_cache, restore_cascade_cache

    monkeypatch.setattr(platform_memory, "metal_available", lambda: True)
    monkeypatch.setattr(platform_memory, "metal_working_set", lambda: 12_000 * MB)
    cfg = CascadeConfig(window=24, sinks=4, block_size=8, top_k=2, chunk=16)
    cas = make_cascade_cache(model, cfg, weights_bytes=2_000 * MB)
    assert cas[0].store.budget_bytes == 8_800 * MB  # 12,000 - 2,000 - a tenth of the pool
    forward(model, cas, tokens(120, seed=3), [60, 60])
    states = cascade_state(cas)
    assert restore_cascade_cache(states, cfg)[0].store.budget_bytes == 8_800 * MB
    old = [(arrays, {k: v for k, v in meta.items() if k != "episodic_budget"}) for arrays, meta in states]
    assert restore_cascade_cache(old, cfg)[0].store.budget_bytes == 10_800 * MB  # older states: the machine's

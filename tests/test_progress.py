"""Long work is never silent: prefill progress events from every prefill loop, in order,
ending at the prompt length (API), and the meter behind them."""

from __future__ import annotations

import pytest

from mlotspark.memory.cascade import CascadeConfig
from mlotspark.runtime.progress import PrefillMeter, PrefillProgress
from test_scheduler import tiny_engine

PROMPT = list(range(3, 103))  # 100 tokens: 7 chunks of 16


def _assert_in_order(events: list[PrefillProgress], total: int) -> None:
    assert events, "no progress event"
    done = [e.done for e in events]
    assert done == sorted(set(done)), done  # strictly increasing: in order, no repeats
    assert done[0] == 0 and done[-1] == total and events[-1].finished
    assert all(e.total == total for e in events)
    assert [e.elapsed_s for e in events] == sorted(e.elapsed_s for e in events)


@pytest.mark.parametrize("options", [
    {},  # the scheduler's chunked prefill, batched decode
    {"num_beams": 2},  # beam search's own loop
    {"num_return_sequences": 2, "temperature": 0.7},  # several samples
    {"speculative": "prompt_lookup"},  # speculative decoding
], ids=["batched", "beams", "returns", "speculative"])
def test_stream_reports_prefill_in_order_then_the_text(options):
    engine = tiny_engine()
    try:
        handle = engine.submit(prompt_ids=PROMPT, progress=True, prefill_chunk=16, max_tokens=3, **options)
        items = list(handle)
        events = [i for i in items if isinstance(i, PrefillProgress)]
        _assert_in_order(events, len(PROMPT))
        first_text = next(k for k, i in enumerate(items) if isinstance(i, str))
        assert all(isinstance(i, PrefillProgress) for i in items[:first_text])  # progress comes first
        assert len(events) >= len(PROMPT) // 16  # one event per chunk at least
        assert handle.progress == events[-1]
        assert handle.result().stats.prefill_tps > 0
    finally:
        engine.close()


def test_engine_stream_yields_progress_then_text_then_stats():
    engine = tiny_engine()
    try:
        out = list(engine.stream("x" * 60, raw=True, progress=True, prefill_chunk=8, max_tokens=2))
        events = [o for o in out if isinstance(o, PrefillProgress)]
        _assert_in_order(events, 60)
        assert not any(isinstance(o, PrefillProgress) for o in engine.stream("x" * 60, raw=True, max_tokens=2))
    finally:
        engine.close()


def test_on_progress_callback_and_cascade_flag():
    engine = tiny_engine()
    seen: list[PrefillProgress] = []
    try:
        engine.caches.cascade = CascadeConfig(sinks=4, window=32, block_size=8, top_k=2)
        cache = engine.caches.make(len(PROMPT), engine.defaults)
        handle = engine.submit(prompt_ids=PROMPT, cache=cache, on_progress=seen.append, max_tokens=2,
                               prefill_chunk=32)
        handle.result()
        _assert_in_order(seen, len(PROMPT))
        assert all(e.cascade for e in seen)
        assert "memory cascade" in seen[-1].describe()
    finally:
        engine.close()


def test_a_finished_request_is_freed_without_the_cycle_collector():
    """Progress reaches the handle through the engine's request record, so the generation
    never points back at its handle: dropping the handle frees the pair (and its KV) at once."""
    import gc
    import weakref

    engine = tiny_engine()
    try:
        handle = engine.submit(prompt_ids=PROMPT, progress=True, max_tokens=2)
        assert list(handle) and handle.progress is not None and handle.progress.finished
        gen = weakref.ref(handle.generation)
        engine.scheduler.call(lambda: None)  # the engine thread's turn that ended it is over
        gc.disable()
        try:
            del handle
            assert gen() is None
        finally:
            gc.enable()
    finally:
        engine.close()


def test_meter_drops_repeats_and_steps_back():
    got: list[PrefillProgress] = []
    clock = iter(range(100)).__next__
    meter = PrefillMeter(10, got.append, clock=lambda: float(clock()))
    for d in (0, 0, 4, 3, 8, 12):
        meter(d, 99)
    meter.finish()
    assert [e.done for e in got] == [0, 4, 8, 10]
    assert got[2].tokens_per_s == pytest.approx(8 / 3) and got[2].eta_s == pytest.approx(2 / (8 / 3))
    assert got[-1].finished and got[-1].fraction == 1.0


def test_describe_counts_down_between_events():
    # One event per prefill chunk (2,048 tokens: many seconds on a CPU); a display redrawn in
    # between passes the seconds since the event arrived.
    e = PrefillProgress(done=4096, total=12000, elapsed_s=48.0, cascade=True)
    assert "ETA 93 s" in e.describe()
    assert "ETA 83 s" in e.describe(since_s=10.0)
    assert "ETA any moment" in e.describe(since_s=200.0)  # slower than the speed so far: never negative
    first = PrefillProgress(done=0, total=12000, elapsed_s=2.0)  # no speed yet: the elapsed time goes up
    assert first.describe().endswith("· 2 s") and first.describe(since_s=5.0).endswith("· 7 s")

"""Several resident models under one memory budget and one thermal governor
(``server/governance.py``): the weights counted once each, the KV budgets split from what is
left, a model that does not fit unloading an idle one first or refused with one line naming the
sizes, one governor's batch cap split among the busy engines. Fake engines for the bookkeeping;
tiny real models through ``Engine.load`` for the admission an engine actually applies."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from mlotspark.server.governance import GovernorShare, SharedGovernor
from mlotspark.server.models import ModelPool
from mlotspark.server.schemas import APIError
from mlotspark.thermal.governor import ThermalGovernor
from mlotspark.thermal.probes import Reading

MB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Calm:
    def read(self) -> Reading:
        return Reading()


class FakeEngine:
    def __init__(self, spec: str, nbytes: int, governor: GovernorShare):
        self.spec, self.governor, self.closed = spec, governor, False
        self.loaded = SimpleNamespace(nbytes=lambda: nbytes)
        self.model_name = spec
        self.scheduler = SimpleNamespace(call=lambda fn, *a, **k: fn(*a, **k))

    def close(self) -> None:
        self.closed = True


def make_pool(sizes: dict[str, int], budget: int, clock: Clock, **kw) -> tuple[ModelPool, SharedGovernor, list]:
    shared = SharedGovernor(ThermalGovernor(probes=[Calm()], max_batch=8, clock=clock), budget, min_kv_bytes=10 * MB)
    loads: list[FakeEngine] = []

    def load(spec: str, governor: GovernorShare) -> FakeEngine:
        loads.append(FakeEngine(spec, sizes[spec], governor))
        return loads[-1]

    pool = ModelPool(load, keep_alive_s=60, clock=clock, governance=shared, estimate=lambda spec: 0, **kw)
    first = shared.share("a")
    pool.add("a", "a", load("a", first), share=first)
    for name in sizes:
        if name != "a":
            pool.add(name, name)
    return pool, shared, loads


def use(pool: ModelPool, name: str):
    slot = asyncio.run(pool.acquire(pool.find(name)))
    pool.release(slot)
    return slot


def test_resident_models_count_their_weights_once_and_split_what_is_left_for_kv():
    clock = Clock()
    pool, shared, loads = make_pool({"a": 100 * MB, "b": 200 * MB}, 1000 * MB, clock)
    assert shared.kv_share() == 900 * MB  # one model: all that its weights leave
    use(pool, "b")
    assert shared.weights() == 300 * MB
    assert shared.kv_share() == 350 * MB  # (1000 - 100 - 200) / 2
    assert loads[1].governor.kv_budget() == loads[0].governor.kv_budget() == 350 * MB
    # One thermal governor behind both engines, not one each.
    assert loads[0].governor.shared.governor is loads[1].governor.shared.governor
    clock.now += 61
    assert pool.reap() == ["b"]
    assert shared.weights() == 100 * MB and shared.kv_share() == 900 * MB


def test_a_model_that_does_not_fit_unloads_the_least_recently_used_idle_one_first():
    clock = Clock()
    sizes = {"a": 100 * MB, "b": 300 * MB, "c": 300 * MB, "d": 300 * MB}
    pool, shared, loads = make_pool(sizes, 900 * MB, clock, max_models=5)
    use(pool, "b")
    clock.now += 1
    use(pool, "c")  # 100 + 300 + 300 + 3 x 10 MB of KV = 730 MB: both fit
    clock.now += 1
    use(pool, "b")  # b used last: c is the least recently used
    clock.now += 1
    use(pool, "d")  # 100 + 300 + 300 + 300 + 40 > 900: c goes
    assert sorted(s.name for s in pool.resident()) == ["a", "b", "d"]
    assert next(e for e in loads if e.spec == "c").closed


def test_a_model_too_big_for_the_budget_is_refused_with_one_line_naming_the_sizes():
    clock = Clock()
    pool, shared, loads = make_pool({"a": 100 * MB, "huge": 2000 * MB}, 1000 * MB, clock)
    with pytest.raises(APIError) as e:
        use(pool, "huge")
    assert e.value.status == 507 and e.value.code == "insufficient_memory"
    msg = e.value.message
    assert "\n" not in msg and "huge" in msg and "2.0 GiB" in msg and "1000.0 MiB" in msg
    assert loads[-1].spec == "huge" and loads[-1].closed  # loaded (its estimate was 0), measured, closed
    assert [s.name for s in pool.resident()] == ["a"] and shared.weights() == 100 * MB
    # Its size is known now: the next request is refused before anything loads.
    n = len(loads)
    with pytest.raises(APIError):
        use(pool, "huge")
    assert len(loads) == n


def test_a_busy_model_is_never_unloaded_for_room_the_request_is_told_to_retry():
    clock = Clock()
    pool, shared, loads = make_pool({"a": 100 * MB, "b": 500 * MB, "c": 500 * MB}, 1000 * MB, clock)
    busy = asyncio.run(pool.acquire(pool.find("b")))  # a request in flight on b
    pool.find("c").weights_bytes = 500 * MB  # known from an earlier load
    with pytest.raises(APIError) as e:
        use(pool, "c")
    assert e.value.status == 503 and "Retry-After" in e.value.headers and "'c'" in e.value.message
    assert pool.find("b").loaded
    pool.release(busy)
    use(pool, "c")  # b idle now: it makes room
    assert sorted(s.name for s in pool.resident()) == ["a", "c"]


def test_one_governor_cap_is_split_among_the_engines_with_work():
    clock = Clock()
    pool, shared, loads = make_pool({"a": 10 * MB, "b": 10 * MB}, 1000 * MB, clock)
    use(pool, "b")
    a, b = loads[0].governor, loads[1].governor
    assert a.update().cap == 8 and b.update().cap == 8  # nothing in flight: each may use the machine's cap
    sa = asyncio.run(pool.acquire(pool.find("a")))
    sb = asyncio.run(pool.acquire(pool.find("b")))
    assert a.update().cap == b.update().cap == 4
    assert a.status()["cap"] == 4 and a.status()["kv_budget_bytes"] == shared.kv_share()
    # Decode rates reach the governor's probe from the first engine only, and only while it runs alone.
    seen = []
    shared.governor.record_throughput = lambda *x: seen.append(x)
    a.record_throughput(2, 10.0)
    b.record_throughput(2, 30.0)
    pool.release(sb)
    a.record_throughput(2, 11.0)
    assert seen == [(2, 11.0, None)]
    pool.release(sa)


def test_an_engine_admits_only_within_its_kv_share():
    clock = Clock()
    pool, shared, loads = make_pool({"a": 100 * MB, "b": 100 * MB}, 500 * MB, clock)
    use(pool, "b")
    a = loads[0].governor  # share: (500 - 200) / 2 = 150 MB
    ok, why = a.admit(100 * MB, 100 * MB + 40 * MB, active_requests=1)
    assert ok, why
    ok, why = a.admit(100 * MB, 100 * MB + 60 * MB, active_requests=1)
    assert not ok and "model a" in why and "150.0 MiB" in why


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    from tiny import tiny_model, write_tiny_gguf

    root = tmp_path_factory.mktemp("gov")
    return write_tiny_gguf(root / "one.gguf", tiny_model(0)), write_tiny_gguf(root / "two.gguf", tiny_model(1))


def test_real_engines_share_one_governor_and_a_request_past_its_kv_share_fails(tiny_files):
    from mlotspark.engine import Engine
    from mlotspark.errors import OptionError

    one, two = tiny_files
    clock = Clock()
    shared = SharedGovernor(ThermalGovernor(probes=[Calm()], max_batch=4), 0, min_kv_bytes=1)

    def load(spec: str, governor: GovernorShare) -> Engine:
        return Engine.load(spec, progress=False, cascade=None, governor=governor)

    first = shared.share(str(one))
    engine = load(str(one), first)
    weights = engine.loaded.nbytes()
    # Room for both models' weights and 200 KiB of KV each (one 256-token KV step is 128 KiB here).
    shared.budget_bytes = 2 * weights + 2 * 200 * 1024
    pool = ModelPool(load, keep_alive_s=60, clock=clock, governance=shared)
    pool.add(engine.model_name, str(one), engine, share=first)
    pool.add("two", str(two))
    try:
        slot = use(pool, "two")
        assert slot.engine.scheduler.governor.shared.governor is engine.scheduler.governor.shared.governor
        assert engine.generate("hi", raw=True, max_tokens=4, temperature=0).text is not None
        with pytest.raises(OptionError, match="KV share"):
            slot.engine.generate("x" * 400, raw=True, max_tokens=4, temperature=0)  # 512 tokens of KV
        clock.now += 61
        assert pool.reap() == ["two"]  # its weights and share go back: the long prompt fits now
        assert engine.generate("x" * 400, raw=True, max_tokens=4, temperature=0).text is not None
    finally:
        pool.close()
        engine.close()


def test_serve_builds_one_governor_for_the_machine_budget():
    from mlotspark.cli.serve import shared_governance

    shared = shared_governance({"mode": "balanced", "max_batch": 4, "memory_limit": None})
    assert shared.budget_bytes > 0 and shared.governor.max_batch == 4
    assert shared.governor.memory_limit_bytes is None  # the shares gate admissions, not the governor
    a, b = shared.share("a"), shared.share("b")
    assert a.shared.governor is b.shared.governor and a.mode_max("balanced") == shared.governor.mode_max("balanced")

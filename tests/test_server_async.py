"""The HTTP path without a thread per request, on a tiny random model in-process:
the request handle iterated from asyncio, options validated once by the engine and
the bad one named from ``OptionError.options``."""

from __future__ import annotations

import asyncio
import threading
import time
import types
from typing import Any
from concurrent.futures import ThreadPoolExecutor

import pytest
from starlette.testclient import TestClient

from mlotspark.errors import OptionError
from mlotspark.options import GenerationOptions
from mlotspark.runtime.request_handle import RequestHandle
from mlotspark.server import ServerState, create_app


def test_a_handle_is_iterated_from_asyncio_without_a_thread():
    handle = RequestHandle(types.SimpleNamespace(cancel=threading.Event()))
    handle.emit("early ")  # before the reader attached: kept in order

    def engine_thread() -> None:
        for piece in ("a", "b", "c"):
            time.sleep(0.01)
            handle.emit(piece)
        handle.finish(types.SimpleNamespace(stats=None))

    producer = threading.Thread(target=engine_thread)

    async def read(start: bool = True) -> list[str]:
        if start:
            producer.start()
        return [p async for p in handle.aiter()]

    before = threading.active_count()
    assert asyncio.run(read()) == ["early ", "a", "b", "c"]
    producer.join()  # the stand-in engine thread itself, which may still be ending
    assert threading.active_count() <= before  # the reader added none
    with pytest.raises(RuntimeError, match="only once"):
        asyncio.run(read(start=False))


def test_an_engine_error_is_raised_from_the_async_iterator():
    handle = RequestHandle(types.SimpleNamespace(cancel=threading.Event()))
    handle.emit("x")
    handle.finish(None, OptionError("boom"))

    async def read() -> list[str]:
        return [p async for p in handle.aiter()]

    with pytest.raises(OptionError, match="boom"):
        asyncio.run(read())


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from mlotspark.engine import Engine
    from tiny import tiny_model, write_tiny_gguf

    path = write_tiny_gguf(tmp_path_factory.mktemp("async-model") / "tiny.gguf", tiny_model())
    e = Engine.load(str(path), progress=False, cascade=None)
    yield e
    e.close()


def _body(**kw) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
            "temperature": 0, **kw}


@pytest.fixture
def served(engine):
    state = ServerState(engine, prompt_cache=None)
    state.close = lambda: state.begin_shutdown()  # the module's engine outlives each app
    with TestClient(create_app(state)) as c:
        yield c, state


def test_concurrent_streams_hold_no_thread_each(served):
    c, _ = served
    client_threads: set[str] = set()
    seen: list[set[str]] = []

    def stream(i: int) -> str:
        client_threads.add(threading.current_thread().name)
        text = ""
        with c.stream("POST", "/v1/chat/completions", json=_body(stream=True, max_tokens=24)) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    seen.append({t.name for t in threading.enumerate()})
                    text += line
        return text

    stream(0)  # warm: the engine thread and the test client's portal are up
    # Threads other tests of this process left behind (their engines, writers, probes) are not this server's.
    earlier = {t.name for t in threading.enumerate()} - {"mlotspark-engine"} - client_threads
    earlier = {n for n in earlier if not n.startswith("asyncio-portal")}
    with ThreadPoolExecutor(6, thread_name_prefix="client") as pool:
        replies = list(pool.map(stream, range(6)))
    assert all('"finish_reason": "length"' in r for r in replies)
    server_side = [{n for n in names - client_threads - earlier if not n.startswith("client")} for names in seen]
    # With 1 or 6 streams in flight the server side runs the event loop and the engine thread only.
    assert all(n == "mlotspark-engine" or n.startswith("asyncio-portal") for names in server_side for n in names)


def test_the_bad_option_is_named_from_the_engines_error(served):
    c, _ = served
    for body, param in [(_body(top_p=0), "top_p"), (_body(top_k=-1), "top_k"),
                        (_body(max_completion_tokens=0), "max_completion_tokens"), (_body(seed=-1), "seed"),
                        (_body(min_p=1.5), "min_p"), (_body(response_format={"type": "xml"}), "response_format"),
                        (_body(n=2, response_format={"type": "json_object"}), "response_format")]:
        r = c.post("/v1/chat/completions", json=body)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == param and f"'{param}'" in err["message"], (body, err)


def test_options_are_validated_once_per_request(served, monkeypatch):
    c, _ = served
    calls = []
    post_init = GenerationOptions.__post_init__

    def counting(self):
        calls.append(1)
        post_init(self)

    monkeypatch.setattr(GenerationOptions, "__post_init__", counting)
    r = c.post("/v1/chat/completions", json=_body(top_p=0.5))
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("length", "stop")
    assert len(calls) == 1


def test_a_silent_stream_sends_keep_alives_and_closing_it_closes_the_stream(monkeypatch):
    # A long prefill sends nothing for minutes: the stream beats every KEEPALIVE_S instead,
    # passes every piece on in order, and a client that leaves closes the inner stream (whose
    # ``finally`` cancels the request) even while it waits.
    from mlotspark.server import exchange

    monkeypatch.setattr(exchange, "KEEPALIVE_S", 0.02)
    closed = []

    async def slow() -> Any:
        try:
            yield "first"
            await asyncio.sleep(0.07)  # the prefill: ~3 beats
            yield "second"
            await asyncio.sleep(10)
            yield "never"
        finally:
            closed.append(True)

    async def read(n: int) -> list[str]:
        out, stream = [], exchange.keep_alive(slow(), ": beat")
        async for item in stream:
            out.append(item)
            if len(out) == n:
                break
        await stream.aclose()
        return out

    got = asyncio.run(read(8))
    assert got[0] == "first" and got.index("second") >= 3 and set(got) == {"first", "second", ": beat"}
    assert got[got.index("second") + 1:] == [": beat"] * (8 - got.index("second") - 1)
    assert closed == [True]  # closed mid-wait: the inner stream's finally ran

    async def whole() -> list[str]:
        async def quick() -> Any:
            for p in ("a", "b"):
                yield p
        return [p async for p in exchange.keep_alive(quick(), ": beat")]

    assert asyncio.run(whole()) == ["a", "b"]


def test_queue_s_and_the_ttft_histogram_count_the_wait_for_the_prompt_cache_lookup(engine, monkeypatch):
    # The lookup runs on the engine thread between steps: a request that arrives during a
    # long prefill chunk waits there before it is submitted. That wait is the user's too.
    from mlotspark.server.prompt_cache import PromptCache

    pc = PromptCache(engine, persist=False)
    took: list[float] = []

    def slow_take(ids, max_tokens):  # as if the engine thread were busy for 0.3 s
        time.sleep(0.3)
        took.append(0.3)
        return None, 0

    monkeypatch.setattr(pc, "take", slow_take)
    state = ServerState(engine, prompt_cache=pc)
    state.close = lambda: state.begin_shutdown()
    with TestClient(create_app(state)) as c:
        r = c.post("/v1/chat/completions", json=_body())
        assert r.status_code == 200 and took
        ext = r.json()["mlotspark"]
        assert ext["queue_s"] >= 0.3
        metrics = c.get("/metrics").text
    ttft_sum = next(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("mlotspark_ttft_seconds_sum"))
    assert ttft_sum >= 0.3 + ext["ttft_s"] - 1e-6  # queue + prefill, as its help says


def test_engine_submit_counts_the_queue_from_arrived_at(engine):
    h = engine.submit(prompt_ids=[4, 5, 6], max_tokens=2, arrived_at=time.perf_counter() - 5.0)
    assert h.result().stats.extra["queue_s"] >= 5.0
    with pytest.raises(OptionError, match="invalid arrived_at 'soon'"):
        engine.submit(prompt_ids=[4, 5, 6], max_tokens=2, arrived_at="soon")

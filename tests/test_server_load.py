"""Many streams across the three APIs, a third of the clients hanging up mid-stream, on the
tiny tool model in-process: every other request completes with its own whole reply, nothing is
lost or duplicated, and nothing stays in flight (a benchmark script takes this to larger counts)."""

from __future__ import annotations

import gc
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import mlx.core as mx
import pytest

from tool_models import write_tool_model

STREAMS = 24  # 8 per API; a third of them hang up after their first few lines


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from live_server import LiveServer
    from mlotspark.engine import Engine

    path = write_tool_model(tmp_path_factory.mktemp("load-model") / "tools.gguf")
    srv = LiveServer(Engine.load(str(path), progress=False, cascade=None, max_batch=8))
    yield srv
    srv.stop()


def _request(live, i: int) -> tuple[str, dict]:
    words = f"request number {i}"
    api = ("openai", "anthropic", "ollama")[i % 3]
    if api == "openai":
        return "/v1/chat/completions", {"model": live.model, "stream": True, "max_tokens": 12, "temperature": 0,
                                        "messages": [{"role": "user", "content": words}]}
    if api == "anthropic":
        return "/v1/messages", {"model": live.model, "stream": True, "max_tokens": 12, "temperature": 0,
                                "messages": [{"role": "user", "content": words}]}
    return "/api/chat", {"model": live.model, "options": {"num_predict": 12, "temperature": 0},
                         "messages": [{"role": "user", "content": words}]}


def _text(path: str, lines: list[str]) -> str:
    out = ""
    for line in lines:
        if path == "/api/chat" and line.startswith("{"):
            out += json.loads(line)["message"]["content"]
        elif line.startswith("data: {"):
            obj = json.loads(line[6:])
            if path == "/v1/messages" and obj.get("type") == "content_block_delta":
                out += obj["delta"]["text"]
            elif path == "/v1/chat/completions" and obj.get("choices"):
                out += obj["choices"][0]["delta"].get("content") or ""
    return out


def _done(path: str, lines: list[str]) -> bool:
    if path == "/api/chat":
        return json.loads(lines[-1]).get("done") is True
    if path == "/v1/messages":
        return any('"message_stop"' in line for line in lines)
    return lines[-1] == "data: [DONE]"


def test_streams_across_three_apis_with_clients_hanging_up(live):
    solo = {}
    for i in range(3):  # one whole reply per API, alone, to compare with
        path, body = _request(live, i)
        with httpx.Client(timeout=120) as h, h.stream("POST", live.url + path, json=body) as r:
            solo[path] = _text(path, list(r.iter_lines()))
    gc.collect()
    before = mx.get_active_memory()
    for _ in range(2):
        _round(live, solo)
    # The server collects reference cycles once idle (its reaper's 1 s tick): every request's KV goes.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and mx.get_active_memory() > before * 1.05 + (1 << 20):
        time.sleep(0.2)
    assert mx.get_active_memory() <= before * 1.05 + (1 << 20)


def _round(live, solo: dict) -> None:
    results: dict[int, tuple[str, list[str]]] = {}
    lock = threading.Lock()

    def run(i: int) -> None:
        path, body = _request(live, i)
        body = {**body, "messages": [{"role": "user", "content": "request number 0"}]} if i % 3 == 0 else body
        with httpx.Client(timeout=120) as h, h.stream("POST", live.url + path, json=body) as r:
            assert r.status_code == 200
            lines = []
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                if _hangs_up(i) and len(lines) >= 3:
                    break  # this client hangs up
        with lock:
            assert i not in results
            results[i] = (path, lines)

    with ThreadPoolExecutor(STREAMS) as pool:
        list(pool.map(run, range(STREAMS)))
    assert sorted(results) == list(range(STREAMS))  # none lost, none twice
    hung = [i for i in range(STREAMS) if _hangs_up(i)]
    assert len(hung) == STREAMS // 3
    for i, (path, lines) in results.items():
        if i in hung:
            continue
        assert _done(path, lines), (i, path, lines[-2:])
        if i % 3 == 0:  # the same question as the solo OpenAI request: the same greedy reply
            assert _text(path, lines) == solo[path]
    deadline = time.monotonic() + 60  # a hung-up stream is noticed at its next write
    while time.monotonic() < deadline and httpx.get(live.url + "/health").json()["requests_in_flight"]:
        time.sleep(0.1)
    health = httpx.get(live.url + "/health").json()
    assert health["requests_in_flight"] == 0 and health["running"] == 0


def _hangs_up(i: int) -> bool:
    return i % 3 == (i // 3) % 3  # a third of the clients, spread over the three APIs

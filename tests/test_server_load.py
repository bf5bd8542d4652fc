"""Many streams across the three APIs, a third of the clients hanging up mid-stream, on the
tiny tool model in-process: every other request completes with its own whole reply, nothing is
lost or duplicated, nothing stays in flight, and once the server is idle the process's RSS and
MLX active memory are back within 5% of their level after a warm-up round of the same shape
(``benchmarks/server_load.py`` takes this to larger counts, the server in its own process)."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import mlx.core as mx
import psutil
import pytest

from tool_models import write_tool_model

STREAMS = 64  # 22 OpenAI, 21 Anthropic, 21 Ollama; a third of them hang up after their first few lines


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


GROWTH = 1.05  # RSS and MLX active memory after the rounds, at most 5% over their level before


def test_streams_across_three_apis_with_clients_hanging_up(live):
    # One client, a connection per stream: an SSL context per client thread (httpx makes one
    # per Client) left 25-35 MB of this process's RSS moving by +-10 MB from round to round.
    limits = httpx.Limits(max_connections=STREAMS + 1, max_keepalive_connections=STREAMS + 1)
    with httpx.Client(base_url=live.url, timeout=120, limits=limits) as client:
        solo = {}
        for i in range(3):  # one whole reply per API, alone, to compare with
            path, body = _request(live, i)
            with client.stream("POST", path, json=body) as r:
                solo[path] = _text(path, list(r.iter_lines()))
        _round(client, live, solo)  # warm-up at the same shape: allocator arenas, first-use buffers
        before = _idle_memory(live)
        for _ in range(2):
            _round(client, live, solo)
        after = _idle_memory(live)
    assert after["rss"] <= before["rss"] * GROWTH, (before, after)
    assert after["mlx_active"] <= before["mlx_active"] * GROWTH, (before, after)


def _idle_memory(live) -> dict:
    """RSS and MLX active memory once the server's idle tick collected every ended request
    (and gave MLX's cache and the C heap's free pages back)."""
    deadline = time.monotonic() + 30
    while not live.state.settled:
        assert time.monotonic() < deadline, "the server did not collect once idle"
        time.sleep(0.05)
    return {"rss": psutil.Process().memory_info().rss, "mlx_active": mx.get_active_memory()}


def _round(client: httpx.Client, live, solo: dict) -> None:
    results: dict[int, tuple[str, list[str]]] = {}
    lock = threading.Lock()

    def run(i: int) -> None:
        path, body = _request(live, i)
        body = {**body, "messages": [{"role": "user", "content": "request number 0"}]} if i % 3 == 0 else body
        with client.stream("POST", path, json=body) as r:  # leaving it unread closes the connection
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
    assert abs(len(hung) - STREAMS / 3) <= 1  # a third (22 of 64)
    for i, (path, lines) in results.items():
        if i in hung:
            continue
        assert _done(path, lines), (i, path, lines[-2:])
        if i % 3 == 0:  # the same question as the solo OpenAI request: the same greedy reply
            assert _text(path, lines) == solo[path]
    deadline = time.monotonic() + 60  # a hung-up stream is noticed at its next write
    while time.monotonic() < deadline and client.get("/health").json()["requests_in_flight"]:
        time.sleep(0.1)
    health = client.get("/health").json()
    assert health["requests_in_flight"] == 0 and health["running"] == 0


def _hangs_up(i: int) -> bool:
    return i % 3 == (i // 3) % 3  # a third of the clients, spread over the three APIs

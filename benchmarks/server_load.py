"""Load and memory of serve across its three APIs with clients hanging up (no suite: `--suite serve` compares speed only).

N concurrent streams, in turn OpenAI chat (SSE), Anthropic messages (SSE) and Ollama chat
(NDJSON), a third of the clients hanging up after their first lines; ``--rounds`` rounds.
Records: every other request completed (its last event seen), none lost or duplicated, the
requests still in flight afterwards, and the server process's RSS and MLX active memory
(``/health``'s ``process``) before the first round and after the last, each read once the server
is idle (its idle tick collected and trimmed), with the change in percent. A warm-up round at the
same shape comes before the "before" reading, so first-use growth (allocator arenas, compiled
pieces, buffers) is not counted as growth of the run.

    flock /tmp/mlotspark-bench.lock python benchmarks/server_load.py [--model M] [--streams 64 128] [--rounds 3]

Without ``--model`` it serves a tiny random model written to a temporary folder (what the
test does at 64 streams): the HTTP path, not the model, is under test.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tiny_model(folder: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from tool_models import write_tool_model  # a tiny random llama GGUF with a ChatML template

    return write_tool_model(folder / "tiny.gguf")


def _request(i: int, model: str, tokens: int) -> tuple[str, dict]:
    msgs = [{"role": "user", "content": f"Request {i}: name a colour."}]
    kind = i % 3
    if kind == 0:
        return "/v1/chat/completions", {"model": model, "stream": True, "max_tokens": tokens, "messages": msgs}
    if kind == 1:
        return "/v1/messages", {"model": model, "stream": True, "max_tokens": tokens, "messages": msgs}
    return "/api/chat", {"model": model, "options": {"num_predict": tokens}, "messages": msgs}


def _finished(path: str, lines: list[str]) -> bool:
    if not lines:
        return False
    if path == "/api/chat":
        return json.loads(lines[-1]).get("done") is True
    if path == "/v1/messages":
        return any('"message_stop"' in line for line in lines)
    return lines[-1] == "data: [DONE]"


def run_round(url: str, model: str, streams: int, tokens: int) -> dict:
    done: dict[int, bool] = {}

    def one(i: int) -> None:
        path, body = _request(i, model, tokens)
        hang = i % 3 == (i // 3) % 3  # a third, spread over the three APIs
        lines: list[str] = []
        with httpx.Client(timeout=600) as h, h.stream("POST", url + path, json=body) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                if hang and len(lines) >= 3:
                    break
        assert i not in done, f"request {i} answered twice"
        done[i] = hang or _finished(path, lines)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(one, range(streams)))
    wall = time.perf_counter() - t0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and httpx.get(url + "/health").json()["requests_in_flight"]:
        time.sleep(0.2)
    return {"answered": len(done), "completed": sum(done.values()), "wall_s": round(wall, 2),
            "in_flight_after": httpx.get(url + "/health").json()["requests_in_flight"]}


IDLE_S = 3.0  # the server's idle tick (every second) collects and trims once nothing is in flight


def _idle_memory(url: str) -> dict:
    """The server's ``process`` memory once it has been idle past its next tick."""
    time.sleep(IDLE_S)
    return httpx.get(url + "/health").json()["process"]


def _change(before: int, after: int) -> str:
    return f"{(after / before - 1) * 100:+.1f}%" if before else "n/a"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model to serve (default: a tiny random one)")
    ap.add_argument("--streams", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(_tiny_model(Path(tmp)))
        port = _port()
        url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "MLOTSPARK_HOME": str(Path(tmp) / "home")}
        proc = subprocess.Popen([sys.executable, "-m", "mlotspark", "serve", "--model", model, "--port", str(port),
                                 "--prompt-cache-mb", "0", "--max-queue", "1024"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    health = httpx.get(url + "/health", timeout=5).json()
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise SystemExit("the server did not start") from None
                    time.sleep(0.3)
            name = health["model"]
            print("| streams | rounds | answered | completed (not hung up) | in flight after "
                  "| RSS before → after (MB) | MLX active before → after (MB) |")
            print("|---|---|---|---|---|---|---|")
            for n in args.streams:
                run_round(url, name, n, args.tokens)  # warm-up at the run's shape: first-use growth
                before = _idle_memory(url)
                results = [run_round(url, name, n, args.tokens) for _ in range(args.rounds)]
                after = _idle_memory(url)
                expected = n - sum(1 for i in range(n) if i % 3 == (i // 3) % 3)
                rss = before["rss_bytes"], after["rss_bytes"]
                mlx = before["mlx_active_bytes"], after["mlx_active_bytes"]
                print(f"| {n} | {args.rounds} | {min(r['answered'] for r in results)}/{n} "
                      f"| {min(r['completed'] for r in results) - (n - expected)}/{expected} "
                      f"| {max(r['in_flight_after'] for r in results)} "
                      f"| {rss[0] / 1e6:,.1f} → {rss[1] / 1e6:,.1f} ({_change(*rss)}) "
                      f"| {mlx[0] / 1e6:,.2f} → {mlx[1] / 1e6:,.2f} ({_change(*mlx)}) |", flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``--suite serve``: ``mlotspark serve`` beside ``mlx_lm.server``, same weights, same run.

Both servers run at once on 127.0.0.1 and are measured turn about, at each client
count in turn, so drift in the machine's load hits both:

- throughput: C clients each send ``requests`` chat requests one after another
  (distinct prompts, greedy, ``tokens`` at most); requests/s = requests / wall time,
  aggregate tok/s = completion tokens (from ``usage``) / wall time. Each count runs
  ``repetitions`` times per server, the servers alternating; the ratio is taken per
  repetition, then its median.
- TTFT of a resent ~2k-token history: *cold* = a history the server has never seen;
  *warm* = the same history plus the reply and one new user message (what a chat
  client sends next). Time to the first streamed content chunk, median of
  ``histories`` distinct histories.
- the Responses API (ours alone: mlx_lm.server has none): a ~2k-token history sent once
  to ``/v1/responses`` (*cold*), then ``responses_turns`` turns each sending only a new
  message with ``previous_response_id``; *warm* = the last turn's TTFT (the stored
  chain's KV snapshot makes its prefill the new message alone), median over ``histories``
  chains, as the agent-workload benchmark measures warm against cold.

mlx_lm.server needs an mlx-lm model directory: the model's GGUF is written out as one
(float32 weights, as ``mlotspark serve`` runs them on the CPU; config; the tokenizer with
its chat template). mlx_lm.server starts with OpenBLAS resolved first, as mlotspark does,
so both use the same BLAS, at its own default thread count: ``OPENBLAS_NUM_THREADS`` is
never passed to it (``peer_env``), since a pinned pool is not its best configuration.

The server pair (``start_servers``, ``chat``, ``stop``, ``write_mlx_lm_dir``) is also what
the agent-workload, BFCL and load-time scripts in ``benchmarks/`` start their servers with.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mlotspark.errors import MlotsparkError, OptionError

TOPICS = ["a lighthouse", "a steam engine", "a market", "the sea", "bread", "a garden", "a star", "chess",
          "a river", "a mountain", "a library", "a violin", "a train", "a forest", "a desert", "a bridge"]
SERVERS = ("mlotspark", "mlx_lm.server")
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class ServeConfig:
    """A serve comparison, validated.

    Args:
        model: alias or GGUF path; None = the default model.
        clients: client counts, each measured in turn (default 1, 4, 8, 16; empty = no throughput).
        requests: requests each client sends, one after another (default 2).
        tokens: most tokens per reply (default 48).
        histories: distinct ~2k-token histories for the cold/warm TTFT (default 3; 0 = skip).
        repetitions: runs per client count and server, alternating (default 3); medians reported.
        max_batch: our server's ``--max-batch`` (default 16).
        responses_turns: ``previous_response_id`` turns after a history's first (default 10; 0 = skip).
    """

    model: str | None = None
    clients: tuple[int, ...] = (1, 4, 8, 16)
    requests: int = 2
    tokens: int = 48
    histories: int = 3
    repetitions: int = 3
    max_batch: int = 16
    responses_turns: int = 10

    def __post_init__(self) -> None:
        def integer(name: str, value: Any, lo: int) -> None:
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                raise OptionError(f"invalid {name} {value!r}: must be an integer >= {lo}")

        object.__setattr__(self, "clients", tuple(self.clients))
        for c in self.clients:
            integer("client count", c, 1)
        integer("requests", self.requests, 1)
        integer("tokens", self.tokens, 1)
        integer("histories", self.histories, 0)
        integer("repetitions", self.repetitions, 1)
        integer("max_batch", self.max_batch, 1)
        integer("responses_turns", self.responses_turns, 0)
        if not self.clients and not self.histories:
            raise OptionError("serve has nothing to measure: give client counts or histories > 0")


# -- the server pair ----------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_mlx_lm_dir(model: str | None, out: Path) -> Path:
    """The model as an mlx-lm directory in ``out`` (float32 weights, config, tokenizer)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlotspark.models import loader
    from mlotspark.models.hub import catalogue
    from mlotspark.models.mlx_lm_twin import mlx_lm_twin

    loaded = loader.load(catalogue.resolve(model, progress=False), weights="float32")
    twin = mlx_lm_twin(loaded)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(twin.parameters())))
    config = {k: v for k, v in loaded.config.items() if k not in ("quantization", "quantization_config")}
    (out / "config.json").write_text(json.dumps(config))
    loaded.tokenizer.save_pretrained(str(out))  # TokenizerWrapper hands it to the Hugging Face tokenizer
    return out


def peer_env(env: dict) -> dict:
    """``env`` for mlx_lm.server: without ``OPENBLAS_NUM_THREADS``, so it keeps its own BLAS threads."""
    out = dict(env)
    if out.pop("OPENBLAS_NUM_THREADS", None) is not None:
        print("note: OPENBLAS_NUM_THREADS is not passed to mlx_lm.server (it keeps its default threads)",
              file=sys.stderr, flush=True)
    return out


def start(cmd: list[str], url: str, env: dict, log: Path) -> subprocess.Popen:
    """Start a server and wait for its ``/health``.

    Raises:
        MlotsparkError: it exited, or did not answer within ``START_TIMEOUT_S`` (its log's tail quoted).
    """
    import httpx

    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise MlotsparkError(f"server exited: {' '.join(cmd)}: {log.read_text()[-500:].strip()}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise MlotsparkError(f"server did not start in {START_TIMEOUT_S:.0f} s: {' '.join(cmd)}")


def start_servers(model: str | None, work: Path, procs: list[subprocess.Popen], *, max_batch: int = 16,
                  mlx_dir: Path | None = None) -> dict[str, tuple[str, str]]:
    """``mlotspark serve`` on ``model``'s GGUF and mlx_lm.server on the same weights (as an
    mlx-lm directory), each in its own best configuration: ours in performance mode,
    mlx_lm.server with its defaults (its prompt cache included) and its own BLAS threads.

    Args:
        model: alias or GGUF path (None = the default model).
        work: a scratch folder (logs, our MLOTSPARK_HOME, the mlx-lm directory).
        procs: the started processes are appended here (for :func:`stop`).
        max_batch: our ``--max-batch``.
        mlx_dir: an mlx-lm directory written before (default: written now).

    Returns:
        ``{"mlotspark": (url, model id), "mlx_lm.server": (url, "default_model")}``.
    """
    from mlotspark.models.hub import catalogue

    env = {**os.environ, "MLOTSPARK_HOME": str(work / "home")}
    if mlx_dir is None:
        mlx_dir = write_mlx_lm_dir(model, Path(tempfile.mkdtemp(dir=work)))
    ours, theirs = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    gguf = str(catalogue.resolve(model, progress=False).path)
    procs.append(start([sys.executable, "-m", "mlotspark", "serve", "--model", gguf, "--port", ours.rsplit(":", 1)[1],
                        "--max-batch", str(max_batch), "--mode", "performance"], ours, env, work / "ours.log"))
    # ``import mlotspark`` resolves OpenBLAS first, as ours does, so both use the same BLAS.
    boot = ("import sys, mlotspark; from mlx_lm.server import main; "
            f"sys.argv = ['mlx_lm.server', '--model', {str(mlx_dir)!r}, '--port', {theirs.rsplit(':', 1)[1]!r}]; main()")
    procs.append(start([sys.executable, "-c", boot], theirs, peer_env(env), work / "mlx_lm.log"))
    # mlx_lm.server's /v1/models scans the Hugging Face cache; "default_model" is its --model.
    return {"mlotspark": (ours, model_id(ours)), "mlx_lm.server": (theirs, "default_model")}


def stop(procs: list[subprocess.Popen]) -> None:
    """Terminate the servers :func:`start_servers` started (killed after a minute)."""
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
    procs.clear()


def model_id(url: str) -> str:
    """The served model's id, from ``/v1/models``."""
    import httpx

    return httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]


# -- the measurements ---------------------------------------------------------------------
def chat(url: str, model: str, messages: list[dict], max_tokens: int) -> dict:
    """One greedy chat completion; the response's JSON."""
    import httpx

    r = httpx.post(url + "/v1/chat/completions", timeout=900, json={
        "model": model, "messages": messages, "temperature": 0.0, "max_tokens": max_tokens})
    r.raise_for_status()
    return r.json()


def throughput(url: str, model: str, clients: int, requests: int, tokens: int, salt: int) -> dict:
    """``clients`` threads each sending ``requests`` chats in turn: req/s and tok/s over the wall time."""
    def client(i: int) -> int:
        n = 0
        for j in range(requests):
            topic = TOPICS[(i * requests + j + salt) % len(TOPICS)]
            msg = [{"role": "user", "content": f"Write a long, detailed story about {topic}. (#{salt}-{i}-{j})"}]
            n += chat(url, model, msg, tokens)["usage"]["completion_tokens"]
        return n

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        done = sum(pool.map(client, range(clients)))
    wall = time.perf_counter() - t0
    return {"rps": clients * requests / wall, "tps": done / wall, "tokens": done, "wall_s": wall}


def ttft(url: str, model: str, messages: list[dict]) -> float:
    """Seconds from the request to the first streamed content chunk."""
    import httpx

    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=900, json={
            "model": model, "messages": messages, "temperature": 0.0, "max_tokens": 8, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                delta = (json.loads(line[6:]).get("choices") or [{}])[0].get("delta", {})
                if delta.get("content"):
                    return time.perf_counter() - t0
    return time.perf_counter() - t0


def history(seed: int, words: int = 1500) -> list[dict]:
    """A ~2k-token chat history unique to ``seed`` (so the first send is cold)."""
    facts = " ".join(f"Note {seed}.{i}: the {TOPICS[(i + seed) % len(TOPICS)]} record number {i * 13 + seed} "
                     f"was filed on day {i % 28 + 1}." for i in range(words // 14))
    return [{"role": "system", "content": "You are a precise archivist. " + facts},
            {"role": "user", "content": "Summarise the notes in one line."}]


def warm_cold(url: str, model: str, seed: int) -> tuple[float, float]:
    """(cold, warm) TTFT: a new history, then the same history with the reply and one more message."""
    first = history(seed)
    cold = ttft(url, model, first)
    reply = chat(url, model, first, 16)["choices"][0]["message"]["content"]
    nxt = first + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Which day was note 3 filed?"}]
    warm = ttft(url, model, nxt)
    return cold, warm


def response_ttft(url: str, model: str, body: dict) -> tuple[float, str]:
    """Seconds from a streamed ``/v1/responses`` request to its first text delta, and the
    response's id (read to the stream's end)."""
    import httpx

    t0 = time.perf_counter()
    first, rid = None, ""
    with httpx.stream("POST", url + "/v1/responses", timeout=900, json={
            "model": model, "temperature": 0.0, "max_output_tokens": 8, "stream": True, **body}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "response.output_text.delta" and first is None:
                first = time.perf_counter() - t0
            elif event["type"] in ("response.completed", "response.incomplete"):
                rid = event["response"]["id"]
    return (first if first is not None else time.perf_counter() - t0), rid


def responses_chain(url: str, model: str, seed: int, turns: int, words: int = 1500) -> dict:
    """Cold TTFT of a new ~2k-token history sent to ``/v1/responses``, then ``turns`` turns of one
    new message each with ``previous_response_id``; ``warm_s`` is the last turn's TTFT."""
    system, user = history(seed, words)
    cold, rid = response_ttft(url, model, {"instructions": system["content"], "input": user["content"]})
    per_turn = []
    for t in range(turns):
        s, rid = response_ttft(url, model, {"instructions": system["content"], "previous_response_id": rid,
                                            "input": f"Which day was note {t + 1} filed?"})
        per_turn.append(s)
    return {"cold_s": cold, "warm_s": per_turn[-1] if per_turn else float("nan"), "turns_s": per_turn}


def run_serve(config: ServeConfig, *, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Start both servers, measure them turn about, stop them.

    Args:
        config: what to measure.
        log: called with one line per run (default: nothing).

    Returns:
        The record: ``throughput[server][clients]`` (medians ``rps``, ``tps``; ``runs``),
        ``ratio[clients]`` (``median`` of the per-repetition tok/s ratios, ``runs``) and
        ``ttft[server]`` (``cold_s``, ``warm_s``, ``pairs``); client counts are string keys.

    Raises:
        MlotsparkError: a server did not start.
    """
    say = log or (lambda _line: None)
    work = Path(tempfile.mkdtemp(prefix="mlotspark-serve-bench-"))
    procs: list[subprocess.Popen] = []
    out: dict[str, Any] = {"throughput": {}, "ratio": {}, "ttft": {}}
    try:
        servers = start_servers(config.model, work, procs, max_batch=config.max_batch)
        for url, model in servers.values():  # warm-up: first-request costs out of the figures
            chat(url, model, [{"role": "user", "content": "Hello"}], 4)
        for k, c in enumerate(config.clients):
            runs: dict[str, list[dict]] = {name: [] for name in servers}
            for rep in range(config.repetitions):
                order = list(servers) if (k + rep) % 2 == 0 else list(reversed(servers))
                for name in order:
                    url, model = servers[name]
                    r = throughput(url, model, c, config.requests, config.tokens, salt=k * 100 + c + 1000 * rep)
                    runs[name].append(r)
                    say(f"{name:14s} clients={c:2d} rep {rep}  {r['rps']:.3f} req/s  {r['tps']:.1f} tok/s  "
                        f"({r['tokens']} tokens, {r['wall_s']:.1f} s)")
            ratios = [a["tps"] / b["tps"] for a, b in zip(runs["mlotspark"], runs["mlx_lm.server"])]
            for name, rs in runs.items():
                out["throughput"].setdefault(name, {})[str(c)] = {
                    "rps": statistics.median(r["rps"] for r in rs), "tps": statistics.median(r["tps"] for r in rs),
                    "tokens": sum(r["tokens"] for r in rs), "wall_s": sum(r["wall_s"] for r in rs), "runs": rs}
            out["ratio"][str(c)] = {"median": statistics.median(ratios), "runs": ratios}
        for name, (url, model) in servers.items() if config.histories else ():
            pairs = [warm_cold(url, model, seed=1000 * (i + 1) + len(name)) for i in range(config.histories)]
            cold = statistics.median(p[0] for p in pairs)
            warm = statistics.median(p[1] for p in pairs)
            out["ttft"][name] = {"cold_s": cold, "warm_s": warm, "pairs": pairs}
            say(f"{name:14s} TTFT cold {cold:.3f} s  warm {warm:.3f} s  ratio {warm / cold:.3f}")
        if config.responses_turns and config.histories:
            url, model = servers["mlotspark"]
            chains = [responses_chain(url, model, 2000 * (i + 1), config.responses_turns)
                      for i in range(config.histories)]
            cold = statistics.median(c["cold_s"] for c in chains)
            warm = statistics.median(c["warm_s"] for c in chains)
            out["responses"] = {"cold_s": cold, "warm_s": warm, "turns": config.responses_turns, "chains": chains}
            say(f"mlotspark      /v1/responses TTFT cold {cold:.3f} s  turn {config.responses_turns + 1} "
                f"{warm:.3f} s  ratio {warm / cold:.3f}")
    finally:
        stop(procs)
        shutil.rmtree(work, ignore_errors=True)
    return out


def render_markdown(record: dict[str, Any]) -> str:
    """The record's figures as markdown tables (throughput by client count; cold vs warm TTFT)."""
    lines: list[str] = []
    ratio = record.get("ratio", {})
    if ratio:
        reps = len(next(iter(ratio.values()))["runs"])
        lines += [f"medians of {reps} repetitions; ratio = median of the per-repetition tok/s ratios (min-max)", "",
                  "| clients | mlotspark req/s | mlotspark tok/s | mlx_lm.server req/s | mlx_lm.server tok/s | tok/s ratio |",
                  "|---:|---:|---:|---:|---:|---:|"]
    for c, q in ratio.items():
        a, b = record["throughput"]["mlotspark"][c], record["throughput"]["mlx_lm.server"][c]
        lines.append(f"| {c} | {a['rps']:.3f} | {a['tps']:.1f} | {b['rps']:.3f} | {b['tps']:.1f} | "
                     f"{q['median']:.2f}x ({min(q['runs']):.2f}-{max(q['runs']):.2f}) |")
    if record.get("ttft"):
        lines += ["", "| server | TTFT cold (2k history) | TTFT warm (resent + 1 message) | warm / cold |",
                  "|---|---:|---:|---:|"]
    for name, t in record.get("ttft", {}).items():
        lines.append(f"| {name} | {t['cold_s']:.3f} s | {t['warm_s']:.3f} s | {t['warm_s'] / t['cold_s']:.3f} |")
    resp = record.get("responses")
    if resp:
        lines += ["", f"| /v1/responses (mlotspark) | TTFT cold (2k history) | TTFT turn {resp['turns'] + 1} "
                      "(previous_response_id) | warm / cold |", "|---|---:|---:|---:|",
                  f"| chain of {resp['turns'] + 1} turns | {resp['cold_s']:.3f} s | {resp['warm_s']:.3f} s | "
                  f"{resp['warm_s'] / resp['cold_s']:.3f} |"]
    return "\n".join(lines).strip() + "\n"


__all__ = ["SERVERS", "ServeConfig", "chat", "render_markdown", "responses_chain", "run_serve", "start_servers",
           "stop", "write_mlx_lm_dir"]

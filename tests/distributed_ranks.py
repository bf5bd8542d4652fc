"""A rank of the distributed tests: every rank runs this script (``mlx.launch`` or
``spawn_ranks`` below); rank 0 writes what it saw as JSON to the file named by argv.

Scenarios (argv[1]):
- ``suite OUT TINY_GGUF``: pipeline greedy replies of the tiny model to PROMPTS, all
  submitted at once with a short request that leaves the batch early and a JSON-format
  one (``batched``); then rank 1 turns hot (its probe reads the file ``$RANK_HEAT``) and two
  requests at once run one at a time under the governor's cap (``serialised``); each
  rank's weight bytes and grammar compiles; the tensor-parallel refusal on the default
  model; the tensor-parallel greedy reply of the tiny model.
- ``wait OUT TINY_GGUF``: load the tiny model in a pipeline, print ``ready``, and on
  rank 0 wait for a line on stdin before generating (the test kills or stops rank 1
  meanwhile); rank 0's outcome goes to OUT.
- ``cancel OUT TINY_GGUF``: rank 0 cancels a reply mid-way, then generates again.
- ``mismatch OUT A.gguf,B.gguf``: rank r loads the r-th file; rank 0's refusal goes to OUT.
- ``quantized OUT TINY,MODEL``: a pipeline over quantized weights (see ``quantized``).
- ``conversation OUT MODEL,BASE``: conversations whose caches every rank keeps and saves
  for its own layers, continued by a new engine on every rank (see ``conversation``).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

#: (prompt index, max_tokens) of the requests that join the batch beside PROMPTS: a short
#: one that leaves early, and the two that run while rank 1 is hot (greedy: prefixes of PROMPTS' replies).
SHORT = (1, 6)
HOT = [(0, 12), (2, 12)]
JSON_PROMPT = "List three colours as a JSON array."

PROMPTS = [
    "Write a short poem about the sea.",
    "Explain how a bicycle works.",
    "Give me three tips for learning to cook.",
]
MAX_TOKENS = 32


def _layer_bytes(engine) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for layer in engine.loaded.model.layers for _, v in tree_flatten(layer.parameters()))


class FileProbe:
    """A probe whose reading is the JSON in a file (rank 0 writes it: rank 1 heats up)."""

    def __init__(self, path: str):
        self.path = path

    def read(self):
        from mlotspark.thermal.probes import Reading

        return Reading(**json.loads(Path(self.path).read_text()))


def _count_compiles() -> list[int]:
    """Count JsonConstraint compiles in this process (a one-item list, bumped per compile)."""
    from mlotspark.decoding.constrained import JsonConstraint

    count, init = [0], JsonConstraint.__init__

    def counted(self, *a, **k):
        count[0] += 1
        init(self, *a, **k)

    JsonConstraint.__init__ = counted
    return count


def _batched(engine) -> dict:
    """Rank 0: PROMPTS, a short request and a JSON one at once; then two at once with rank 1 hot."""
    out: dict = {}
    handles = [engine.submit(p, max_tokens=MAX_TOKENS, temperature=0) for p in PROMPTS]
    short = engine.submit(PROMPTS[SHORT[0]], max_tokens=SHORT[1], temperature=0)
    as_json = engine.submit(JSON_PROMPT, max_tokens=12, temperature=0, response_format={"type": "json_object"})
    results = [h.result() for h in handles]
    out["replies"] = [r.tokens for r in results]
    out["mean_batch"] = [r.stats.extra["mean_batch"] for r in results]
    s = short.result()
    out["short"] = {"tokens": s.tokens, "finish": s.stats.finish_reason, "mean_batch": s.stats.extra["mean_batch"]}
    out["json_finish"] = as_json.result().stats.finish_reason
    out["cool_status"] = engine.status()
    # Rank 1 heats up: its next figures (asked for after a second) carry the reading.
    Path(os.environ["RANK_HEAT"]).write_text(json.dumps({"temperature_c": 95.0}))
    time.sleep(1.2)
    engine.status()
    t0 = len(engine.scheduler.timeline)
    hot = [engine.submit(PROMPTS[i], max_tokens=n, temperature=0) for i, n in HOT]
    hot = [h.result() for h in hot]
    out["serialised"] = {"replies": [r.tokens for r in hot], "mean_batch": [r.stats.extra["mean_batch"] for r in hot],
                         "batches": [rec.batch for rec in list(engine.scheduler.timeline)[t0:]],
                         "status": engine.status()}
    return out


def suite(out: Path, tiny: str) -> None:
    from mlotspark import Engine
    from mlotspark.errors import DistributedError
    from mlotspark.thermal.governor import ThermalGovernor

    report: dict = {}
    compiles = _count_compiles()
    rank = int(os.environ.get("MLX_RANK", "0"))
    heat = os.environ["RANK_HEAT"]
    # Rank 0 reads no probe of its own here (this machine's load is no test input); rank 1 reads the file.
    probes = [] if rank == 0 else [FileProbe(heat)]
    governor = ThermalGovernor(probes=probes, mode="performance", max_batch=8, min_interval_s=0)
    # The tiny model: two ranks exchange activations every step, and a real model's steps
    # beside the suite's other worker made this one scenario take minutes. Real weights over
    # ranks: ``quantized`` (test_quantized_path.py).
    engine = Engine.load(tiny, distributed="pipeline", split="even", progress=False, rank_timeout=120,
                         governor=governor)
    # After the load the rank group is the engine's (rank 0 beats on it while idle): each rank's
    # own facts go to a file of its own, which the test reads (``rank_facts``).
    _write_rank_facts(out, engine.rank, {"weights": engine.loaded.nbytes(), "layer_bytes": _layer_bytes(engine),
                                         "layers": list(engine.ranks.setup.layers[engine.rank])})
    if engine.rank == 0:
        report.update(_batched(engine))
        report["temperature"] = engine.defaults.temperature  # the model's defaults, as alone
        report["backend"] = engine.info()["distributed"]["backend"]
        report["status"] = report["serialised"]["status"]
        engine.close()
    else:
        report["followed"] = engine.follow()
    report["compiles"] = engine.ranks.setup.group.gather_json(compiles[0])
    try:
        Engine.load(distributed="tensor", progress=False)
    except DistributedError as e:
        report["tensor_refusal"] = str(e)
    engine = Engine.load(tiny, distributed="tensor", progress=False, rank_timeout=60)
    if engine.rank == 0:
        report["tiny_tensor"] = engine.generate("hello world", raw=True, max_tokens=MAX_TOKENS, temperature=0).tokens
        engine.close()
        out.write_text(json.dumps(report))
    else:
        engine.follow()


def wait(out: Path, tiny: str) -> None:
    from mlotspark import Engine
    from mlotspark.errors import DistributedError

    engine = Engine.load(tiny, distributed="pipeline", split="even", progress=False,
                         rank_timeout=float(os.environ.get("RANK_TIMEOUT", "5")))
    print("ready", flush=True)
    if engine.rank != 0:
        engine.follow()
        return
    sys.stdin.readline()
    try:
        engine.generate("hello world", raw=True, max_tokens=400, temperature=0)
        result = {"error": None}
    except DistributedError as e:
        result = {"error": str(e)}
    out.write_text(json.dumps(result))
    os._exit(0)  # the worker thread may be blocked on the dead rank


def cancel(out: Path, tiny: str) -> None:
    """Rank 0 cancels a long reply after its first piece, then asks again: the ranks must
    still be in step (same reply as a fresh run)."""
    from mlotspark import Engine

    engine = Engine.load(tiny, distributed="pipeline", split="even", progress=False, rank_timeout=60)
    if engine.rank != 0:
        engine.follow()
        return
    handle = engine.submit("hello world", raw=True, max_tokens=400, temperature=0)
    next(iter(handle))
    handle.cancel()
    first = handle.result()
    again = engine.generate("hello world", raw=True, max_tokens=MAX_TOKENS, temperature=0)
    engine.close()
    out.write_text(json.dumps({"finish": first.stats.finish_reason, "cancelled_after": len(first.tokens),
                               "again": again.tokens}))


TURNS = ["My sister is called Ilse and she lives in Ghent. Say hello to her.",
         "Where does my sister live, and what is her name?"]
#: a cascade small enough that the default model's turns evict and retrieve blocks.
#: The second turn leaves more blocks than top_k and its question (16 tokens) is in the
#: window: its question pass runs, on both ranks.
SMALL_CASCADE = {"window": 32, "sinks": 16, "block_size": 16, "top_k": 1, "question_pass": 16}
TURN_TOKENS = 16


def converse(engine, name: str, turns: list[str]) -> list[dict]:
    """Send ``turns`` to conversation ``name`` (semantic memory off: the prompt is the
    conversation alone); per turn its greedy tokens and where its cache came from."""
    engine.persistence.set_budgets(memory=False, learn=False)
    conv = engine.conversation(name)
    out = []
    for text in turns:
        r = conv.send(text, max_tokens=TURN_TOKENS, temperature=0)
        out.append({"tokens": r.tokens, "source": r.stats.extra.get("cache_source"),
                    "ranks": r.stats.extra.get("rank_snapshots"), "replayed": r.stats.extra.get("rank_replayed"),
                    "passes": r.stats.extra.get("cascade", {}).get("question_passes")})
    return out


def conversation(out: Path, spec: str) -> None:
    """``spec`` = ``MODEL,BASE``: every rank keeps its data in ``BASE/rank<r>`` (as on its own
    machine). A plain-KV and a cascade conversation each take their first turn; the engine
    closes on every rank (what each rank holds in memory goes with it) and a new one takes
    the second turn, which must continue from every rank's own snapshot; rank 1 loses its
    snapshot of ``plain`` before that turn and rebuilds its share from rank 0's tokens."""
    model, base = spec.split(",")
    rank = int(os.environ.get("MLX_RANK", "0"))
    os.environ["MLOTSPARK_HOME"] = str(Path(base) / f"rank{rank}")
    from mlotspark import Engine

    report: dict = {}
    for name, cascade in (("plain", "auto"), ("cascade", SMALL_CASCADE)):
        for turns in (TURNS[:1], TURNS[1:]):
            if rank == 1 and name == "plain" and turns == TURNS[1:]:
                (mine,) = (Path(os.environ["MLOTSPARK_HOME"]) / "conversations" / name).glob("snapshot.layers-*")
                shutil.rmtree(mine)
            engine = Engine.load(model, distributed="pipeline", split="even", cascade=cascade, progress=False,
                                 rank_timeout=120)
            if engine.rank != 0:
                engine.follow()
                continue
            report.setdefault(name, []).extend(converse(engine, name, turns))
            engine.close()
    if rank == 0:
        out.write_text(json.dumps(report))


def mismatch(out: Path, tinies: str) -> None:
    """Each rank loads its own file of ``tinies`` (comma-separated): rank 0 records the refusal."""
    from mlotspark import Engine
    from mlotspark.errors import DistributedError

    mine = tinies.split(",")[int(os.environ["MLX_RANK"])]
    try:
        Engine.load(mine, distributed="pipeline", progress=False)
        error = None
    except DistributedError as e:
        error = str(e)
    if os.environ["MLX_RANK"] == "0":
        out.write_text(json.dumps({"error": error}))


QUANT_TEXTS = ["the harbour at dawn", "three ships and a lighthouse keeper", "a long quiet road"]
QUANT_MESSAGE = "What is the capital of France?"


def quantized(out: Path, spec: str) -> None:
    """``spec`` = ``TINY,MODEL``: a two-rank pipeline over quantized weights. The tiny
    model with the GPU dtype rule forced (half-precision activations and KV, as on
    Metal), QUANT_TEXTS submitted together; then MODEL's stored quantized weights as the
    CPU runs them (float32 activations). Rank 0 writes the greedy tokens."""
    from mlotspark import Engine
    from mlotspark.runtime.scheduler_config import activation_dtype

    tiny, model = spec.split(",")
    report: dict = {}
    os.environ["MLOTSPARK_GPU_DTYPES"] = "1"
    engine = Engine.load(tiny, weights="quantized", distributed="pipeline", split="even", cascade=None,
                         progress=False, rank_timeout=120)
    _write_rank_facts(out, engine.rank, {"dtype": str(activation_dtype(engine.loaded.model))})
    if engine.rank == 0:
        handles = [engine.submit(t, raw=True, max_tokens=8, temperature=0) for t in QUANT_TEXTS]
        report["tiny"] = [h.result().tokens for h in handles]
        engine.close()
    else:
        engine.follow()
    os.environ["MLOTSPARK_GPU_DTYPES"] = "0"
    engine = Engine.load(model, weights="quantized", distributed="pipeline", split="even", cascade=None,
                         progress=False, rank_timeout=300)
    if engine.rank == 0:
        report["model"] = engine.generate(QUANT_MESSAGE, max_tokens=8, temperature=0).tokens
        report["weights"] = engine.loaded.weights
        engine.close()
        out.write_text(json.dumps(report))
    else:
        engine.follow()


def _write_rank_facts(out: Path, rank: int, facts: dict) -> None:
    Path(f"{out}.rank{rank}").write_text(json.dumps(facts))


def rank_facts(out: Path, n: int = 2) -> list[dict]:
    """What each rank of a scenario wrote about itself after its load, in rank order."""
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(n)]


def free_port_pair() -> int:
    """A base port whose next one is free too, for two local ranks.

    Drawn from the OS's randomness, not ``random`` (conftest seeds it for every test, so
    every test, and every run of the suite beside another, would get the same pair), below
    Linux's ephemeral range (32768-60999, where outgoing connections take their ports), and
    checked bindable (MLX's ring sets SO_REUSEPORT: a second listener there would not fail,
    it would share the connections)."""
    draw = random.SystemRandom()
    while True:
        base = draw.randrange(20000, 32000, 2)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base))
                b.bind(("127.0.0.1", base + 1))
        except OSError:
            continue
        return base


def spawn_ranks(args: list[str], n: int, port: int, tmp: Path, env: dict | None = None,
                **popen) -> list[subprocess.Popen]:
    """Start ``n`` local ranks of this script as ``mlx.launch --backend ring`` does
    (``MLX_RANK`` and a ``MLX_HOSTFILE`` of loopback addresses), without the launcher,
    so a test can kill or stop one rank and watch the others."""
    hostfile = tmp / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{port + r}"] for r in range(n)]))
    procs = []
    for r in range(n):
        rank_env = dict(env or os.environ, MLX_RANK=str(r), MLX_HOSTFILE=str(hostfile))
        procs.append(subprocess.Popen([sys.executable, __file__, *args], env=rank_env, **popen))
    return procs


if __name__ == "__main__":
    import mlotspark  # noqa: F401  (OpenBLAS before MLX)

    {"suite": suite, "wait": wait, "mismatch": mismatch, "cancel": cancel,
     "conversation": conversation, "quantized": quantized}[sys.argv[1]](Path(sys.argv[2]), sys.argv[3])
    # As the CLI ranks do: once another thread has run MLX over the ring, the interpreter's
    # teardown can abort ("terminate called without an active exception"; a known limit,
    # README's distributed section). The results are written: leave without the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

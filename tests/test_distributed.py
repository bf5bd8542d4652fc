"""Distributed runs on MLX's ring backend: two local ranks over loopback.

The launched tests start real ranks: ``mlx.launch -n 2 --backend ring`` once for the
module's replies (pipeline on a tiny model, the tensor-parallel refusal on the default model, tensor
parallel on a tiny model), and ranks started as ``mlx.launch`` starts them for the
failure tests, which kill or stop one rank and watch rank 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlotspark.errors import DistributedError, OptionError
from mlotspark.distributed import plan_layers
from mlotspark.distributed.protocol import IDLE_BEAT_S, join_plan
from mlotspark.distributed.rank_status import RemoteProbe
from mlotspark.distributed.tensor import check_tensor_split
from mlotspark.models.llama import ModelArgs
from mlotspark.thermal.governor import ThermalGovernor
from mlotspark.thermal.probes import ScriptedProbe

from tiny import TINY, tiny_model, write_tiny_gguf

HERE = Path(__file__).resolve().parent
RANKS = HERE / "distributed_ranks.py"
LAUNCH = Path(sys.executable).with_name("mlx.launch")
sys.path.insert(0, str(HERE))
from distributed_ranks import HOT, MAX_TOKENS, PROMPTS, SHORT, free_port_pair, rank_facts, spawn_ranks  # noqa: E402


def _port() -> int:
    # Two ranks take two consecutive ports; a random free base keeps parallel runs apart.
    return free_port_pair()


# ------------------------------------------------------------------ no ranks
def test_even_split_gives_the_extra_layers_to_the_first_ranks():
    assert plan_layers(30, [1, 1], "even") == [(0, 15), (15, 30)]
    assert plan_layers(7, [1, 1, 1], "even") == [(0, 3), (3, 5), (5, 7)]


def test_memory_split_follows_free_memory():
    # A rank with three times the free memory gets about three times the layers.
    assert plan_layers(30, [8 << 30, 24 << 30], "memory") == [(0, 8), (8, 30)]
    # Every rank keeps a layer, however little memory it has.
    assert plan_layers(4, [0, 100 << 30], "memory") == [(0, 1), (1, 4)]


def test_bad_splits_are_refused():
    with pytest.raises(OptionError, match="'halves'"):
        plan_layers(30, [1, 1], "halves")
    with pytest.raises(DistributedError, match="3 layers over 4 ranks"):
        plan_layers(3, [1, 1, 1, 1], "even")


def test_tensor_split_refusal_names_the_head_counts():
    smollm = ModelArgs(num_attention_heads=9, num_key_value_heads=3)  # the default model's shape
    with pytest.raises(DistributedError) as e:
        check_tensor_split(smollm, 2, "smollm2-135m-instruct")
    assert "9 attention heads, 3 KV heads" in str(e.value) and "pipeline" in str(e.value)
    check_tensor_split(ModelArgs.from_dict(TINY), 2, "tiny")  # 4 and 2 heads split in two


def test_every_rank_decides_alike_after_a_join():
    ok, lacks = {"ok": True}, {"ok": False, "lacks": True, "error": "no snapshot"}
    assert join_plan([ok, ok], replayable=False) == ("go", [], "")
    # A rank without its share of a conversation rebuilds it when rank 0 has the tokens ...
    assert join_plan([ok, lacks, ok, lacks], replayable=True) == ("replay", [1, 3], "")
    # ... and the request fails, naming the rank, when it has not, or on any other error.
    assert join_plan([ok, lacks], replayable=False) == ("refuse", [1], "rank 1 cannot continue this request: no snapshot")
    other = {"ok": False, "lacks": False, "error": "prompt too long"}
    assert join_plan([ok, lacks, other], replayable=True)[0] == "refuse"


def test_rank0_governor_reads_every_rank_and_the_hottest_sets_the_cap():
    rows = [{"rank": 0, "reading": {}},
            {"rank": 1, "reading": {"temperature_c": 60.0, "memory_pressure": 0.5}},
            {"rank": 2, "reading": {"temperature_c": 95.0, "memory_pressure": 0.2}}]
    remote = RemoteProbe(lambda: rows)
    merged = remote.read()
    assert merged.temperature_c == 95.0 and merged.memory_pressure == 0.5  # the worse of each field
    cool = ScriptedProbe([{"temperature_c": 40.0}])  # rank 0 itself is cool
    governor = ThermalGovernor(probes=[cool, remote], mode="performance", max_batch=8, min_interval_s=0)
    decision = governor.update()
    assert decision.state == "critical" and decision.cap == 1
    assert RemoteProbe(lambda: []).read().temperature_c is None  # nothing heard yet: no opinion


def test_engine_refuses_the_cascade_with_tensor_parallelism():
    from mlotspark import Engine

    with pytest.raises(OptionError, match="distributed='pipeline' only, not 'tensor'"):
        Engine.load(distributed="tensor", cascade={"window": 256}, pull=False)


# --------------------------------------------------------------- two ranks
@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", tiny_model(seed=3))


@pytest.fixture(scope="module")
def launched(tmp_path_factory, tiny_gguf, default_gguf) -> dict:
    """One ``mlx.launch -n 2 --backend ring`` run of the ``suite`` scenario."""
    tmp = tmp_path_factory.mktemp("ranks")
    out, heat = tmp / "suite.json", tmp / "heat.json"
    heat.write_text(json.dumps({"temperature_c": 40.0}))  # rank 1 starts cool
    env = dict(os.environ, MLOTSPARK_HOME=str(default_gguf.parent.parent.parent), RANK_HEAT=str(heat))
    cmd = [str(LAUNCH), "-n", "2", "--backend", "ring", "--starting-port", str(_port()),
           sys.executable, str(RANKS), "suite", str(out), str(tiny_gguf)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-2000:] + proc.stderr[-4000:]
    return {**json.loads(out.read_text()), "ranks": rank_facts(out)}


@pytest.fixture(scope="module")
def alone(tiny_gguf) -> dict:
    """The single-process greedy replies to PROMPTS, each run alone, the weight bytes and the defaults' temperature."""
    from mlotspark import Engine

    engine = Engine.load(str(tiny_gguf), cascade=None, progress=False)
    try:
        replies = [engine.generate(p, max_tokens=MAX_TOKENS, temperature=0).tokens for p in PROMPTS]
        return {"replies": replies, "bytes": engine.loaded.nbytes(), "temperature": engine.defaults.temperature}
    finally:
        engine.close()


@pytest.mark.slow
def test_batched_pipeline_greedy_tokens_equal_each_request_alone(launched, alone):
    """Three prompts of different lengths, a short request and a JSON one decode together
    through two ranks; each reply is the one it gets alone in one process."""
    replies, full_bytes = alone["replies"], alone["bytes"]
    assert launched["replies"] == replies
    assert sum(len(t) for t in replies) >= 2 * MAX_TOKENS  # long replies, not three stops at once
    assert all(b > 2 for b in launched["mean_batch"])  # decoded in one batch, not one after another
    short = launched["short"]  # it left the batch early; the others went on without it
    assert short["tokens"] == replies[SHORT[0]][: SHORT[1]] and short["finish"] == "length"
    assert max(len(t) for t in launched["replies"]) > 2 * SHORT[1]
    assert launched["json_finish"] in ("stop", "length")
    # Only rank 0 samples: the JSON grammar is compiled there (once), never on the follower.
    assert launched["compiles"] == [1, 0]
    assert launched["temperature"] == alone["temperature"]  # the model's defaults hold across ranks too
    assert launched["backend"] == "ring"  # what `mlotspark info --distributed` names
    ranks = launched["ranks"]
    assert [r["layers"] for r in ranks] == [[0, 1], [1, 2]]
    # Each rank holds half of the layers' weights; rank 0 also the embedding (= tied LM head).
    layers_total = ranks[0]["layer_bytes"] + ranks[1]["layer_bytes"]
    for r in ranks:
        assert abs(r["layer_bytes"] / layers_total - 0.5) < 0.01
    assert ranks[1]["weights"] == ranks[1]["layer_bytes"]
    assert ranks[0]["weights"] + ranks[1]["weights"] == full_bytes  # nothing held twice
    assert ranks[1]["weights"] < 0.45 * full_bytes and ranks[0]["weights"] < 0.65 * full_bytes
    # Rank 0 knows every rank's figures (sent with the steps); the hottest sets the state.
    status = launched["status"]
    assert [r["rank"] for r in status["ranks"]] == [0, 1]
    assert [r["layers"] for r in status["ranks"]] == [[0, 1], [1, 2]]
    assert all(r["last_step_ms"] is not None and r["rss_mb"] > 0 for r in status["ranks"])
    assert status["state"] in ("nominal", "fair", "serious", "critical") and status["reason"].startswith("hottest: rank")


@pytest.mark.slow
def test_the_hottest_rank_caps_the_batch_across_ranks(launched, alone):
    """Rank 1 reports 95 °C: rank 0's governor goes critical, the cap drops to 1 and two
    requests submitted together decode one at a time, still with their own greedy tokens."""
    cool, hot = launched["cool_status"], launched["serialised"]
    assert cool["state"] == "nominal" and cool["cap"] == 8
    assert hot["replies"] == [alone["replies"][i][:n] for i, n in HOT]
    assert hot["mean_batch"] == [1.0, 1.0]
    assert max(hot["batches"]) == 1 and hot["batches"].count(1) >= sum(n for _, n in HOT) - 2
    status = hot["status"]
    assert status["state"] == "critical" and status["cap"] == 1
    assert status["reason"].startswith("hottest: rank 1") and "temperature 95" in status["reason"]


@pytest.mark.slow
def test_tensor_parallel_is_refused_on_the_default_model(launched):
    assert launched["tensor_refusal"] == (
        "tensor parallelism cannot split smollm2-135m-instruct over 2 ranks: its 9 attention heads, "
        "3 KV heads and MLP width 1536 must all divide by 2; use --distributed pipeline"
    )


@pytest.mark.slow
def test_tensor_parallel_greedy_tokens_equal_the_single_process_run(launched, tiny_gguf):
    from mlotspark import Engine

    engine = Engine.load(str(tiny_gguf), cascade=None, progress=False)
    try:
        alone = engine.generate("hello world", raw=True, max_tokens=MAX_TOKENS, temperature=0).tokens
    finally:
        engine.close()
    assert launched["tiny_tensor"] == alone and len(alone) == MAX_TOKENS


@pytest.mark.slow
def test_conversations_continue_from_per_rank_snapshots(tmp_path, tiny_gguf, monkeypatch):
    """A plain-KV and a cascade conversation on two ranks: first turns, then new engines on
    both ranks take the second turns from each rank's own snapshot; every turn's greedy
    tokens equal the single-process conversation's. On the tiny model: which tokens come
    out does not matter, only that both topologies give the same ones."""
    from distributed_ranks import SMALL_CASCADE, TURNS, converse

    from mlotspark import Engine

    out = tmp_path / "conversations.json"
    cmd = [str(LAUNCH), "-n", "2", "--backend", "ring", "--starting-port", str(_port()), sys.executable,
           str(RANKS), "conversation", str(out), f"{tiny_gguf},{tmp_path / 'homes'}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-2000:] + proc.stderr[-4000:]
    replies = json.loads(out.read_text())
    monkeypatch.setenv("MLOTSPARK_HOME", str(tmp_path / "alone"))
    for name, cascade in (("plain", "auto"), ("cascade", SMALL_CASCADE)):
        engine = Engine.load(str(tiny_gguf), cascade=cascade, progress=False)
        try:
            alone = converse(engine, name, TURNS)
        finally:
            engine.close()
        first, second = replies[name]
        assert [first["tokens"], second["tokens"]] == [t["tokens"] for t in alone], name
        assert first["source"] == "none" and second["source"] == "snapshot"  # rank 0 restored its own
        assert first["ranks"][0]["saved"] and second["ranks"][0]["saved"]
        if name == "plain":  # rank 1 lost its snapshot: rebuilt from rank 0's tokens, not a failed turn
            assert second["replayed"]["ranks"] == [1] and second["replayed"]["tokens"] > 20
        else:  # restored from rank 1's own snapshot
            assert second["replayed"] is None
            # The question pass ran on the second turn's prompt, on both ranks (the consensus summed
            # over them): the same tokens as one process, which ran it too.
            # (the single process's count is its cache's: the first turn's pass as well)
            assert second["passes"] == 1 and alone[1]["passes"] == (alone[0]["passes"] or 0) + 1, (first, alone)
        # One snapshot per rank, each in its own rank's home, holding its own layers.
        homes = tmp_path / "homes"
        assert (homes / "rank0" / "conversations" / name / "snapshot" / "snapshot.json").is_file()
        assert (homes / "rank1" / "conversations" / name / "snapshot.layers-1-2" / "snapshot.json").is_file()
        assert not list((homes / "rank0" / "conversations" / name).glob("snapshot.layers-*"))


@contextlib.contextmanager
def _waiting_ranks(tmp_path: Path, tiny: Path, timeout: float) -> Iterator[tuple[subprocess.Popen, subprocess.Popen, Path]]:
    """Two ranks of the ``wait`` scenario, both loaded and rank 0 idle until told "go";
    yields ``(rank0, rank1, rank 0's outcome file)`` and kills what is left at the end."""
    out = tmp_path / "rank0.json"
    env = dict(os.environ, RANK_TIMEOUT=str(timeout))
    procs = spawn_ranks(["wait", str(out), str(tiny)], 2, _port(), tmp_path, env=env,
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for p in procs:
            line = p.stdout.readline()
            assert line.strip() == "ready", p.stderr.read()[-2000:] if p.poll() is not None else line
        yield procs[0], procs[1], out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _go(rank0: subprocess.Popen, timeout: float) -> None:
    """Tell rank 0 to ask for its reply, and wait for it to write the outcome and end."""
    rank0.stdin.write("go\n")
    rank0.stdin.flush()
    rank0.wait(timeout=timeout + 30)


def _rank0_after(tmp_path: Path, tiny: Path, harm: int, timeout: float) -> tuple[dict, float]:
    """Start two ranks, harm rank 1 with signal ``harm`` once both are loaded, then ask
    rank 0 for a reply; return rank 0's outcome and how long it took to fail."""
    with _waiting_ranks(tmp_path, tiny, timeout) as (rank0, rank1, out):
        os.kill(rank1.pid, harm)
        t0 = time.monotonic()
        _go(rank0, timeout)
        took = time.monotonic() - t0
    return json.loads(out.read_text()), took


def test_an_idle_rank_sleeps_between_rank0s_beats_instead_of_polling(tmp_path, tiny_gguf):
    """MLX's ring backend polls inside a collective: a rank waiting there for rank 0's next
    step kept a core busy all the time rank 0 was idle. Rank 0's idle beat lets it sleep;
    the group still answers afterwards."""
    import psutil

    with _waiting_ranks(tmp_path, tiny_gguf, timeout=30) as (rank0, rank1, out):
        follower = psutil.Process(rank1.pid)
        time.sleep(0.5)  # past the tail of its load
        cpu0, t0 = sum(follower.cpu_times()[:2]), time.monotonic()
        time.sleep(2.0)
        busy = (sum(follower.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
        _go(rank0, 30)
    assert busy < 0.25, f"rank 1 kept {busy:.0%} of a core busy while rank 0 was idle"
    assert json.loads(out.read_text()) == {"error": None}


def test_a_killed_rank_makes_rank0_fail_at_once(tmp_path, tiny_gguf):
    outcome, took = _rank0_after(tmp_path, tiny_gguf, signal.SIGKILL, timeout=30)
    assert outcome["error"] and "died or stalled" in outcome["error"]
    assert took < 30  # the lost connection, not the watchdog


def test_a_stalled_rank_makes_rank0_fail_within_the_timeout(tmp_path, tiny_gguf):
    outcome, took = _rank0_after(tmp_path, tiny_gguf, signal.SIGSTOP, timeout=3)
    assert outcome["error"] and "no progress from the other ranks" in outcome["error"]
    assert 3 - IDLE_BEAT_S <= took < 3 + 20  # timed from the idle beat it stalled in (up to a beat earlier)


def test_other_model_files_on_a_rank_are_refused_naming_it():
    from mlotspark.distributed.loading import _check_same_model

    ranks = [{"rank": 0, "host": "mac1", "model": "m", "fingerprint": "aaaa"},
             {"rank": 1, "host": "mac2", "model": "m", "fingerprint": "aaaa"},
             {"rank": 2, "host": "mac3", "model": "m", "fingerprint": "bbbb"}]
    with pytest.raises(DistributedError, match=r"^rank 2 \(mac3\) has other model files than rank 0"):
        _check_same_model(ranks)
    _check_same_model(ranks[:2])


def test_ranks_with_other_model_files_refuse_to_load(tmp_path, tiny_gguf):
    other = write_tiny_gguf(tmp_path / "other.gguf", tiny_model(seed=4))
    out = tmp_path / "rank0.json"
    procs = spawn_ranks(["mismatch", str(out), f"{tiny_gguf},{other}"], 2, _port(), tmp_path,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for p in procs:
        p.wait(timeout=120)
    error = json.loads(out.read_text())["error"]
    assert error.startswith("rank 1 (") and "has other model files than rank 0" in error


def test_a_cancel_on_rank0_stops_every_rank_at_the_same_token(tmp_path, tiny_gguf):
    from mlotspark import Engine

    out = tmp_path / "rank0.json"
    procs = spawn_ranks(["cancel", str(out), str(tiny_gguf)], 2, _port(), tmp_path,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for p in procs:
        p.wait(timeout=120)
    assert all(p.returncode == 0 for p in procs), [p.stderr.read()[-2000:] for p in procs]
    seen = json.loads(out.read_text())
    assert seen["finish"] == "cancelled" and seen["cancelled_after"] < 400
    engine = Engine.load(str(tiny_gguf), cascade=None, progress=False)
    try:
        alone = engine.generate("hello world", raw=True, max_tokens=MAX_TOKENS, temperature=0).tokens
    finally:
        engine.close()
    assert seen["again"] == alone  # the follower left the cancelled request where rank 0 did


def test_engine_panel_shows_a_row_per_rank():
    from tui.backend import MachineFigures
    from tui.widgets.stats import machine_text

    ranks = [{"rank": 0, "host": "mac1", "layers": [0, 15], "rss_mb": 648.2, "available_mb": 20500.0,
              "thermal": "nominal", "last_step_ms": 151.3},
             {"rank": 1, "host": "mac2", "layers": [15, 30], "rss_mb": 447.0, "available_mb": 7200.0,
              "thermal": "serious", "last_step_ms": None}]
    text = machine_text(MachineFigures(state="serious", ranks=ranks, blas_warning=None), None, None).plain
    assert "rank 0   mac1 L0-14 · 648 MB · 20.5 GB free · nominal · step 151 ms" in text
    assert "rank 1   mac2 L15-29 · 447 MB · 7.2 GB free · serious · step —" in text


def test_the_hottest_rank_sets_the_distributed_state():
    from mlotspark.distributed.session import DistributedSession

    class Ranks(DistributedSession):  # the figures only: no group, no leader
        def __init__(self, ranks):
            self.leader, self._ranks = None, ranks
            self.setup = type("S", (), {"mode": "pipeline"})()

        def ranks_status(self):
            return self._ranks

    ranks = [{"rank": 0, "host": "mac1", "thermal": "fair", "thermal_reason": "CPU 80 C"},
             {"rank": 1, "host": "mac2", "thermal": "critical", "thermal_reason": "CPU 99 C"}]
    base = {"state": "fair", "cap": 2, "mode": "balanced", "batch_size": 2, "reason": "calm → fair: cap 4→2"}
    status = Ranks(ranks).scheduler_status(base)
    assert status["state"] == "critical" and status["ranks"] == ranks and status["cap"] == 2
    assert status["reason"] == "hottest: rank 1 (mac2) critical: CPU 99 C; calm → fair: cap 4→2"
    assert status["mode"] == "distributed pipeline · balanced"


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_a_follower_without_a_usable_share_says_it_lacks_it(tmp_path, monkeypatch, damage):
    """What a follower answers at a join when its snapshot is gone or damaged: a
    SnapshotError (``lacks``), which rank 0 answers with a replay, not a failed turn."""
    import mlx.core as mx

    from mlotspark.distributed.rank_memory import RankMemory
    from mlotspark.errors import SnapshotError
    from mlotspark.caches.kv import KVCache

    monkeypatch.setenv("MLOTSPARK_HOME", str(tmp_path))
    cache = [KVCache() for _ in range(2)]
    for c in cache:  # 5 tokens of a (1, 2 heads, T, 8) cache
        c.update_and_fetch(mx.ones((1, 2, 5, 8)), mx.ones((1, 2, 5, 8)))
    memory = RankMemory((15, 17), "fp", "float32", "tiny")
    assert memory.keep("chat", [1, 2, 3, 4, 5], cache, save=True)["saved"]
    store = memory.store("chat").directory
    if damage == "missing":
        shutil.rmtree(store)
    else:
        for f in store.glob("*.safetensors"):
            f.write_bytes(f.read_bytes()[:40])
    fresh = RankMemory((15, 17), "fp", "float32", "tiny")  # a new engine: nothing held in memory
    with pytest.raises(SnapshotError, match="no cache of 5 tokens for conversation 'chat' on layers 15-17"):
        fresh.take("chat", 5, "kv")

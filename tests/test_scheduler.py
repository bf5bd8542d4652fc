"""The scheduler: engine thread, priority queue, continuous batching, governor wiring.

Fast tests run a tiny random llama model with a character tokenizer; the slow ones
run the real default model. Governor time is a fake clock; no test measures time.
"""

from __future__ import annotations

import functools
import json
import threading
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

from mlotspark.engine import Engine
from mlotspark.errors import OptionError
from mlotspark.thermal.governor import ThermalGovernor
from mlotspark.models.loader import LoadedModel
from mlotspark.models import llama
from mlotspark.models.execution import prepare
from mlotspark.caches.kv import KVCache
from mlotspark.options import GenerationOptions
from mlotspark.thermal.probes import Reading, ScriptedProbe
from mlotspark.runtime.scheduler import SchedulerConfig, parse_memory_limit

EOS = 1000  # outside the tiny vocabulary: replies run to max_tokens


class CharDetokenizer:
    """Token t -> one printable character, so text length == token count."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def reset(self) -> None:
        self.tokens = []

    def add_token(self, t: int) -> None:
        self.tokens.append(t)

    def finalize(self) -> None:
        pass

    @property
    def text(self) -> str:
        return "".join(chr(33 + t % 90) for t in self.tokens)


class CharTokenizer:
    eos_token_ids = [EOS]
    bos_token_id = None

    @property
    def detokenizer(self) -> CharDetokenizer:
        return CharDetokenizer()

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1 + ord(c) % 120 for c in text]


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        self.t += 1.0  # every governor look is a second later
        return self.t


class RowKV(KVCache):
    """A cache the batcher must not pack (stands in for cascade / restored kinds)."""


def tiny_engine(governor: ThermalGovernor | None = None, execution: str | None = None, **sched) -> Engine:
    mx.random.seed(3)
    args = llama.ModelArgs(hidden_size=64, num_hidden_layers=2, intermediate_size=96,
                           num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    model = llama.Model(args)
    # Peaky logits: no near-ties, so greedy is well defined.
    model.update({"model": {"embed_tokens": {"weight": model.model.embed_tokens.weight * 8}}})
    mx.eval(model.parameters())
    loaded = LoadedModel(model=model, tokenizer=CharTokenizer(), config={},
                         source=SimpleNamespace(name="tiny", path="tiny"), weights="float32",
                         fingerprint="tiny", context_length=4096, supports_cascade=True,
                         runner=prepare(model, execution))  # the device's runner, as the loader does
    gov = governor or ThermalGovernor([ScriptedProbe([Reading()])], clock=FakeClock(), min_interval_s=0,
                                      **sched)
    engine = Engine(loaded, GenerationOptions(temperature=0.0), SchedulerConfig(governor=gov))
    engine.scheduler.pause_wait_s = 0.001
    return engine


PROMPTS = [[5, 9, 14, 3], list(range(10, 41)), [7], list(range(50, 62))]


def test_batched_greedy_equals_solo_with_mixed_caches_and_a_late_joiner():
    engine = tiny_engine()
    solo = [engine.submit(prompt_ids=p, max_tokens=24).result().tokens for p in PROMPTS]
    # Rows 1 and 3 use a cache kind that attends row by row; 0 and 2 get packed.
    caches = [None, [RowKV(), RowKV()], None, [RowKV(), RowKV()]]
    first = [engine.submit(prompt_ids=p, cache=c, max_tokens=24) for p, c in zip(PROMPTS[:3], caches)]
    it = iter(first[0])
    next(it), next(it)  # the first three are decoding together now
    late = engine.submit(prompt_ids=PROMPTS[3], cache=caches[3], max_tokens=24)
    batched = [h.result().tokens for h in first + [late]]
    assert batched == solo
    assert max(h.stats.extra["mean_batch"] for h in first) > 1
    assert late.stats.extra["mean_batch"] > 1  # it joined the running batch
    # The caller's cache holds exactly the fed tokens afterwards.
    for g in (late.generation, first[0].generation):  # row by row, and packed then written back
        assert g.cache[0].offset == len(g.fed_tokens) >= len(g.prompt) + len(g.tokens) - 1
        assert g.fed_tokens == (g.prompt + g.tokens)[: len(g.fed_tokens)]


@pytest.mark.parametrize("rows", [3, 4])
def test_few_plain_rows_take_numpy_steps_one_by_one_and_more_are_packed(rows, monkeypatch):
    """Under the CPU runner fewer than ``CpuRunner.PACK_FROM`` plain rows each run the NumPy step
    (models/execution.py); from that many they are packed into one MLX batch. Either way a
    row's greedy tokens are its tokens alone."""
    from mlotspark.models.cpu import cpu_step
    from mlotspark.runtime import batching

    engine = tiny_engine(execution="cpu")  # the device's default is the GPU runner on a Mac: pin the CPU one
    prompts = PROMPTS[:rows]
    solo = [engine.submit(prompt_ids=p, max_tokens=16).result().tokens for p in prompts]
    packed, numpy_rows = [], []
    merge, run = batching.BatchKVCache.merge, cpu_step.run
    spy = SimpleNamespace(merge=lambda caches: packed.append(len(caches)) or merge(caches))
    monkeypatch.setattr(batching, "BatchKVCache", spy)  # the decode batch's packing only

    def counted(model, inputs, cache):
        logits = run(model, inputs, cache)
        numpy_rows.append(logits is not None)
        return logits

    monkeypatch.setattr(cpu_step, "run", counted)
    gate, holding = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        gate.wait()

    blocker = threading.Thread(target=engine.scheduler.call, args=(hold,))
    blocker.start()  # all rows queue up, then start together
    holding.wait()
    handles = [engine.submit(prompt_ids=p, max_tokens=16) for p in prompts]
    gate.set()
    blocker.join()
    assert [h.result().tokens for h in handles] == solo
    assert min(h.stats.extra["mean_batch"] for h in handles) > 1  # they decoded together
    if rows < engine.loaded.runner.PACK_FROM:
        assert not packed and sum(numpy_rows) >= rows * 15
    else:
        assert packed and set(packed) == {rows}  # one merge of all rows per layer


@pytest.mark.parametrize("own", [{"num_beams": 3, "num_return_sequences": 2},
                                 {"num_return_sequences": 2, "temperature": 1.0, "seed": 4},
                                 {"speculative": "prompt_lookup"}], ids=["beams", "returns", "speculative"])
@pytest.mark.parametrize("pipelined", [False, True], ids=["in-step", "pipelined"])
def test_a_request_with_its_own_loop_steps_with_the_batch_and_blocks_no_one(own, pipelined):
    """A beam (or speculative, or several-returns) request takes one step per turn of the
    engine thread: a plain request submitted with it streams and finishes while it runs,
    and both replies are what each gives alone (with the batch's steps pipelined, as on a
    GPU, or taken in at once, as on the CPU)."""
    engine = tiny_engine()
    engine.scheduler.pipelined = pipelined
    alone = engine.submit(prompt_ids=PROMPTS[1], max_tokens=16, **own).result()
    plain_alone = engine.submit(prompt_ids=PROMPTS[0], max_tokens=4).result().tokens
    events: list[str] = []
    gate, holding = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        gate.wait()

    blocker = threading.Thread(target=engine.scheduler.call, args=(hold,))
    blocker.start()  # both queue up, then start in the same turn
    holding.wait()
    long = engine.submit(prompt_ids=PROMPTS[1], max_tokens=16, on_finish=lambda g: events.append("own"), **own)
    plain = engine.submit(prompt_ids=PROMPTS[0], max_tokens=4, on_finish=lambda g: events.append("plain"))
    gate.set()
    blocker.join()
    assert plain.result().tokens == plain_alone
    pieces = list(long)
    result = long.result()
    assert events == ["plain", "own"]  # the plain one did not wait for the whole of the other
    assert result.tokens == alone.tokens and len(result.tokens) == 16
    assert [s.tokens for s in result.sequences] == [s.tokens for s in alone.sequences]
    assert "".join(pieces) == result.text
    if "speculative" in own:  # a verified round per turn, not one token: it keeps its speed in company
        assert result.stats.extra["speculative"]["accepted"] > 0 and len(pieces) < len(result.tokens)


@pytest.mark.parametrize("own", [{"num_beams": 3, "num_return_sequences": 2}, {"speculative": "prompt_lookup"}],
                         ids=["beams", "speculative"])
def test_a_request_with_its_own_loop_cancelled_midway_ends_with_what_it_has(own):
    """Cancelled between two of its steps, a beam request's reply is its best beam so far (streamed,
    like the text of a cancelled plain request), and a speculative one's is its text so far."""
    engine = tiny_engine()
    long = engine.submit(prompt_ids=PROMPTS[1], max_tokens=2000, **own)
    plain = engine.submit(prompt_ids=PROMPTS[0], max_tokens=4)
    assert len(plain.result().tokens) == 4  # the long one is still running: it has ~2000 steps to go
    long.cancel()
    streamed = "".join(long)
    r = long.result()
    assert r.stats.finish_reason == "cancelled" and streamed == r.text
    assert 0 < len(r.tokens) < 2000 and len(r.sequences) == own.get("num_return_sequences", 0)


def test_cancel_mid_stream_ends_that_stream_and_frees_its_kv_while_others_go_on():
    engine = tiny_engine()
    ids = [list(range(3, 20)), list(range(30, 40)), list(range(60, 75))]
    handles = [engine.submit(prompt_ids=p, max_tokens=64, stop=None) for p in ids]
    victim = handles[1]
    pieces = []
    for piece in victim:
        pieces.append(piece)
        if len(pieces) == 3:
            victim.cancel()
    r = victim.result()
    assert r.stats.finish_reason == "cancelled"
    assert r.text == "".join(pieces) and 3 <= len(r.tokens) < 64
    assert victim.generation.cache == []  # the engine dropped its KV at once
    others = [h.result() for h in (handles[0], handles[2])]
    assert [o.stats.finish_reason for o in others] == ["length", "length"]
    assert [len(o.tokens) for o in others] == [64, 64]


def test_priority_queue_runs_lower_priority_numbers_first():
    engine = tiny_engine(max_batch=1)
    gate, holding = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        gate.wait()

    blocker = threading.Thread(target=engine.scheduler.call, args=(hold,))
    blocker.start()  # holds the engine thread while all three queue up
    holding.wait()
    order: list[str] = []
    for name, prio in (("late-low", 5), ("urgent", 0), ("normal", 2)):
        engine.submit(prompt_ids=[4, 5, 6], priority=prio, max_tokens=3,
                      on_finish=lambda g, n=name: order.append(n))
    assert engine.status()["queued"] == 3
    gate.set()
    blocker.join()
    engine.submit(prompt_ids=[1], priority=9, max_tokens=1).result()
    assert order == ["urgent", "normal", "late-low"]


def test_heat_up_shrinks_the_batch_to_the_floor_pauses_then_cooling_grows_it():
    temps = [50] * 2 + [72] * 2 + [82] * 2 + [92] * 6 + [60] * 400
    gov = ThermalGovernor([ScriptedProbe([Reading(temperature_c=t) for t in temps])],
                          mode="performance", max_batch=8, clock=FakeClock(), min_interval_s=0)
    engine = tiny_engine(gov)
    handles = [engine.submit(prompt_ids=[i + 1, i + 2], max_tokens=120) for i in range(8)]
    for h in handles:
        h.result()
    tl = list(engine.scheduler.timeline)
    assert all(s.batch <= s.cap for s in tl)
    states = [s.state for s in tl]
    assert {"fair", "serious", "critical"} <= set(states)
    crit = [s for s in tl if s.state == "critical"]
    assert any(s.paused for s in crit) and all(s.batch <= 1 for s in crit)
    cooled = tl[states.index("critical") + len(crit):]
    assert max(s.batch for s in cooled) > 1  # the cap grew back


def test_memory_pressure_queues_new_requests_without_failing_running_ones():
    gov = ThermalGovernor([ScriptedProbe([Reading(memory_pressure=0.9)])], clock=FakeClock(),
                          min_interval_s=0)
    engine = tiny_engine(gov)
    handles = [engine.submit(prompt_ids=[2, 3, i + 4], max_tokens=10) for i in range(3)]
    results = [h.result() for h in handles]
    assert all(r.stats.finish_reason in ("length", "stop") for r in results)
    assert max(s.batch for s in engine.scheduler.timeline) == 1  # one at a time
    assert max(s.queued for s in engine.scheduler.timeline) == 2  # the others waited


def test_memory_limit_queues_what_does_not_fit_and_fails_what_never_can():
    engine = tiny_engine()
    per_token = engine.scheduler.kv_per_token
    weights = engine.loaded.nbytes()
    # Room for two requests' KV (each reserves 256 tokens), not three.
    gov = ThermalGovernor([ScriptedProbe([Reading()])], clock=FakeClock(), min_interval_s=0,
                          memory_limit_bytes=weights + int(2.5 * 256 * per_token))
    engine = tiny_engine(gov)
    handles = [engine.submit(prompt_ids=[3, 4, i + 5], max_tokens=30) for i in range(4)]
    assert all(len(h.result().tokens) > 0 for h in handles)
    assert max(s.batch for s in engine.scheduler.timeline) == 2
    with pytest.raises(OptionError, match="memory limit"):
        engine.submit(prompt_ids=[3, 4], max_tokens=4000).result(timeout=60)


def test_generate_batch_returns_texts_in_prompt_order():
    engine = tiny_engine()
    prompts = ["first prompt", "2nd", "a third, longer prompt than the others"]
    solo = [engine.generate(p, raw=True, max_tokens=6).text for p in prompts]
    assert engine.generate_batch(prompts, raw=True, max_tokens=6) == solo


def test_scheduler_config_and_memory_limit_parsing_name_the_bad_value():
    assert parse_memory_limit("1.5GB") == int(1.5 * 2**30)
    assert parse_memory_limit("512MiB") == 512 * 2**20
    assert parse_memory_limit(4096) == 4096
    with pytest.raises(OptionError, match="'lots'"):
        parse_memory_limit("lots")
    with pytest.raises(OptionError, match="memory limit '0'.*> 0"):
        parse_memory_limit("0")
    assert parse_memory_limit(8e9) == 8_000_000_000 and parse_memory_limit(np.int64(4096)) == 4096  # Python callers
    with pytest.raises(OptionError, match="'turbo'"):
        SchedulerConfig(mode="turbo")
    with pytest.raises(OptionError, match="0"):
        SchedulerConfig(max_batch=0)


@pytest.mark.parametrize("text, n", [("4GB", 4 << 30), ("4 GiB", 4 << 30), ("4g", 4 << 30), ("500MB", 500 << 20),
                                     ("1.5k", 1536), ("4096", 4096), ("12b", 12), ("1TB", 1 << 40), ("0", 0)])
def test_one_size_parser_reads_a_spelling_as_one_size_in_every_option(text, n):
    from mlotspark.units import fmt_bytes, parse_bytes

    assert parse_bytes(text, "--store-budget", allow_zero=True) == n
    if n >= 1 << 30:
        assert fmt_bytes(parse_bytes(text)) == f"{n / (1 << 30):.1f} GiB"


@pytest.mark.parametrize("bad", ["lots", "4 GX", "-1GB", "", "1e9", True, 2.5])
def test_a_bad_size_is_named_in_the_error(bad):
    from mlotspark.units import parse_bytes

    with pytest.raises(OptionError, match=r"invalid --store-budget .*8GB"):
        parse_bytes(bad, "--store-budget", allow_zero=True)


def test_status_reports_state_cap_batch_queue_and_reason():
    engine = tiny_engine()
    engine.submit(prompt_ids=[1, 2, 3], max_tokens=5).result()
    st = engine.status()
    assert {"state", "cap", "batch_size", "queued", "reason", "admission"} <= st.keys()
    assert st["state"] == "nominal" and st["cap"] == 8 and st["queued"] == 0
    assert "→ nominal" in st["reason"]
    assert engine.info()["scheduler"]["cap"] == 8


def test_prompts_file_runs_writes_jsonl_and_resumes(tmp_path):
    from mlotspark.cli.batch import run_prompts_file

    engine = tiny_engine()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join([
        json.dumps({"prompt": "abc", "max_tokens": 3}),
        json.dumps({"prompt": "hello", "max_tokens": 5, "seed": 1}),
        json.dumps({"prompt": "xyz"}),
    ]) + "\n")
    out = tmp_path / "out.jsonl"
    done = run_prompts_file(engine, prompts, out, raw=True, num_return_sequences=2,
                            options={"max_tokens": 4}, progress=False)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert done == 6 and len(rows) == 6
    assert {(r["index"], r["sequence"]) for r in rows} == {(i, j) for i in range(3) for j in range(2)}
    assert all(r["generation_tokens"] <= (3 if r["index"] == 0 else 5 if r["index"] == 1 else 4) for r in rows)
    # Interrupted run: keep two finished lines, then resume.
    out.write_text("\n".join(out.read_text().splitlines()[:2]) + "\n")
    kept = out.read_text()
    again = run_prompts_file(engine, prompts, out, raw=True, num_return_sequences=2,
                             options={"max_tokens": 4}, progress=False)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert again == 4 and out.read_text().startswith(kept)
    assert len({(r["index"], r["sequence"]) for r in rows}) == len(rows) == 6


# --- the real default model ---------------------------------------------------------


@pytest.fixture(scope="module")
def engine(default_gguf):
    e = Engine.load(str(default_gguf), governor=ThermalGovernor([ScriptedProbe([Reading()])]))
    yield e
    e.close()


REAL_PROMPTS = [
    "Hi!",
    "Write one sentence about the sea.",
    "List three fruits, then explain in two sentences why people like to eat fruit in summer.",
    "def add(a, b):\n",
]


@pytest.mark.slow
def test_real_model_batched_greedy_equals_solo_token_for_token(engine):
    opts = dict(temperature=0, max_tokens=24)
    solo_results = [engine.generate(p, **opts) for p in REAL_PROMPTS]
    solo = [r.tokens for r in solo_results]
    first = [engine.submit(p, **opts) for p in REAL_PROMPTS[:3]]
    it = iter(first[1])
    next(it)  # decoding has started
    late = engine.submit(REAL_PROMPTS[3], **opts)
    batched = [h.result().tokens for h in first + [late]]
    assert batched == solo
    assert late.stats.extra["mean_batch"] > 1
    assert [h.result().text for h in first + [late]] == [r.text for r in solo_results]


def test_prompts_file_resume_refuses_rows_made_with_other_options(tmp_path, capsys):
    from mlotspark.cli.batch import run_prompts_file

    engine = tiny_engine()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("abc\nhello\nxyz\n")
    out = tmp_path / "out.jsonl"
    try:
        assert run_prompts_file(engine, prompts, out, raw=True, options={"max_tokens": 4}, progress=False) == 3
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert all(r["settings"]["options"] == {"max_tokens": 4} for r in rows)
        capsys.readouterr()
        # Same settings: everything is skipped, and it says so.
        assert run_prompts_file(engine, prompts, out, raw=True, options={"max_tokens": 4}, progress=False) == 0
        assert "3 rows already in" in capsys.readouterr().err
        # Other settings: refused with the count, the difference and the way out; nothing changes.
        kept = out.read_text()
        with pytest.raises(OptionError, match=r"3 of 3 finished rows .* max_tokens 4 -> 2.*--redo"):
            run_prompts_file(engine, prompts, out, raw=True, options={"max_tokens": 2}, progress=False)
        assert out.read_text() == kept
        assert run_prompts_file(engine, prompts, out, raw=True, options={"max_tokens": 2}, progress=False,
                                redo=True) == 3
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(rows) == 3 and all(r["settings"]["options"] == {"max_tokens": 2} for r in rows)
    finally:
        engine.close()


def test_prompts_file_resume_refuses_rows_made_with_other_cascade_flags(tmp_path):
    """``generate --prompts`` with ``--window 64``, rerun with ``--window 128`` (or with
    ``--cascade auto --window 64``): the rows were skipped as made "with the same settings"
    (the cascade flags were not stored)."""
    from mlotspark.cli.batch import run_prompts_file

    engine = tiny_engine()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("abc\nhello\n")
    out = tmp_path / "out.jsonl"
    run = functools.partial(run_prompts_file, engine, prompts, out, raw=True, options={"max_tokens": 2},
                            progress=False)
    on64 = {"cascade": {"window": 64}}  # as cli.common.cascade_kwargs makes them
    try:
        assert run(cascade=on64) == 2
        assert json.loads(out.read_text().splitlines()[0])["settings"]["cascade"] == {"window": 64}
        assert run(cascade=on64) == 0
        for other in ({"cascade": {"window": 128}}, {"cascade": "auto"},
                      {"cascade": "auto", "cascade_settings": {"window": 64}}):  # --cascade auto --window 64
            with pytest.raises(OptionError, match=r"2 of 2 finished rows .* cascade \{'window': 64\} -> "):
                run(cascade=other)
        assert run(cascade={"cascade": "auto", "cascade_settings": {"window": 64}}, redo=True) == 2
        with pytest.raises(OptionError, match=r"cascade_settings \{'window': 64\} -> None"):
            run(cascade={"cascade": "auto"})
        assert run(cascade={"cascade": "auto"}, redo=True) == 2
        assert "cascade" not in json.loads(out.read_text().splitlines()[0])["settings"]  # files made before stay valid
        # --weights likewise: rows made with quantized weights are not float32's
        assert run(weights="quantized", redo=True) == 2
        assert run(weights="quantized") == 0
        with pytest.raises(OptionError, match=r"2 of 2 finished rows .* weights 'quantized' -> None"):
            run(weights="auto")
    finally:
        engine.close()


@pytest.mark.parametrize("pipelined", [False, True], ids=["collect-then-launch", "pipelined"])
def test_step_order_keeps_the_tokens_and_only_pipelining_pays_a_step_past_the_end(pipelined):
    engine = tiny_engine()
    solo = engine.submit(prompt_ids=PROMPTS[1], max_tokens=6).result().tokens
    engine.scheduler.pipelined = pipelined  # None (the default) = pipelined on a GPU only
    batch = engine.scheduler._batch
    launches = []
    launch = batch.launch
    batch.launch = lambda seqs: launches.append(len(seqs)) or launch(seqs)
    assert engine.submit(prompt_ids=PROMPTS[1], max_tokens=6).result().tokens == solo
    # Six tokens take six steps; the pipelined order launches one more that nobody reads.
    assert len(launches) == (7 if pipelined else 6)

# Past 500 lines on purpose: one file for the conversation API's fixtures (engine, homes, snapshots) and every test that shares them.
"""Conversations: the API, snapshots across restarts, refusals, prefix cache, semantic
memory in turns, budgets and stats, and two processes sharing one home."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mlotspark  # noqa: F401
from mlotspark.errors import OptionError
from mlotspark.memory.snapshots import SnapshotWarning

from persist_helpers import engines, tiny_dirs, tiny_loaded, tiny_loaded_other  # noqa: F401  (fixtures)

OPTS = dict(temperature=0.0, max_tokens=6)


def conv_dir(home: Path, name: str) -> Path:
    return home / "conversations" / name


def cold_reply(engine, conv, text: str, **opts):
    """The same turn without any cache: the whole rendered prompt prefilled."""
    return engine.generate(conv.render(text), **{**OPTS, **opts})


# ------------------------------------------------------------------------ API
def test_conversation_api_and_listing(engines, tiny_loaded, _isolated_home):
    e = engines(tiny_loaded)
    c = e.conversation("notes")
    assert c.messages == [] and c.system == ""  # the model's template default, as generate uses
    r = c.send("Hello there.", **OPTS)
    assert r.stats.generation_tokens >= 1
    pieces = list(c.stream("And again.", **OPTS))
    stats = pieces.pop()
    assert "".join(pieces) == c.messages[-1]["content"] and stats.extra["conversation"] == "notes"
    assert [m["role"] for m in c.messages] == ["user", "assistant"] * 2
    assert c.messages[0]["content"] == "Hello there."
    c.system = "You answer in French."
    assert e.conversation("notes").system == "You answer in French."
    e.conversation("other", system="Be brief.").send("Hi.", **OPTS)
    listed = e.conversations()
    assert [i.name for i in listed] == ["other", "notes"]
    info = listed[1]
    assert (info.title, info.turns) == ("Hello there.", 2) and info.tokens > 0
    c.reset()
    assert c.messages == [] and c.system == "You answer in French."
    assert not (conv_dir(_isolated_home, "notes") / "snapshot" / "snapshot.json").exists()
    c.delete()
    assert not conv_dir(_isolated_home, "notes").exists()
    assert [i.name for i in e.conversations()] == ["other"]


def test_tool_approvals_are_kept_with_the_conversation_across_a_restart(engines, tiny_loaded, _isolated_home):
    from mlotspark import Approval
    from mlotspark.results import ToolCall

    e = engines(tiny_loaded)
    c = e.conversation("tools")
    asked: list[str] = []
    answers = {"get_time": "always", "rm": "never", "echo": "once"}
    approval = Approval(lambda call: asked.append(call.name) or answers[call.name],
                        remembered=c.tool_approvals, remember=c.remember_tool)
    assert [approval.allows(ToolCall(f"call_{n}", n, {})) for n in ("get_time", "rm", "echo")] == [True, False, True]
    assert c.tool_approvals == {"get_time": "always", "rm": "never"}  # "once" is not a standing answer
    again = engines(tiny_loaded).conversation("tools")  # a new engine: read from disk
    assert again.tool_approvals == {"get_time": "always", "rm": "never"}
    reopened = Approval(lambda call: asked.append(call.name) or "once", remembered=again.tool_approvals)
    assert [reopened.allows(ToolCall(f"call_{n}", n, {})) for n in ("get_time", "rm", "echo")] == [True, False, True]
    assert asked == ["get_time", "rm", "echo", "echo"]  # only the call with no standing answer asked again
    with pytest.raises(OptionError, match="invalid tool approval 'x': 'once'"):
        again.remember_tool("x", "once")
    again.reset()
    assert again.tool_approvals == {} and e.conversation("tools").tool_approvals == {}
    path = conv_dir(_isolated_home, "tools") / "conversation.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "tool_approvals": {"rm": "sometimes", "ls": "never"}}))
    assert engines(tiny_loaded).conversation("tools").tool_approvals == {"ls": "never"}  # no answer: asked again
    path.write_text(json.dumps({**doc, "tool_approvals": None}))
    assert engines(tiny_loaded).conversation("tools").tool_approvals == {}


def test_private_files_and_names_that_cannot_escape(engines, tiny_loaded, _isolated_home):
    e = engines(tiny_loaded)
    e.conversation("safe").send("Hi.", **OPTS)
    for bad in ["../escape", "/etc/passwd", ".hidden", "a/b", "..", "", "x" * 200, "tab\there"]:
        with pytest.raises(OptionError, match="conversation name"):
            e.conversation(bad)
    # a message no encoder can take is refused before the turn starts, the history untouched
    for text in ("hi \ud800", "\udfff"):
        with pytest.raises(OptionError, match="lone surrogate"):
            e.conversation("safe").send(text, **OPTS)
    assert len(e.conversation("safe").messages) == 2
    for path in _isolated_home.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), path


# ------------------------------------------------------------------ snapshots
def test_next_turn_prefills_only_new_tokens_also_after_restart(engines, tiny_loaded):
    e1 = engines(tiny_loaded)
    c = e1.conversation("chat")
    c.send("Tell me about the sea.", **OPTS)
    after1 = c.info().tokens
    r2 = c.send("And the mountains?", **OPTS)
    assert r2.stats.extra["cache_source"] == "warm"
    assert r2.stats.cached_tokens == after1
    assert r2.stats.prefilled_tokens == r2.stats.prompt_tokens - after1
    after2 = c.info().tokens
    # A new engine: nothing in memory, everything from disk.
    e2 = engines(tiny_loaded)
    c2 = e2.conversation("chat")
    text = "What about rivers?"
    cold = cold_reply(e2, c2, text)
    r3 = c2.send(text, **OPTS)
    assert r3.stats.extra["cache_source"] == "snapshot"
    assert r3.stats.cached_tokens == after2
    assert r3.stats.prefilled_tokens == cold.stats.prompt_tokens - after2
    assert r3.tokens == cold.tokens
    assert e2.persistence.stats()["episodic"]["restored"] == 1


def test_a_reply_cut_by_a_stop_string_trims_the_cache_to_the_common_prefix(engines, tiny_loaded):
    e = engines(tiny_loaded)
    c = e.conversation("cut")
    first = c.send("Say something.", max_tokens=12, temperature=0.0)
    # A stop string across the first two tokens: the cut lands inside the fed tokens.
    k = len(e.tokenizer.decode(first.tokens[:1]))
    stop = first.text[k - 1 : k + 1]
    if len(first.tokens) < 3 or len(stop) < 2 or stop in first.text[:k]:
        pytest.skip("the tiny model's reply cannot be cut between its tokens")
    c.reset()
    cut = c.send("Say something.", max_tokens=12, temperature=0.0, stop=[stop])
    assert cut.stats.finish_reason == "stop" and cut.text == first.text[: k - 1]
    fed = c.info().tokens
    cold = cold_reply(e, c, "Go on.")
    r = c.send("Go on.", **OPTS)
    assert r.stats.extra["cache_source"] == "warm"
    assert r.stats.cached_tokens < fed  # the tokens after the cut were trimmed
    assert r.tokens == cold.tokens


@pytest.mark.parametrize("damage", ["corrupt", "truncated", "bad-json", "other-model"])
def test_unusable_snapshot_warns_and_reprefills_losing_nothing(engines, tiny_loaded, tiny_loaded_other, _isolated_home, damage):
    e1 = engines(tiny_loaded_other if damage == "other-model" else tiny_loaded)
    c = e1.conversation("fragile")
    c.send("First message.", **OPTS)
    c.send("Second message.", **OPTS)
    before = c.messages
    snap = conv_dir(_isolated_home, "fragile") / "snapshot"
    segment = sorted(snap.glob("*.safetensors"))[0]
    if damage == "corrupt":
        data = bytearray(segment.read_bytes())
        data[-20] ^= 0xFF
        segment.write_bytes(bytes(data))
    elif damage == "truncated":
        segment.write_bytes(segment.read_bytes()[: segment.stat().st_size // 2])
    elif damage == "bad-json":
        (snap / "snapshot.json").write_text('{"format": "mlotspark-snapshot", "tok')
    e2 = engines(tiny_loaded)
    c2 = e2.conversation("fragile")
    assert c2.messages == before
    cold = cold_reply(e2, c2, "Third message.")
    with pytest.warns(SnapshotWarning, match="re-prefilling"):
        r = c2.send("Third message.", **OPTS)
    assert r.stats.extra["snapshot_refused"]
    assert r.stats.extra["cache_source"] in ("none", "prefix")
    assert r.stats.prefilled_tokens == cold.stats.prompt_tokens - r.stats.cached_tokens
    assert r.tokens == cold.tokens
    assert c2.messages[:4] == before and len(c2.messages) == 6
    # The snapshot was rewritten whole: the next restart uses it again.
    c3 = engines(tiny_loaded).conversation("fragile")
    assert c3.send("Fourth.", **OPTS).stats.extra["cache_source"] == "snapshot"


# --------------------------------------------------------------- prefix cache
def test_shared_system_prompt_makes_a_new_conversation_a_hit_also_after_restart(engines, tiny_loaded):
    e = engines(tiny_loaded)
    e.persistence.set_budgets(memory=False)  # keep the system message exactly the shared one
    first = e.conversation("one").send("Hi.", **OPTS)
    assert first.stats.extra["cache_source"] == "none"
    system_tokens = len(e.persistence.system_ids(""))
    r = e.conversation("two").send("Hello.", **OPTS)
    assert r.stats.extra["cache_source"] == "prefix"
    assert r.stats.cached_tokens == system_tokens
    e2 = engines(tiny_loaded)
    e2.persistence.set_budgets(memory=False)
    r = e2.conversation("three").send("Hey.", **OPTS)
    assert r.stats.extra["cache_source"] == "prefix"
    stats = e2.persistence.stats()["prefix_cache"]
    assert stats["loaded_from_disk"] == 1 and stats["hits"] == 1 and stats["hit_rate"] == 1.0


# ------------------------------------------------------------ semantic memory
def test_memory_retrieved_into_prompt_and_facts_learned_from_turns(engines, tiny_loaded):
    e = engines(tiny_loaded)
    fact = e.memory.remember("My favourite colour is green.")
    a = e.conversation("a")
    r = a.send("I live in Ghent. Do you like trains?", **OPTS)
    learned = r.stats.extra["memory"]["learned"]
    assert [e.memory.get(i).text for i in learned] == ["I live in Ghent."]
    assert e.memory.get(learned[0]).conversation == "a" and e.memory.get(learned[0]).source == "turn"
    b = e.conversation("b")
    r = b.send("What is my favourite colour?", **OPTS)
    assert r.stats.extra["memory"]["used"] == [fact] == r.stats.extra["memory"]["added"]
    first = b.render()[0]  # no system prompt of its own: the template's default stays
    assert first["role"] == "user" and first["content"].endswith("green. (said today)\n\nWhat is my favourite colour?")
    # A later turn: new entries go in front of that message; entries shown stay shown.
    r = b.send("Where do I live?", **OPTS)
    assert r.stats.extra["memory"]["added"] == [learned[0]]
    assert b.render()[-2]["content"].endswith("- I live in Ghent. (said today)\n\nWhere do I live?")
    assert r.stats.extra["cache_source"] == "warm"  # memory never invalidates earlier turns
    r = b.send("Tell me my favourite colour again.", **OPTS)
    assert fact in r.stats.extra["memory"]["used"] and r.stats.extra["memory"]["added"] == []
    assert r.stats.extra["memory"]["forgotten"] == []
    # An update said as chat: kept as said (which entry is current is decided when a question is asked).
    r = b.send("Moved away from Ghent, I live in Porto now! Anyway, trains.", **OPTS)
    moved = r.stats.extra["memory"]["learned"]
    assert [e.memory.get(i).text for i in moved] == ["Moved away from Ghent, I live in Porto now!"], e.memory.list()
    # A retraction in a turn: the turn says which entry it removed (by id: the text is gone).
    r = b.send("Please forget that I live in Ghent.", **OPTS)
    assert r.stats.extra["memory"]["forgotten"] == [learned[0]] and e.memory.get(learned[0]) is None
    assert r.stats.extra["memory"]["not_remembered"] == 0
    # "Remember that X" keeps X; a reminder is kept as said.
    r = b.send("Remember that my locker is number 12.", **OPTS)
    assert [e.memory.get(i).text for i in r.stats.extra["memory"]["learned"]] == ["my locker is number 12"]


def test_entries_told_over_days_reach_the_prompt_with_their_days(engines, tiny_loaded):
    # The multi-session eval's path: sessions on other days (the store's clock), questions now.
    import datetime

    e = engines(tiny_loaded)
    for day in (3, 7, 12):
        e.memory.clock = lambda day=day: datetime.datetime(2026, 3, day, 12).timestamp()
        r = e.conversation(f"day{day}").send("I baked bread today. Any tips?", **OPTS)
        assert [e.memory.get(i).text for i in r.stats.extra["memory"]["learned"]] == ["I baked bread today."]
    q = e.conversation("questions")
    q.send("How many times did I tell you I baked bread?", **OPTS)
    assert "- I baked bread today. (said 3 times, last 12 March 2026)" in q.render()[0]["content"]


# -------------------------------------------------------------- budgets/stats
def test_budgets_and_stats_per_tier(engines, tiny_loaded, _isolated_home):
    e = engines(tiny_loaded)
    for name in ("x", "y"):
        e.conversation(name).send("Some words here.", **OPTS)
    s = e.persistence.stats()
    assert s["working"]["conversations_warm"] == 2 and s["working"]["bytes"] > 0
    assert s["episodic"]["snapshots"] == 2 and s["episodic"]["bytes"] > 0
    assert {"entries", "bytes", "hit_rate", "evictions", "budget_bytes"} <= set(s["prefix_cache"])
    assert {"entries", "bytes", "hit_rate"} <= set(s["semantic"])
    e.persistence.set_budgets(warm_mb=0)
    e.conversation("z").send("More words.", **OPTS)
    assert e.persistence.stats()["working"]["evictions"] >= 2
    r = e.conversation("x").send("Back again.", **OPTS)
    assert r.stats.extra["cache_source"] == "snapshot"  # evicted from memory, restored from disk
    e.persistence.set_budgets(snapshot_disk_mb=0)
    e.conversation("y").send("Last one.", **OPTS)
    s = e.persistence.stats()["episodic"]
    assert s["snapshots"] == 1 and s["evictions"] == 2
    assert len(e.conversation("x").messages) == 4  # messages are never evicted
    with pytest.raises(OptionError, match="warm_mb"):
        e.persistence.set_budgets(warm_mb=-1)
    with pytest.raises(OptionError, match="unknown"):
        e.persistence.set_budgets(colour="blue")


def test_cancel_keeps_the_text_so_far(engines, tiny_loaded):
    c = engines(tiny_loaded).conversation("stop")
    stream = c.stream("Talk for a long time.", temperature=0.0, max_tokens=200)
    next(stream)
    c.cancel()
    stats = list(stream)[-1]
    assert stats.finish_reason == "cancelled"
    assert c.messages[-1]["role"] == "assistant" and c.messages[-1]["finish_reason"] == "cancelled"
    assert c.send("Still there?", **OPTS).stats.generation_tokens >= 1
    # Leaving a stream early stops the reply and stores what was said; the lock is free.
    stream = c.stream("Another long story.", temperature=0.0, max_tokens=200)
    next(stream)
    stream.close()
    assert [m["content"] for m in c.messages].count("Another long story.") == 1
    assert c.send("Short one.", **OPTS).stats.extra["cache_source"] == "warm"
    with pytest.raises(OptionError, match="message"):
        c.send("   ")


# ------------------------------------------------------------- two processes
CHILD = textwrap.dedent(
    """
    import sys
    import mlotspark
    from mlotspark.engine import Engine
    model, who = sys.argv[1], sys.argv[2]
    e = Engine.load(model, temperature=0.0, max_tokens=4)
    c = e.conversation("shared")
    for i in range(3):
        c.send(f"Process {who} says hello number {i}.")
        e.conversation(f"own {who}").send("Hi.")
    e.memory.remember(f"My name is {who}.")
    e.close()
    print("done", flush=True)
    """
)


def test_two_processes_share_one_home(engines, tiny_loaded, tiny_dirs, _isolated_home):
    procs = [
        subprocess.Popen([sys.executable, "-c", CHILD, str(tiny_dirs[0]), who],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for who in ("Anna", "Bert")
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        # Judged by its work, not by an abort during interpreter exit after it.
        assert "done" in out, err
    e = engines(tiny_loaded)
    shared = e.conversation("shared")
    users = [m["content"] for m in shared.messages if m["role"] == "user"]
    for who in ("Anna", "Bert"):
        mine = [u for u in users if who in u]
        assert mine == [f"Process {who} says hello number {i}." for i in range(3)]
    assert [m["role"] for m in shared.messages] == ["user", "assistant"] * 6
    assert {i.name for i in e.conversations()} == {"shared", "own Anna", "own Bert"}
    assert {"My name is Anna.", "My name is Bert."} <= {x.text for x in e.memory.list()}
    doc = json.loads((conv_dir(_isolated_home, "shared") / "conversation.json").read_text())
    assert doc["revision"] == 6
    r = shared.send("Who spoke?", **OPTS)
    assert r.stats.extra["cache_source"] == "snapshot" and r.stats.cached_tokens == shared_tokens(doc)


def shared_tokens(doc: dict) -> int:
    return doc["tokens"]


# ------------------------------------------------------------------------ CLI
def test_memory_cli(capsys, tmp_path):
    from mlotspark.cli.entry import main

    assert main(["memory", "add", "My sister's name is Ilse."]) == 0
    assert main(["memory", "add", "I live in Ghent."]) == 0
    capsys.readouterr()
    assert main(["memory", "search", "sister", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert hits[0]["text"] == "My sister's name is Ilse."
    out = tmp_path / "mem.json"
    assert main(["memory", "export", str(out)]) == 0
    assert main(["memory", "forget", str(hits[0]["id"])]) == 0
    assert main(["memory", "forget", "999"]) == 2
    assert "999" in capsys.readouterr().err
    assert main(["memory", "search", "  "]) == 2
    assert "invalid query '  '" in capsys.readouterr().err
    assert main(["memory", "export", ""]) == 2 and "invalid file ''" in capsys.readouterr().err
    assert main(["memory", "add", "Line one.\nLine two: my dentist is Dr Vos."]) == 0
    capsys.readouterr()
    assert main(["memory", "list"]) == 0  # one row an entry, its id first
    rows = capsys.readouterr().out.splitlines()
    assert any("Line one. ⏎ Line two" in r for r in rows) and all(r.split()[0].isdigit() for r in rows)
    assert main(["memory", "forget", rows[0].split()[0]]) == 0
    with pytest.raises(SystemExit):  # past int64: the range it may take, starting at 1 (it had said 0)
        main(["memory", "search", "x", "-k", "99999999999999999999"])
    assert "must be from 1 to 9223372036854775807" in capsys.readouterr().err
    assert main(["memory", "import", str(out)]) == 0
    assert main(["memory", "list", "--json"]) == 0
    texts = [x["text"] for x in json.loads(capsys.readouterr().out.split("\n", 1)[1])]
    assert sorted(texts) == ["I live in Ghent.", "My sister's name is Ilse."]


def test_memory_export_and_import_through_a_pipe(capsys, monkeypatch):
    """``-`` is stdout / stdin: ``mlotspark memory export - | ssh other mlotspark memory import -``."""
    import io

    from mlotspark.cli.entry import main

    assert main(["memory", "add", "My sister's name is Ilse."]) == 0
    capsys.readouterr()
    assert main(["memory", "export", "-"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)  # stdout holds the document alone
    assert "1 entries written to stdout" in err
    assert main(["memory", "forget", "1"]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(doc)))
    capsys.readouterr()
    assert main(["memory", "import", "-"]) == 0
    assert "1 entries added from stdin" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("not json"))
    assert main(["memory", "import", "-"]) != 0
    err = capsys.readouterr().err
    assert "cannot read stdin" in err and "mlotspark-memory-" not in err


# ----------------------------------------------------------------- real model
@pytest.fixture(scope="module")
def real_loaded(default_gguf):
    from mlotspark.models import loader
    from mlotspark.models.hub.catalogue import ModelSource

    return loader.load(ModelSource("smollm2-135m-instruct", "gguf", default_gguf))


@pytest.mark.slow
def test_real_model_restart_same_greedy_reply_prefilling_only_new_tokens(engines, real_loaded):
    c = engines(real_loaded).conversation("real")
    c.send("What is the capital of France?", temperature=0.0, max_tokens=8)
    held = c.info().tokens
    e2 = engines(real_loaded)
    c2 = e2.conversation("real")
    text = "And of Germany?"
    cold = e2.generate(c2.render(text), temperature=0.0, max_tokens=8)
    r = c2.send(text, temperature=0.0, max_tokens=8)
    assert r.stats.extra["cache_source"] == "snapshot"
    assert r.stats.cached_tokens == held
    assert r.stats.prefilled_tokens == cold.stats.prompt_tokens - held
    assert r.text == cold.text and r.tokens == cold.tokens


@pytest.mark.slow
def test_real_model_remembers_a_fact_across_conversations(engines, real_loaded):
    e = engines(real_loaded)
    e.conversation("A").send("My sister's name is Ilse.", temperature=0.0, max_tokens=4)
    fact = [x for x in e.memory.list() if x.text == "My sister's name is Ilse."]
    assert fact and fact[0].conversation == "A"
    r = e.conversation("B").send("What is my sister's name?", temperature=0.0, max_tokens=10)
    assert fact[0].id in r.stats.extra["memory"]["used"]
    assert "Ilse" in r.text


def test_a_cache_that_cannot_be_trimmed_falls_back_to_a_full_prefill(engines, tiny_loaded, monkeypatch):
    """A cascade cache may refuse to trim; the turn then re-prefills instead of failing."""
    from mlotspark.caches.kv import KVCache

    e = engines(tiny_loaded)
    e.persistence.set_budgets(prefix_cache_mb=0)
    c = e.conversation("rigid")
    c.send("Hello.", **OPTS)
    monkeypatch.setattr(KVCache, "is_trimmable", lambda self: False)
    c.system = "You are terse."  # the cached prefix now ends inside the system message
    cold = cold_reply(e, c, "Hi again.")
    r = c.send("Hi again.", **OPTS)
    assert r.stats.extra["cache_source"] == "none"
    assert r.stats.prefilled_tokens == cold.stats.prompt_tokens
    assert r.tokens == cold.tokens


# ---------------------------------------------------------- past the context
def test_a_conversation_passing_the_context_switches_to_the_cascade(engines, tiny_loaded):
    """A conversation that began on a plain KV cache moves to the memory cascade once a
    turn (prompt + max_tokens) passes the model's context, instead of failing there;
    the turns after it continue from the cascade, also after a restart."""
    import dataclasses

    small = dataclasses.replace(tiny_loaded, context_length=256)
    e = engines(small)
    e.persistence.set_budgets(prefix_cache_mb=0)
    c = e.conversation("long")
    first = c.send("Hello.", **OPTS)
    text = "Tell me more about the harbour and its ships. " * 12  # ~120 tokens a turn
    second = c.send(text, **OPTS)
    assert "cascade" not in (first.stats.extra["cache"]["kind"], second.stats.extra["cache"]["kind"])
    third = c.send(text, **OPTS)  # prompt + max_tokens pass the 256-token context now
    assert third.stats.extra["cache"]["kind"] == "cascade"
    assert "256-token context" in third.stats.extra["cache_switch"]
    assert third.stats.extra["cache_source"] == "none"  # the plain KV cannot be carried over
    assert c.messages[-1]["content"] == third.text
    fourth = c.send("And then?", **OPTS)
    assert fourth.stats.extra["cache"]["kind"] == "cascade" and fourth.stats.extra["cache_source"] == "warm"
    again = engines(small).conversation("long").send("And now?", **OPTS)  # a restart
    assert again.stats.extra["cache_source"] == "snapshot" and "snapshot_refused" not in again.stats.extra


def test_a_turn_back_under_the_context_says_the_conversation_leaves_the_cascade(engines, tiny_loaded):
    """A turn can go back under the context after one past it (a long max_tokens, then a
    short one); the note said "pass the context ... moves from its KV cache to the memory
    cascade" both ways. Here a larger context brings the second turn back under it."""
    import dataclasses

    first = engines(dataclasses.replace(tiny_loaded, context_length=256))
    first.persistence.set_budgets(prefix_cache_mb=0, memory=False, learn=False)
    long = first.conversation("flip").send("Hello.", temperature=0.0, max_tokens=250)
    assert long.stats.extra["cache"]["kind"] == "cascade"
    wide = engines(dataclasses.replace(tiny_loaded, context_length=1024))
    wide.persistence.set_budgets(prefix_cache_mb=0, memory=False, learn=False)
    back = wide.conversation("flip").send("Hi.", **OPTS)
    assert back.stats.extra["cache"]["kind"] != "cascade"
    assert "fit the model's 1024-token context: the conversation moves from the memory cascade to a KV cache" in (
        back.stats.extra["cache_switch"])



def test_a_conversation_past_the_context_without_the_cascade_is_refused_in_one_line(engines, tiny_loaded):
    import dataclasses

    from mlotspark.errors import PromptTooLongError

    e = engines(dataclasses.replace(tiny_loaded, context_length=256))
    e.caches.cascade = None  # --no-cascade
    c = e.conversation("short")
    c.send("Hello.", **OPTS)
    with pytest.raises(PromptTooLongError, match="256"):
        c.send("Tell me more about the harbour and its ships. " * 30, **OPTS)


def test_a_conversation_turn_runs_the_question_pass(engines, tiny_loaded):
    """A turn long enough to leave more blocks than top_k behind the window: the
    conversation's request runs the cascade's question pass (the runtime's lifecycle step
    after prefill), as a single request does."""
    from mlotspark.memory.cascade import CascadeConfig

    e = engines(tiny_loaded)
    e.persistence.set_budgets(prefix_cache_mb=0, memory=False, learn=False)
    e.caches.cascade = CascadeConfig.for_model(tiny_loaded.context_length, window=32, sinks=4, block_size=8, top_k=2,
                                        chunk=16, question_pass=8)
    c = e.conversation("question")
    turn = c.send("Tell me more about the harbour and its ships. " * 8, **OPTS)
    assert turn.stats.extra["cascade"]["question_passes"] == 1
    # Each prompt its own pass; the count is the conversation's caches' (they carry over).
    assert c.send("And then?", **OPTS).stats.extra["cascade"]["question_passes"] == 2


def test_a_kept_cascade_continues_with_the_engines_cascade_config(engines, tiny_loaded):
    """A conversation kept on the cascade, continued by an engine with another cascade
    config (a restart with another window or top_k, or ``engine.caches.cascade`` changed), runs
    with that config from its snapshot; it ran with the saved one before, silently. One
    whose sinks differ cannot continue: it is re-prefilled, with one warning."""
    from mlotspark.memory.cascade import CascadeConfig

    def engine(**fields):
        e = engines(tiny_loaded)
        e.persistence.set_budgets(prefix_cache_mb=0, memory=False, learn=False)
        e.caches.cascade = CascadeConfig.for_model(tiny_loaded.context_length,
                                            **{**dict(window=32, sinks=4, block_size=8, top_k=2), **fields})
        return e

    def config(result) -> dict:
        return result.stats.extra["cascade"]["config"]

    first = engine().conversation("cfg").send("Tell me more about the harbour and its ships. " * 6, **OPTS)
    assert config(first)["window"] == 32
    wider = engine(window=64, top_k=3)
    second = wider.conversation("cfg").send("And then?", **OPTS)
    assert second.stats.extra["cache_source"] == "snapshot"
    assert (config(second)["window"], config(second)["top_k"]) == (64, 3)
    wider.caches.cascade = CascadeConfig.for_model(tiny_loaded.context_length, window=48, sinks=4, block_size=8, top_k=2)
    third = wider.conversation("cfg").send("And then?", **OPTS)  # the warm cache has the old config
    assert third.stats.extra["cache_source"] == "snapshot" and config(third)["window"] == 48
    with pytest.warns(SnapshotWarning, match="sinks"):
        fourth = engine(sinks=8).conversation("cfg").send("And now?", **OPTS)
    assert fourth.stats.extra["cache_source"] == "none" and config(fourth)["sinks"] == 8


def test_a_tool_result_turn_is_stored_as_tool_and_neither_recalls_nor_learns(engines, tiny_loaded):
    e = engines(tiny_loaded)
    e.memory.remember("My favourite colour is green.")
    c = e.conversation("tools")
    c.send("What colour do I like?", **OPTS)
    r = c.send("I live in Ghent. My favourite colour is green.", role="tool", **OPTS)  # a tool said it, not the user
    assert [m["role"] for m in c.messages] == ["user", "assistant", "tool", "assistant"]
    assert r.stats.extra["memory"]["used"] == [] and r.stats.extra["memory"]["learned"] == []
    assert c.render()[-2] == {"role": "tool", "content": "I live in Ghent. My favourite colour is green."}
    assert e.conversation("tools").info().title == "What colour do I like?"
    with pytest.raises(OptionError, match="invalid turn role 'system'"):
        c.send("x", role="system", **OPTS)

# Past 500 lines on purpose: the store, its search and its safety rules share one temporary store fixture.
"""Semantic memory: the SQLite store, its search, its safety rules, and fact extraction."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from mlotspark.errors import OptionError, StoreError
from mlotspark.memory.semantic import (
    DEFAULT_THRESHOLD,
    MEMORY_HEADER,
    SCHEMA_VERSION,
    Embedder,
    HashingEmbedder,
    SemanticStore,
    learn_turn,
    format_memory_section,
)

SISTER = "My sister's name is Ilse."
UNRELATED = [
    "My brother's name is Tom.",
    "My name is Anna.",
    "I live in Ghent.",
    "I prefer tea over coffee.",
    "I am allergic to nuts.",
    "I work as a nurse at the hospital.",
    "My dog is called Rex.",
    "I was born in 1985.",
    "I drive a blue Volvo.",
    "The office closes at 6 pm on Fridays.",
    "I speak Dutch and French.",
    "My favourite colour is green.",
    "I play the cello in an orchestra.",
    "I have two children.",
    "My wife works at a bank.",
    "I run every morning before work.",
    "I don't like horror movies.",
    "My birthday is on May 3.",
    "I grew up on a farm.",
    "I support Club Brugge.",
]


@pytest.fixture
def store(tmp_path):
    with SemanticStore(tmp_path / "mem" / "semantic.db") as s:
        yield s


@pytest.fixture
def filled(store):
    for text in UNRELATED[:10]:
        store.remember(text)
    store.remember(SISTER, conversation="A")
    for text in UNRELATED[10:]:
        store.remember(text)
    return store


def _raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path)


# -- search ---------------------------------------------------------------------------


def test_fact_from_one_conversation_is_top_hit_for_the_question(filled):
    hits = filled.search("What is my sister's name?")
    assert hits[0].text == SISTER
    assert hits[0].entry.conversation == "A"
    assert hits[0].score >= DEFAULT_THRESHOLD > hits[1].score
    chosen = filled.retrieve_for_prompt("What is my sister's name?")
    assert [h.text for h in chosen] == [SISTER]
    section = format_memory_section(chosen)
    assert section == f"{MEMORY_HEADER}\n- {SISTER} (said today)"
    assert filled.stats()["last_retrieval"] == [chosen[0].id]


def test_other_facts_are_found_by_their_own_questions(filled):
    assert filled.search("Where do I live?")[0].text == "I live in Ghent."
    assert filled.search("who is my brother")[0].text == "My brother's name is Tom."
    # Small talk retrieves nothing into the prompt.
    assert filled.retrieve_for_prompt("hi") == []
    assert filled.retrieve_for_prompt("What's the weather like today?") == []


@pytest.mark.parametrize(
    "query",
    [
        'what is "my sister',
        "sister*",
        "name AND sister",
        "sister OR NOT name",
        "(sister) NEAR(name ilse)",
        "text:ilse ^name",
        '"""',
        "***",
        "AND OR NOT",
        "()",
        "___ - + : ; ' \\",
        "",
        "   ",
        "ilse\x00sister",
    ],
)
def test_queries_with_fts_syntax_do_not_raise(filled, query):
    hits = filled.search(query)
    if "ilse" in query.lower() or "sister" in query.lower():
        assert hits and hits[0].text == SISTER


def test_top_k_and_threshold(filled):
    assert len(filled.search("my name", k=2)) == 2
    assert filled.search("my name", k=0) == []
    hits = filled.search("my name", k=20, threshold=0.3)
    assert hits and all(h.score >= 0.3 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert len(filled.search("my name", k=20, threshold=0.0)) > len(hits)
    assert filled.retrieve_for_prompt("my name", top_k=1) == filled.search("my name", k=1, threshold=DEFAULT_THRESHOLD)


def test_token_budget_bounds_the_whole_section(store):
    # Five facts of one kind that stay apart (no newer one takes an older one's place here).
    store.calibration = dataclasses.replace(store.calibration, newer_gap=-1.0)
    for i, pet in enumerate(["cat", "dog", "parrot", "hamster", "goldfish"]):
        store.remember(f"My sister Ilse has a {pet} called Pet{i} that she adopted " + "long ago " * i)

    def count(text: str) -> int:  # one token per word, a stand-in for the tokenizer
        return len(text.split())

    everything = store.retrieve_for_prompt("my sister Ilse", top_k=5, token_budget=1000, count_tokens=count)
    assert len(everything) == 5
    for budget in (30, 45, 60):
        hits = store.retrieve_for_prompt("my sister Ilse", top_k=5, token_budget=budget, count_tokens=count)
        assert hits, budget
        assert count(format_memory_section(hits)) <= budget
        assert len(hits) < 5
        assert store.stats()["last_retrieval"] == [h.id for h in hits]
    # Not even the header fits: nothing is injected.
    assert store.retrieve_for_prompt("my sister Ilse", token_budget=3, count_tokens=count) == []
    assert store.stats()["last_retrieval"] == []


def test_stats_count_searches_and_hits(filled):
    filled.search("What is my sister's name?")
    filled.retrieve_for_prompt("hello there")
    stats = filled.stats()
    assert stats["entries"] == 21
    assert stats["searches"] == 2 and stats["hits"] == 1 and stats["hit_rate"] == 0.5
    assert stats["bytes"] > 0 and stats["embedder"] == HashingEmbedder().name
    assert stats["stale_vectors"] == 0


# -- writing -----------------------------------------------------------------------------


def test_forget_removes_entry_from_search_and_fts(filled):
    entry_id = filled.search("sister")[0].id
    assert filled.forget(entry_id) is True
    assert filled.get(entry_id) is None
    assert all(h.text != SISTER for h in filled.search("What is my sister's name? Ilse", k=30))
    assert filled.forget(entry_id) is False
    with _raw(filled.path) as raw:
        assert raw.execute("SELECT rowid FROM entries_fts WHERE entries_fts MATCH 'ilse'").fetchall() == []
        assert raw.execute("SELECT count(*) FROM vectors WHERE entry_id = ?", (entry_id,)).fetchone()[0] == 0
        raw.execute("INSERT INTO entries_fts(entries_fts) VALUES ('integrity-check')")
    # Ids are never reused, so a turn's stats never point at a different fact.
    assert filled.remember("A brand new fact about my garden.") > entry_id


def test_dedupe_returns_existing_id(store):
    first = store.remember("I am allergic to nuts.")
    assert store.remember("i am allergic to nuts") == first
    assert store.remember("  I AM ALLERGIC TO NUTS!!  ") == first
    assert store.remember("I’m allergic to nuts.") == first  # near duplicate: same content words
    assert store.remember("I like tea.") != store.remember("I don't like tea.")
    assert store.remember("I am 34 years old.") != store.remember("I am 43 years old.")
    assert store.remember("My sister's name is Ilse.") != store.remember("My sister's name is Ilsa.")
    assert len(store) == 7
    assert store.stats()["deduplicated"] == 3
    # A user's audit: symbols carry meaning, and texts with no word shared are no near duplicates
    # (an encoder maps emoji, or two long unknown words, alike)
    ids = [store.remember(t) for t in ("😀😀😀", "🐱", "I like 🍣", "I like 🍕", "z" * 1999, "y" * 1999)]
    assert len(set(ids)) == 6 and store.remember("i like 🍣!") == ids[2]
    # NUL and other control characters are no part of a fact (they were stored verbatim)
    pin = store.remember("My PIN is \x00 1234.\x07")
    assert store.get(pin).text == "My PIN is   1234."
    with pytest.raises(OptionError, match="non-empty"):
        store.remember("\x00\x00")


def test_export_writes_through_a_link_a_pipe_and_a_device(store, tmp_path):
    # A user's audit: export replaced whatever was at the path by rename, so a FIFO's reader got
    # nothing and /dev/full (as root, /dev/null too) became a regular file.
    import os
    import stat
    import threading

    store.remember("I live in Ghent.")
    real = tmp_path / "real.json"
    real.write_text("[]")
    (tmp_path / "link.json").symlink_to(real)
    assert store.export_json(tmp_path / "link.json") == 1
    assert (tmp_path / "link.json").is_symlink() and "Ghent" in real.read_text()
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()), daemon=True)
    reader.start()
    assert store.export_json(fifo) == 1
    reader.join(10)
    assert "Ghent" in got[0] and stat.S_ISFIFO(fifo.stat().st_mode)
    if Path("/dev/null").exists() and stat.S_ISCHR(os.stat("/dev/null").st_mode):
        assert store.export_json(Path("/dev/null")) == 1
        assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    if Path("/dev/full").exists():  # Linux: a full disk is a one-line error
        with pytest.raises(StoreError, match="cannot write /dev/full"):
            store.export_json(Path("/dev/full"))


def test_near_duplicates_need_a_shared_word_and_the_same_symbols(tmp_path):
    class Same:  # one vector for every text, as an encoder gives unknown tokens alike
        name, dim = "same", 4

        def embed(self, texts):
            return np.ones((len(texts), 4), np.float32) / 2

    with SemanticStore(tmp_path / "m.db", Same()) as s:
        first = s.remember("I like sushi 🍣.")
        assert s.remember("I really like sushi 🍣") == first  # same words, same symbol: a near duplicate
        assert s.remember("I like sushi 🍕.") != first
        assert s.remember("z" * 1999) != s.remember("y" * 1999)


def test_remember_keeps_source_conversation_and_meta(store):
    entry_id = store.remember("I live in Ghent.", source="turn", conversation="chat 1", meta={"turn": 3})
    entry = store.get(entry_id)
    assert (entry.text, entry.source, entry.conversation, entry.meta) == ("I live in Ghent.", "turn", "chat 1", {"turn": 3})
    assert [e.id for e in store.list()] == [entry_id]
    second = store.remember("I speak Dutch.")
    assert [e.id for e in store.list()] == [second, entry_id]
    assert [e.id for e in store.list(limit=1)] == [second]


@pytest.mark.parametrize(
    "call, bad",
    [
        (lambda s: s.remember(""), "''"),
        (lambda s: s.remember(None), "None"),
        (lambda s: s.remember("x" * 5000), "5000"),
        (lambda s: s.remember("I live here", meta={"a": object()}), "meta"),
        (lambda s: s.remember("I live here", source=""), "''"),
        (lambda s: s.search("x", k=-1), "-1"),
        (lambda s: s.search("x", threshold=1.5), "1.5"),
        (lambda s: s.search(42), "42"),
        (lambda s: s.forget("7"), "'7'"),
        (lambda s: s.list(limit=-2), "-2"),
        (lambda s: s.retrieve_for_prompt("x", token_budget=-5), "-5"),
    ],
)
def test_bad_arguments_name_the_value(store, call, bad):
    store.remember("I live in Ghent.")
    with pytest.raises(OptionError, match=bad.replace("(", r"\(")):
        call(store)
    assert [e.text for e in store.list()] == ["I live in Ghent."]


def test_closed_store_refuses_use(tmp_path):
    s = SemanticStore(tmp_path / "m.db")
    s.close()
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.remember("I live in Ghent.")


def test_two_store_objects_see_each_others_writes(tmp_path):
    with SemanticStore(tmp_path / "m.db") as a, SemanticStore(tmp_path / "m.db") as b:
        a.search("anything")
        entry_id = b.remember(SISTER)
        assert a.search("my sister's name")[0].id == entry_id
        assert a.remember("my sister's name is ilse") == entry_id
        b.forget(entry_id)
        assert a.search("my sister's name") == []


# -- export / import ------------------------------------------------------------------------


def test_export_import_round_trip(filled, tmp_path):
    out = tmp_path / "export" / "memory.json"
    assert filled.export_json(out) == 21
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    doc = json.loads(out.read_text())
    assert doc["format"] == "mlotspark-semantic-memory" and len(doc["entries"]) == 21

    with SemanticStore(tmp_path / "fresh.db") as fresh:
        assert fresh.import_json(out) == 21
        assert fresh.import_json(out) == 0  # dedupes
        key = lambda e: (e.text, e.source, e.conversation, e.meta, e.created)  # noqa: E731
        assert sorted(map(key, fresh.list())) == sorted(map(key, filled.list()))
        assert fresh.search("What is my sister's name?")[0].text == SISTER


def test_import_accepts_strings_and_rejects_bad_files_whole(store, tmp_path):
    good = tmp_path / "list.json"
    good.write_text(json.dumps(["I live in Ghent.", "I live in Ghent", "I speak Dutch."]))
    assert store.import_json(good) == 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"entries": [{"text": "I own a boat."}, {"text": 17}]}))
    with pytest.raises(StoreError, match=r"entries\[1\].*17"):
        store.import_json(bad)
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(StoreError, match="junk.json"):
        store.import_json(tmp_path / "junk.json")
    with pytest.raises(StoreError, match="missing.json"):
        store.import_json(tmp_path / "missing.json")
    with pytest.raises(OptionError, match="own file"):
        store.export_json(store.path)
    # A user's audit: a time no calendar shows made every later `memory list` fail; JSON nested
    # 100,000 deep raised RecursionError instead of this one-line error.
    for created in (1e308, -1e12):
        bad.write_text(json.dumps({"entries": [{"text": "I own a boat.", "created": created}]}))
        with pytest.raises(StoreError, match=r"entries\[0\].*between 1900 and 9999"):
            store.import_json(bad)
    loop = [{"id": 1, "text": "I live in Ghent.", "superseded_by": 2}, {"id": 2, "text": "I live in Lyon.", "superseded_by": 1}]
    bad.write_text(json.dumps({"entries": loop}))
    with pytest.raises(StoreError, match="superseded in a loop"):
        store.import_json(bad)
    for query in ("\ud800", "hi \udfff"):  # a lone surrogate reached a sentence embedder's tokenizer (TypeError)
        with pytest.raises(OptionError, match="lone surrogate"):
            store.search(query)
        with pytest.raises(OptionError, match="lone surrogate"):
            store.retrieve_for_prompt(query)
    bad.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StoreError, match="nested too deeply"):
        store.import_json(bad)
    assert sorted(e.text for e in store.list()) == ["I live in Ghent.", "I speak Dutch."]


def test_a_long_import_and_a_reembed_report_their_progress(store, tmp_path):
    """1,000 entries take minutes with a sentence embedder: the steps say how far they are."""
    from mlotspark import steps

    (tmp_path / "many.json").write_text(json.dumps([f"Item {i} is kept in drawer {i}." for i in range(200)]))
    events: list = []
    stop = steps.listen(events.append)
    try:
        assert store.import_json(tmp_path / "many.json") == 200
        with SemanticStore(store.path, HashingEmbedder(dim=256)) as other:  # another embedder: re-embeds all
            assert other.stats()["stale_vectors"] == 0
    finally:
        stop()
    last = {e.name: e for e in events}
    for name in ("embedding 200 entries from many.json", "adding 200 entries from many.json",
                 "re-embedding 200 memory entries with hashing-v1-256"):
        assert last[name].finished and last[name].done == last[name].total == 200, name
    assert sum(e.name.startswith("adding") and not e.finished for e in events) > 2  # it moves as it goes


# -- files and safety -----------------------------------------------------------------------------


def test_default_location_and_private_permissions(_isolated_home):
    old = os.umask(0o022)  # the usual umask would leave new files world-readable
    try:
        with SemanticStore() as s:
            s.remember(SISTER)
            assert s.path == _isolated_home / "memory" / "semantic.db"
            for suffix in ("", "-wal", "-shm"):
                f = Path(str(s.path) + suffix)
                assert f.exists() and stat.S_IMODE(f.stat().st_mode) == 0o600, suffix
            assert stat.S_IMODE(s.path.parent.stat().st_mode) == 0o700
            s.export_json(s.path.parent / "out.json")
            assert stat.S_IMODE((s.path.parent / "semantic.db.lock").stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_database_is_wal_versioned_and_fts_kept_in_sync(filled):
    with _raw(filled.path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        raw.execute("INSERT INTO entries_fts(entries_fts) VALUES ('integrity-check')")
        dims = raw.execute("SELECT DISTINCT embedder, dim, length(vec) FROM vectors").fetchall()
    assert dims == [(HashingEmbedder().name, 1024, 4096)]


def test_newer_schema_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "m.db"
    with SemanticStore(path) as s:
        s.remember(SISTER)
    with _raw(path) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1}"):
        SemanticStore(path)
    with _raw(path) as raw:
        assert raw.execute("SELECT text FROM entries").fetchall() == [(SISTER,)]


def test_not_a_database_is_a_store_error(tmp_path):
    path = tmp_path / "m.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="m.db"):
        SemanticStore(path)
    assert path.read_bytes() == b"this is not sqlite" * 100


def test_a_store_whose_wal_cannot_be_made_says_where_to_look(tmp_path):
    path = tmp_path / "m.db"
    SemanticStore(path).close()
    (tmp_path / "m.db-wal").mkdir()  # as an unwritable directory would: SQLite cannot open its WAL
    with pytest.raises(StoreError, match=f"m.db: unable to open database file .*m.db-wal.*is {tmp_path} writable"):
        SemanticStore(path)


def _writer(path: str, tag: str, n: int, barrier) -> None:
    barrier.wait()  # open and write at the same instant as the other process
    with SemanticStore(Path(path)) as s:
        for i in range(n):
            s.remember(f"Writer {tag} noted fact {i} with code {tag}{i * 7919}")


def test_two_processes_writing_at_once_keep_every_entry(tmp_path):
    path = tmp_path / "shared" / "semantic.db"
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_writer, args=(str(path), tag, 50, barrier)) for tag in "AB"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    with SemanticStore(path) as s:
        assert len(s) == 100
        assert s.stats()["stale_vectors"] == 0
    with _raw(path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        raw.execute("INSERT INTO entries_fts(entries_fts) VALUES ('integrity-check')")


_CRASHER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from mlotspark.memory.semantic import SemanticStore
    s = SemanticStore(Path(sys.argv[1]))
    i = 0
    while True:
        print(s.remember(f"Fact number {i} about item {i * 31}"), flush=True)
        i += 1
    """
)


def test_store_opens_after_a_writer_is_killed(tmp_path):
    path = tmp_path / "semantic.db"
    committed: list[int] = []
    for stop_after in (5, 23, 41):  # kill at different points of the write loop
        proc = subprocess.Popen([sys.executable, "-c", _CRASHER, str(path)], stdout=subprocess.PIPE, text=True)
        try:
            for _ in range(stop_after):
                line = proc.stdout.readline()
                assert line, "writer died early"
                committed.append(int(line))
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
        with SemanticStore(path) as s:
            ids = {e.id for e in s.list()}
            assert set(committed) <= ids
            assert s.remember("I live in Ghent.") in {e.id for e in s.list()}
        with _raw(path) as raw:
            assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# -- embedders ------------------------------------------------------------------------------------


class ConstantEmbedder:
    """Maps every text to the same vector: any mixing with real vectors would show."""

    def __init__(self, name: str = "constant-v1", dim: int = 1024):
        self.name, self.dim = name, dim

    def embed(self, texts: list[str]) -> np.ndarray:
        vecs = np.ones((len(texts), self.dim), dtype=np.float32)
        return vecs / np.sqrt(self.dim)


def test_hashing_embedder_is_deterministic_and_normalised():
    emb = HashingEmbedder()
    assert isinstance(emb, Embedder)
    a = emb.embed([SISTER, "What is my sister's name?", "", "the and of"])
    assert a.shape == (4, 1024) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a[:2], axis=1), 1.0)
    assert not a[2:].any()  # no content words, no direction
    assert np.array_equal(a, emb.embed([SISTER, "What is my sister's name?", "", "the and of"]))
    # Deterministic across processes (str hashes are salted per process).
    code = "from mlotspark.memory.semantic import HashingEmbedder as H; print(H().embed([%r])[0].tobytes().hex())" % SISTER
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == a[0].tobytes().hex()


def test_another_embedders_vectors_are_never_mixed(tmp_path):
    path = tmp_path / "m.db"
    with SemanticStore(path) as s:
        for text in [SISTER, *UNRELATED]:
            s.remember(text)
        before = [(h.id, h.score) for h in s.search("What is my sister's name?")]

    with SemanticStore(path, ConstantEmbedder(), reembed=False) as other:
        assert other.stats()["stale_vectors"] == 21
        hits = other.search("What is my sister's name?", k=21)
        assert hits[0].text == SISTER  # still found, by its words
        assert all(h.vector == 0.0 for h in hits)  # hashing vectors never compared with constant ones
        assert other.reembed() == 21
        assert other.stats()["stale_vectors"] == 0
        assert all(h.vector > 0.99 for h in other.search("What is my sister's name?", k=21))

    with SemanticStore(path) as s:  # the hashing vectors are still there, untouched
        assert s.stats()["stale_vectors"] == 0
        assert [(h.id, h.score) for h in s.search("What is my sister's name?")] == before
    with _raw(path) as raw:
        rows = raw.execute("SELECT embedder, count(*) FROM vectors GROUP BY embedder ORDER BY embedder").fetchall()
    assert rows == [("constant-v1", 21), (HashingEmbedder().name, 21)]


def test_new_embedder_reembeds_on_open(tmp_path):
    path = tmp_path / "m.db"
    with SemanticStore(path, ConstantEmbedder()) as s:
        s.remember(SISTER)
        s.remember("I live in Ghent.")
    with SemanticStore(path) as s:
        assert s.stats()["stale_vectors"] == 0
        assert s.search("What is my sister's name?")[0].vector > 0.5


def test_broken_embedder_is_reported(tmp_path):
    class Wrong(ConstantEmbedder):
        def embed(self, texts):
            return np.zeros((len(texts), 3), dtype=np.float32)

    with SemanticStore(tmp_path / "m.db", Wrong("wrong-v1")) as s:
        with pytest.raises(StoreError, match="wrong-v1"):
            s.remember(SISTER)
        assert len(s) == 0


# -- extraction and the turn loop ------------------------------------------------------------------------


def test_a_fact_from_conversation_a_reaches_conversation_b(tmp_path):
    path = tmp_path / "m.db"
    with SemanticStore(path) as a:  # conversation A, after its turn
        learn_turn(a, "Hi there! My sister's name is Ilse. Can you suggest a gift for her?", "A")
        for fact in UNRELATED:
            a.remember(fact)
    with SemanticStore(path) as b:  # conversation B, another process later
        hits = b.retrieve_for_prompt("What is my sister's name?")
        assert "Ilse" in format_memory_section(hits)
        assert hits[0].entry.source == "turn"


def test_threads_can_share_one_store(store):
    def work(tag: str) -> None:
        for i in range(25):
            store.remember(f"Thread {tag} keeps fact {i} numbered {tag}{i * 13}")
            store.search(f"fact {i}")

    threads = [threading.Thread(target=work, args=(t,)) for t in "ABCD"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store) == 100


def test_public_names_and_no_mlx_import():
    import mlotspark.memory.semantic as semantic

    assert all(hasattr(semantic, name) for name in semantic.__all__)
    # Memory must work without loading MLX (CLI `memory` commands, tests, other processes).
    code = "import sys, mlotspark.memory.semantic; print(any(m == 'mlx' or m.startswith('mlx.') for m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"

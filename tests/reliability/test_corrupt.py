"""Corrupt files (issue 16 §2): mutated GGUF, safetensors, snapshots and their JSON,
the SQLite memory file, conversation.json and the prefix-cache index. Every input
opens, or fails with a typed mlotspark error on one line naming the file: never a
signal, a hang or a traceback."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rel_common import count, record
from rel_corrupt import GgufWorker, gguf_header_end, judge, mutate

from mlotspark.errors import MlotsparkError

FP, W = "fp-rel", "float32"
SETTINGS = dict(deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

U64 = st.one_of(st.integers(0, (1 << 64) - 1), st.sampled_from([0, 1, 255, 1 << 31, (1 << 32) - 1, 1 << 40, (1 << 63) - 1, (1 << 64) - 1]))


def edits(limit: int):
    kinds = st.sampled_from(["flip", "flip", "u64", "u32", "zero", "truncate"])
    return st.lists(st.tuples(kinds, st.integers(0, limit), U64), min_size=1, max_size=3)


WEIRD = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.floats(allow_nan=True),
                  st.text(max_size=8), st.just([]), st.just({}), st.just("../../etc/passwd"), st.just("\udcff"))


def json_edit(doc, data):
    """Replace one value somewhere in ``doc`` (chosen by ``data``) with a weird one."""
    node = doc
    while True:
        keys = list(node) if isinstance(node, dict) else list(range(len(node))) if isinstance(node, list) else []
        if not keys:
            return WEIRD.example() if False else data.draw(WEIRD)
        key = data.draw(st.sampled_from(keys))
        child = node[key]
        if not isinstance(child, (dict, list)) or not child or data.draw(st.booleans()):
            node[key] = data.draw(WEIRD)
            return doc
        node = child


# ------------------------------------------------------------------ GGUF files
@pytest.fixture(scope="module")
def gguf_worker(tmp_path_factory):
    w = GgufWorker(tmp_path_factory.mktemp("gguf-home"))
    yield w
    w.close()


def test_mutated_gguf_files_fail_typed(tiny_gguf, gguf_worker, tmp_path_factory):
    original = tiny_gguf.read_bytes()
    header = gguf_header_end(tiny_gguf)
    work = tmp_path_factory.mktemp("gguf-mutants")
    outcomes: list[str] = []

    @settings(max_examples=count(30, 1000), **SETTINGS)
    @given(edits=edits(header + 64), anywhere=st.integers(0, len(original)))
    def one(edits, anywhere):
        path = work / "mutant.gguf"
        if edits[0][0] == "truncate" and anywhere % 3 == 0:
            edits = [("truncate", anywhere, 0)]  # truncations anywhere, not only in the header
        path.write_bytes(mutate(original, edits))
        outcome = gguf_worker.load(path)
        outcomes.append(outcome)
        assert outcome in ("ok", "typed"), (outcome, edits, getattr(gguf_worker, "last_untyped", ""))

    try:
        one()
    finally:
        record("corrupt", kind="gguf", outcomes=outcomes)
    assert outcomes.count("typed") >= len(outcomes) // 3, outcomes


# ----------------------------------------------------------- the other stores
@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> Path:
    """A home with a conversation, a two-segment snapshot, a prefix-cache entry and
    a memory store, written by the real writers (numpy states: no model needed)."""
    import os

    from mlotspark.conversations.record import ConversationFiles, ConversationRecord
    from mlotspark.memory.kv_state import CacheState
    from mlotspark.memory.semantic import SemanticStore
    from mlotspark.memory.snapshots import write_state

    home = tmp_path_factory.mktemp("stores") / "home"
    old = os.environ.get("MLOTSPARK_HOME")
    os.environ["MLOTSPARK_HOME"] = str(home)
    try:
        rng = np.random.default_rng(0)
        files = ConversationFiles(home / "conversations" / "c")
        record = ConversationRecord(name="c", system="s")
        for n in (16, 24):
            record.messages += [{"role": "user", "content": f"u{n}"}, {"role": "assistant", "content": f"a{n}"}]
            files.save(record)
            keep, start = files.snapshots.plan(list(range(n)), "kv", FP, W)
            shape = (1, 2, n - start, 8)
            layers = [({"keys": rng.standard_normal(shape, dtype=np.float32),
                        "values": rng.standard_normal(shape, dtype=np.float32)}, {}) for _ in range(2)]
            files.snapshots.write(CacheState("kv", layers, start, n), list(range(n)), keep, fingerprint=FP, weights=W)
        pdir = home / "prefix_cache" / "m"
        pdir.mkdir(parents=True)
        layers = [({"keys": np.ones((1, 2, 10, 8), np.float32), "values": np.ones((1, 2, 10, 8), np.float32)}, {})] * 2
        size, digest = write_state(pdir / "prefix-10-ab.safetensors", CacheState("kv", layers, 0, 10))
        (pdir / "index.json").write_text(json.dumps({
            "format": "mlotspark-prefix-cache", "version": 1, "fingerprint": FP, "weights": W,
            "entries": [{"file": "prefix-10-ab.safetensors", "tokens": list(range(10)), "bytes": size, "sha256": digest,
                         "hits": 3, "kind": "kv", "config": {}, "n_layers": 2, "layer_meta": []}]}))
        from mlotspark.caches.policy import save_probes

        save_probes(FP, "float32@cpu", {}, None)  # the settings-like probe store
        with SemanticStore(home / "memory" / "semantic.db") as mem:
            for i in range(20):
                mem.remember(f"I have {i} cats and a dog called Rex{i}.")
    finally:
        if old is not None:
            os.environ["MLOTSPARK_HOME"] = old
    return home


def _open(kind: str, home: Path) -> None:
    from mlotspark.conversations.record import ConversationFiles
    from mlotspark.memory.prefix_cache import PrefixCache
    from mlotspark.memory.semantic import SemanticStore

    if kind == "conversation":
        ConversationFiles(home / "conversations" / "c").load()
    elif kind in ("snapshot_json", "snapshot_segment"):
        ConversationFiles(home / "conversations" / "c").snapshots.load(fingerprint=FP, weights=W, n_layers=2)
    elif kind in ("prefix_index", "prefix_entry"):
        pc = PrefixCache(directory=home / "prefix_cache" / "m", fingerprint=FP, weights=W)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pc.load()  # refusals are warnings: it must never raise
    elif kind == "settings":
        import os

        from mlotspark.caches.policy import load_probes

        os.environ["MLOTSPARK_HOME"] = str(home)
        load_probes(FP, "float32@cpu")  # a damaged file is a cache miss: never raises
    elif kind == "sqlite":
        with SemanticStore(home / "memory" / "semantic.db") as mem:
            mem.list()
            mem.search("how many cats")
            mem.remember("I live in Ghent.")


def _target(kind: str, home: Path) -> Path:
    snap = home / "conversations" / "c" / "snapshot"
    return {
        "conversation": home / "conversations" / "c" / "conversation.json",
        "snapshot_json": snap / "snapshot.json",
        "snapshot_segment": sorted(snap.glob("*.safetensors"))[-1] if snap.is_dir() else snap,
        "prefix_index": home / "prefix_cache" / "m" / "index.json",
        "prefix_entry": home / "prefix_cache" / "m" / "prefix-10-ab.safetensors",
        "sqlite": home / "memory" / "semantic.db",
        "settings": next((home / "decoding").glob("*.json")),
    }[kind]


KINDS = ["conversation", "snapshot_json", "snapshot_segment", "prefix_index", "prefix_entry", "sqlite", "settings"]


@pytest.mark.parametrize("kind", KINDS)
def test_mutated_store_files_fail_typed_naming_the_file(kind, stores, tmp_path_factory):
    work = tmp_path_factory.mktemp(f"mut-{kind}")
    outcomes: list[str] = []

    @settings(max_examples=count(25, 170), **SETTINGS)
    @given(data=st.data())
    def one(data):
        home = work / "home"
        shutil.rmtree(home, ignore_errors=True)
        shutil.copytree(stores, home)
        for side in (home / "memory").glob("semantic.db-*"):
            side.unlink()  # the -wal/-shm of the writer: a closed store has none
        path = _target(kind, home)
        raw = path.read_bytes()
        if path.suffix == ".json" and data.draw(st.booleans()):
            doc = json_edit(json.loads(raw), data)
            path.write_text(json.dumps(doc, ensure_ascii=False, allow_nan=True), encoding="utf-8", errors="surrogatepass")
        else:
            path.write_bytes(mutate(raw, data.draw(edits(min(len(raw), 4096)))))
        try:
            _open(kind, home)
            outcome = "ok"
        except MlotsparkError as e:
            outcome = judge(e, path)
        except Exception as e:  # noqa: BLE001
            outcome = f"untyped {type(e).__name__}: {e}"
        outcomes.append(outcome)
        assert outcome in ("ok", "typed"), outcome

    try:
        one()
    finally:
        record("corrupt", kind=kind, outcomes=outcomes)
    if kind not in ("prefix_index", "prefix_entry", "settings"):  # those refuse by warning, never raise
        assert "typed" in outcomes, outcomes


def test_huge_declared_sizes_are_refused_before_allocating(tmp_path):
    """Lengths near 2**64 in a GGUF string or a safetensors header fail at once."""
    import struct

    from mlotspark.memory.snapshots import parse_safetensors
    from mlotspark.models.formats.gguf_check import check_gguf

    path = tmp_path / "huge.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", (1 << 64) - 1) + b"k" * 64)
    with pytest.raises(MlotsparkError, match="huge.gguf"):
        check_gguf(path)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 60, 1 << 60) + b"\0" * 64)
    with pytest.raises(MlotsparkError, match="cannot fit"):
        check_gguf(path)
    with pytest.raises(MlotsparkError, match="header length"):
        parse_safetensors(struct.pack("<Q", 1 << 62) + b"{}", "x.safetensors")
    assert math.isfinite(1.0)

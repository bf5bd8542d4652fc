"""Snapshots on disk: the cache state interface, the file format, refusals, kills."""

from __future__ import annotations

import os
import random
import select
import signal
import stat
import time
from pathlib import Path

import numpy as np
import pytest

import mlotspark  # noqa: F401
import mlx.core as mx
from mlotspark.memory.kv_state import CacheState, capture, prefix_state, restore, trim_to
from mlotspark.conversations.record import ConversationFiles, ConversationRecord
from mlotspark.errors import SnapshotError
from mlotspark.memory.snapshots import MAX_SEGMENTS, SnapshotStore, parse_safetensors, write_safetensors

from persist_helpers import extend, kv_cache, kv_equal, tiny_model

FP, W = "0123456789abcdef", "float32"


# ----------------------------------------------------------------- file format
def test_safetensors_round_trip_all_dtypes_and_mlx_reads_it(tmp_path):
    arrays = {
        "f32": mx.arange(12, dtype=mx.float32).reshape(3, 4),
        "f16": mx.array([1.5, -2.25], dtype=mx.float16),
        "bf16": mx.array([1.0, 3.5, -7.0], dtype=mx.bfloat16),
        "u32": mx.array([1, 2**31], dtype=mx.uint32),
        "np": np.arange(5, dtype=np.int64),
    }
    path = tmp_path / "x.safetensors"
    size, digest = write_safetensors(path, arrays, {"k": "v"})
    assert path.stat().st_size == size and len(digest) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    parsed = parse_safetensors(path.read_bytes())
    assert parsed["bf16"][1] == "BF16"
    loaded = mx.load(str(path))  # the format is standard: MLX's own reader agrees
    for name, a in arrays.items():
        expect = mx.array(a) if isinstance(a, np.ndarray) else a
        assert loaded[name].dtype == expect.dtype
        assert mx.array_equal(loaded[name], expect).item()


def test_parse_refuses_garbage():
    with pytest.raises(SnapshotError, match="corrupt"):
        parse_safetensors(b"\xff" * 64)
    with pytest.raises(SnapshotError, match="corrupt"):
        parse_safetensors(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"a\":1}")


# ------------------------------------------------------------- state interface
def test_kv_state_capture_restore_trim_and_prefix_are_independent_copies():
    cache = kv_cache(20)
    state = capture(cache)
    again = restore([state])
    assert kv_equal(cache, again)
    # Segments [0, 12) + [12, 20) restore the same cache.
    seg2 = capture(cache, 12)
    seg1 = prefix_state(cache, 12)
    assert seg2.start == 12 and seg2.tokens == 8 and seg1.tokens == 12
    assert kv_equal(cache, restore([seg1, seg2]))
    # Writing into a restored cache never reaches the state it came from.
    assert trim_to(again, 5) and again[0].offset == 5
    extend(again, 3)
    assert kv_equal(cache, restore([state]))
    # A prefix keeps its values when the cache it came from changes.
    before = mx.array(seg1.layers[0][0]["keys"])
    trim_to(cache, 4)
    extend(cache, 10, seed=9)
    assert mx.array_equal(before, seg1.layers[0][0]["keys"]).item()
    with pytest.raises(SnapshotError, match="do not join"):
        restore([seg2])


@pytest.mark.parametrize("kind", ["kv", "cascade"])
def test_state_interface_carries_kv_and_cascade_caches(tmp_path, kind):
    """Save after 40 tokens, restore in a new cache, feed 3 more tokens: same logits."""
    model = tiny_model(vocab_size=128)
    if kind == "kv":
        cache = model.make_cache()
    else:
        from mlotspark.memory.cascade import CascadeConfig, make_cascade_cache

        cache = make_cascade_cache(model, CascadeConfig(window=16, sinks=4, block_size=4, top_k=2, rolling_window=4))
    prompt = mx.array([[i % 97 + 3 for i in range(40)]])
    model(prompt, cache=cache)
    mx.eval([c.state for c in cache])
    store = SnapshotStore(tmp_path / "snap")
    meta = store.save(cache, list(range(40)), fingerprint=FP, weights=W)
    assert meta.kind == kind and meta.tokens == list(range(40))
    _, restored = SnapshotStore(tmp_path / "snap").load(fingerprint=FP, weights=W, n_layers=2)
    nxt = mx.array([[5, 6, 7]])
    a, b = model(nxt, cache=cache), model(nxt, cache=restored)
    assert mx.allclose(a, b, atol=1e-5).item()


def test_trim_contract_holds_for_a_cascade_cache():
    """``trim_to`` either cuts to n tokens or reports False and leaves the cache as it was."""
    from mlotspark.memory.cascade import CascadeConfig, make_cascade_cache

    model = tiny_model(vocab_size=128)
    cache = make_cascade_cache(model, CascadeConfig(window=16, sinks=4, block_size=4, top_k=2, rolling_window=4))
    model(mx.array([[i % 97 + 3 for i in range(40)]]), cache=cache)
    ok = trim_to(cache, 38)
    assert cache[0].offset == (38 if ok else 40)
    assert prefix_state(cache, 30) is None or prefix_state(cache, 30).end == 30


# -------------------------------------------------------------- snapshot store
def test_snapshot_appends_one_segment_per_turn_and_rewrites_past_divergence(tmp_path):
    store = SnapshotStore(tmp_path / "snap")
    cache = kv_cache(10)
    tokens = list(range(10))
    store.save(cache, tokens, fingerprint=FP, weights=W)
    extend(cache, 6)
    tokens += [100 + i for i in range(6)]
    meta = store.save(cache, tokens, fingerprint=FP, weights=W)
    assert [(s.start, s.end) for s in meta.segments] == [(0, 10), (10, 16)]
    # The next turn diverges at token 12 (e.g. a stop string cut the reply).
    trim_to(cache, 12)
    extend(cache, 4, seed=3)
    tokens = tokens[:12] + [7, 7, 7, 7]
    meta = store.save(cache, tokens, fingerprint=FP, weights=W)
    assert [(s.start, s.end) for s in meta.segments] == [(0, 10), (10, 16)]
    files = sorted(p.name for p in store.directory.glob("*.safetensors"))
    assert len(files) == 2  # the stale segment is gone
    _, restored = store.load(fingerprint=FP, weights=W, n_layers=2)
    assert kv_equal(cache, restored)
    assert stat.S_IMODE(store.directory.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in store.directory.iterdir())


def test_snapshot_compacts_after_max_segments(tmp_path):
    store = SnapshotStore(tmp_path / "snap")
    cache, tokens = kv_cache(2), [0, 1]
    for i in range(MAX_SEGMENTS + 1):
        meta = store.save(cache, tokens, fingerprint=FP, weights=W)
        extend(cache, 1, seed=i)
        tokens.append(i)
    assert len(meta.segments) == 1
    assert len(list(store.directory.glob("*.safetensors"))) == 1


@pytest.mark.parametrize("damage", ["other-model", "other-weights", "truncated", "corrupt", "missing", "bad-json"])
def test_snapshot_refused_with_a_clear_error(tmp_path, damage):
    store = SnapshotStore(tmp_path / "snap")
    meta = store.save(kv_cache(30), list(range(30)), fingerprint=FP, weights=W)
    seg = store.directory / meta.segments[0].file
    fingerprint, weights = FP, W
    if damage == "other-model":
        fingerprint = "fedcba9876543210"
    elif damage == "other-weights":
        weights = "quantized"
    elif damage == "truncated":
        seg.write_bytes(seg.read_bytes()[:-100])
    elif damage == "corrupt":
        data = bytearray(seg.read_bytes())
        data[len(data) // 2] ^= 0xFF
        seg.write_bytes(bytes(data))
    elif damage == "missing":
        seg.unlink()
    else:
        store.meta_path.write_text("{not json")
    expected = {"other-model": "another model", "other-weights": "weights", "truncated": "truncated",
                "corrupt": "corrupt", "missing": "missing", "bad-json": "corrupt"}[damage]
    with pytest.raises(SnapshotError, match=expected) as info:
        store.load(fingerprint=fingerprint, weights=weights, n_layers=2)
    if damage == "other-model":
        assert FP in str(info.value) and fingerprint in str(info.value)
    # A refused snapshot is dropped (as conversations do) and the next save is whole again.
    store.delete()
    store.save(kv_cache(30), list(range(30)), fingerprint=fingerprint, weights=weights)
    store.load(fingerprint=fingerprint, weights=weights, n_layers=2)


# ----------------------------------------------------------------- kill -9
def _turns_forever(home: Path, report_fd: int, kill_at: int = 0) -> None:
    """Child of a fork: take turns on the persistence layer (no model, no MLX) until killed.
    ``kill_at`` > 0: after its first turn, the child SIGKILLs itself at that write step
    (``storage.write_step``, a temp file written, not yet renamed)."""
    from mlotspark import storage
    from mlotspark.memory.semantic import SemanticStore

    os.environ["MLOTSPARK_HOME"] = str(home)
    files = ConversationFiles(home / "conversations" / "k")
    memory = SemanticStore()
    rng = np.random.default_rng(os.getpid())
    while True:
        with files.lock:
            record = files.load() or ConversationRecord(name="k", system="s")
            n = record.turns
            record.messages += [{"role": "user", "content": f"u{n}"}, {"role": "assistant", "content": f"a{n}"}]
            tokens = list(range(16 * (n + 1)))
            record.tokens = len(tokens)
            files.save(record)
            keep, start = files.snapshots.plan(tokens, "kv", FP, W)
            shape = (1, 4, len(tokens) - start, 64)
            layers = [({"keys": rng.standard_normal(shape, dtype=np.float32),
                        "values": rng.standard_normal(shape, dtype=np.float32)}, {}) for _ in range(4)]
            files.snapshots.write(CacheState("kv", layers, start, len(tokens)), tokens, keep, fingerprint=FP, weights=W)
            memory.remember(f"I have {n} cats.")
        os.write(report_fd, f"{n}\n".encode())
        if kill_at and not storage._KILL_AT:
            storage._KILL_STEP, storage._KILL_AT, storage._steps = "written", kill_at, 0


def temp_files(home: Path) -> list[Path]:
    return [p for p in (home / "conversations").rglob(".*") if p.name != ".lock"]


def test_sigkill_at_random_instants_leaves_the_last_completed_turn(tmp_path):
    from mlotspark.memory.semantic import SemanticStore

    home = tmp_path / "home"
    rnd = random.Random(4)
    completed, reported, mid_write = -1, set(), 0
    for life in range(20):
        # Every fifth life kills itself inside a write (so some kill surely lands mid-write);
        # the others are killed at a random instant.
        kill_at = 1 + life // 5 if life % 5 == 4 else 0
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                os.close(r)
                _turns_forever(home, w, kill_at)
            finally:
                os._exit(1)
        os.close(w)
        # Let each life finish one turn (so the test progresses on a busy machine), then
        # kill it at a random instant of the turns that follow.
        select.select([r], [], [], 30)
        if kill_at:
            _, status = os.waitpid(pid, 0)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        else:
            time.sleep(rnd.uniform(0.0, 0.06))
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        with os.fdopen(r) as f:
            done = [int(x) for x in f.read().split()]
        completed = max([completed, *done])
        reported.update(done)
        mid_write += bool(temp_files(home))
        files = ConversationFiles(home / "conversations" / "k")
        record = files.load()  # always opens
        if completed >= 0:
            assert record is not None and record.turns >= completed + 1
            assert [m["content"] for m in record.messages[: 2 * (completed + 1)]] == [
                x for i in range(completed + 1) for x in (f"u{i}", f"a{i}")
            ]
            meta, cache = files.snapshots.load(fingerprint=FP, weights=W, n_layers=4)
            assert len(meta.tokens) >= 16 * (completed + 1) and cache[0].offset == len(meta.tokens)
            with SemanticStore(home / "memory" / "semantic.db") as mem:
                assert {f"I have {n} cats." for n in reported} <= {e.text for e in mem.list()}
    assert completed >= 19  # every life completed a turn before its kill
    assert mid_write  # some kills landed while a file was being written
    files.save(files.load())  # the next saves clear what killed writers left behind
    files.snapshots.save(cache, meta.tokens, fingerprint=FP, weights=W)
    assert not temp_files(home)


def test_every_directory_the_data_directory_makes_is_private(tmp_path):
    # mkdir(parents=True, mode=0o700) gives the mode to the last directory only: the parents
    # it made got the umask's 0755 ($MLOTSPARK_HOME/cache/gguf was one).
    from mlotspark.storage import ensure_dir

    ensure_dir(tmp_path / "home" / "cache" / "gguf")
    for d in (tmp_path / "home", tmp_path / "home" / "cache", tmp_path / "home" / "cache" / "gguf"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d

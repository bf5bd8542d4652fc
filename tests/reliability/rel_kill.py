"""Kill at any instant: the harness behind test_kill.py and the benchmark.

Each life forks a driver (``rel_driver``) that takes conversation turns on the tiny
model: messages, KV snapshots, prefix-cache files and semantic memory are written
after every turn. Half the lives die by SIGKILL from outside at a uniformly random
instant once a turn has completed; the other half SIGKILL themselves at a random
write step (temp file open, half written, synced, renamed), alternately any step and
a "half written" step, so kills land inside writes. After each death this process
opens every store and checks it (``check_home``). With atomic writes a snapshot is
never refused after a kill (segments first, then its JSON by rename), so a refusal
counts as a failure too.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

from rel_common import HERE, child_env, rng

STEPS_PER_LIFE = 90  # write steps a driver life reaches in its first few turns (~25 per turn)
HALF_STEPS_PER_LIFE = 8  # "half written" steps (two or three per turn: JSON files)


def completed_turns(log: Path) -> list[tuple[str, str]]:
    if not log.exists():
        return []
    return [tuple(line.split("\t", 1)) for line in log.read_text(encoding="utf-8").splitlines() if "\t" in line]


def check_home(home: Path, completed: list[tuple[str, str]]) -> Counter:
    """Open every store under ``home`` and compare with the completed turns.

    Returns:
        Counts: ``unreadable`` stores, ``lost`` turns, ``lost_facts``,
        ``snapshots_ok`` / ``snapshots_refused``, ``prefix_refused``.
    """
    from mlotspark.errors import MlotsparkError, SnapshotError
    from mlotspark.conversations.record import ConversationFiles
    from mlotspark.memory.prefix_cache import PrefixCache
    from mlotspark.memory.semantic import SemanticStore

    out: Counter = Counter()
    by_conv: dict[str, list[str]] = {}
    for conv, text in completed:
        by_conv.setdefault(conv, []).append(text)
    for conv, texts in by_conv.items():
        files = ConversationFiles(home / "conversations" / conv)
        try:
            record = files.load()
        except MlotsparkError:
            out["unreadable"] += 1
            continue
        users = [m["content"] for m in record.messages if m["role"] == "user"] if record else []
        out["lost"] += sum(t not in users for t in texts)
        try:
            meta = files.snapshots.read_meta()
            if meta is not None:
                _, cache = files.snapshots.load(fingerprint=meta.fingerprint, weights=meta.weights, n_layers=meta.n_layers)
                ok = cache[0].offset == len(meta.tokens) and len(meta.tokens) <= (record.tokens if record else 0)
                out["snapshots_ok" if ok else "snapshots_bad"] += 1
        except SnapshotError:
            out["snapshots_refused"] += 1
    for d in sorted((home / "prefix_cache").glob("*")) if (home / "prefix_cache").is_dir() else []:
        index = d / "index.json"
        if not index.exists():
            continue
        try:
            fp = json.loads(index.read_text())["fingerprint"]
        except (ValueError, KeyError, TypeError):
            out["unreadable"] += 1
            continue
        pc = PrefixCache(directory=d, fingerprint=fp)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pc.load()
        out["prefix_refused"] += pc.counters.refused
        out["prefix_loaded"] += pc.counters.loaded
    db = home / "memory" / "semantic.db"
    if db.exists():
        try:
            with SemanticStore(db) as mem:
                texts = {e.text for e in mem.list(limit=100000)}
            facts = {t.split(". ")[0] + "." for _, t in completed}
            out["lost_facts"] += len(facts - texts)
        except MlotsparkError:
            out["unreadable"] += 1
    return out


class Zygote:
    """The forking driver process (see ``rel_driver``)."""

    def __init__(self, model: Path, home: Path):
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "rel_driver.py"), "zygote", str(model)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(home.parent / f"{home.name}-driver.err", "ab"), text=True,
            env=child_env(home), cwd=str(home.parent),
        )

    def start(self, kill_at: int, step: str, seed: int, log: Path) -> int:
        self.proc.stdin.write(f"life {kill_at} {step} {seed} {log}\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline().split()[1])

    def wait(self, timeout: float) -> int | None:
        """The child's wait status, or None if it is still running after ``timeout``."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        return int(self.proc.stdout.readline().split()[1])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it died first; the zygote reports how
        pass


def run_kills(model: Path, home: Path, lives: int, salt: str = "kill") -> dict:
    """``lives`` driver lives, each killed; the stores checked after each death.

    Returns:
        Totals: ``kills``, ``in_write`` (self-kills at a write step), ``timed``,
        ``completed`` turns, and the problems ``check_home`` counts.
    """
    r = rng(salt)
    home.mkdir(parents=True, exist_ok=True)
    log = home.parent / f"{home.name}-turns.log"
    zygote = Zygote(model, home)
    totals: Counter = Counter()
    try:
        for life in range(lives):
            in_write = life % 2 == 0
            step = "half" if life % 4 == 0 else "any"
            kill_at = r.randint(1, HALF_STEPS_PER_LIFE if step == "half" else STEPS_PER_LIFE) if in_write else 0
            before = len(completed_turns(log))
            pid = zygote.start(kill_at, step, life, log)
            status = None
            if not in_write:
                # One completed turn first (progress on a busy machine), then a uniform instant.
                deadline = time.monotonic() + 120
                while len(completed_turns(log)) == before and time.monotonic() < deadline:
                    if (status := zygote.wait(0.02)) is not None:
                        break
                if status is None:
                    time.sleep(r.uniform(0.0, 0.4))
                    _kill(pid)
            if status is None:
                status = zygote.wait(300)
                if status is None:  # a self-kill step never reached: kill it now
                    _kill(pid)
                    status = zygote.wait(60)
            killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            totals["kills"] += killed
            totals["crashed"] += not killed  # exited by itself: the driver failed
            totals["in_write" if in_write else "timed"] += killed
            totals.update(check_home(home, completed_turns(log)))
    finally:
        zygote.close()
    totals["completed"] = len(completed_turns(log))
    return dict(totals)

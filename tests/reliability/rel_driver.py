"""The process the kill test kills: conversation turns on the tiny model, forever.

Run as ``python rel_driver.py zygote MODEL``: it imports mlotspark and MLX once,
then for each line ``life KILL_AT STEP SEED LOG`` on stdin forks a child that loads the
model and takes turns, appending ``conversation<TAB>text`` to LOG after each
``send`` returned (a completed turn). The zygote answers ``pid N`` at once and
``exit STATUS`` when the child died. ``KILL_AT`` > 0 makes the child SIGKILL itself
at that write step (``storage.write_step``; only steps named ``STEP`` count unless it
is ``any``); 0 leaves the killing to the caller.
Forking from an importer that never ran MLX keeps a kill cycle near 0.3 s instead
of the ~3 s of a fresh interpreter.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

CONVERSATIONS = ("alpha", "beta")


def turn_text(life: int, i: int) -> str:
    # A fact (learned into semantic memory), unique per life and turn.
    return f"My name is Person{life}x{i}. Please greet me briefly."


def run_turns(model: str, log: Path, seed: int, life: int) -> None:
    """Take turns until killed (or forever); log each completed one."""
    from mlotspark import Engine

    rnd = random.Random(seed)
    engine = Engine.load(model, progress=False, temperature=0.0, max_tokens=rnd.randint(2, 6))
    i = 0
    with open(log, "a", encoding="utf-8") as out:
        while True:
            name = f"{rnd.choice(CONVERSATIONS)}-{life // 10}"  # new conversations every 10 lives
            text = turn_text(life, i)
            engine.conversation(name).send(text)
            out.write(f"{name}\t{text}\n")
            out.flush()
            i += 1


def zygote(model: str) -> None:
    import mlotspark  # noqa: F401  (OpenBLAS, then MLX: imported once, not run)
    import mlx.core  # noqa: F401
    from mlotspark import storage

    import mlotspark.engine  # noqa: F401
    import mlotspark.conversations.persistence  # noqa: F401

    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] != "life":
            continue
        kill_at, step, seed, log = int(parts[1]), parts[2], int(parts[3]), Path(parts[4])
        pid = os.fork()
        if pid == 0:  # child
            code = 1
            try:
                storage._KILL_AT = kill_at
                storage._KILL_STEP = "" if step == "any" else step
                run_turns(model, log, seed, life=seed)
            except BaseException as e:  # noqa: BLE001
                sys.stderr.write(f"driver failed: {type(e).__name__}: {e}\n")
            finally:
                os._exit(code)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exit {status}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "zygote":
        zygote(sys.argv[2])

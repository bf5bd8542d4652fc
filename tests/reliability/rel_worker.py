"""One of several processes sharing a home (test_concurrency.py): turns on a shared
conversation and on its own, memory adds and searches. Prints ``ERROR ...`` for
anything raised, ``done`` at the end."""

from __future__ import annotations

import sys


def main(model: str, who: str, turns: int) -> None:
    from mlotspark import Engine

    engine = Engine.load(model, progress=False, temperature=0.0, max_tokens=2)
    for i in range(turns):
        try:
            name = "shared" if i % 2 == 0 else f"own-{who}"
            engine.conversation(name).send(f"{who} says {i}. My name is {who}x{i}.")
            engine.memory.remember(f"{who} keeps note number {i}.")
            engine.memory.search("note number")
        except Exception as e:  # noqa: BLE001  the test reads these
            print(f"ERROR {type(e).__name__}: {e}", flush=True)
    engine.close()
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))

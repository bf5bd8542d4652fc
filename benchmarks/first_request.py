"""A new process's first requests beside a busy core (no suite: each run needs a fresh process and a busy loop).

The first requests of a new process, beside another busy process (the CPU backend's
BLAS threads): prefill speed of each, through ``Engine.generate``.

The engine fits OpenBLAS's threads to the cores other processes leave free
(``thermal/cores.py``); the first request used to start before any reading, at the
default thread count, and beside a busy core that prefill crawled.

    python benchmarks/first_request.py --busy 1 --requests 2

``--busy N`` starts N busy-loop processes at normal priority for the run (0: the machine as
it is). Each request is a different ~800-token prompt (no prefix cache hit), greedy, 4 tokens.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

TEXT = Path("/usr/share/common-licenses/GPL-3")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--busy", type=int, default=1, help="busy-loop processes beside the engine")
    p.add_argument("--requests", type=int, default=2)
    p.add_argument("--model", default=None)
    args = p.parse_args()
    print("command: python " + " ".join(sys.argv), flush=True)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        time.sleep(1.0)  # the loops running before the engine starts
        from mlotspark import Engine
        from mlotspark.platform import blas

        doc = TEXT.read_text(encoding="utf-8")[:3000] if TEXT.exists() else "A line of text. " * 200
        engine = Engine.load(args.model, progress=False)
        try:
            for i in range(args.requests):
                t0 = time.perf_counter()
                r = engine.generate(f"Request {i}.\n{doc}\nSummarise.", temperature=0.0, max_tokens=4)
                print(f"request {i}: {r.stats.prompt_tokens} tokens, prefill {r.stats.prefill_tps:.1f} tok/s, "
                      f"{time.perf_counter() - t0:.1f} s, BLAS threads {blas.fitted_threads()}", flush=True)
        finally:
            engine.close()
    finally:
        for b in busy:
            b.kill()


if __name__ == "__main__":
    main()

"""Scheduler benchmark: aggregate decode tok/s at batch 1, 2, 3, 4 and 8, in one run.

B requests are submitted together (greedy, distinct prompts) and decode as one
continuous batch; the figure is taken from the scheduler's own step records while
all B sequences decode together: aggregate tok/s = B / median step time (the
median is robust to the other processes sharing this machine's two cores). Sizes
are interleaved over the repetitions so drift in machine load hits all of them.
The governor is held calm (a scripted probe with no signals), so this measures the
batcher, not the thermal policy (``batch_throttle.py`` does that).

    nice python benchmarks/batch_throughput.py [-r 3] [--tokens 48] [--sizes 1 2 3 4 8] [--also-packed]
                                               [--model M] [--json FILE]

Prints a markdown table for the "Scheduler" section of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import mlotspark  # noqa: F401  (OpenBLAS before MLX)
from mlotspark.engine import Engine
from mlotspark.thermal.governor import ThermalGovernor
from mlotspark.thermal.probes import Reading, ScriptedProbe

SIZES = (1, 2, 3, 4, 8)
PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in detail how a steam engine works, step by step.",
    "Describe a walk through a busy market in a city you imagine.",
    "Write a long letter from a sailor to his sister about life at sea.",
    "Tell me everything you know about the history of bread.",
    "Write a detailed guide to planting a vegetable garden in spring.",
    "Describe the life cycle of a star, from cloud to remnant, at length.",
    "Write a long dialogue between a chess master and a curious child.",
]


def run_size(engine: Engine, b: int, tokens: int) -> dict:
    """Decode ``b`` requests together; return the steps taken at full batch size."""
    sched = engine.scheduler
    start = len(sched.timeline)
    t0 = time.perf_counter()
    handles = [engine.submit(PROMPTS[i], temperature=0, max_tokens=tokens) for i in range(b)]
    results = [h.result() for h in handles]
    wall = time.perf_counter() - t0
    steps = [s for s in list(sched.timeline)[start:] if s.batch == b and not s.paused]
    return {
        "step_s": [s.step_s for s in steps],
        "cpu_s": [s.cpu_s for s in steps],
        "tokens": sum(len(r.tokens) for r in results),
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-r", "--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48, help="max_tokens per request")
    ap.add_argument("--model", default=None)
    ap.add_argument("--json", default=None, help="write the raw step times here")
    ap.add_argument("--also-packed", action="store_true",
                    help="also run the sizes below the CPU runner's PACK_FROM packed on MLX (rows '2p', '3p')")
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="batch sizes (default 1 2 3 4 8)")
    args = ap.parse_args(argv)

    calm = ThermalGovernor([ScriptedProbe([Reading()])], max_batch=max(args.sizes))
    engine = Engine.load(args.model, governor=calm, progress=False)
    load_start = os.getloadavg()
    run_size(engine, 2, 8)  # warm-up: first-call allocations, BLAS threads
    # Runs: (label, batch size, pack from); "Bp" packs B rows that would go one by one.
    runner = engine.loaded.runner  # models/execution.py: it says when rows are packed
    pack_from = getattr(runner, "PACK_FROM", 2)
    runs = [(str(b), b, pack_from) for b in args.sizes]
    if args.also_packed:
        runs += [(f"{b}p", b, 2) for b in args.sizes if 1 < b < pack_from]
    raw: dict[str, dict[str, list]] = {k: {"step_s": [], "cpu_s": [], "tok_s_wall": []} for k, _, _ in runs}
    for rep in range(args.reps):
        for k, b, pack in runs:
            runner.PACK_FROM = pack  # asked by the decode batch at each step
            r = run_size(engine, b, args.tokens)
            raw[k]["step_s"] += r["step_s"]
            raw[k]["cpu_s"] += r["cpu_s"]
            raw[k]["tok_s_wall"].append(r["tokens"] / r["wall_s"])
            print(f"rep {rep + 1} batch {k}: {len(r['step_s'])} full steps, "
                  f"median {statistics.median(r['step_s']) * 1000:.0f} ms", file=sys.stderr, flush=True)
    load_end = os.getloadavg()
    engine.close()

    base = base_cpu = None
    print(f"\nmodel {engine.model_name} ({engine.loaded.weights}), {args.reps} reps x "
          f"{args.tokens} tokens; load average {load_start[0]:.1f} -> {load_end[0]:.1f} "
          f"on {os.cpu_count()} cores\n")
    print("| batch | full-batch steps | median step | aggregate decode tok/s | vs batch 1 "
          "| tok per CPU-s | vs batch 1 | end-to-end tok/s (incl. prefill, tails) |")
    print("|---|---|---|---|---|---|---|---|")
    runner.PACK_FROM = pack_from
    for k, b, _ in runs:
        step = statistics.median(raw[k]["step_s"])
        cpu = statistics.median(raw[k]["cpu_s"])
        agg, agg_cpu = b / step, b / cpu if cpu > 0 else 0.0
        base = base or agg
        base_cpu = base_cpu or agg_cpu
        e2e = statistics.median(raw[k]["tok_s_wall"])
        print(f"| {k} | {len(raw[k]['step_s'])} | {step * 1000:.0f} ms | {agg:.1f} | {agg / base:.2f}x "
              f"| {agg_cpu:.1f} | {agg_cpu / base_cpu:.2f}x | {e2e:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load": [load_start, load_end], "raw": raw}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

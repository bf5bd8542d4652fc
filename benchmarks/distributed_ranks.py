"""Local pipeline ranks vs one process (no suite: it launches rank processes): capacity, not speed.

1 vs 2 local pipeline ranks (and the plain engine): prefill and decode tok/s, per-rank
weights and peak memory.

Each repetition launches ``mlx.launch -n N --backend ring`` (N = 1 runs the same
code as a group of one), alternating N so both see the same machine load. Every
rank loads its share of the default model; rank 0 prefills a ~512-token raw prompt
and decodes 64 greedy tokens, after a warm-up request, and writes the figures, with
rank 0's CPU time per decoded token (comparable across code paths on a busy machine).
Then batched throughput: CONCURRENT short requests of BATCH_TOKENS tokens each, first
one after another, then all submitted at once (rank 0's scheduler batches them for
every rank): aggregate generated tokens per second of wall time, and their ratio.
Set ``OPENBLAS_NUM_THREADS`` to fix every rank's BLAS pool.

    python benchmarks/distributed_ranks.py --reps 3 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPT = " ".join(f"Item {i} is a small grey stone found near the river." for i in range(45))
#: the concurrent requests: chat prompts of different lengths.
BATCH_PROMPTS = ["Write a short poem about the sea.", "Explain how a bicycle works, step by step.",
                 "Give me three tips for learning to cook at home on a budget.", "Why is the sky blue?"]
CONCURRENT = len(BATCH_PROMPTS)
BATCH_TOKENS = 24


def _batched(engine) -> dict:
    """Aggregate tok/s of BATCH_PROMPTS one after another, then all at once."""
    import time

    t0 = time.perf_counter()
    seq = [engine.generate(p, max_tokens=BATCH_TOKENS, temperature=0) for p in BATCH_PROMPTS]
    t1 = time.perf_counter()
    handles = [engine.submit(p, max_tokens=BATCH_TOKENS, temperature=0) for p in BATCH_PROMPTS]
    together = [h.result() for h in handles]
    t2 = time.perf_counter()
    n_seq, n_together = sum(len(r.tokens) for r in seq), sum(len(r.tokens) for r in together)
    return {"seq_tps": n_seq / (t1 - t0), "batch_tps": n_together / (t2 - t1),
            "same_tokens": [r.tokens for r in seq] == [r.tokens for r in together],
            "mean_batch": max(r.stats.extra.get("mean_batch", 1.0) for r in together)}


def rank_main(out: Path) -> None:
    import mlotspark  # noqa: F401  (OpenBLAS before MLX)
    from mlotspark import Engine

    if os.environ.get("BENCH_PLAIN"):  # the engine without --distributed, as a baseline
        engine = Engine.load(progress=False, cascade=None)
        me = {"rank": 0, "layers": [0, len(engine.loaded.model.layers)], "weights_mb": engine.loaded.nbytes() / 1e6}
    else:
        engine = Engine.load(distributed="pipeline", split="even", progress=False)
        me = {"rank": engine.rank, "layers": list(engine.ranks.setup.layers[engine.rank]),
              "weights_mb": engine.loaded.nbytes() / 1e6}
    if engine.rank != 0:
        engine.follow()
        me["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
        Path(f"{out}.rank{engine.rank}").write_text(json.dumps(me))
        os._exit(0)
    engine.generate("warm up", raw=True, max_tokens=4, temperature=0)
    # Rank 0's CPU seconds per decoded token: the 64-token request less the 1-token one
    # (same prompt). Unlike tok/s it barely moves with the load other processes put on
    # the cores, so it compares the code paths on a shared machine.
    c0 = _cpu_s()
    engine.generate(PROMPT, raw=True, max_tokens=1, temperature=0)
    c1 = _cpu_s()
    r = engine.generate(PROMPT, raw=True, max_tokens=64, temperature=0)
    c2 = _cpu_s()
    s = r.stats
    me.update(_batched(engine))
    engine.close()
    me.update(prompt_tokens=s.prompt_tokens, prefill_tps=s.prefill_tps, decode_tps=s.decode_tps,
              generated=s.generation_tokens,
              decode_cpu_ms=((c2 - c1) - (c1 - c0)) / max(1, s.generation_tokens - 1) * 1000,
              peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3)
    out.write_text(json.dumps(me))
    os._exit(0)


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run(n: int, tmp: Path) -> dict:
    """One launch of ``n`` ranks (0: the plain engine in one process, no launcher)."""
    out = tmp / f"n{n}-{random.randrange(1 << 30)}.json"
    launch = Path(sys.executable).with_name("mlx.launch")
    cmd = [str(launch), "-n", str(max(n, 1)), "--backend", "ring", "--starting-port",
           str(random.randrange(20000, 60000, 2)), sys.executable, __file__, "--rank", str(out)]
    env = dict(os.environ)
    if n == 0:
        cmd, env["BENCH_PLAIN"] = [sys.executable, __file__, "--rank", str(out)], "1"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if not out.exists():
        raise SystemExit(f"{n} ranks failed:\n{proc.stderr[-3000:]}")
    ranks = [json.loads(out.read_text())]
    ranks += [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(1, max(n, 1))]
    return {"n": n, "ranks": ranks}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--rank", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank:
        return rank_main(Path(args.rank))
    runs: dict[int, list] = {0: [], 1: [], 2: []}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(args.reps):
            for n in runs:
                runs[n].append(run(n, Path(d)))
    rows = []
    for n, rs in runs.items():
        med = lambda k: statistics.median(r["ranks"][0][k] for r in rs)  # noqa: E731
        per_rank = [(statistics.median(r["ranks"][i]["weights_mb"] for r in rs),
                     statistics.median(r["ranks"][i]["peak_rss_mb"] for r in rs)) for i in range(max(n, 1))]
        rows.append({"ranks": n or "plain engine", "prefill_tps": med("prefill_tps"), "decode_tps": med("decode_tps"),
                     "decode_cpu_ms": med("decode_cpu_ms"),
                     "seq_tps": med("seq_tps"), "batch_tps": med("batch_tps"),
                     "batch_ratio": statistics.median(r["ranks"][0]["batch_tps"] / r["ranks"][0]["seq_tps"] for r in rs),
                     "mean_batch": med("mean_batch"),
                     "same_tokens": all(r["ranks"][0]["same_tokens"] for r in rs),
                     "prompt_tokens": rs[0]["ranks"][0]["prompt_tokens"],
                     "per_rank_weights_mb": [w for w, _ in per_rank], "per_rank_peak_rss_mb": [m for _, m in per_rank]})
    print("| ranks | prompt tokens | prefill tok/s | decode tok/s | rank 0 CPU ms / decoded token "
          "| weights per rank (MB) | peak RSS per rank (MB) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['ranks']} | {r['prompt_tokens']} | {r['prefill_tps']:.1f} | {r['decode_tps']:.2f} | "
              f"{r['decode_cpu_ms']:.0f} | "
              f"{' / '.join(f'{w:.0f}' for w in r['per_rank_weights_mb'])} | "
              f"{' / '.join(f'{m:.0f}' for m in r['per_rank_peak_rss_mb'])} |")
    print(f"\n| ranks | {CONCURRENT} requests one after another, tok/s | {CONCURRENT} at once, tok/s | ratio "
          "| mean batch | same greedy tokens |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['ranks']} | {r['seq_tps']:.2f} | {r['batch_tps']:.2f} | {r['batch_ratio']:.2f}x | "
              f"{r['mean_batch']:.2f} | {'yes' if r['same_tokens'] else 'NO'} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()

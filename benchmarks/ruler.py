"""RULER-style long-context suite through the memory cascade, sinks + window only, and full attention.

Tasks and haystacks: ``mlotspark/bench/ruler.py`` (Python's own documentation as
varied natural text, needles at evenly spread depths, seeded). Each case is asked
through the chat template, greedy; its score is the share of expected answers in
the reply.

    python benchmarks/ruler.py --multiples 1 2 4 8 --lengths 16384 32768 --trials 4 --out ruler.jsonl

Modes: ``cascade`` (default ``CascadeConfig`` unless flags change it),
``streaming`` (the same with top_k 0: sinks + window), ``full`` (plain KV; only
below the model's trained context). Lengths are multiples of the window plus
``--lengths``. A markdown table (mean score per task x length x mode) ends the run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

from cascade_common import command_line, emit, load_engine, make_cache, run_greedy

from mlotspark.bench.ruler import TASKS, depths, make_case
from mlotspark.memory.cascade import CascadeConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = CascadeConfig()
    p.add_argument("--model", default=None)
    p.add_argument("--tasks", nargs="*", default=list(TASKS), choices=TASKS)
    p.add_argument("--window", type=int, default=d.window)
    p.add_argument("--sinks", type=int, default=d.sinks)
    p.add_argument("--block-size", type=int, default=d.block_size)
    p.add_argument("--top-k-blocks", type=int, default=d.top_k)
    p.add_argument("--routing", default=d.routing)
    p.add_argument("--representation", default=d.representation)
    p.add_argument("--rolling-window", type=int, default=d.rolling_window)
    p.add_argument("--follow", type=int, default=d.follow, help="blocks after each retrieved block taken with it")
    p.add_argument("--question-pass", type=int, default=d.question_pass,
                   help="prompt tokens re-read with the blocks all layers' question queries agree on (0 = off)")
    p.add_argument("--question-sharpen", type=int, default=d.question_sharpen,
                   help="exponent on each (layer, KV head)'s attention mass in the question pass (1 = plain sum)")
    p.add_argument("--question-focus", type=float, default=d.question_focus,
                   help="pin only blocks scoring >= this share of the best (0 = the top-k best)")
    p.add_argument("--multiples", type=int, nargs="*", default=[1, 2, 4, 8], help="lengths as multiples of the window")
    p.add_argument("--lengths", type=int, nargs="*", default=[16384, 32768], help="further lengths in tokens")
    p.add_argument("--modes", nargs="*", default=["cascade", "streaming", "full"])
    p.add_argument("--trials", type=int, default=4, help="cases per task and length (depths spread evenly)")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk (tokens per forward pass)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", type=int, nargs="*", default=None, help="run only these trial indices (split a long run)")
    p.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    args = p.parse_args()

    engine = load_engine(args.model)
    trained = engine.loaded.context_length
    config = CascadeConfig(window=args.window, sinks=args.sinks, block_size=args.block_size, top_k=args.top_k_blocks,
                           routing=args.routing, representation=args.representation,
                           rolling_window=args.rolling_window, follow=args.follow,
                           question_pass=args.question_pass, question_sharpen=args.question_sharpen,
                           question_focus=args.question_focus)
    emit({"command": command_line(), "config": config.to_dict(), "model": engine.model_name,
          "weights": engine.loaded.weights}, args.out)
    lengths = [m * args.window for m in args.multiples] + list(args.lengths)
    scores: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    count = lambda text: len(engine.encode(text))  # noqa: E731  (chat template included)
    for n in lengths:
        for task in args.tasks:
            for i, depth in enumerate(depths(args.trials)):
                if args.only is not None and i not in args.only:
                    continue
                case = make_case(task, n, depth, seed=args.seed * 100003 + n + i, count_tokens=count)
                ids = engine.encode(case.text)
                for mode in args.modes:
                    if mode == "full" and len(ids) + args.max_tokens > trained:
                        continue  # past the trained context full attention is not a fair reference
                    t0 = time.perf_counter()
                    run = run_greedy(engine, ids, make_cache(engine, mode, config), max_tokens=args.max_tokens, chunk=args.chunk)
                    s = case.score(run.text)
                    scores[(task, n, mode)].append(s)
                    emit({"task": task, "length": n, "tokens": len(ids), "mode": mode, "depth": round(depth, 3),
                          "score": s, "answers": list(case.answers), "reply": run.text.strip()[:120],
                          "s": round(time.perf_counter() - t0, 1),
                          "decode_ms": round(statistics.median(run.decode_ms), 1) if run.decode_ms else None,
                          "peak_mb": round(run.peak_mb, 1)}, args.out)
    print(f"\n| task | tokens | x window | {' | '.join(args.modes)} |")
    print("|---|---|---|" + "---|" * len(args.modes))
    for task in args.tasks:
        for n in lengths:
            cells = []
            for mode in args.modes:
                v = scores.get((task, n, mode))
                cells.append(f"{statistics.mean(v):.0%} ({len(v)})" if v else "n/a")
            print(f"| {task} | {n} | {n / args.window:g} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()

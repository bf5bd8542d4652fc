"""Which catalogue model opens by default (an evaluation: general knowledge and decode speed per model).

Every catalogue chat model answers the questions of ``data/general_knowledge.json``
greedily through ``Engine`` (chat template, the requests batched by the engine); a
reply is right when it matches one of the question's patterns. Decode speed is the
median ``decode_tps`` of solo requests of a fixed prompt (``--reps``), in the same run.

Usage (the speed part runs one benchmark at a time on a shared machine; the scores
do not depend on timing, so ``--part score`` may run beside other work):
    python benchmarks/model_choice.py --part score [-m ALIAS ...] [--max-tokens 32] [--json scores.json]
    flock /tmp/mlotspark-bench.lock python benchmarks/model_choice.py --part speed [--reps 3] \
        [--context 0 4000] [--busy 1]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

import mlotspark  # noqa: F401  (OpenBLAS before mlx)
from mlotspark import Engine
from mlotspark.models.aliases import ALIASES

DATA = Path(__file__).resolve().parent / "data" / "general_knowledge.json"
SPEED_PROMPT = "Write a short story about a lighthouse keeper and a storm."


def score(engine: Engine, questions: list[dict], max_tokens: int) -> tuple[int, list[dict]]:
    """Right answers of ``engine`` to ``questions`` (greedy), and each reply."""
    replies = engine.generate_batch([q["q"] for q in questions], temperature=0.0, max_tokens=max_tokens)
    rows = []
    for q, reply in zip(questions, replies):
        ok = any(re.search(p, reply, re.I) for p in q["a"])
        rows.append({"q": q["q"], "reply": reply, "right": ok})
    return sum(r["right"] for r in rows), rows


def decode_speed(engine: Engine, reps: int, context: int = 0) -> float:
    """Median decode tokens/s of a solo 64-token reply, after ``context`` tokens of prose
    (``bench.ruler``'s haystack: a conversation that has grown) when > 0."""
    prompt = SPEED_PROMPT
    if context:
        from mlotspark.bench.ruler import haystack_text

        ids = engine.encode(haystack_text(context * 6, seed=0), raw=True)
        if len(ids) < context:
            raise SystemExit(f"model_choice: only {len(ids)} tokens of prose for --context {context}")
        prompt = engine.tokenizer.decode(ids[:context]) + "\n\nSummarise the text above in one paragraph."
    tps = []
    for _ in range(reps):
        out = engine.generate(prompt, temperature=0.0, max_tokens=64)
        tps.append(out.stats.decode_tps)
    return statistics.median(tps)


def busy_loops(n: int) -> list:
    """``n`` processes that each keep a core busy (a laptop running other work)."""
    import subprocess
    import sys

    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", action="append", help="catalogue alias (default: every chat model)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="write every reply here")
    ap.add_argument("--part", choices=["all", "score", "speed"], default="all")
    ap.add_argument("--context", type=int, nargs="+", default=[0],
                    help="speed after these many tokens of prose in the prompt (0: the short prompt)")
    ap.add_argument("--busy", type=int, default=0, help="processes keeping a core busy during the speed part")
    args = ap.parse_args()
    questions = json.loads(DATA.read_text())["questions"]
    models = args.model or list(ALIASES)
    results = {}
    for name in models:
        t0 = time.perf_counter()
        engine = Engine.load(name)
        try:
            right, rows = score(engine, questions, args.max_tokens) if args.part != "speed" else (0, [])
            by_context = {}
            if args.part != "score":
                loops = busy_loops(args.busy)
                try:
                    by_context = {n: round(decode_speed(engine, args.reps, n), 1) for n in args.context}
                finally:
                    for p in loops:
                        p.kill()
                        p.wait()
            tps = by_context.get(args.context[0], 0.0)
        finally:
            engine.close()
        results[name] = {"right": right, "of": len(questions), "decode_tps": round(tps, 1), "replies": rows,
                         "decode_tps_by_context": by_context, "busy": args.busy,
                         "weights": engine.loaded.weights, "seconds": round(time.perf_counter() - t0, 1)}
        print(f"{name}: {right}/{len(questions)} right, decode {tps:.1f} tok/s, by context {by_context} "
              f"(busy {args.busy}; {engine.loaded.weights}, {results[name]['seconds']} s)", flush=True)
        if args.json:  # after each model: a long run that is stopped keeps what it measured
            args.json.write_text(json.dumps(results, indent=1, ensure_ascii=False))
    print("\n| model | right of %d | decode tok/s (this CPU) | weights |" % len(questions))
    print("|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['right']} ({100 * r['right'] / r['of']:.0f}%) | {r['decode_tps']} | {r['weights']} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()

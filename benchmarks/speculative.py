"""Speculative decoding vs plain decoding: speed-up and acceptance, greedy, one run.

    nice python benchmarks/speculative.py --reps 3 --max-tokens 96

Tasks: ``copy`` (repeat a passage), ``edit`` (the passage with one name changed)
and ``free`` (an open-ended story). For each task and repetition, plain greedy and
speculative greedy run back to back on the same engine thread-free path
(``Engine.new_generation(...).run()``: ``generate_step`` vs ours), so the ratio is
taken under the same machine load (DESIGN §7). Reported per task: medians of the
end-to-end seconds (prefill + decode of the same tokens), the speed-up, the
acceptance rate, tokens per target forward pass, and whether the tokens are
identical (they must be: greedy speculation is exact).

``no_draft`` is our speculative loop with drafting switched off (one token per
target pass): its ratio to ``plain`` is loop overhead, not speculation, so the gain
of speculation itself is ``no_draft s / prompt_lookup s``.

``--draft-model NAME`` adds a draft-model column (on this CPU the only draft at hand
is the default model itself, which shows the mechanics and the overhead, not a gain).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import mlotspark  # noqa: F401  (OpenBLAS before mlx)

PASSAGE = (
    "The lighthouse keeper, Mara Ellison, climbed the spiral stairs every evening at dusk. "
    "She trimmed the wick, polished the great lens, and wrote the weather in a leather "
    "logbook. In forty years the light never failed, not even during the storm of 1952, "
    "when the waves broke over the gallery and the ships of the northern fleet steered "
    "home by her beam alone."
)
TASKS = {
    "copy": "Repeat the following passage exactly, word for word:\n\n" + PASSAGE,
    "edit": "Rewrite the following passage with the name Mara Ellison replaced by Anna Berg, "
            "changing nothing else:\n\n" + PASSAGE,
    "free": "Write a short story about a robot who learns to paint.",
}


@contextlib.contextmanager
def drafting_off(on: bool):
    """Prompt lookup that never proposes: the speculative loop alone (benchmark only)."""
    from mlotspark.decoding.drafters import PromptLookupDrafter

    real = PromptLookupDrafter.propose
    if on:
        PromptLookupDrafter.propose = lambda self, context, k, dist=None: ([], None)
    try:
        yield
    finally:
        PromptLookupDrafter.propose = real


def run_once(engine, ids, max_tokens, no_draft=False, **opts):
    gen = engine.new_generation(list(ids), engine.defaults.merged(temperature=0, max_tokens=max_tokens, **opts))
    with drafting_off(no_draft):
        t0 = time.perf_counter()
        result = gen.run()
        return time.perf_counter() - t0, result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    p.add_argument("--draft-model", default=None, help="also run speculative='draft' with this model")
    p.add_argument("--json", action="store_true", help="one JSON object per task on stdout")
    args = p.parse_args()

    from mlotspark.engine import Engine

    engine = Engine.load(progress=False)
    modes = [("plain", {}), ("no_draft", {"speculative": "prompt_lookup", "no_draft": True}),
             ("prompt_lookup", {"speculative": "prompt_lookup"})]
    if args.draft_model:
        modes.append(("draft", {"speculative": "draft", "draft_model": args.draft_model}))
    ids0 = engine.encode("Hello")
    run_once(engine, ids0, 4)  # warm-up (graph caches, BLAS threads)
    for _, opts in modes[1:]:
        run_once(engine, ids0, 4, **opts)
    rows = []
    for task in args.tasks:
        ids = engine.encode(TASKS[task])
        times: dict[str, list[float]] = {m: [] for m, _ in modes}
        stats: dict[str, list[dict]] = {m: [] for m, _ in modes}
        tokens: dict[str, list[list[int]]] = {m: [] for m, _ in modes}
        for _ in range(args.reps):
            for mode, opts in modes:  # interleaved: each repetition sees the same load
                dt, result = run_once(engine, ids, args.max_tokens, **opts)
                times[mode].append(dt)
                stats[mode].append(result.stats.extra.get("speculative", {}))
                tokens[mode].append(result.tokens)
        plain = statistics.median(times["plain"])
        row = {"task": task, "prompt_tokens": len(ids), "tokens": len(tokens["plain"][0]),
               "plain_s": round(plain, 3)}
        for mode, _ in modes[1:]:
            med = statistics.median(times[mode])
            s = stats[mode]
            row[mode] = {
                "s": round(med, 3),
                "speedup": round(plain / med, 2),
                "acceptance": round(statistics.median(x.get("acceptance_rate", 0.0) for x in s), 3),
                "tokens_per_call": round(statistics.median(x.get("tokens_per_call", 0.0) for x in s), 2),
                "identical": all(t == tokens["plain"][0] for t in tokens[mode] + tokens["plain"]),
            }
            if mode != "no_draft":
                row[mode]["vs_no_draft"] = round(statistics.median(times["no_draft"]) / med, 2)
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
    if not args.json:
        head = "| task | prompt tok | gen tok | plain s |"
        for mode, _ in modes[1:]:
            head += f" {mode} s | speed-up | vs no_draft | acceptance | tok/call | identical |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for r in rows:
            line = f"| {r['task']} | {r['prompt_tokens']} | {r['tokens']} | {r['plain_s']} |"
            for mode, _ in modes[1:]:
                m = r[mode]
                line += (f" {m['s']} | {m['speedup']}x | {m.get('vs_no_draft', '-')} | {m['acceptance']} |"
                         f" {m['tokens_per_call']} |"
                         f" {'yes' if m['identical'] else 'NO'} |")
            print(line)
        print(f"\n{len(args.tasks)} tasks x {args.reps} reps, medians; command: python {' '.join(sys.argv)}")
    engine.close()


if __name__ == "__main__":
    main()

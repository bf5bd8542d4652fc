"""TTFT of a new turn in a conversation with ~2k tokens of history, four ways, one run.

- cold: the conversation's snapshot deleted, no warm cache, no prefix cache: the
  whole history is prefilled (what a chat app that stores text only does);
- warm: the previous turn ran in this process, its cache is in memory;
- restored: a new process loads the engine and the snapshot from disk;
- mlx-lm: ``mlx_lm.stream_generate`` prefilling the same prompt tokens on the same
  weights (``reference.mlx_lm_twin``), its default prefill step.

Every mode answers the same turn after the same history (greedy, so the previous
reply is the same token for token). TTFT is the wall time from the call to the first
text piece, so it includes the memory lookup, cache restore and queueing. Reported:
medians of ``--reps`` runs and ratios to cold.

    python benchmarks/ttft_restore.py [--reps 3] [--history-tokens 2000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import mlotspark  # noqa: F401  (OpenBLAS before MLX)

PRIME = "Thanks. Please keep all of that in mind."
QUESTION = "Summarise what we discussed in one sentence."
TOPICS = ["the river", "the old mill", "our garden", "the train station", "the museum", "the harbour",
          "the library", "the bakery", "the mountain hut", "the market square"]
VERBS = ["was built", "was painted", "was repaired", "was visited", "was described", "was measured"]
ADJS = ["quiet", "busy", "narrow", "bright", "cold", "ancient", "modern", "small", "wide", "green"]


def history_messages(tokens: int, count) -> list[dict]:
    """Alternating user/assistant messages of plain English, about ``tokens`` long."""
    rnd = random.Random(0)
    out: list[dict] = []
    total = 0
    i = 0
    while total < tokens:
        sentences = [
            f"In {1850 + rnd.randrange(170)}, {rnd.choice(TOPICS)} {rnd.choice(VERBS)} by a "
            f"{rnd.choice(ADJS)} team, and people still talk about the {rnd.choice(ADJS)} result."
            for _ in range(6 if i % 2 == 0 else 4)
        ]
        text = " ".join(sentences)
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
        total += count(text) + 5
        i += 1
    if out[-1]["role"] == "user":
        out.append({"role": "assistant", "content": "I see."})
    return out


def timed_turn(conv, text: str) -> dict:
    """One turn; TTFT = call to first piece (the reply must not start with EOS)."""
    t0 = time.perf_counter()
    first = None
    stats = None
    for item in conv.stream(text, temperature=0.0, max_tokens=2):
        if isinstance(item, str):
            first = first or time.perf_counter()
        else:
            stats = item
    assert first is not None and stats is not None, "empty reply: pick another question"
    return {
        "ttft_s": first - t0,
        "prefilled": stats.prefilled_tokens,
        "cached": stats.cached_tokens,
        "source": stats.extra.get("cache_source"),
        "prepare_s": stats.extra.get("prepare_s"),
        "reply": conv.messages[-1]["content"],
    }


def child(args: argparse.Namespace) -> None:
    """``--child NAME``: the restored mode, run in a new process."""
    from mlotspark.engine import Engine

    engine = Engine.load(args.model, progress=False)
    engine.set_budgets(prefix_cache_mb=0)
    print(json.dumps(timed_turn(engine.conversation(args.child), QUESTION)), flush=True)
    engine.close()


def mlx_lm_ttft(twin, tokenizer, ids: list[int]) -> float:
    import mlx.core as mx
    from mlx_lm.generate import stream_generate

    t0 = time.perf_counter()
    for _ in stream_generate(twin, tokenizer, mx.array(ids), max_tokens=1):
        break
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--history-tokens", type=int, default=2000)
    ap.add_argument("--model", default=None, help="model (default: the default model, as stored now)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)

    from mlotspark.models.hub import catalogue
    from mlotspark.engine import Engine

    model = args.model or str(catalogue.resolve(None, progress=False).path)  # from the user's home
    home = Path(tempfile.mkdtemp(prefix="mlotspark-bench-"))
    os.environ["MLOTSPARK_HOME"] = str(home)  # conversations of this run only
    engine = Engine.load(model, progress=False)
    engine.set_budgets(prefix_cache_mb=0)  # cold means cold: not even the system prompt cached
    count = lambda s: len(engine.tokenizer.encode(s, add_special_tokens=False))  # noqa: E731
    convs = home / "conversations"

    seed = engine.conversation("seed")
    for m in history_messages(args.history_tokens, count):
        seed.add(m["role"], m["content"])
    shutil.copytree(convs / "seed", convs / "base")
    base = engine.conversation("base")
    primed = timed_turn(base, PRIME)  # the history's last exchange; writes the snapshot
    history = len(engine.encode(base.render()))
    print(f"history: {history} tokens ({len(base.messages)} messages)", file=sys.stderr)

    runs: dict[str, list[dict]] = {"cold": [], "warm": [], "restored": []}
    mlx_lm: list[float] = []
    ids = engine.encode(base.render(QUESTION))
    from mlotspark.models.mlx_lm_twin import mlx_lm_twin

    twin = mlx_lm_twin(engine.loaded)
    for i in range(args.reps):
        shutil.copytree(convs / "base", convs / f"cold-{i}")
        shutil.rmtree(convs / f"cold-{i}" / "snapshot")
        runs["cold"].append(timed_turn(engine.conversation(f"cold-{i}"), QUESTION))

        shutil.copytree(convs / "seed", convs / f"warm-{i}")
        w = engine.conversation(f"warm-{i}")
        again = timed_turn(w, PRIME)
        assert again["reply"] == primed["reply"], "greedy priming turn differs"
        runs["warm"].append(timed_turn(w, QUESTION))

        shutil.copytree(convs / "base", convs / f"restored-{i}")
        out = subprocess.run(
            [sys.executable, __file__, "--child", f"restored-{i}", "--model", model],
            capture_output=True, text=True, env={**os.environ},
        )
        # Judged by its JSON line, not its exit code: an abort at interpreter exit
        # (after the figures are printed) is an engine-shutdown issue, not this turn's.
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise RuntimeError(f"restored run failed (exit {out.returncode}): {out.stderr[-2000:]}")
        runs["restored"].append(json.loads(lines[-1]))

        mlx_lm.append(engine.run_on_engine(mlx_lm_ttft, twin, engine.tokenizer, ids))
        print(f"rep {i}: " + ", ".join(f"{k} {v[-1]['ttft_s']:.3f}s" for k, v in runs.items())
              + f", mlx-lm {mlx_lm[-1]:.3f}s", file=sys.stderr)
    engine.close()

    med = {k: statistics.median(r["ttft_s"] for r in v) for k, v in runs.items()}
    med["mlx-lm"] = statistics.median(mlx_lm)
    replies = {r["reply"] for v in runs.values() for r in v}
    result = {
        "history_tokens": history,
        "prompt_tokens": len(ids),
        "reps": args.reps,
        "median_ttft_s": {k: round(v, 4) for k, v in med.items()},
        "ratio_to_cold": {k: round(v / med["cold"], 4) for k, v in med.items()},
        "prefilled": {k: [r["prefilled"] for r in v] for k, v in runs.items()},
        "cached": {k: [r["cached"] for r in v] for k, v in runs.items()},
        "sources": {k: sorted({r["source"] for r in v}) for k, v in runs.items()},
        "prepare_s_median": {k: round(statistics.median(r["prepare_s"] for r in v), 4) for k, v in runs.items()},
        "same_reply_everywhere": len(replies) == 1,
        "snapshot_bytes": sum(p.stat().st_size for p in (convs / "base" / "snapshot").iterdir()),
    }
    print(json.dumps(result, indent=2))
    print("\n| mode | median TTFT (s) | x cold | prefilled tokens |")
    print("|---|---|---|---|")
    for k in ("cold", "warm", "restored", "mlx-lm"):
        pre = result["prefilled"].get(k, [len(ids)])[0]
        print(f"| {k} | {med[k]:.3f} | {med[k] / med['cold']:.3f} | {pre} |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

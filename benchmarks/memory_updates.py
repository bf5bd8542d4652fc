"""Knowledge updates, same-kind pairs and retractions at the memory store (no suite: no chat model; `--suite memory` runs one).

Data: the five older sets ``benchmarks/data/memory_updates.json`` and
``memory_updates_set{2..5}.json`` (updates: old, new, question; same-kind pairs: a, b
and a question about a; retractions: fact, say, question, key). Each set is told to a
fresh store as chat turns through ``learn_turn`` (the simple writer), the older
statements first, then the newer ones and the retractions; then each question is
asked with ``retrieve_for_prompt``:

- newer wins: the newer statement is injected and the older is not;
- pair kept: the first fact is injected (the second did not take its place);
- retraction: the fact is gone from current entries and nothing injected carries its key.

``--grid`` scores a range of the calibration's ``newer_gap`` (the question-time rule of
``search.newest_of_alike``) on all five sets: how the shipped value was chosen.

    python benchmarks/memory_updates.py --embedder mpnet [--grid]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from mlotspark.memory.semantic import MiniLMEmbedder, MPNetEmbedder, SemanticStore, learn_turn
from mlotspark.memory.semantic.requests import forget_queries
from mlotspark.memory.semantic.writer import statements
from mlotspark.models import bundles

from mlotspark.bench.memory_judge import Precomputed

DATA = Path(__file__).with_name("data")
SETS = ["memory_updates.json"] + [f"memory_updates_set{i}.json" for i in range(2, 6)]
BUNDLE = {"minilm": bundles.EMBEDDER_MODEL, "mpnet": bundles.MPNET_MODEL}


def _has(texts: list[str], needle: str) -> bool:
    return any(needle.lower() in t.lower() for t in texts)


def score_set(data: dict, emb, tmp: Path, newer_gap: float | None) -> dict:
    with SemanticStore(tmp / "m.db", emb) as store:
        if newer_gap is not None:
            store.calibration = dataclasses.replace(store.calibration, newer_gap=newer_gap)
        ups, pairs, rets = data["updates"], data["unrelated_pairs"], data.get("retractions", [])
        for u in ups:
            learn_turn(store, u["old"])
        for p in pairs:
            learn_turn(store, p["a"])
        for r in rets:
            learn_turn(store, r["fact"])
        for u in ups:
            learn_turn(store, u["new"])
        for p in pairs:
            learn_turn(store, p["b"])
        told = {e.id for e in store.list()}
        facts = {e.id for e in store.list() if any(r["key"].lower() in e.text.lower() for r in rets)}
        for r in rets:
            learn_turn(store, r["say"])
        lost = len(told - facts - {e.id for e in store.list()})  # deleted, though no request named them

        def shown(q: str) -> list[str]:
            return [h.entry.text for h in store.retrieve_for_prompt(q)]

        newer = sum(_has(shown(u["question"]), u["new_key"]) and not _has(shown(u["question"]), u["old_key"])
                    for u in ups)
        kept = sum(_has(shown(p["question"]), p["a_key"]) for p in pairs)
        current = [e.text for e in store.list(current_only=True)]
        gone = sum(not _has(current, r["key"]) and not _has(shown(r["question"]), r["key"]) for r in rets)
        return {"updates": [newer, len(ups)], "pairs": [kept, len(pairs)], "retractions": [gone, len(rets)],
                "other_entries_lost": [lost, len(told)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embedder", default="mpnet", choices=["minilm", "mpnet"])
    ap.add_argument("--grid", action="store_true", help="score newer_gap from 0.0 to 0.3")
    ap.add_argument("--forget-apart", type=float, default=None, help="score this learning.FORGET_APART")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    print("command: python " + " ".join(sys.argv), flush=True)
    sets = {f: json.loads((DATA / f).read_text(encoding="utf-8")) for f in SETS}
    emb = Precomputed((MiniLMEmbedder if args.embedder == "minilm" else MPNetEmbedder)(
        bundles.pull(BUNDLE[args.embedder], progress=False)))
    # Every text a store will embed, in batches once: the statements told, the questions, the requests.
    said = [t for d in sets.values() for u in d["updates"] for t in (u["old"], u["new"])]
    said += [t for d in sets.values() for p in d["unrelated_pairs"] for t in (p["a"], p["b"])]
    said += [t for d in sets.values() for r in d.get("retractions", []) for t in (r["fact"], r["say"])]
    emb.prime([s for t in said for s in statements(t)] + [q for t in said for q in forget_queries(t)]
              + [x["question"] for d in sets.values() for k in ("updates", "unrelated_pairs", "retractions")
                 for x in d.get(k, [])])
    if args.forget_apart is not None:
        from mlotspark.memory.semantic import learning

        learning.FORGET_APART = args.forget_apart
    gaps = [round(0.02 * i, 2) for i in range(16)] if args.grid else [None]
    results = {}
    for gap in gaps:
        totals = {"updates": [0, 0], "pairs": [0, 0], "retractions": [0, 0], "other_entries_lost": [0, 0]}
        per = {}
        for f, data in sets.items():
            with tempfile.TemporaryDirectory() as tmp:
                per[f] = score_set(data, emb, Path(tmp), gap)
            for k, (a, n) in per[f].items():
                totals[k][0] += a
                totals[k][1] += n
        results[str(gap)] = {"total": totals, "sets": per}
        print(f"newer_gap {gap if gap is not None else 'shipped'}: " + ", ".join(
            f"{k} {a}/{n} ({a / max(1, n):.0%})" for k, (a, n) in totals.items()), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()

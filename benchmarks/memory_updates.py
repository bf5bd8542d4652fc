"""Knowledge updates and retractions in semantic memory, held out (issue 27).

Data: ``benchmarks/data/memory_updates.json`` (written before any update rule):
60 updates (older fact, newer fact, question, newer and older key word), 30 pairs
of same-kind facts about different things, 12 retractions. Each list is split in
seeded halves: ``fit`` (the rules in ``memory/semantic/updates.py`` were tuned on
it) and ``held_out`` (judged only). Every store also holds the 420 background
entries of ``memory_eval.json`` + ``memory_eval_fresh.json`` (facts and notes),
so an update must find its fact among many.

    python benchmarks/memory_updates.py --embedder mpnet --e2e-model qwen2.5-coder-0.5b

Per set:

- superseded: the older fact is marked superseded by the newer one;
- wrongly superseded: entries marked that should not be (a background entry, a
  same-kind pair's first fact, another update's fact), over all marks;
- newer wins: ``retrieve_for_prompt(question)`` injects the newer fact and not the
  older one; newer in top 3: the newer fact among the first 3 search hits;
- retractions: the named fact removed and nothing else, and the question then
  injects nothing carrying its key word;
- how the facts are told (``--tell``): ``turn`` (the default, the user's path) says each
  older fact, same-kind pair and newer fact as a chat turn (``learn_turn``: only what the
  turn's rules keep is stored, and a retraction is a turn too); ``remember`` stores every
  sentence as ``memory add`` does (the figures before 2026-11-28 were taken so);
- end to end (``--e2e-model``): each update question asked in a new conversation
  of an engine whose memory holds the background (imported) and was told the facts in
  order (with ``--tell turn`` each in a conversation's turn, else imported),
  greedy, 32 tokens: the reply carries the newer key word and not the older one.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path

from mlotspark.memory.semantic import HashingEmbedder, MiniLMEmbedder, MPNetEmbedder, SemanticStore, learn_turn
from mlotspark.memory.semantic.facts import sentences, statements
from mlotspark.memory.semantic.retractions import retraction
from mlotspark.models import bundles, catalogue

sys.path.insert(0, str(Path(__file__).parent))
from embed_cache import Precomputed  # noqa: E402

DATA = Path(__file__).with_name("data")
BUNDLE = {"minilm": bundles.EMBEDDER_MODEL, "mpnet": bundles.MPNET_MODEL}


def halves(n: int, seed: int) -> dict[str, list[int]]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return {"fit": sorted(order[: n // 2]), "held_out": sorted(order[n // 2 :])}


def background() -> list[str]:
    doc = json.loads((DATA / "memory_eval.json").read_text(encoding="utf-8"))
    fresh = json.loads((DATA / "memory_eval_fresh.json").read_text(encoding="utf-8"))
    return [p["fact"] for p in doc["pairs"] + fresh["pairs"]] + doc["distractors"] + fresh["distractors"]


def embedder(name: str):
    if name == "hashing":
        return HashingEmbedder()
    d = bundles.pull(BUNDLE[name], progress=False)
    return (MiniLMEmbedder if name == "minilm" else MPNetEmbedder)(d)


def told(store: SemanticStore, text: str, tell: str) -> int | None:
    """The entry ``text`` became: said in a chat turn (``tell="turn"``: ``learn_turn``, what a
    conversation does with the user's message; None when nothing was kept) or remembered as
    ``memory add`` / ``memory import`` do (``"remember"``)."""
    if tell == "remember":
        return store.remember(text)
    kept = learn_turn(store, text).remembered
    return kept[-1] if kept else None


def updates_on(store: SemanticStore, bg: list[str], ups: list[dict], pairs: list[dict], tell: str = "turn") -> dict:
    for t in bg:  # what the user's memory already holds (as an import adds it)
        store.remember(t)
    olds = [told(store, u["old"], tell) for u in ups]
    firsts = [told(store, p["a"], tell) for p in pairs]
    news = [told(store, u["new"], tell) for u in ups]
    seconds = {told(store, p["b"], tell) for p in pairs} - {None}
    expected = {o: n for o, n in zip(olds, news) if o is not None}
    marked = {e.id: e.superseded_by for e in store.list() if e.superseded_by is not None}
    right = sum(o is not None and n is not None and marked.get(o) == n for o, n in zip(olds, news))
    # Marks other than the intended ones, listed for reading: some are right (the background
    # and the updates hold two values of one slot, e.g. two favourite colours), some not.
    wrong = [(store.get(i).text if store.get(i) else i, store.get(j).text if store.get(j) else j)
             for i, j in marked.items() if expected.get(i) != j]
    newer_wins = top3 = 0
    rows = []
    for u, o, n in zip(ups, olds, news):
        chosen = [h.id for h in store.retrieve_for_prompt(u["question"])]
        hits = [h.id for h in store.search(u["question"], k=3)]
        ok = n is not None and n in chosen and (o is None or o not in chosen)
        newer_wins += ok
        top3 += n is not None and n in hits
        rows.append({"question": u["question"], "superseded": o is not None and n is not None and marked.get(o) == n,
                     "newer_wins": ok, "old_kept": o is not None, "new_kept": n is not None,
                     "injected": [store.get(i).text for i in chosen]})
    return {"n": len(ups), "tell": tell, "superseded": right / len(ups), "newer_wins": newer_wins / len(ups),
            "old_kept": sum(o is not None for o in olds) / len(ups), "new_kept": sum(n is not None for n in news) / len(ups),
            "newer_in_top3": top3 / len(ups),
            "pairs_kept_apart": sum(f is None or marked.get(f) not in seconds for f in firsts) / max(1, len(pairs)),
            "other_marks": len(wrong), "marks": len(marked), "other_marks_list": wrong, "rows": rows}


def retractions_on(store: SemanticStore, bg: list[str], rets: list[dict], tell: str = "turn") -> dict:
    for t in bg:
        store.remember(t)
    ids = [told(store, r["fact"], tell) for r in rets]
    before = {e.id for e in store.list()}
    removed_right = clean = 0
    for r, i in zip(rets, ids):
        # In a chat turn each sentence that reads as a retraction retracts (``learn_turn``).
        gone = learn_turn(store, r["say"]).forgotten if tell == "turn" else store.retract(r["say"])
        removed_right += i is not None and [e.id for e in gone] == [i]
        chosen = store.retrieve_for_prompt(r["question"])
        clean += not any(r["key"].lower() in h.text.lower() for h in chosen)
    after = {e.id for e in store.list()}
    # Lost: entries there before the retractions and gone after, other than the facts they named
    # (counted by id: a retraction's turn may also store a fact, which is no loss).
    lost = before - after - {i for i in ids if i is not None}
    return {"n": len(rets), "removed_the_fact": removed_right / len(rets), "question_clean": clean / len(rets),
            "entries_lost_besides": len(lost), "entries_added": len(after - before)}


def end_to_end(model: str, bg: list[str], ups: list[dict], home: Path, emb_name: str, emb_dir: Path,
               tell: str = "turn") -> dict:
    os.environ["MLOTSPARK_HOME"] = str(home)  # conversations and memory in a scratch home
    os.environ["MLOTSPARK_EMBEDDER"] = emb_name
    if emb_name in BUNDLE:  # the embedder in this home: a link to the pulled copy
        link = home / "models" / BUNDLE[emb_name]
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(emb_dir, target_is_directory=True)
    from mlotspark import Engine

    engine = Engine.load(model)
    try:
        # The background as ``mlotspark memory import`` fills it (one batched embedding, each entry
        # through the insert and update rules); the updates' facts, with --tell turn, each said in a
        # conversation's turn as a user says them (one token of reply), else imported too.
        said = [u["old"] for u in ups] + [u["new"] for u in ups]
        fill = home / "fill.json"
        fill.write_text(json.dumps(bg + (said if tell == "remember" else [])), encoding="utf-8")
        engine.memory.import_json(fill)
        if tell == "turn":
            for i, text in enumerate(said):
                engine.conversation(f"tell{i}").send(text, temperature=0.0, max_tokens=1)
        ok = injected = 0
        rows = []
        for i, u in enumerate(ups):
            r = engine.conversation(f"u{i}").send(u["question"], temperature=0.0, max_tokens=32)
            text = r.text.lower()
            good = u["new_key"].lower() in text and u["old_key"].lower() not in text
            ok += good
            used = [engine.memory.get(j).text for j in r.stats.extra["memory"]["used"]]
            # The newer fact among what was injected: its key in an injected entry (a turn stores the
            # sentence that says it, tidied, not the turn's whole text that ``u["new"]`` holds).
            injected += any(u["new_key"].lower() in t.lower() for t in used)
            rows.append({"question": u["question"], "ok": good, "reply": r.text, "injected": used})
        return {"model": model, "embedder": engine.memory.embedder.name, "n": len(ups), "tell": tell,
                "reply_has_newer_only": ok / len(ups), "newer_injected": injected / len(ups), "rows": rows}
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embedder", default="mpnet", choices=["hashing", "minilm", "mpnet"])
    ap.add_argument("--sets", nargs="+", default=["fit", "held_out"], choices=["fit", "held_out"])
    ap.add_argument("--e2e-model", default=None, help="chat model (alias or path) for the end-to-end questions (held out)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", type=Path, default=DATA / "memory_updates.json",
                    help="the cases (default: memory_updates.json; memory_updates_round2.json is a second set, in other words)")
    ap.add_argument("--tell", choices=["turn", "remember"], default="turn",
                    help="how the updates' facts reach memory: said in a chat turn as a user says them (learn_turn, "
                         "the default: the user's path), or remembered as 'memory add' does (every sentence kept)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    print("command: python " + " ".join(sys.argv), flush=True)
    data = json.loads(args.data.read_text(encoding="utf-8"))
    bg = background()
    split_u = halves(len(data["updates"]), args.seed)
    split_p = halves(len(data["unrelated_pairs"]), args.seed + 1)
    split_r = halves(len(data["retractions"]), args.seed + 2)
    emb = Precomputed(embedder(args.embedder))  # every text embedded once, in batches
    emb.prime(bg + [u[k] for u in data["updates"] for k in ("old", "new", "question")]
              + [p[k] for p in data["unrelated_pairs"] for k in "ab"]
              + [r[k] for r in data["retractions"] for k in ("fact", "question")]
              + [w for r in data["retractions"] if (w := retraction(r["say"]))]
              # what a chat turn embeds: the turn's sentences as tidied, and what they retract
              + [t for u in data["updates"] for k in ("old", "new") for t in statements(u[k])]
              + [t for p in data["unrelated_pairs"] for k in "ab" for t in statements(p[k])]
              + [t for r in data["retractions"] for t in statements(r["fact"])]
              + [w for r in data["retractions"] for t in sentences(r["say"]) if (w := retraction(t))])
    emb_dir = bundles.bundle_dir(BUNDLE[args.embedder]) if args.embedder in BUNDLE else Path()
    gguf = str(catalogue.resolve(args.e2e_model, progress=False).path) if args.e2e_model else None
    results: dict = {"embedder": emb.name, "tell": args.tell}
    with tempfile.TemporaryDirectory() as tmp:
        for part in args.sets:
            ups = [data["updates"][i] for i in split_u[part]]
            pairs = [data["unrelated_pairs"][i] for i in split_p[part]]
            rets = [data["retractions"][i] for i in split_r[part]]
            with SemanticStore(Path(tmp) / f"u-{part}.db", emb) as s:
                u = updates_on(s, bg, ups, pairs, args.tell)
            with SemanticStore(Path(tmp) / f"a-{part}.db", emb) as s:  # the same without the background entries
                alone = updates_on(s, [], ups, pairs, args.tell)
            print(f"{part}, without the 420 background entries: superseded {alone['superseded']:.0%}, newer wins "
                  f"{alone['newer_wins']:.0%}, pairs kept apart {alone['pairs_kept_apart']:.0%}, other marks "
                  f"{alone['other_marks']} of {alone['marks']}", flush=True)
            with SemanticStore(Path(tmp) / f"r-{part}.db", emb) as s:
                r = retractions_on(s, bg, rets, args.tell)
            results[part] = {"updates": u, "updates_alone": alone, "retractions": r}
            print(f"{part}: told as {args.tell}: old facts kept {u['old_kept']:.0%}, newer kept {u['new_kept']:.0%}; "
                  f"updates superseded {u['superseded']:.0%} of {u['n']}, newer wins at retrieval "
                  f"{u['newer_wins']:.0%}, newer in top 3 {u['newer_in_top3']:.0%}, same-kind pairs kept apart "
                  f"{u['pairs_kept_apart']:.0%}, other marks {u['other_marks']} of {u['marks']}; retractions: "
                  f"removed {r['removed_the_fact']:.0%} of {r['n']}, question clean {r['question_clean']:.0%}, "
                  f"other entries lost {r['entries_lost_besides']}, entries added {r['entries_added']}", flush=True)
            for w in u["other_marks_list"]:
                print(f"   also superseded: {w[0]!r} by {w[1]!r}")
        if gguf:
            ups = [data["updates"][i] for i in split_u["held_out"]]
            e = end_to_end(gguf, bg, ups, Path(tmp) / "home", args.embedder, emb_dir, args.tell)
            results["e2e_held_out"] = e
            print(f"end to end ({args.e2e_model}, held out): reply has the newer key and not the older "
                  f"{e['reply_has_newer_only']:.0%} of {e['n']}, newer fact injected {e['newer_injected']:.0%}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()

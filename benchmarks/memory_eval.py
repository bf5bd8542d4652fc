"""Semantic-memory evaluation on its input sets (`--suite memory` is the user's path; this one scores the store and its thresholds).

Retrieval of paraphrased questions, wrong injections, what a turn keeps, end to end.

Data (written for this project): ``benchmarks/data/memory_eval.json``, 205
(personal fact, paraphrased question, key word) pairs, 110 distractor notes, 103
prompts about nothing stored, and 50 + 50 user turns with and without a personal
fact; ``benchmarks/data/memory_eval_fresh.json``, 75 more pairs, 30 distractors on
the same topics and 60 unrelated prompts, used only as held-out data;
``benchmarks/data/memory_eval_fit_extra.json``, 40 first-person requests ("I need a
name for my blog."), unrelated prompts of the fit set only.

    python benchmarks/memory_eval.py --embedder hashing mpnet --e2e 40

Per embedder (hashing, MiniLM, MPNet), one store holds every fact and distractor of
both files (420 entries, each through ``SemanticStore.remember``), and each figure
is computed with the embedder's shipped calibration (``calibration_for``):

- recall@1 / recall@3: the question's own fact among the first 1 / 3 search hits
  (calibrated score);
- injected: the fact is among what ``retrieve_for_prompt`` would put into the
  prompt (top 3, the calibration's threshold for the message, ``about_user``
  deciding which, and its margin; the token budget and ``newest_of_alike`` aside);
- wrong injections: prompts about nothing stored that get anything injected
  (``unrelated``); questions that get entries injected but not their fact
  (``wrong-only``); and the share of injected entries that are not the fact;
- what a turn keeps: the entries the simple writer (``learn_turn``'s default)
  makes of the 50 fact turns (one of them must contain the turn's key word) and of
  the 50 turns that state none;
- end to end (``--e2e N``, the default chat model or ``--model``, greedy): N
  questions (seeded sample), each asked in a *new* conversation of an engine whose
  memory holds the other entries (imported) and the asked facts, told through
  ``learn_turn`` with the engine's memory writer (``--e2e-tell turn``, the default)
  or imported; the reply must contain the key word.

Held out: the first file's pairs and unrelated prompts are split in two halves
(seeded); the two thresholds (about the user / other) are fitted on the first half
(the injection rate is maximised with unrelated injections <= 5%, grid 0.05..0.80)
and every figure is also given on the held-out set, the second half plus the whole
fresh file, with the shipped calibration and with the fitted one, and on the fresh
file alone. ``--misses`` prints each question of a set whose fact is not in the top
3: the fact's rank and scores, and the three entries above it (study the fit half,
judge on the held-out set). ``--rerank N``: the chat model as a reranker of the top
5, on held-out questions and unrelated prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from mlotspark.memory.semantic import (Calibration, HashingEmbedder, MiniLMEmbedder, MPNetEmbedder, SemanticStore, SimpleWriter,
                                       about_user, calibration_for, learn_turn)
from mlotspark.models import bundles, catalogue

from mlotspark.bench.memory_judge import Precomputed

DATA = Path(__file__).with_name("data") / "memory_eval.json"
FRESH = Path(__file__).with_name("data") / "memory_eval_fresh.json"
FIT_EXTRA = Path(__file__).with_name("data") / "memory_eval_fit_extra.json"  # first-person requests, fit set only


BUNDLE = {"minilm": bundles.EMBEDDER_MODEL, "mpnet": bundles.MPNET_MODEL}


def make_embedder(name: str, dirs: dict[str, Path]):
    if name == "hashing":
        return HashingEmbedder()
    return (MiniLMEmbedder if name == "minilm" else MPNetEmbedder)(dirs[name])


def split(n: int, seed: int) -> tuple[list[int], list[int]]:
    """Indices of a seeded half (for fitting) and the other half (held out)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return sorted(order[: n // 2]), sorted(order[n // 2 :])


def candidates(store: SemanticStore, query: str) -> list[tuple[int, float, float]]:
    """(entry id, cosine, lexical) of the best entries for ``query`` (any calibration re-ranks them)."""
    return [(h.id, h.vector, h.lexical) for h in store.search(query, k=15)]


def figures(cal: Calibration, qs: list, golds: list[int], unrelated: list) -> dict:
    """Recall and injection figures of ``cal`` on candidate lists (chosen as ``retrieve_for_prompt`` does, top 3,
    its token budget and ``newest_of_alike`` aside)."""
    def ranked(cands):
        return sorted(((cal.score(v, lx), i) for i, v, lx in cands), key=lambda t: (-t[0], -t[1]))

    def chosen(text, cands):
        th, out = cal.threshold(text), []
        for score, i in ranked(cands):
            if score < th or (out and score < out[0][0] - cal.margin) or len(out) == 3:
                break
            out.append((score, i))
        return [i for _, i in out]

    r1 = r3 = inj = wrong_only = n_inj = n_foreign = 0
    misses = []
    for (text, cands), gold in zip(qs, golds):
        top = [i for _, i in ranked(cands)[:3]]
        r1 += top[:1] == [gold]
        r3 += gold in top
        c = chosen(text, cands)
        inj += gold in c
        wrong_only += bool(c) and gold not in c
        n_inj += len(c)
        n_foreign += sum(i != gold for i in c)
        if gold not in top:
            misses.append(text)
    n = max(1, len(qs))
    return {"n": len(qs), "n_unrelated": len(unrelated), "recall@1": r1 / n, "recall@3": r3 / n, "injected": inj / n,
            "wrong_unrelated": sum(bool(chosen(t, c)) for t, c in unrelated) / max(1, len(unrelated)),
            "wrong_only": wrong_only / n, "foreign_share": n_foreign / max(1, n_inj), "misses@3": misses}


def fit(base: Calibration, qs: list, golds: list[int], unrelated: list, max_wrong: float = 0.05) -> Calibration:
    """Thresholds that inject the asked fact most often with unrelated injections <= ``max_wrong``.

    The two thresholds (about the user / other) are fitted together on a grid of
    0.05..0.80; scoring formula and margin stay as ``base``'s. Each message gets
    exactly one of them, so the counts per threshold are computed once and summed.
    Ties go to the higher thresholds (fewer injections of anything)."""
    grid = np.round(0.05 + 0.01 * np.arange(76), 2)

    def kind(text: str) -> int:
        return int(about_user(text))

    def chosen_at(cands, t: float) -> list[int]:
        out: list[tuple[float, int]] = []
        for score, i in sorted(((base.score(v, lx), i) for i, v, lx in cands), key=lambda x: (-x[0], -x[1])):
            if score < t or (out and score < out[0][0] - base.margin) or len(out) == 3:
                break
            out.append((score, i))
        return [i for _, i in out]

    inj, wrong = np.zeros((2, len(grid))), np.zeros((2, len(grid)))
    for (text, cands), gold in zip(qs, golds):
        inj[kind(text)] += [gold in chosen_at(cands, t) for t in grid]
    for text, cands in unrelated:
        wrong[kind(text)] += [bool(chosen_at(cands, t)) for t in grid]
    # (other, about the user) over the grid, each axis one threshold.
    total_inj = inj[0][:, None] + inj[1][None, :]
    total_wrong = wrong[0][:, None] + wrong[1][None, :]
    th_sum = grid[:, None] + grid[None, :]
    ok = total_wrong <= max_wrong * max(1, len(unrelated)) + 1e-9
    if not ok.any():
        return base
    key = np.where(ok, total_inj * 1000 + th_sum, -np.inf)
    o, u = np.unravel_index(int(np.argmax(key)), key.shape)
    return replace(base, threshold_other=float(grid[o]), threshold_about_user=float(grid[u]))


def sets(doc: dict, fresh: dict, seed: int, n_extra: int = 0) -> dict[str, tuple[list[int], list[int]]]:
    """(pair indices, unrelated indices) of each set, over ``pairs`` / ``unrelated`` of the files concatenated.

    ``fit``: the seeded first half of the first file (plus the ``n_extra`` fit-only
    prompts, which come last); ``held_out``: its other half plus the whole fresh
    file; ``fresh``: the fresh file alone; ``all``: both files, fit-only prompts aside."""
    n_p, n_u = len(doc["pairs"]), len(doc["unrelated"])
    fit_q, held_q = split(n_p, seed)
    fit_u, held_u = split(n_u, seed + 1)
    fresh_q = list(range(n_p, n_p + len(fresh["pairs"])))
    fresh_u = list(range(n_u, n_u + len(fresh["unrelated"])))
    extra_u = list(range(n_u + len(fresh_u), n_u + len(fresh_u) + n_extra))
    return {"fit": (fit_q, fit_u + extra_u), "held_out": (held_q + fresh_q, held_u + fresh_u), "fresh": (fresh_q, fresh_u),
            "all": (list(range(n_p + len(fresh_q))), list(range(n_u + len(fresh_u))))}


def print_misses(store: SemanticStore, cal: Calibration, pairs: list[dict], ids: list[int], which: list[int], label: str) -> None:
    """For each question of ``which`` whose fact is not in the top 3: its rank, scores and the entries above it."""
    print(f"\n{label}: questions whose fact is not in the top 3 (rank, score = calibrated (cosine, lexical))")
    for i in which:
        hits = store.search(pairs[i]["question"], k=len(store))
        ranked = sorted(hits, key=lambda h: (-cal.score(h.vector, h.lexical), -h.id))
        rank = next((r for r, h in enumerate(ranked) if h.id == ids[i]), None)
        if rank is not None and rank < 3:
            continue
        gold = ranked[rank] if rank is not None else None
        where = f"rank {rank + 1}, {cal.score(gold.vector, gold.lexical):.3f} ({gold.vector:.3f}, {gold.lexical:.3f})" if gold else "not found"
        print(f"- {pairs[i]['question']!r} -> {pairs[i]['fact']!r}: {where}")
        for h in ranked[:3]:
            print(f"    {cal.score(h.vector, h.lexical):.3f} ({h.vector:.3f}, {h.lexical:.3f}) {h.entry.text!r}")


RERANK_PROMPT = ("Question: {q}\n\nNotes:\n{notes}\n\nWhich note answers the question? "
                 "Reply with the note's number only, or 0 if no note answers it.")


def rerank(engine, store: SemanticStore, cal: Calibration, items: list[tuple[str, list]], golds: list[int | None], k: int = 5) -> dict:
    """The chat model as a reranker of the top ``k`` candidates (through ``Engine.generate``, greedy).

    For each question, the model reads its top ``k`` notes (calibrated order) and names
    the one that answers it (or 0). Figures, before and after: the fact first (recall@1),
    and what would be injected if the named note alone were (the fact; for prompts about
    nothing stored, ``gold`` None, anything)."""
    before1 = after1 = named_gold = named_any_unrelated = 0
    n_q = sum(g is not None for g in golds)
    n_u = len(golds) - n_q
    rows = []
    for (text, cands), gold in zip(items, golds):
        ranked = [i for _, i in sorted(((cal.score(v, lx), i) for i, v, lx in cands), key=lambda t: (-t[0], -t[1]))][:k]
        notes = "\n".join(f"{j + 1}. {store.get(i).text}" for j, i in enumerate(ranked))
        reply = engine.generate(RERANK_PROMPT.format(q=text, notes=notes), temperature=0.0, max_tokens=4).text
        digits = [c for c in reply if c.isdigit()]
        pick = int(digits[0]) if digits else 0
        named = ranked[pick - 1] if 1 <= pick <= len(ranked) else None
        if gold is None:
            named_any_unrelated += named is not None
        else:
            before1 += ranked[:1] == [gold]
            after1 += (named == gold) if named is not None else (ranked[:1] == [gold])
            named_gold += named == gold
        rows.append({"question": text, "reply": reply, "named": named, "gold": gold})
        print(f"rerank {len(rows)}/{len(items)}: gold {gold} named {named} {reply!r}", flush=True)
    return {"questions": n_q, "unrelated": n_u, "recall@1_before": before1 / max(1, n_q),
            "recall@1_after": after1 / max(1, n_q), "named_the_fact": named_gold / max(1, n_q),
            "unrelated_named_a_note": named_any_unrelated / max(1, n_u), "rows": rows}


def retrieval(doc: dict, fresh: dict, extra: list[str], embedder, directory: Path, seed: int, misses: str | None = None,
              reranker=None, rerank_n: int = 0) -> dict:
    t0 = time.perf_counter()
    pairs = doc["pairs"] + fresh["pairs"]
    embedder = Precomputed(embedder)  # every text embedded once, in batches: same vectors, less time
    embedder.prime([p["fact"] for p in pairs] + [p["question"] for p in pairs] + doc["distractors"] + fresh["distractors"]
                   + doc["unrelated"] + fresh["unrelated"] + extra)
    store = SemanticStore(directory / f"{embedder.name}.db", embedder, near_duplicate=None)
    ids = [store.remember(p["fact"]) for p in pairs]
    for d in doc["distractors"] + fresh["distractors"]:
        store.remember(d)
    filled = time.perf_counter() - t0
    qs = [(p["question"], candidates(store, p["question"])) for p in pairs]
    unrelated = [(u, candidates(store, u)) for u in doc["unrelated"] + fresh["unrelated"] + extra]
    entries = len(store)
    shipped = calibration_for(embedder.name)
    parts = sets(doc, fresh, seed, len(extra))
    pick = lambda xs, idx: [xs[i] for i in idx]  # noqa: E731

    def on(cal: Calibration, name: str) -> dict:
        q, u = parts[name]
        return figures(cal, pick(qs, q), pick(ids, q), pick(unrelated, u))

    fitted = fit(shipped, pick(qs, parts["fit"][0]), pick(ids, parts["fit"][0]), pick(unrelated, parts["fit"][1]))
    if misses:
        print_misses(store, shipped, pairs, ids, parts[misses][0], f"{embedder.name}, {misses} set")
    reranked = None
    if reranker is not None:  # held out only: a seeded sample of its questions and of its unrelated prompts
        rng = random.Random(seed)
        hq, hu = parts["held_out"]
        sq, su = rng.sample(hq, min(rerank_n, len(hq))), rng.sample(hu, min(rerank_n // 2, len(hu)))
        reranked = rerank(reranker, store, shipped, pick(qs, sq) + pick(unrelated, su), pick(ids, sq) + [None] * len(su))
    store.close()
    first_person = [t for t, _ in pick(unrelated, parts["all"][1]) if about_user(t)]
    out = {"embedder": embedder.name, "entries": entries, "fill_s": round(filled, 1),
           **on(shipped, "all"),
           "about_user": {"questions": sum(about_user(t) for t, _ in qs) / len(qs),
                          "unrelated": len(first_person) / len(parts["all"][1])},
           "fitted": {"threshold_about_user": fitted.threshold_about_user, "threshold_other": fitted.threshold_other},
           "fit_half": on(fitted, "fit"), "fit_half_shipped": on(shipped, "fit"),
           "held_out_shipped": on(shipped, "held_out"), "held_out_fitted": on(fitted, "held_out"),
           "fresh_shipped": on(shipped, "fresh")}
    if reranked is not None:
        out["rerank"] = reranked
    return out


def kept(turn: str) -> list[str]:
    """The entries ``learn_turn`` with the simple writer makes of ``turn`` (its ``add`` operations; no store needed)."""
    return [op.text for op in SimpleWriter().operations(turn, {}) if op.kind == "add"]


def turns_kept(doc: dict) -> dict:
    """What the simple writer keeps of ``doc["turns"]`` (``fact``: {text, key}; ``chat``: texts)."""
    fact = [(t["key"].lower(), kept(t["text"])) for t in doc["turns"]["fact"]]
    chat = [k for t in doc["turns"]["chat"] for k in kept(t)]
    with_key = sum(key in k.lower() for key, ks in fact for k in ks)
    total = sum(len(ks) for _, ks in fact) + len(chat)
    return {
        "fact_turns": len(fact),
        "chat_turns": len(doc["turns"]["chat"]),
        "key_kept": sum(any(key in k.lower() for k in ks) for key, ks in fact) / len(fact),
        "entries_with_key": with_key / total if total else 1.0,
        "entries_from_fact_turns": sum(len(ks) for _, ks in fact),
        "chat_turns_with_an_entry": sum(bool(kept(t)) for t in doc["turns"]["chat"]),
        "kept_from_chat": chat,
    }


def end_to_end(doc: dict, fresh: dict, embedder_name: str, n: int, seed: int, home: Path, gguf: Path, dirs: dict[str, Path],
               which: str = "held_out", tell: str = "turn") -> dict:
    """``n`` questions of set ``which`` (seeded sample; ``fit`` to tune, ``held_out`` to report), each in a
    new conversation of an engine whose memory holds every other entry (imported) and the asked facts:
    with ``tell="turn"`` each told as a user turn through ``learn_turn`` with the engine's memory writer
    (what the engine does after a turn, without generating the reply), with ``"import"`` imported with the rest."""
    os.environ["MLOTSPARK_HOME"] = str(home)  # conversations and memory in a scratch home
    os.environ["MLOTSPARK_EMBEDDER"] = embedder_name
    if embedder_name in BUNDLE:  # the embedder in this home: a link to the pulled copy
        link = home / "models" / BUNDLE[embedder_name]
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(dirs[embedder_name], target_is_directory=True)
    from mlotspark import Engine

    engine = Engine.load(str(gguf))
    try:
        pairs = doc["pairs"] + fresh["pairs"]
        # Filled as ``mlotspark memory import`` does (one batched embedding, entries in order,
        # each through the same insert and dedupe as ``remember``): one ``remember`` per
        # entry took 45 minutes on the loaded CPU.
        held = sets(doc, fresh, seed)[which][0]
        sample = [pairs[i] for i in random.Random(seed).sample(held, min(n, len(held)))]
        n = len(sample)
        told = {p["fact"] for p in sample} if tell == "turn" else set()
        fill = home / "fill.json"
        fill.write_text(json.dumps([p["fact"] for p in pairs if p["fact"] not in told] + doc["distractors"]
                                   + fresh["distractors"]), encoding="utf-8")
        engine.memory.import_json(fill)
        writer = engine.persistence.memory_writer()
        for i, p in enumerate(sample):
            if p["fact"] in told:
                learn_turn(engine.memory, p["fact"], f"tell{i}", writer)
        stored = {e.text for e in engine.memory.list()}
        hits = injected = 0
        rows = []
        for i, p in enumerate(sample):
            r = engine.conversation(f"q{i}").send(p["question"], temperature=0.0, max_tokens=32)
            used = [engine.memory.get(j).text for j in r.stats.extra["memory"]["used"]]
            ok = p["key"].lower() in r.text.lower()
            hits += ok
            injected += p["fact"] in used
            rows.append({"question": p["question"], "key": p["key"], "injected": p["fact"] in used, "ok": ok, "reply": r.text,
                         "shown": used, "stored": p["fact"] in stored})
            print(f"e2e {i + 1}/{n}: {'ok' if ok else 'miss'} {p['question']!r} -> {r.text!r}", flush=True)
        return {"embedder": engine.memory.embedder.name, "set": which, "n": n, "tell": tell, "writer": writer.name,
                "answer_has_key": hits / n,
                "fact_stored": sum(r["stored"] for r in rows) / n, "fact_injected": injected / n, "rows": rows}
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--embedder", nargs="+", default=["hashing", "minilm", "mpnet"], choices=["hashing", "minilm", "mpnet"])
    ap.add_argument("--e2e", type=int, default=0, help="questions asked end to end per embedder (0: none)")
    ap.add_argument("--e2e-set", choices=["fit", "held_out", "fresh", "all"], default="held_out",
                    help="the set --e2e samples (fit: to tune prompts; held_out: the figure to report)")
    ap.add_argument("--e2e-tell", choices=["turn", "import"], default="turn",
                    help="how the asked facts reach memory: each told as a user turn through learn_turn with the "
                         "engine's memory writer (the default: a user's path), or imported with the others")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rerank", type=int, default=0,
                    help="held-out questions (and half as many unrelated prompts) reranked by the chat model (0: none)")
    ap.add_argument("--model", default=None, help="chat model for --e2e and --rerank (default: the default model)")
    ap.add_argument("--out", type=Path, default=None, help="write every figure as JSON here")
    ap.add_argument("--misses", choices=["fit", "held_out", "fresh", "all"], default=None,
                    help="print the questions of this set whose fact is not in the top 3, with ranks and scores")
    args = ap.parse_args()
    doc = json.loads(DATA.read_text(encoding="utf-8"))
    fresh = json.loads(FRESH.read_text(encoding="utf-8"))
    extra = json.loads(FIT_EXTRA.read_text(encoding="utf-8"))["unrelated"]
    print("command: python " + " ".join(sys.argv))
    results: dict = {"turns_kept": turns_kept(doc)}
    # Both models come from the user's home (pulled there if missing), before any switch.
    dirs = {name: bundles.pull(BUNDLE[name], progress=False) for name in args.embedder if name in BUNDLE}
    gguf = catalogue.resolve(args.model, progress=False).path if (args.e2e or args.rerank) else Path()
    reranker = None
    if args.rerank:
        from mlotspark import Engine

        reranker = Engine.load(str(gguf))
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.embedder:
            r = retrieval(doc, fresh, extra, make_embedder(name, dirs), Path(tmp), args.seed, args.misses, reranker, args.rerank)
            results[name] = r
            if args.e2e:
                results[name]["e2e"] = end_to_end(doc, fresh, name, args.e2e, args.seed, Path(tmp) / f"home-{name}", gguf, dirs,
                                                  args.e2e_set, args.e2e_tell)
                e = results[name]["e2e"]
                print(f"end to end ({name}, {e['set']}, told as {e['tell']}, writer {e['writer']}): fact stored {e['fact_stored']:.0%}, "
                      f"injected {e['fact_injected']:.0%}, key in reply {e['answer_has_key']:.0%} of {e['n']}")
    if reranker is not None:
        reranker.close()
    print("\n| embedder | recall@1 | recall@3 | fact injected | unrelated prompts injected | wrong-only | injected not the fact | end to end (key in reply) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.embedder:
        r = results[name]
        e2e = r.get("e2e")
        e2e_s = (f"{e2e['answer_has_key']:.0%} of {e2e['n']} {e2e['set']} (fact injected {e2e['fact_injected']:.0%})"
                 if e2e else "-")
        print(f"| {r['embedder']} | {r['recall@1']:.1%} | {r['recall@3']:.1%} | {r['injected']:.1%} | "
              f"{r['wrong_unrelated']:.1%} | {r['wrong_only']:.1%} | {r['foreign_share']:.1%} | {e2e_s} |")
    print("\nBy set (fit: half 1 of the first file; held out: its half 2 + the fresh file; thresholds fitted on fit):")
    print("| embedder | set | calibration | thresholds (about user / other) | questions | recall@1 | recall@3 | fact injected | unrelated injected (of) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.embedder:
        r = results[name]
        cal = calibration_for(r["embedder"])
        shipped_th = (cal.threshold_about_user, cal.threshold_other)
        fitted_th = (r["fitted"]["threshold_about_user"], r["fitted"]["threshold_other"])
        for part, label, f, th in (("fit", "shipped", r["fit_half_shipped"], shipped_th),
                                   ("fit", "fitted", r["fit_half"], fitted_th),
                                   ("held out", "shipped", r["held_out_shipped"], shipped_th),
                                   ("held out", "fitted on fit", r["held_out_fitted"], fitted_th),
                                   ("fresh only", "shipped", r["fresh_shipped"], shipped_th)):
            print(f"| {r['embedder']} | {part} | {label} | {th[0]:.2f} / {th[1]:.2f} | {f['n']} | {f['recall@1']:.1%} | "
                  f"{f['recall@3']:.1%} | {f['injected']:.1%} | {f['wrong_unrelated']:.1%} ({f['n_unrelated']}) |")
    for name in args.embedder:
        rr = results[name].get("rerank")
        if rr:
            print(f"\nrerank by the chat model ({results[name]['embedder']}, held out, top 5): recall@1 "
                  f"{rr['recall@1_before']:.1%} -> {rr['recall@1_after']:.1%} of {rr['questions']} (named the fact "
                  f"{rr['named_the_fact']:.1%}); unrelated prompts where it named a note {rr['unrelated_named_a_note']:.1%} of {rr['unrelated']}")
    x = results["turns_kept"]
    print(f"\nwhat a turn keeps (simple writer): the key word kept in {x['key_kept']:.1%} of {x['fact_turns']} fact turns; "
          f"{x['entries_with_key']:.1%} of kept entries carry it ({x['entries_from_fact_turns']} from fact turns, "
          f"{len(x['kept_from_chat'])} from chat turns); chat turns with an entry kept: {x['chat_turns_with_an_entry']} "
          f"of {x['chat_turns']}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()

"""A multi-session memory evaluation in the spirit of LongMemEval, through ``engine.conversation``.

Synthetic histories (seeded, generated here, no judge model): each is 5-10
sessions, each session a new conversation opened with its date ("It's Tuesday 4
March.") and two user turns: small talk with facts about the user spread over the
sessions, some facts later updated ("I moved to Porto."), some retracted ("Forget
that my dog is called Rex."), and things that happen in several sessions ("I
bought another plant today."). After the last session, questions are asked in a
new conversation, as a user would; the reply (greedy, at most 32 tokens) is scored
by exact key words:

- ``single``: a fact stated once ("What's my sister called?" -> "Ilse");
- ``update``: a fact updated later: the newer value, and not the older one;
- ``retracted``: a retracted fact: the reply must not carry it;
- ``count``: how many times something happened across sessions (digit or word);
- ``when``: "When did I tell you I got the promotion?" -> the session's day and month.

Memory: the engine's own (semantic memory learns from every turn, retractions
included; between histories every entry is forgotten). The sessions happened on
their days: the store's clock (``engine.memory.clock``) is set to each session's
noon, so what it learns is dated as if told then, and the questions are asked now. Baseline ("whole history in
the prompt"): every user turn of every session, with its date, in one prompt before
the question, through ``Engine.generate`` (no semantic memory), where it fits.

    python benchmarks/longmem_eval.py --histories 30 --model smollm2-135m-instruct
    python benchmarks/longmem_eval.py --summary data/longmem_qwen_simple_writer_11.jsonl   # rescore a record, print the table
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

SLOTS = {
    # slot: (statement, question, values, update statement or None)
    "city": ("By the way, I live in {v}.", "Which city do I live in?", ["Utrecht", "Ghent", "Lyon", "Leeds", "Graz", "Porto"],
             "Big news: I moved to {v} last week."),
    "job": ("I work as a {v}.", "What is my job?", ["nurse", "plumber", "pharmacist", "translator", "geologist"],
            "I changed jobs, I work as a {v} now."),
    "dog": ("My dog is called {v}.", "What is my dog's name?", ["Rex", "Biscuit", "Pluto", "Bolt", "Nala"], None),
    "sister": ("My sister is called {v}.", "What is my sister's name?", ["Ilse", "Marta", "Yuki", "Fenna", "Zora"], None),
    "car": ("I drive a {v}.", "What car do I drive?", ["Volvo", "Skoda", "Fiat", "Tesla", "Mazda"],
            "I sold my old car and now drive a {v}."),
    "food": ("My favourite food is {v}.", "What is my favourite food?", ["lasagne", "sushi", "ramen", "paella", "falafel"],
             "My favourite food is {v} these days."),
    "sport": ("I play {v} on weekends.", "Which sport do I play?", ["tennis", "hockey", "volleyball", "badminton", "rugby"], None),
}
EVENTS = [("I bought another plant today.", "How many plants did I tell you I bought?"),
          ("I went to the dentist today.", "How many times did I tell you I went to the dentist?"),
          ("I baked bread today.", "How many times did I tell you I baked bread?")]
WHEN = [("I got the promotion today!", "When did I tell you I got the promotion?"),
        ("I finished my first marathon today.", "When did I tell you I finished my first marathon?")]
SMALL_TALK = ["The weather has been strange lately.", "I watched a documentary about whales last night.",
              "Work was busy this week.", "I'm thinking about what to cook tonight.", "Can you give me a tip for sleeping better?",
              "What is a good name for a houseplant?", "Tell me a fun fact about octopuses."]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"]
FIRST_DAY = datetime.date(2026, 1, 1)
NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}


@dataclass
class Question:
    ability: str
    text: str
    keys: list[str]  # any of these must be in the reply
    forbidden: list[str] = field(default_factory=list)  # none of these may be


@dataclass
class History:
    sessions: list[tuple[str, list[str]]]  # (ISO date, user turns)
    questions: list[Question]


def make_history(rng: random.Random) -> History:
    """One synthetic history (see the module docstring)."""
    n = rng.randint(5, 10)
    day = rng.randint(0, 300)
    dates = []
    for _ in range(n):
        day += rng.randint(2, 6)
        d = FIRST_DAY + datetime.timedelta(days=day)  # calendar days: the store dates entries by them
        dates.append((f"It's {DAYS[d.weekday()]} {d.day} {MONTHS[d.month - 1]}.", d.isoformat(), d.day, MONTHS[d.month - 1]))
    turns: list[list[str]] = [[] for _ in range(n)]
    questions = []
    slots = rng.sample(sorted(SLOTS), rng.randint(4, 6))
    kinds = ["single"] * len(slots)
    updatable = [i for i, s in enumerate(slots) if SLOTS[s][3]]
    for i in rng.sample(updatable, min(2, len(updatable))):
        kinds[i] = "update"
    singles = [i for i, k in enumerate(kinds) if k == "single"]
    if len(singles) > 1:
        kinds[rng.choice(singles)] = "retracted"
    for slot, kind in zip(slots, kinds):
        stmt, q, values, upd = SLOTS[slot]
        old, new = rng.sample(values, 2)
        first = rng.randrange(0, n - 2) if kind != "single" else rng.randrange(0, n)
        turns[first].append(stmt.format(v=old))
        if kind == "update":
            turns[rng.randrange(first + 1, n)].append(upd.format(v=new))
            questions.append(Question("update", q, [new], [old]))
        elif kind == "retracted":
            fact = stmt.format(v=old).replace("By the way, ", "")
            turns[rng.randrange(first + 1, n)].append(f"Please forget that {fact[0].lower() + fact[1:].rstrip('.')}.")
            questions.append(Question("retracted", q, [], [old]))
        else:
            questions.append(Question("single", q, [old]))
    event, eq = rng.choice(EVENTS)
    times = rng.randint(2, 4)
    for s in rng.sample(range(n), times):
        turns[s].append(event)
    # "twice" is as right as "two" (added after the first 30-history runs answered it: --summary rescores).
    questions.append(Question("count", eq, [str(times), NUMBERS[times], *(["twice"] if times == 2 else [])]))
    said, wq = rng.choice(WHEN)
    s = rng.randrange(0, n)
    turns[s].append(said)
    questions.append(Question("when", wq, [f"{dates[s][2]} {dates[s][3]}", f"{dates[s][3]} {dates[s][2]}"]))
    sessions = []
    for i in range(n):
        facts = turns[i]
        first = " ".join([dates[i][0], *facts[:2]]) if facts else f"{dates[i][0]} {rng.choice(SMALL_TALK)}"
        second = " ".join(facts[2:]) if len(facts) > 2 else rng.choice(SMALL_TALK)
        sessions.append((dates[i][1], [first, second]))
    return History(sessions, questions)


def _says(reply: str, word: str) -> bool:
    # Whole words: "2" must not be found in "2026", nor "Leeds" in "Leedsville".
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", reply, re.I) is not None


def score(q: Question, reply: str) -> bool:
    return (not q.keys or any(_says(reply, k) for k in q.keys)) and not any(_says(reply, f) for f in q.forbidden)


def run_history(engine, h: History, idx: int, max_tokens: int, baseline: bool, session_tokens: int | None = None) -> list[dict]:
    for e in engine.memory.list():  # each history starts with an empty memory
        engine.memory.forget(e.id)
    try:
        for s, (day, turns) in enumerate(h.sessions):
            # The sessions happened on their days: the store dates what it learns by its clock.
            noon = datetime.datetime.combine(datetime.date.fromisoformat(day), datetime.time(12)).timestamp()
            engine.memory.clock = lambda noon=noon: noon
            conv = engine.conversation(f"h{idx}-s{s}")
            for t in turns:
                # The sessions' replies are never scored (memory learns from the user's turns):
                # ``session_tokens`` may cap them lower than the questions' replies to save time.
                conv.send(t, temperature=0.0, max_tokens=session_tokens or max_tokens)
    finally:
        engine.memory.clock = time.time  # the questions are asked now
    rows = []
    history_text = "\n".join(t for _, turns in h.sessions for t in turns)
    for j, q in enumerate(h.questions):
        r = engine.conversation(f"h{idx}-q{j}").send(q.text, temperature=0.0, max_tokens=max_tokens)
        row = {"ability": q.ability, "question": q.text, "keys": q.keys, "forbidden": q.forbidden,
               "memory": {"ok": score(q, r.text), "reply": r.text}}
        if baseline:
            msgs = [{"role": "system", "content": "Earlier, in conversations on several days, the user told you:\n"
                     + history_text + "\nAnswer the user's question from that."},
                    {"role": "user", "content": q.text}]
            try:
                b = engine.generate(msgs, temperature=0.0, max_tokens=max_tokens)
                row["full_history"] = {"ok": score(q, b.text), "reply": b.text}
            except Exception as e:  # a prompt past the model's context: reported, not fatal
                row["full_history"] = {"ok": None, "reply": f"error: {e}"}
        rows.append(row)
    return rows


ABILITIES = ["single", "update", "retracted", "count", "when"]


def print_table(rows: list[dict]) -> None:
    """The per-ability table of finished rows (memory vs whole history in the prompt)."""
    print("| ability | questions | memory (engine.conversation) | whole history in the prompt |")
    print("|---|---|---|---|")
    for a in ABILITIES + ["all"]:
        sel = [r for r in rows if a == "all" or r["ability"] == a]
        mem = sum(r["memory"]["ok"] for r in sel)
        base = [r["full_history"]["ok"] for r in sel if "full_history" in r and r["full_history"]["ok"] is not None]
        b = f"{sum(base)}/{len(base)}" if base else "-"
        print(f"| {a} | {len(sel)} | {mem}/{len(sel)} | {b} |")


def read_records(path: Path, made: list[History]) -> dict[int, list[dict]]:
    """A --resume file's histories (the last line of a history wins), rescored with this script's scorer.

    The questions come from the seed, so they are checked against the stored ones: a
    record of another seed or another version of the questions is refused.
    """
    finished: dict[int, list[dict]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        questions = made[rec["history"]].questions
        if [q.text for q in questions] != [r["question"] for r in rec["rows"]]:
            raise SystemExit(f"{path}: history {rec['history']} asks other questions than this seed's: not rescored")
        rows = []
        for q, row in zip(questions, rec["rows"]):
            row = {**row, "keys": q.keys, "memory": {**row["memory"], "ok": score(q, row["memory"]["reply"])}}
            if row.get("full_history", {}).get("ok") is not None:
                row["full_history"] = {**row["full_history"], "ok": score(q, row["full_history"]["reply"])}
            rows.append(row)
        finished[rec["history"]] = rows
    return finished


def summary(path: Path, seed: int, histories: int) -> None:
    """Rescore a --resume file's replies with this script's questions and scorer, and print the table."""
    rng = random.Random(seed)
    finished = read_records(path, [make_history(rng) for _ in range(histories)])
    rows = [r for i in sorted(finished) for r in finished[i]]
    print(f"{path}: {len(finished)} histories, {len(rows)} questions, rescored")
    print_table(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--histories", type=int, default=30)
    ap.add_argument("--model", default=None, help="chat model alias or path (default: the default model)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--no-baseline", action="store_true")
    ap.add_argument("--memory-writer", choices=["auto", "model", "simple"], default="auto",
                    help="who writes memory (Engine.load's memory_writer; default auto)")
    ap.add_argument("--time-limit", type=float, default=3600.0, help="stop starting histories after this many seconds")
    ap.add_argument("--session-tokens", type=int, default=None,
                    help="reply cap for the sessions' (unscored) turns (default: --max-tokens)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--resume", type=Path, default=None,
                    help="JSONL of finished histories: each is appended when done, and histories found there are skipped")
    ap.add_argument("--summary", type=Path, default=None,
                    help="rescore the replies of a --resume file (same --seed and --histories) and print the table")
    args = ap.parse_args()
    if args.summary:
        summary(args.summary, args.seed, args.histories)
        return
    print("command: python " + " ".join(sys.argv), flush=True)
    from mlotspark import Engine
    from mlotspark.models import bundles, catalogue

    rng = random.Random(args.seed)
    histories = [make_history(rng) for _ in range(args.histories)]
    model = str(catalogue.resolve(args.model, progress=False).path)
    # A scratch home: conversations and memory never touch the user's; the embedders are links to the pulled ones.
    home = Path(tempfile.mkdtemp(prefix="longmem-"))
    for name in (bundles.MPNET_MODEL, bundles.EMBEDDER_MODEL):
        if bundles.is_pulled(name):
            (home / "models").mkdir(parents=True, exist_ok=True)
            (home / "models" / name).symlink_to(bundles.bundle_dir(name), target_is_directory=True)
    os.environ["MLOTSPARK_HOME"] = str(home)
    engine = Engine.load(model, memory_writer=args.memory_writer)
    t0 = time.perf_counter()
    rows: list[dict] = []
    finished: dict[int, list[dict]] = {}
    if args.resume and args.resume.exists():
        finished = read_records(args.resume, histories)  # rescored: the table is the current scorer's
    done = 0
    try:
        for i, h in enumerate(histories):
            if i in finished:
                rows += finished[i]
                done += 1
                continue
            if time.perf_counter() - t0 > args.time_limit:
                break
            hrows = run_history(engine, h, i, args.max_tokens, not args.no_baseline, args.session_tokens)
            rows += hrows
            done += 1
            if args.resume:
                with args.resume.open("a", encoding="utf-8") as f:
                    f.write(json.dumps({"history": i, "rows": hrows}, ensure_ascii=False) + "\n")
            print(f"history {i + 1}/{len(histories)}: {len(h.sessions)} sessions, {time.perf_counter() - t0:.0f} s", flush=True)
        embedder = engine.memory.embedder.name
    finally:
        engine.close()
    print(f"\n{args.model or 'default model'}, embedder {embedder}, {done} of {len(histories)} histories, "
          f"{sum(len(h.sessions) for h in histories[:done])} sessions, {len(rows)} questions")
    print_table(rows)
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "embedder": embedder, "histories": done, "rows": rows},
                                       indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()

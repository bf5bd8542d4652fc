"""Sampling settings evaluation (backs the catalogue's sampling defaults): how often short factual answers are right.

Evidence for a model's default sampling (``models/sampling_defaults.BUILTIN``): each
question is asked as ``mlotspark chat`` asks it (chat template, its default system
prompt), once per seed per setting, and a reply counts when it contains the expected
fact (a regular expression, case-insensitive). Requests of one setting and seed go in
together, so the engine batches them.

Usage:
    python benchmarks/sampling_heldout.py [-m MODEL] [--seeds 2] [--max-tokens 16]
        [--setting "card:temperature=0.2,top_p=0.9" --setting "greedy:temperature=0" ...]
        [--first-token]

``--first-token`` also prints, per question, the model's top first tokens and their
probabilities (temperature 1): where a wrong answer starts.
"""

from __future__ import annotations

import argparse
import re
import time

import mlotspark  # noqa: F401  (OpenBLAS before mlx)

# (question, expected fact as a regex). None of them is the Paris question the test asks.
QUESTIONS = [
    ("What is the capital of Japan?", r"tokyo"), ("What is the capital of Italy?", r"rome"),
    ("What is the capital of Germany?", r"berlin"), ("What is the capital of Spain?", r"madrid"),
    ("What is the capital of England?", r"london"), ("What is the largest planet in our solar system?", r"jupiter"),
    ("Which planet is known as the Red Planet?", r"mars"), ("Who wrote Romeo and Juliet?", r"shakespeare"),
    ("What is the chemical formula of water?", r"h2o|h₂o"),
    ("What gas do plants absorb from the air?", r"carbon dioxide|co2|co₂"),
    ("How many days are in a week?", r"\bseven\b|\b7\b"), ("At what temperature in Celsius does water boil?", r"\b100\b"),
    ("What is the largest ocean on Earth?", r"pacific"), ("Who painted the Mona Lisa?", r"leonardo|da vinci"),
    ("What is the tallest mountain in the world?", r"everest"), ("How many legs does a spider have?", r"\beight\b|\b8\b"),
    ("What is the currency of the United States?", r"dollar"),
    ("Which animal is called the king of the jungle?", r"\blions?\b"),
    ("What is the opposite of hot?", r"\bcold"), ("What color is the sky on a clear day?", r"\bblue\b"),
    ("Who was the first president of the United States?", r"washington"), ("What is 2 plus 2?", r"\b4\b|\bfour\b"),
    ("What language is spoken in Brazil?", r"portuguese"), ("What is the capital of Canada?", r"ottawa"),
    ("Which metal is liquid at room temperature?", r"mercury"),
]

DEFAULT_SETTINGS = ["card:temperature=0.2,top_p=0.9", "greedy:temperature=0",
                    "greedy+rp1.1:temperature=0,repetition_penalty=1.1"]


def parse_setting(text: str) -> tuple[str, dict[str, float]]:
    """``"name:key=value,key=value"`` -> ``(name, {key: value})``."""
    name, _, body = text.partition(":")
    if not name or not body:
        raise SystemExit(f"--setting {text!r}: expected NAME:key=value[,key=value]")
    opts = {}
    for part in body.split(","):
        key, _, value = part.partition("=")
        opts[key.strip()] = int(value) if key.strip() == "top_k" else float(value)  # a count, not a float
    return name, opts


def first_tokens(engine, question: str, k: int = 4) -> str:
    """The top ``k`` first tokens of the reply and their probabilities (temperature 1)."""
    import mlx.core as mx

    ids = engine.encode([{"role": "user", "content": question}])
    logits = engine.loaded.runner(mx.array([ids]))[0, -1].astype(mx.float32)
    p = mx.softmax(logits)
    top = mx.argsort(-p)[:k].tolist()
    return ", ".join(f"{engine.tokenizer.decode([i])!r} {float(p[i]):.2f}" for i in top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--seeds", type=int, default=2, help="seeds per sampled setting (greedy runs once)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--setting", action="append", help="NAME:key=value,... (repeatable)")
    ap.add_argument("--first-token", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every reply")
    args = ap.parse_args()
    from mlotspark.engine import Engine

    engine = Engine.load(args.model, progress=False)
    try:
        if args.first_token:
            for q, _ in QUESTIONS:
                print(f"{q:55s} {first_tokens(engine, q)}", flush=True)
        for name, opts in map(parse_setting, args.setting or DEFAULT_SETTINGS):
            seeds = [0] if opts.get("temperature", 1.0) == 0 else list(range(args.seeds))
            t0 = time.perf_counter()
            right = total = 0
            misses = []
            for seed in seeds:
                handles = [engine.submit([{"role": "user", "content": q}], seed=seed, max_tokens=args.max_tokens, **opts)
                           for q, _ in QUESTIONS]
                for (q, pattern), h in zip(QUESTIONS, handles):
                    text = h.result().text
                    ok = re.search(pattern, text, re.I) is not None
                    right += ok
                    total += 1
                    if args.verbose:
                        print(f"  [{name} seed {seed}] {'ok  ' if ok else 'MISS'} {q!r} -> {text!r}", flush=True)
                    if not ok:
                        misses.append(q)
            print(f"{name} {opts}: {right}/{total} right ({time.perf_counter() - t0:.0f} s); "
                  f"missed: {sorted(set(misses))}", flush=True)
    finally:
        engine.close()


if __name__ == "__main__":
    main()

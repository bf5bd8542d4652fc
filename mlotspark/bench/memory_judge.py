"""The judge set of the ``memory_writer`` conformance cell: does the model write memory better
than the simple writer?

Twelve cases from ``benchmarks/data/memory_updates.json`` (the first update set; never the
fresh set the memory figures are reported on): six updates, four same-kind pairs, two
requests to forget. Each case runs in a store of its own: its statements told as turns
through the writer, then its question asked with ``retrieve_for_prompt``. A case is right
when what would be injected holds the current value and not the replaced or forgotten one.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

UPDATES = [  # (older, newer, question, newer key, older key)
    ("I live in Utrecht.", "I moved to Porto last month.", "Which city do I live in?", "Porto", "Utrecht"),
    ("I work as a nurse at the county hospital.", "I quit nursing and now work as a software tester.",
     "What is my job?", "tester", "nurse"),
    ("I drive a red Toyota Corolla.", "I sold the Toyota and now drive a Tesla Model 3.", "What car do I drive?",
     "Tesla", "Toyota"),
    ("My favourite colour is green.", "My favourite colour is purple these days.", "What's my favourite colour?",
     "purple", "green"),
    ("I am 34 years old.", "I just turned 35.", "How old am I?", "35", "34"),
    ("My sister lives in Lyon.", "My sister moved from Lyon to Marseille.", "Where does my sister live?",
     "Marseille", "Lyon"),
]
PAIRS = [  # (first, second, question about the first, first key, second key)
    ("My dog is called Rex.", "My cat is called Tom.", "What's my dog's name?", "Rex", "Tom"),
    ("My sister is called Ilse.", "My brother is called Joris.", "What's my sister called?", "Ilse", "Joris"),
    ("I play the violin.", "I play tennis on Sundays.", "What instrument do I play?", "violin", "tennis"),
    ("I drive a blue Volvo.", "My husband drives a grey Skoda.", "What car do I drive?", "Volvo", "Skoda"),
]
FORGETS = [  # (fact, request, question, key)
    ("My cat is called Mochi.", "Forget that my cat is called Mochi.", "What is my cat called?", "Mochi"),
    ("I am allergic to shellfish.", "Please forget that I'm allergic to shellfish, it was a mistake.",
     "What am I allergic to?", "shellfish"),
]


class Precomputed:
    """An embedder that embeds texts in batches once (``prime``), then answers from memory: the
    store embeds one text per call, the slow part of a judge or an eval on two cores. Same
    ``name`` and ``dim`` as the wrapped embedder, so calibration and vectors are its own."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.name, self.dim = inner.name, inner.dim
        self._cache: dict[str, Any] = {}

    def prime(self, texts: list[str]) -> None:
        todo = sorted({t for t in texts if t not in self._cache})
        for t, v in zip(todo, self.inner.embed(todo) if todo else []):
            self._cache[t] = v

    def embed(self, texts: list[str]) -> Any:
        import numpy as np

        self.prime(texts)
        return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)


def _case(store: Any, writer: Any, said: tuple[str, ...], question: str, right: str | None, wrong: str) -> bool:
    from mlotspark.memory.semantic import learn_turn

    for text in said:
        learn_turn(store, text, writer=writer)
    shown = " ".join(h.entry.text for h in store.retrieve_for_prompt(question)).lower()
    return (right is None or right.lower() in shown) and wrong.lower() not in shown


def judge(embedder: Any, writer: Any) -> tuple[int, int]:
    """(right, cases) of ``writer`` on the judge set, each case in a fresh store of ``embedder``'s vectors."""
    from mlotspark.memory.semantic import SemanticStore

    cases = ([((o, n), q, nk, ok) for o, n, q, nk, ok in UPDATES] + [((a, b), q, ak, bk) for a, b, q, ak, bk in PAIRS]
             + [((f, s), q, None, k) for f, s, q, k in FORGETS])
    from mlotspark.memory.semantic.requests import forget_queries

    if not isinstance(embedder, Precomputed):
        embedder = Precomputed(embedder)
    embedder.prime([t for said, q, _, _ in cases for t in (*said, q)] + [w for said, *_ in cases for t in said
                                                                          for w in forget_queries(t)])
    right = 0
    with tempfile.TemporaryDirectory(prefix="mlotspark-judge-") as tmp:
        for i, (said, question, good, bad) in enumerate(cases):
            with SemanticStore(Path(tmp) / f"{i}.db", embedder) as store:
                right += _case(store, writer, said, question, good, bad)
    return right, len(cases)


__all__ = ["FORGETS", "PAIRS", "Precomputed", "UPDATES", "judge"]

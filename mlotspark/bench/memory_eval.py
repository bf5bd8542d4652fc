"""Semantic memory as a user lives it: facts told in chats, changed in later chats, asked in new ones.

``mlotspark bench --suite memory --memory-set FILE`` runs it on one model, in a scratch
``$MLOTSPARK_HOME`` (the user's memory is never touched). Everything goes through
``engine.conversation(...).send``, greedy: each statement is said in its own conversation (one
token of reply: what matters is what memory keeps of the turn), each question in a new one
(32 tokens), in the order a life goes — first facts, then their changes and retractions, then
the questions. The set file holds (every key optional, each scored on its own):

- ``updates``: ``old``, ``new``, ``question``, ``new_key``, ``old_key`` — the reply to the
  question carries ``new_key`` and not ``old_key``;
- ``same_kind_pairs``: ``a``, ``b`` (both true at once), ``question`` about ``a``, ``a_key``,
  ``b_key`` — the reply carries ``a_key`` and not ``b_key``;
- ``retractions``: ``fact``, ``say`` (the user asks to forget it), ``question``, ``key`` — the
  reply lacks ``key`` and no current entry holds it;
- ``paraphrases``: ``fact``, ``question``, ``key`` — the reply carries ``key`` (told in one
  chat, used in another), and ``memory search`` ranks an entry holding it in its top 3.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

QUESTION_TOKENS = 32


def _has(text: str, key: str) -> bool:
    return key.lower() in text.lower()


def evaluate(engine: Any, cases: dict, on_part: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """Tell ``cases`` to ``engine``'s memory through conversations, ask the questions, score the replies.

    Args:
        engine: a loaded ``Engine`` whose home is a scratch folder.
        cases: the set (see the module docstring).
        on_part: called with (part, right, total) as each part is scored.

    Returns:
        Per part: ``right``, ``n`` and ``rows`` (question, reply, injected entries, verdict).
    """
    ups, pairs = cases.get("updates", []), cases.get("same_kind_pairs", [])
    rets, paras = cases.get("retractions", []), cases.get("paraphrases", [])
    names = itertools.count()

    def say(text: str, tokens: int = 1):
        return engine.conversation(f"memory-eval-{next(names)}").send(text, temperature=0.0, max_tokens=tokens)

    for text in ([u["old"] for u in ups] + [p["a"] for p in pairs] + [r["fact"] for r in rets]
                 + [p["fact"] for p in paras] + [u["new"] for u in ups] + [p["b"] for p in pairs]
                 + [r["say"] for r in rets]):
        say(text)

    def asked(question: str, verdict: Callable[[str], bool], **extra: Any) -> dict[str, Any]:
        r = say(question, QUESTION_TOKENS)
        used = [e.text for i in r.stats.extra.get("memory", {}).get("used", []) if (e := engine.memory.get(i))]
        return {"question": question, "reply": r.text, "injected": used, "ok": verdict(r.text), **extra}

    current = [e.text for e in engine.memory.list(current_only=True)]
    parts: dict[str, list[dict]] = {
        "updates": [asked(u["question"], lambda t, u=u: _has(t, u["new_key"]) and not _has(t, u["old_key"]))
                    for u in ups],
        "same_kind_pairs": [asked(p["question"], lambda t, p=p: _has(t, p["a_key"]) and not _has(t, p["b_key"]))
                            for p in pairs],
        "retractions": [asked(r["question"], lambda t, r=r: not _has(t, r["key"])
                              and not any(_has(e, r["key"]) for e in current)) for r in rets],
        "paraphrases": [asked(p["question"], lambda t, p=p: _has(t, p["key"]),
                              top3=any(_has(h.entry.text, p["key"]) for h in engine.memory.search(p["question"], k=3)))
                        for p in paras],
    }
    out: dict[str, Any] = {}
    for part, rows in parts.items():
        if not rows:
            continue
        out[part] = {"right": sum(r["ok"] for r in rows), "n": len(rows), "rows": rows}
        if on_part:
            on_part(part, out[part]["right"], len(rows))
    if paras:
        out["paraphrase_recall_at_3"] = {"right": sum(r["top3"] for r in parts["paraphrases"]), "n": len(paras)}
        if on_part:
            on_part("paraphrase recall@3", out["paraphrase_recall_at_3"]["right"], len(paras))
    out["entries"] = len(current)
    return out


__all__ = ["QUESTION_TOKENS", "evaluate"]

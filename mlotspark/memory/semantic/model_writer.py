"""``ModelWriter``: the chat model judges which memories a turn makes outdated, in one constrained call.

As mem0 writes memory, the model sees the turn and the current entries related to it
(numbered by id); unlike mem0's, its answer only adds links: every statement of the turn is
kept as said and explicit requests are acted on as the simple writer does (a small model that
drops or rewrites what the user said would lose it). The model names the entries the turn
makes no longer true, ``{"outdated": [ids]}``, held by a JSON schema whose ids are an enum of
the candidates, so the reply always parses and never names an entry that is not there; each
is marked superseded by the turn's statement that found it. Whether a model judges well is
measured (the ``memory_writer`` conformance cell); ``auto`` takes this writer only where it
beats the simple one. The call goes through ``generate`` (the engine's, at a low priority: a
user's reply queued meanwhile goes first).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

from mlotspark.memory.semantic.records import Entry
from mlotspark.memory.semantic.writer import Operation, SimpleWriter, statements

MAX_CANDIDATES = 8  # related entries shown to the model
REPLY_TOKENS = 64  # {"outdated": [..]} of at most MAX_CANDIDATES ids: never cut

INSTRUCTIONS = (
    "You keep a memory of facts about the user. Given the memories (with their ids) and the user's new "
    "message, list the ids of the memories the new message makes no longer true: the same thing now has "
    "another value (a new city, a new job, a car sold). Two different things of the same kind (a dog and a "
    "cat, a brother and a sister) are both true: do not list them. Answer with JSON only.\n\n"
    "Example. Memories:\n[3] I live in Leeds.\n[5] My dog is called Pepper.\n"
    "New message: Got the keys to our new flat in Bristol! Our cat Miso loves it.\n"
    'Answer: {"outdated": [3]}'
)


def operations_schema(ids: Sequence[int]) -> dict[str, Any]:
    """The JSON schema of the reply: ``outdated`` names only ``ids`` (a repeat is dropped when read)."""
    return {"type": "object", "additionalProperties": False, "required": ["outdated"],
            "properties": {"outdated": {"type": "array", "maxItems": len(ids),
                                        "items": {"enum": list(ids)}}}}


def prompt_messages(turn: str, candidates: Sequence[Entry]) -> list[dict[str, str]]:
    """The chat messages of the call: instructions, then the memories and the message."""
    shown = "\n".join(f"[{e.id}] {e.text}" for e in candidates) or "(none)"
    return [{"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": f"Memories:\n{shown}\n\nNew message from the user:\n{turn}"}]


def parse_outdated(reply: str, ids: Sequence[int]) -> list[int] | None:
    """The ids a reply names, or None when it is not what the schema allows."""
    try:
        named = json.loads(reply)["outdated"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(named, list) or any(i not in ids for i in named):
        return None
    return list(dict.fromkeys(named))


class ModelWriter:
    """A ``MemoryWriter`` that keeps what the simple writer keeps, and lets the chat model mark
    the entries a turn makes outdated.

    Args:
        generate: ``(messages, json_schema) -> reply text``; the engine's low-priority call.
    """

    name = "model"
    related_floor = 0.0  # the model judges: it sees the nearest entries, however near

    def __init__(self, generate: Callable[[list[dict[str, str]], dict[str, Any]], str]):
        self._generate = generate
        self._simple = SimpleWriter()

    def related_queries(self, turn: str) -> list[str]:
        return statements(turn)

    def operations(self, turn: str, related: Mapping[str, Sequence[Entry]]) -> list[Operation]:
        ops = self._simple.operations(turn, related)
        found = {s: [e.id for e in related.get(s, ())] for s in statements(turn)}
        candidates: dict[int, Entry] = {}
        for s in found:
            for e in related.get(s, ()):
                candidates.setdefault(e.id, e)
        shown = sorted(candidates.values(), key=lambda e: e.id)[:MAX_CANDIDATES]
        if not shown:  # nothing it could make outdated: no call
            return ops
        ids = [e.id for e in shown]
        outdated = parse_outdated(self._generate(prompt_messages(turn, shown), operations_schema(ids)), ids) or []
        for old in outdated:
            # The statement that found the entry (the first whose hits hold it) supersedes it.
            by = next((s for s, hits in found.items() if old in hits), None)
            ops = [Operation("supersede", op.text, op.ids + (old,)) if op.kind == "add" and op.text == by and not op.explicit
                   else op for op in ops]
        return ops


__all__ = ["ModelWriter", "operations_schema", "parse_outdated", "prompt_messages"]

"""``ModelWriter``: the chat model proposes a turn's memory operations in one constrained call.

As mem0 writes memory: the model sees the turn and the current entries related to it
(numbered by id) and answers with operations. The reply is held by a JSON schema whose
target ids are an enum of those entries, so it always parses and never names an entry
that is not there; a small model's judgement is another matter, which is why ``auto``
takes this writer only for a model the conformance matrix measured beating the simple one
(``capabilities``). The call goes through ``generate`` (the engine's, at a low priority:
a user's reply queued meanwhile goes first).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

from mlotspark.memory.semantic.records import Entry
from mlotspark.memory.semantic.requests import sentences
from mlotspark.memory.semantic.writer import Operation, SimpleWriter, statements

MAX_CANDIDATES = 8  # related entries shown to the model
MAX_OPERATIONS = 4
MAX_TEXT = 200
REPLY_TOKENS = 320  # room for MAX_OPERATIONS texts of MAX_TEXT characters: a reply is never cut

INSTRUCTIONS = (
    "You maintain a memory of facts about the user. Given the user's new message and the memories "
    "related to it (with their ids), list the operations to apply:\n"
    '- {"op": "add", "text": ...}: a new fact about the user the message states, written as a short sentence;\n'
    '- {"op": "supersede", "id": ID, "text": ...}: the message changes memory ID (the same thing now has '
    "another value); text is the new fact;\n"
    '- {"op": "delete", "id": ID}: the user asks to forget memory ID.\n'
    "Two different things of the same kind (a dog and a cat, a brother and a sister) are both kept: add, "
    "do not supersede. Answer with JSON only.\n\n"
    "Example. Memories:\n[3] I live in Leeds.\n[5] My dog is called Pepper.\n"
    "New message: Got the keys to our new flat in Bristol! Our cat Miso loves it.\n"
    'Answer: {"operations": [{"op": "supersede", "id": 3, "text": "I live in Bristol."}, '
    '{"op": "add", "text": "My cat is called Miso."}]}'
)


def operations_schema(ids: Sequence[int]) -> dict[str, Any]:
    """The JSON schema of the reply: ``supersede`` and ``delete`` only name ``ids``."""
    text = {"type": "string", "minLength": 3, "maxLength": MAX_TEXT}
    kinds: list[dict[str, Any]] = [
        {"type": "object", "properties": {"op": {"const": "add"}, "text": text},
         "required": ["op", "text"], "additionalProperties": False}]
    if ids:
        target = {"enum": list(ids)}
        kinds += [
            {"type": "object", "properties": {"op": {"const": "supersede"}, "id": target, "text": text},
             "required": ["op", "id", "text"], "additionalProperties": False},
            {"type": "object", "properties": {"op": {"const": "delete"}, "id": target},
             "required": ["op", "id"], "additionalProperties": False}]
    return {"type": "object", "additionalProperties": False, "required": ["operations"],
            # At least one: the model is asked only about a turn that states something.
            "properties": {"operations": {"type": "array", "minItems": 1, "maxItems": MAX_OPERATIONS,
                                          "items": {"anyOf": kinds}}}}


def prompt_messages(turn: str, candidates: Sequence[Entry]) -> list[dict[str, str]]:
    """The chat messages of the call: instructions, then the memories and the message."""
    shown = "\n".join(f"[{e.id}] {e.text}" for e in candidates) or "(none)"
    return [{"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": f"Memories:\n{shown}\n\nNew message from the user:\n{turn}"}]


def parse_operations(reply: str, ids: Sequence[int]) -> list[Operation] | None:
    """The operations of a reply, or None when it is not what the schema allows (a reply cut
    at the token limit)."""
    try:
        items = json.loads(reply)["operations"]
    except (ValueError, KeyError, TypeError):
        return None
    ops: list[Operation] = []
    for item in items if isinstance(items, list) else []:
        kind, target = item.get("op"), item.get("id")
        if kind not in ("add", "supersede", "delete") or (kind != "add" and target not in ids):
            return None
        ops.append(Operation(kind, str(item.get("text", "")).strip(), (target,) if kind != "add" else ()))
    return ops


class ModelWriter:
    """A ``MemoryWriter`` whose operations the chat model proposes.

    Args:
        generate: ``(messages, json_schema) -> reply text``; the engine's low-priority call.
    """

    name = "model"
    related_floor = 0.0  # the model judges: it sees the nearest entries, however near

    def __init__(self, generate: Callable[[list[dict[str, str]], dict[str, Any]], str]):
        self._generate = generate
        self._simple = SimpleWriter()

    def related_queries(self, turn: str) -> list[str]:
        return [s for s in sentences(turn) if len(s.split()) >= 2]

    def operations(self, turn: str, related: Mapping[str, Sequence[Entry]]) -> list[Operation]:
        # Explicit requests stay the user's word, whatever the model makes of them.
        explicit = [op for op in self._simple.operations(turn, related) if op.explicit]
        if not statements(turn):
            return explicit
        seen: dict[int, Entry] = {}
        for hits in related.values():
            for e in hits:
                seen.setdefault(e.id, e)
        candidates = sorted(seen.values(), key=lambda e: e.id)[:MAX_CANDIDATES]
        ids = [e.id for e in candidates]
        ops = parse_operations(self._generate(prompt_messages(turn, candidates), operations_schema(ids)), ids)
        if ops is None:  # cut short: the turn is kept as said rather than lost
            return self._simple.operations(turn, related)
        deleted = {i for op in explicit if op.kind == "delete" for i in op.ids}
        return explicit + [op for op in ops if not (op.kind == "delete" and op.ids[0] in deleted)]


__all__ = ["ModelWriter", "operations_schema", "parse_operations", "prompt_messages"]

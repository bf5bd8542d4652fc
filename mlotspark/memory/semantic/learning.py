"""What a finished user turn changes in semantic memory: retractions, then new facts.

"Forget that my cat is called Mochi." deletes the entry it names
(``SemanticStore.retract``); the turn's lasting statements (``extract_facts``) are
remembered, and a newer one about the same thing supersedes the older entry
(``updates.py``); any other statement of the turn is remembered when it would supersede
one (``SemanticStore.would_update``: updates are mostly said as chat). Retractions go
first, so "Forget that I live in Ghent. I live in Porto." leaves only Porto.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlotspark.memory.semantic.facts import asked_to_remember, extract_facts, sentences, statements
from mlotspark.memory.semantic.records import Entry
from mlotspark.memory.semantic.retractions import asks_to_forget_all, retraction
from mlotspark.memory.semantic.updates import may_update


@dataclass
class Learned:
    """What one turn changed.

    Attributes:
        remembered: ids of the entries the turn's facts became (or already were).
        forgotten: the entries its retractions removed.
        not_forgotten: its retractions that named no entry clearly, so removed nothing
            (none matched, or two alike): the user should say which (``memory forget ID``).
        updated: the older entries its facts superseded (kept, marked; ``memory list``
            shows them, and ``memory forget ID`` of the newer entry undoes a wrong update).
        not_remembered: its explicit requests ("Remember that X") that kept nothing: under three
            words, a reminder ("to buy milk"), or longer than an entry may be.
    """

    remembered: list[int] = field(default_factory=list)
    forgotten: list[Entry] = field(default_factory=list)
    not_forgotten: int = 0
    updated: list[int] = field(default_factory=list)
    not_remembered: int = 0

    def keep(self, told) -> None:  # told: store.Told
        self.remembered.append(told.id)
        self.updated += told.superseded


def learn_turn(store, user_text: str, conversation: str | None = None) -> Learned:  # store: SemanticStore
    """Apply a user turn to ``store``: retractions, then remembered facts.

    Args:
        store: a ``SemanticStore``.
        user_text: the user's message.
        conversation: the conversation it came from (kept with new entries).

    Returns:
        What changed.
    """
    out = Learned()
    if not isinstance(user_text, str) or not user_text.strip():
        return out
    for s in sentences(user_text):
        if retraction(s) is not None:
            gone = store.retract(s)
            out.forgotten += gone
            out.not_forgotten += not gone
        elif asks_to_forget_all(s):  # all of it: never on a sentence, but said back
            out.not_forgotten += 1
    facts = extract_facts(user_text)
    out.not_remembered = sum(asked not in facts for asked in asked_to_remember(user_text))
    for fact in facts:
        out.keep(store.tell(fact, source="turn", conversation=conversation))
    # Updates said as chat ("Traded in the old car, I've got a Mazda now.", "Ingrid moved to
    # Stavanger."): the narrow rules above miss most; kept when they replace an entry.
    said = [s for s in statements(user_text)
            if s not in facts and retraction(s) is None and (may_update(s) or store.names_someone(s))]
    for s, replaced in zip(said, store.would_update(said)):
        if replaced:  # judged on the store as the turn found it (one batched embedding)
            out.keep(store.tell(s, source="turn", conversation=conversation))
    return out


__all__ = ["Learned", "learn_turn"]

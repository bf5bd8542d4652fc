"""What a finished user turn changes in semantic memory: the writer's operations, applied.

``learn_turn`` asks the writer which entries it needs to see (``related_queries``), finds
them by search, has the writer propose operations and applies them in one go
(``SemanticStore.apply``). Deletions go first, so "Forget that I live in Ghent. I live in
Porto." leaves only Porto.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlotspark.memory.semantic.records import Entry
from mlotspark.memory.semantic.requests import forget_queries
from mlotspark.memory.semantic.writer import MemoryWriter, SimpleWriter

RELATED_K = 5  # entries shown to the writer per query
# A request to forget takes its best match when it scores at least the injection threshold and
# stands FORGET_APART above the next entry: a wrong deletion loses what the user told, a missed
# one is left for ``memory forget ID`` (chosen on the five older update sets: 67/96 requests
# done, 8 of 998 other entries lost; 13 lost without the margin).
FORGET_APART = 0.03


@dataclass
class Learned:
    """What one turn changed.

    Attributes:
        remembered: ids of the entries the turn's statements became (or already were).
        forgotten: the entries its deletions removed.
        not_forgotten: its requests to forget that matched no entry (the user should say
            which: ``memory forget ID``).
        updated: the older entries marked superseded (kept; ``memory list --history`` shows them).
        not_remembered: explicit "remember that …" requests that kept nothing.
    """

    remembered: list[int] = field(default_factory=list)
    forgotten: list[Entry] = field(default_factory=list)
    not_forgotten: int = 0
    updated: list[int] = field(default_factory=list)
    not_remembered: int = 0


def learn_turn(store, user_text: str, conversation: str | None = None,  # store: SemanticStore
               writer: MemoryWriter | None = None) -> Learned:
    """Apply a user turn to ``store`` through ``writer`` (default ``SimpleWriter``).

    Args:
        store: a ``SemanticStore``.
        user_text: the user's message.
        conversation: the conversation it came from (kept with new entries).
        writer: who decides the operations.

    Returns:
        What changed.
    """
    if not isinstance(user_text, str) or not user_text.strip():
        return Learned()
    writer = writer or SimpleWriter()
    # A request to forget takes only an entry that clearly matches it, whichever the writer.
    strict = store.calibration.threshold_about_user
    related = {q: _named(store.search(q, k=2, threshold=strict)) for q in forget_queries(user_text)}
    floor = strict if writer.related_floor is None else writer.related_floor
    for q in writer.related_queries(user_text):
        if q not in related:
            related[q] = [h.entry for h in store.search(q, k=RELATED_K, threshold=floor)]
    return store.apply(writer.operations(user_text, related), conversation=conversation)


def _named(hits: list) -> list[Entry]:
    """The entry a request to forget names: its best hit when it stands ``FORGET_APART`` above the next."""
    if not hits:
        return []
    best, second = hits[0].score, hits[1].score if len(hits) > 1 else 0.0
    return [hits[0].entry] if best - second >= FORGET_APART else []


__all__ = ["FORGET_APART", "Learned", "learn_turn"]

"""Who decides what a turn changes in memory: the ``MemoryWriter`` protocol and the simple writer.

A writer reads one user turn and the current entries related to it and proposes
``Operation`` s; the store applies them (``SemanticStore.apply``) and knows nothing of
language. Two writers: ``SimpleWriter`` (here: keeps what the turn says, acts on explicit
requests) and ``ModelWriter`` (``model_writer.py``: the chat model proposes the operations
in one JSON-constrained call). Which statement about a thing is current is decided when a
question is asked (``search.newest_of_alike``), so a writer that only adds loses nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping, Protocol, Sequence, runtime_checkable

from mlotspark.memory.semantic.records import Entry
from mlotspark.memory.semantic.requests import forget_queries, forget_request, remember_request, sentences

Kind = Literal["add", "supersede", "delete", "none"]
MIN_WORDS = 3  # "ok thanks", "lol" say nothing to keep


@dataclass(frozen=True)
class Operation:
    """One change to memory.

    Attributes:
        kind: ``add`` (keep ``text``), ``supersede`` (keep ``text``, mark ``ids`` replaced by it),
            ``delete`` (remove ``ids``), ``none`` (explicit: a request that found nothing to act on).
        text: the entry's text for ``add`` and ``supersede``.
        ids: the existing entries it touches (``supersede``, ``delete``).
        explicit: the user asked for it ("remember that …", "forget …").
    """

    kind: Kind
    text: str = ""
    ids: tuple[int, ...] = ()
    explicit: bool = False


@runtime_checkable
class MemoryWriter(Protocol):
    """Turns one user turn into operations on memory."""

    name: str
    #: Score a related entry needs (None: the store's threshold for a message about the user).
    related_floor: float | None

    def related_queries(self, turn: str) -> list[str]:
        """The texts whose search hits are the ``related`` entries ``operations`` needs (the
        learner adds what each request to forget names, ``requests.forget_queries``)."""
        ...

    def operations(self, turn: str, related: Mapping[str, Sequence[Entry]]) -> list[Operation]:
        """The operations ``turn`` asks for, given the current entries related to it: for each of
        ``related_queries(turn)``, the entries that match it, best first."""
        ...


def statements(turn: str) -> list[str]:
    """The sentences of a turn worth keeping as said: not questions, not requests, three words or more."""
    return [s for s in sentences(turn) if not s.rstrip().endswith("?") and forget_request(s) is None
            and len(s.split()) >= MIN_WORDS]


class SimpleWriter:
    """Keeps every statement of a turn as said; "remember that X" keeps X; "forget X" deletes
    the entry that matches X best (found by the learner's search: ``related_queries``)."""

    name = "simple"
    related_floor = None  # a request to forget takes only an entry that clearly matches

    def related_queries(self, turn: str) -> list[str]:
        return forget_queries(turn)

    def operations(self, turn: str, related: Mapping[str, Sequence[Entry]]) -> list[Operation]:
        # A request to forget that matches nothing is an explicit ``none``: the user is told.
        ops = [Operation("delete", ids=(hits[0].id,), explicit=True) if (hits := related.get(q))
               else Operation("none", q, explicit=True) for q in self.related_queries(turn)]
        for s in statements(turn):
            asked = remember_request(s)
            ops.append(Operation("add", asked or s, explicit=asked is not None))
        return ops


__all__ = ["MemoryWriter", "Operation", "SimpleWriter", "statements"]

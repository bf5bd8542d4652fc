"""A finishing conversation is stored beside the engine thread: while its writes are
held, another request still decodes; once they run, the turn is whole on disk."""

from __future__ import annotations

import threading

import mlotspark  # noqa: F401
from mlotspark.conversations.writer import Writer

from persist_helpers import engines, tiny_dirs, tiny_loaded  # noqa: F401  (fixtures)

OPTS = dict(temperature=0.0, max_tokens=6)
GUARD_S = 300  # only against a hang: nothing here measures time


def test_a_slow_finish_does_not_stall_another_requests_decode(engines, tiny_loaded):
    e = engines(tiny_loaded)
    entered, release = threading.Event(), threading.Event()
    seen: dict = {}
    store = e.memory
    tell = store.tell  # what a turn's learning writes with (remember is tell's id)

    def slow_tell(text, **kw):  # the semantic store's write, held until the test lets go
        seen["thread"] = threading.current_thread().name
        entered.set()
        assert release.wait(GUARD_S)
        return tell(text, **kw)

    store.tell = slow_tell
    conv = e.conversation("slow")
    turn: dict = {}
    sender = threading.Thread(target=lambda: turn.setdefault("result", conv.send("I live in Ghent. Hi!", **OPTS)))
    sender.start()
    try:
        assert entered.wait(GUARD_S), "the turn never reached its memory write"
        # The turn's memory write is held. Another request decodes meanwhile.
        other = e.submit("Count to five.", temperature=0.0, max_tokens=5)
        pieces = list(other)
        result = other.result(GUARD_S)
        assert pieces and result.stats.generation_tokens >= 1
        assert not release.is_set() and sender.is_alive()  # the turn is still storing
        assert seen["thread"] != "mlotspark-engine"
        # The messages are already on disk (they come first); send waits for the rest.
        assert [m["role"] for m in conv.messages] == ["user", "assistant"]
    finally:
        release.set()
        sender.join(GUARD_S)
    learned = turn["result"].stats.extra["memory"]["learned"]
    assert [e.memory.get(i).text for i in learned] == ["I live in Ghent."]
    assert turn["result"].stats.extra["snapshot"]["saved"]


def test_the_writer_keeps_order_and_runs_inline_after_close():
    w = Writer()
    order: list[int] = []
    gate = threading.Event()
    first = w.submit(lambda: (gate.wait(GUARD_S), order.append(1)))
    second = w.submit(lambda: order.append(2))
    gate.set()
    second.result(GUARD_S)
    assert first.done() and order == [1, 2]
    w.close()
    here = w.submit(lambda: threading.current_thread().name)
    assert here.result() == threading.current_thread().name  # after close: in the caller's thread

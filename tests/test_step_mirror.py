"""The scheduler tells a StepMirror every step, in order (what rank 0 sends the other ranks).

A tiny model in one process with a recording mirror: every request is announced before its
first prefill, stepped only while announced, and leaves before its ``on_finish``; a join the
mirror refuses fails that request alone.
"""

from __future__ import annotations

import contextlib

import pytest

from mlotspark.errors import SnapshotError
from mlotspark.runtime.mirror import StepMirror

from test_scheduler import PROMPTS, tiny_engine

REFUSED = [99, 98, 97]  # a prompt the recorder refuses at its join


class Recorder(StepMirror):
    def __init__(self):
        self.events: list[tuple[str, object]] = []

    def joined(self, request):
        self.events.append(("join", request.seq_no))
        if list(request.generation.prompt) == REFUSED:
            raise SnapshotError("rank 1 cannot continue this request: no share")

    def prefill(self, requests, batched):
        self.events.append(("prefill", [r.seq_no for r in requests]))
        return contextlib.nullcontext()

    def decode(self, requests):
        self.events.append(("decode", [r.seq_no for r in requests]))
        return contextlib.nullcontext()

    def left(self, request):
        self.events.append(("left", request.seq_no))

    def dropped(self, request):
        self.events.append(("drop", request.seq_no))


def test_every_step_is_announced_in_order_and_a_refused_join_fails_alone():
    engine = tiny_engine()
    solo = [engine.submit(prompt_ids=p, max_tokens=12).result().tokens for p in PROMPTS]
    mirror = engine.scheduler.mirror = Recorder()
    finished: list[int] = []
    handles = []
    for p in PROMPTS[:2] + [REFUSED] + PROMPTS[2:]:
        handles.append(engine.submit(prompt_ids=p, max_tokens=12,
                                     on_finish=lambda g: mirror.events.append(("finish", id(g)))))
    refused = handles.pop(2)
    with pytest.raises(SnapshotError, match="rank 1 cannot continue"):
        refused.result()
    assert [h.result().tokens for h in handles] == solo  # the mirror changes nothing here
    events = mirror.events
    ids = [e[1] for e in events if e[0] == "join"]
    assert len(ids) == 5
    live: set = set()
    for kind, what in events:
        if kind == "join":
            live.add(what)
        elif kind in ("prefill", "decode"):
            assert set(what) <= live and what  # only announced, unfinished requests are stepped
        elif kind in ("left", "drop"):
            live.discard(what)
    assert ("left", ids[2]) not in events and ("drop", ids[2]) in events  # failed: dropped, never stepped
    assert max(len(w) for k, w in events if k == "decode") > 1  # batched
    # Each request leaves before its on_finish runs (its share's snapshot outcome goes into the result).
    lefts = [i for i, e in enumerate(events) if e[0] == "left"]
    finishes = [i for i, e in enumerate(events) if e[0] == "finish"]
    assert len(lefts) == len(finishes) == 4 and all(a < b for a, b in zip(lefts, finishes))

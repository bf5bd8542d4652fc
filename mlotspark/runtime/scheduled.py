"""What the engine thread holds: a submitted ``Request``, a ``Job`` other code asked it to
run (``Scheduler.call``), and a ``StepRecord`` of each turn that decoded or paused."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from mlotspark.runtime.generation import Generation
from mlotspark.runtime.sequence import Sequence

__all__ = ["Job", "Request", "StepRecord", "cache_bytes"]


@dataclass(frozen=True)
class StepRecord:
    """One turn of the engine thread that decoded or paused (``Scheduler.timeline``)."""

    t: float  # scheduler clock at the end of the turn
    state: str  # governor state
    cap: int  # batch cap in force
    batch: int  # sequences decoded (0 in a pause)
    step_s: float  # seconds the decode step (or the pause wait) took
    queued: int  # requests waiting in the queue
    paused: bool = False
    cpu_s: float = 0.0  # process CPU seconds of the step (contention shows as cpu_s << step_s)


@dataclass
class Request:
    """A submitted request as the scheduler holds it."""

    generation: Generation  # the caller's record: it reads the result there
    handle: Any  # RequestHandle: how the engine thread reaches the caller (emit, progressed, finish)
    priority: int = 0
    on_finish: Callable[[Generation], None] | None = None
    owns_cache: bool = True  # the engine made the cache, so it may drop it on cancel
    projected_bytes: int = 0
    seq_no: int = 0
    submitted_at: float = field(default_factory=time.perf_counter)
    state: Sequence | None = None  # the engine-side state, made when it is admitted
    stepper: Iterator[str] | None = None  # its Sequence's own loop (beams, speculation): one step per turn
    meta: dict = field(default_factory=dict)  # what the StepMirror needs (distributed: the conversation)

    @property
    def sort_key(self) -> tuple[int, int]:
        return (self.priority, self.seq_no)


@dataclass
class Job:
    """A call to run on the engine thread between steps; ``done`` is set once it ran."""

    fn: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None


def cache_bytes(cache: list | None) -> int:
    """Bytes a per-layer cache holds (0 for a cache that cannot tell)."""
    total = 0
    for c in cache or ():
        try:
            n = getattr(c, "nbytes", 0)
            total += int(n() if callable(n) else n or 0)
        except (AttributeError, NotImplementedError, TypeError):
            continue  # a cache that cannot tell its size
    return total

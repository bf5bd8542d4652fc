"""Slow first-time steps, reported to whoever shows them.

Some steps run once and take seconds: converting a GGUF file MLX cannot read, probing
the KV cache kinds for ``cache_kind="auto"``, loading the sentence-embedding model.
Each runs inside ``with step(name, total=..., unit=...) as s: ... s.advance(n)``, which
publishes ``StepProgress`` events. The CLI's status line (``cli/progress.py``, stderr on a
terminal) and the TUI (loading panel, reply area) read ``active()`` as they redraw; an API
caller may ``listen(callback)`` instead. A prompt's prefill has its own per-request
events (``runtime.progress.PrefillProgress``); these are process-wide, since the steps
belong to no single request.

At the bottom of the layers (no MLX, no other mlotspark module), so ``models``,
``memory`` and ``decoding`` all report through it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator

log = logging.getLogger(__name__)

__all__ = ["Step", "StepListener", "StepProgress", "active", "listen", "step", "watched", "watching"]


@dataclass(frozen=True)
class StepProgress:
    """Where one slow step stands.

    Attributes:
        name: what runs, e.g. ``converting model.gguf`` or ``choosing the KV cache kind``.
        done: units done so far (bytes, kinds, ...; 0 when the step has no measure).
        total: units in all, or None when unknown (only the time then moves).
        unit: ``"B"`` for bytes (shown as MB), else a word for ``done``/``total``.
        elapsed_s: seconds since the step began, at this event.
        finished: True for the step's last event.
        started_at: ``time.perf_counter()`` when the step began (a display redrawing
            between events gets the time so far from it).
    """

    name: str
    done: float = 0
    total: float | None = None
    unit: str = ""
    elapsed_s: float = 0.0
    finished: bool = False
    started_at: float = 0.0

    def describe(self, now: float | None = None) -> str:
        """One line: ``converting model.gguf · 41/120 MB (34%) · 6 s``.

        Args:
            now: ``time.perf_counter()`` to count the seconds to (default: the event's own time).
        """
        elapsed = self.elapsed_s if now is None or self.finished else max(now - self.started_at, self.elapsed_s)
        parts = [self.name]
        if self.total:
            if self.unit == "B":
                amount = f"{self.done / 1e6:,.0f}/{self.total / 1e6:,.0f} MB"
            else:
                amount = f"{self.done:,.0f}/{self.total:,.0f}" + (f" {self.unit}" if self.unit else "")
            parts.append(f"{amount} ({min(1.0, self.done / self.total):.0%})")
        parts.append(f"{elapsed:.0f} s")
        return " · ".join(parts)


StepListener = Callable[[StepProgress], None]

_lock = threading.Lock()
_listeners: list[StepListener] = []
_active: dict[int, StepProgress] = {}  # running steps by id, in start order
_ids = itertools.count()
_watchers = 0  # displays showing steps now (``watching``)


class Step:
    """A running step (what ``step()`` yields): ``advance`` it as work gets done."""

    def __init__(self, key: int, event: StepProgress, t0: float):
        self._key, self._event, self._t0 = key, event, t0

    @property
    def event(self) -> StepProgress:
        """The step's latest event."""
        return self._event

    def advance(self, n: float = 1) -> None:
        """Count ``n`` more units done and tell the listeners."""
        self._publish(replace(self._event, done=self._event.done + n, elapsed_s=time.perf_counter() - self._t0))

    def _publish(self, event: StepProgress) -> None:
        self._event = event
        with _lock:
            if event.finished:
                _active.pop(self._key, None)
            else:
                _active[self._key] = event
            listeners = list(_listeners)
        for fn in listeners:
            try:
                fn(event)
            except Exception:  # noqa: BLE001  a display that fails must not fail the work
                log.exception("step listener %r failed", fn)


@contextlib.contextmanager
def step(name: str, total: float | None = None, unit: str = "") -> Iterator[Step]:
    """Run a slow step: a first event now, the last one (``finished``) when it ends.

    Args:
        name: what runs, said to the user (``loading the sentence-embedding model``).
        total: units the step has in all (None: only the time is shown).
        unit: ``"B"`` for bytes, else the word for a unit (or "").

    Yields:
        The ``Step``, to ``advance`` as units get done.
    """
    t0 = time.perf_counter()
    s = Step(next(_ids), StepProgress(name, 0, total, unit, started_at=t0), t0)
    s._publish(s.event)
    try:
        yield s
    finally:
        s._publish(replace(s.event, elapsed_s=time.perf_counter() - t0, finished=True))


def active() -> list[StepProgress]:
    """The latest event of every step running now, the oldest step first."""
    with _lock:
        return list(_active.values())


def listen(listener: StepListener) -> Callable[[], None]:
    """Call ``listener`` with every step event (on the thread doing the step: keep it quick).

    Args:
        listener: takes a ``StepProgress``.

    Returns:
        A function that stops the listening.
    """
    with _lock:
        _listeners.append(listener)

    def stop() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return stop


@contextlib.contextmanager
def watching() -> Iterator[None]:
    """Mark that a display shows the steps (the CLI's status line while it is drawn),
    so a step that would otherwise draw a bar of its own leaves the line to it."""
    global _watchers
    with _lock:
        _watchers += 1
    try:
        yield
    finally:
        with _lock:
            _watchers -= 1


def watched() -> bool:
    """True while some display shows the steps (see ``watching``)."""
    with _lock:
        return _watchers > 0

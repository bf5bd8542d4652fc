"""Prefill progress: one event type and one meter for every prefill loop.

A 12k-token prompt can prefill for minutes before its first token. The prefill
(``runtime/prefill.py``: the scheduler's chunks, or a request's own loop's whole prompt
before it starts) reports ``(done, total)`` to a :class:`PrefillMeter`,
which turns it into :class:`PrefillProgress` events for whoever listens: the CLI's
bar (``cli/progress.py``), the TUI's progress line, or an API caller
(``Engine.stream(..., progress=True)`` or ``Engine.submit(..., on_progress=f)``).

Events of one request arrive in order, ``done`` never decreases, and the last one
has ``done == total`` (the prompt is in the cache; the first token follows).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["PrefillMeter", "PrefillProgress", "ProgressListener", "meter_for"]


@dataclass(frozen=True)
class PrefillProgress:
    """How far one request's prefill has got.

    Attributes:
        done: prompt tokens prefilled so far (this request's, cached ones excluded).
        total: prompt tokens to prefill (the prompt minus what came from a cache).
        elapsed_s: seconds since the prefill started.
        cascade: True when the memory cascade holds the context (prompts past the
            model's context, or forced on).
        cached: prompt tokens whose KV came from a cache or snapshot (not prefilled).
    """

    done: int
    total: int
    elapsed_s: float
    cascade: bool = False
    cached: int = 0

    @property
    def finished(self) -> bool:
        """True for the last event: the whole prompt is prefilled."""
        return self.done >= self.total

    @property
    def fraction(self) -> float:
        """``done / total`` in [0, 1]."""
        return min(1.0, self.done / self.total) if self.total else 1.0

    @property
    def tokens_per_s(self) -> float:
        """Prefill speed so far (0 until a chunk has finished)."""
        return self.done / self.elapsed_s if self.done and self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the speed so far; None until it is known."""
        tps = self.tokens_per_s
        return (self.total - self.done) / tps if tps > 0 else None

    def describe(self, since_s: float = 0.0) -> str:
        """One line: ``prefill 4,096/12,000 tokens (34%) · 85 tok/s · ETA 93 s · memory cascade``.

        Args:
            since_s: seconds since this event arrived: a display that redraws between events
                (one per prefill chunk, which can take many seconds) counts the ETA down, or
                the elapsed time up before the first chunk has given a speed.
        """
        parts = [f"prefill {self.done:,}/{self.total:,} tokens ({self.fraction:.0%})"]
        if self.tokens_per_s:
            parts.append(f"{self.tokens_per_s:.0f} tok/s")
        eta = self.eta_s
        since_s = max(0.0, since_s)
        if eta is not None and not self.finished:
            left = eta - since_s
            parts.append(f"ETA {left:.0f} s" if left >= 0.5 else "ETA any moment")
        else:
            parts.append(f"{self.elapsed_s + since_s:.0f} s")
        if self.cached:
            parts.append(f"{self.cached:,} cached")
        if self.cascade:
            parts.append("memory cascade")
        return " · ".join(parts)


ProgressListener = Callable[[PrefillProgress], None]


class PrefillMeter:
    """Turns ``(done, total)`` reports of a prefill loop into ordered events.

    Args:
        total: prompt tokens to prefill.
        listener: called with each event (on the engine thread: keep it quick).
        cascade: whether the memory cascade holds the context.
        cached: prompt tokens that came from a cache.
        clock: seconds (default ``time.perf_counter``).
    """

    def __init__(self, total: int, listener: ProgressListener, *, cascade: bool = False, cached: int = 0,
                 clock: Callable[[], float] = time.perf_counter):
        self.total = total
        self.listener = listener
        self.cascade = cascade
        self.cached = cached
        self.clock = clock
        self.t0 = clock()
        self.done = -1  # nothing reported yet

    def __call__(self, done: int, total: int | None = None) -> None:
        """Report ``done`` prompt tokens prefilled (``total`` is accepted for mlx-lm's
        ``prompt_progress_callback`` and otherwise ignored: the meter's own counts).

        Repeats and steps back are dropped, so events stay in order.
        """
        done = max(0, min(int(done), self.total))
        if done <= self.done:
            return
        self.done = done
        self.listener(PrefillProgress(done, self.total, self.clock() - self.t0, self.cascade, self.cached))

    def finish(self) -> None:
        """Report the whole prompt prefilled (once; later calls do nothing)."""
        self(self.total)


def meter_for(request: Any, listener: ProgressListener | None) -> PrefillMeter | None:
    """The meter of one request's prefill (None when nobody listens), reporting ``(0, total)`` at once.

    Args:
        request: the request (``prompt``: the tokens not yet in the cache, ``cached_tokens``,
            ``cascaded``).
        listener: whoever takes the events (the request handle's ``progressed``), or None.
    """
    if listener is None:
        return None
    meter = PrefillMeter(len(request.prompt), listener, cascade=request.cascaded, cached=request.cached_tokens)
    meter(0)
    return meter

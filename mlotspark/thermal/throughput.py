"""Throttling evidence from the engine's own decode throughput (any platform).

This module never imports mlx.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mlotspark.thermal.reading import Reading, clamp01

__all__ = ["ThroughputProbe"]


@dataclass
class _Rate:
    """Throughput history at one batch size."""

    n: int = 0
    ewma: float = 0.0
    best: float = 0.0  # best settled EWMA seen: the "cold machine" rate
    low_run: int = 0  # consecutive samples below best by more than the tolerance
    last_t: float = 0.0


class ThroughputProbe:
    """Throttling evidence from the engine's own decode throughput.

    The engine calls :meth:`record` with the aggregate decode rate at a batch size,
    about once a second (a rate over at least half a second of decoding, not one
    step, so a GC pause is not mistaken for heat). A sustained drop at the same batch
    size, compared with the best rate seen at that size, is throttling on any
    platform, with or without sensors.

    Args:
        alpha: EWMA weight of a new sample.
        min_samples: samples at a batch size before its rate counts as settled.
        sustain: consecutive low samples needed before any evidence is reported.
        tolerance: a drop below this fraction is noise (evidence 0).
        full_drop: a drop of this fraction or more is evidence 1.
        stale_s: history older than this says nothing about the machine now.
        clock: monotonic seconds, injectable for tests.
    """

    def __init__(
        self,
        alpha: float = 0.3,
        min_samples: int = 4,
        sustain: int = 3,
        tolerance: float = 0.10,
        full_drop: float = 0.40,
        stale_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.alpha, self.min_samples, self.sustain = alpha, min_samples, sustain
        self.tolerance, self.full_drop, self.stale_s = tolerance, full_drop, stale_s
        self._clock = clock
        self._rates: dict[int, _Rate] = {}
        self._last_batch: int | None = None
        self._lock = threading.Lock()  # engine thread writes, governor may read elsewhere

    def record(self, batch_size: int, tokens_per_s: float) -> None:
        """Add one throughput sample.

        Args:
            batch_size: number of sequences decoded together (< 1 is ignored).
            tokens_per_s: aggregate decode tokens/s of the batch. Non-positive or
                non-finite values (a stalled step) are ignored.
        """
        if batch_size < 1 or not math.isfinite(tokens_per_s) or tokens_per_s <= 0:
            return
        with self._lock:
            h = self._rates.setdefault(int(batch_size), _Rate())
            h.n += 1
            a = 1.0 if h.n == 1 else self.alpha
            h.ewma = a * tokens_per_s + (1 - a) * h.ewma
            if h.n >= self.min_samples:
                h.best = max(h.best, h.ewma)
            low = h.best > 0 and tokens_per_s < h.best * (1 - self.tolerance)
            h.low_run = h.low_run + 1 if low else 0
            h.last_t = self._clock()
            self._last_batch = int(batch_size)

    def evidence(self, batch_size: int | None = None) -> float | None:
        """Throttle evidence 0..1 at a batch size (default: the last one recorded).

        Returns:
            None when there is no settled, recent history at that size.
        """
        with self._lock:
            bs = self._last_batch if batch_size is None else batch_size
            h = self._rates.get(bs) if bs is not None else None
            if h is None or h.best <= 0 or h.n < self.min_samples:
                return None
            if self._clock() - h.last_t > self.stale_s:
                return None
            if h.low_run < self.sustain:
                return 0.0
            drop = 1.0 - h.ewma / h.best
            return clamp01((drop - self.tolerance) / (self.full_drop - self.tolerance))

    def history(self) -> dict[int, dict[str, float]]:
        """Per batch size: samples, current EWMA and best rate (for status pages)."""
        with self._lock:
            rates = sorted(self._rates.items())
            return {bs: {"n": h.n, "ewma": h.ewma, "best": h.best} for bs, h in rates}

    def read(self) -> Reading:
        """Return a Reading carrying only ``throttle_evidence``."""
        return Reading(throttle_evidence=self.evidence())


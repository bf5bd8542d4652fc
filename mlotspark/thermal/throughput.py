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


#: contexts below this many tokens share one bucket (attention is a small part of a step there);
#: above it, buckets grow by CONTEXT_STEP: within one, a step's cost grows by less than
#: (STEP - 1) / STEP = 9 % even when attention is all of it, under the 10 % tolerance.
CONTEXT_BASE, CONTEXT_STEP = 256, 1.1


def context_bucket(context: int | None) -> int:
    """The bucket of a context length (0 for None or short contexts)."""
    if not context or context < CONTEXT_BASE:
        return 0
    return 1 + int(math.log(context / CONTEXT_BASE, CONTEXT_STEP))


@dataclass
class _Rate:
    """Throughput history at one batch size and context bucket."""

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

    A longer context slows every step (attention reads all of it), so rates are kept
    per context bucket (:func:`context_bucket`, buckets ×1.1 wide) and a rate is
    compared only with the best seen at the same or a *longer* context, which can
    only have been slower: a long generation at a steady clock is no evidence.

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
        self._rates: dict[tuple[int, int], _Rate] = {}
        self._last_key: tuple[int, int] | None = None
        self._lock = threading.Lock()  # engine thread writes, governor may read elsewhere

    def record(self, batch_size: int, tokens_per_s: float, context: int | None = None) -> None:
        """Add one throughput sample.

        Args:
            batch_size: number of sequences decoded together (< 1 is ignored).
            tokens_per_s: aggregate decode tokens/s of the batch. Non-positive or
                non-finite values (a stalled step) are ignored.
            context: the longest context in the batch, in tokens (None: not known,
                every sample in one bucket as before).
        """
        if batch_size < 1 or not math.isfinite(tokens_per_s) or tokens_per_s <= 0:
            return
        with self._lock:
            key = (int(batch_size), context_bucket(context))
            h = self._rates.setdefault(key, _Rate())
            h.n += 1
            a = 1.0 if h.n == 1 else self.alpha
            h.ewma = a * tokens_per_s + (1 - a) * h.ewma
            if h.n >= self.min_samples:
                h.best = max(h.best, h.ewma)
            ref = self._reference(key)
            low = ref > 0 and tokens_per_s < ref * (1 - self.tolerance)
            h.low_run = h.low_run + 1 if low else 0
            h.last_t = self._clock()
            self._last_key = key

    def rebase(self) -> None:
        """Forget every rate: the engine changed how it runs (its BLAS threads), so a rate
        before the change is no reference for one after it."""
        with self._lock:
            self._rates.clear()
            self._last_key = None

    def _reference(self, key: tuple[int, int]) -> float:
        """The best settled rate at this batch size and this or a longer context."""
        bs, bucket = key
        return max((h.best for (b, c), h in self._rates.items() if b == bs and c >= bucket), default=0.0)

    def evidence(self, batch_size: int | None = None) -> float | None:
        """Throttle evidence 0..1 at a batch size (default: the last one recorded),
        at the context bucket last recorded for it.

        Returns:
            None when there is no settled, recent history at that size.
        """
        with self._lock:
            key = self._last_key
            if batch_size is not None and (key is None or key[0] != batch_size):
                keys = [k for k in self._rates if k[0] == batch_size]
                key = max(keys, key=lambda k: self._rates[k].last_t) if keys else None
            h = self._rates.get(key) if key is not None else None
            ref = self._reference(key) if key is not None else 0.0
            if h is None or ref <= 0 or h.n < min(self.min_samples, self.sustain):
                return None
            if self._clock() - h.last_t > self.stale_s:
                return None
            if h.low_run < self.sustain:
                return 0.0
            drop = 1.0 - h.ewma / ref
            return clamp01((drop - self.tolerance) / (self.full_drop - self.tolerance))

    def history(self) -> dict[int, dict[str, float]]:
        """Per batch size: samples, current EWMA and best rate (for status pages), of its
        most recent context bucket (``context_bucket``)."""
        with self._lock:
            out: dict[int, dict[str, float]] = {}
            for (bs, bucket), h in sorted(self._rates.items(), key=lambda kv: kv[1].last_t):
                out[bs] = {"n": h.n, "ewma": h.ewma, "best": h.best, "context_bucket": bucket}
            return dict(sorted(out.items()))

    def read(self) -> Reading:
        """Return a Reading carrying only ``throttle_evidence``."""
        return Reading(throttle_evidence=self.evidence())


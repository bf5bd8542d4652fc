"""Thermal governor: turns probe readings into a batch-size cap, pauses and admissions.

The scheduler calls ``update()`` between decode steps (it reads the probes at most
once per ``min_interval_s``), keeps its batch ≤ ``Decision.cap``, sleeps
``Decision.pause_s`` when positive, and asks ``admit()`` before starting a request.

Which signal puts the machine in which state is in ``grading.py``; how each mode
reacts is the table in ``policies.py``; this module is the state machine.

Batch cap (AIMD): +1 per calm update at most once per ``increase_s``; halved when
the state gets worse (and again every ``repeat_decrease_s`` while it stays serious);
the floor ``min_batch`` in critical, with a cool-down pause, then ``work_s`` of
work before the next pause. This module never imports mlx at import time.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mlotspark.errors import OptionError
from mlotspark.options import check_int
from mlotspark.thermal.cores import blas_threads, usable_cores
from mlotspark.thermal.grading import CRITICAL, NOMINAL, SERIOUS, STATES, Thresholds
from mlotspark.thermal.policies import MODES, POLICIES, ModePolicy
from mlotspark.thermal.probes import Probe, Reading, ThroughputProbe, default_probes
from mlotspark.units import fmt_bytes

__all__ = ["STATES", "MODES", "Decision", "Thresholds", "ModePolicy", "POLICIES",
           "ThermalGovernor"]


@dataclass(frozen=True)
class Decision:
    """What the scheduler should do now.

    Attributes:
        state: "nominal" | "fair" | "serious" | "critical".
        cap: the most sequences to decode together.
        pause_s: seconds to pause decoding now (cool-down left), 0 when none.
        mode: the effective mode (auto resolved to balanced or efficiency).
        reason: one line saying why, e.g.
            "temperature 92°C ≥ 90 → critical: cap 4→1, pause 2.0s".
        t: clock time of the evaluation.
        threads: BLAS threads for the cores other processes leave free
            (``thermal.cores``); None while not known.
    """

    state: str
    cap: int
    pause_s: float
    mode: str
    reason: str
    t: float = 0.0
    threads: int | None = None



class ThermalGovernor:
    """Sets the batch cap, cool-down pauses and admissions from probe readings.

    Args:
        probes: objects with ``read() -> Reading`` (default: :func:`default_probes`).
        mode: "balanced" (default), "performance", "efficiency" or "auto".
        max_batch: the largest cap any mode allows (default 8).
        min_batch: the floor of the cap, used in critical (default 1).
        memory_limit_bytes: projected KV + weights must stay under this (None: no limit).
        clock: monotonic seconds (default ``time.monotonic``); tests inject a fake.
        min_interval_s: probes are read at most this often; calls in between return
            the last decision (default 1.0).
        thresholds: signal thresholds (default :class:`Thresholds`).
        admit_pressure: system memory pressure at which new requests wait while
            others run (default 0.85).
        history_len: decisions kept for :attr:`history` (default 500).

    Raises:
        OptionError: for an unknown mode, max_batch < 1, min_batch outside
            [1, max_batch], or a non-positive memory limit.
    """

    def __init__(
        self,
        probes: Sequence[Probe] | None = None,
        mode: str = "balanced",
        max_batch: int = 8,
        min_batch: int = 1,
        memory_limit_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        min_interval_s: float = 1.0,
        thresholds: Thresholds | None = None,
        admit_pressure: float = 0.85,
        history_len: int = 500,
    ) -> None:
        self.max_batch = check_int("max_batch", max_batch, 1)
        self.min_batch = check_int("min_batch", min_batch, 1)
        if min_batch > max_batch:
            raise OptionError(f"min_batch {min_batch!r} is larger than max_batch {max_batch!r}")
        if memory_limit_bytes is not None:
            check_int("memory_limit_bytes", memory_limit_bytes, 1)
        if not min_interval_s >= 0:
            raise OptionError(f"min_interval_s must be ≥ 0, got {min_interval_s!r}")
        if not 0 < admit_pressure <= 1:
            raise OptionError(f"admit_pressure must be in (0, 1], got {admit_pressure!r}")
        self.mode = self._check_mode(mode)
        self.memory_limit_bytes = memory_limit_bytes
        self.probes = list(default_probes() if probes is None else probes)
        self.thresholds = thresholds or Thresholds()
        self.min_interval_s = min_interval_s
        self.admit_pressure = admit_pressure
        self._clock = clock
        self._lock = threading.RLock()  # update() on the engine thread, status() from UI threads

        self._eff_mode = "balanced" if mode == "auto" else mode
        self._cap = self.mode_max(self._eff_mode)  # a cold machine starts at full speed
        self._level = NOMINAL
        self._reading = Reading()
        self._decision: Decision | None = None
        self._eval_t = float("-inf")
        self._last_adjust_t = clock()
        self._last_decrease_t = float("-inf")
        self._pause_until = float("-inf")
        self._probe_errors: list[str] = []
        self._threads: int | None = None  # BLAS threads for the free cores (thermal.cores)
        self._history: deque[Decision] = deque(maxlen=check_int("history_len", history_len, 1))

    @staticmethod
    def _check_mode(mode: Any) -> str:
        if mode not in MODES:
            raise OptionError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        return mode

    def set_mode(self, mode: str) -> None:
        """Change the mode; the next update applies it.

        Args:
            mode: "performance", "balanced", "efficiency" or "auto".
        """
        with self._lock:
            self.mode = self._check_mode(mode)
            self._eval_t = float("-inf")  # do not let the rate limit hide the change

    def mode_max(self, mode: str) -> int:
        """The highest cap a mode allows with this governor's max/min batch."""
        return max(self.min_batch, max(1, self.max_batch // POLICIES[mode].cap_divisor))

    @property
    def throughput(self) -> ThroughputProbe | None:
        """The ThroughputProbe among the probes (the engine records into it), if any."""
        return next((p for p in self.probes if isinstance(p, ThroughputProbe)), None)

    def record_throughput(self, batch_size: int, tokens_per_s: float, context: int | None = None) -> None:
        """Pass a decode-rate sample (at ``context`` tokens, if known) to the ThroughputProbe."""
        probe = self.throughput
        if probe is not None:
            probe.record(batch_size, tokens_per_s, context)

    def _read_probes(self) -> Reading:
        readings, errors = [], []
        for p in self.probes:
            try:
                r = p.read()
            except Exception as e:  # noqa: BLE001  a broken probe must not stop the engine
                errors.append(f"{type(p).__name__}: {e}")
                continue
            if isinstance(r, Reading):
                readings.append(r)
        self._probe_errors = errors
        return Reading.combine(readings)

    def update(self, force: bool = False) -> Decision:
        """Read the probes (at most once per ``min_interval_s``) and decide.

        Args:
            force: read the probes even if the last reading is recent.

        Returns:
            The Decision; between readings, the last one with ``pause_s`` counting down.
        """
        with self._lock:
            now = self._clock()
            recent = now - self._eval_t < self.min_interval_s
            if self._decision is not None and recent and not force:
                return replace(self._decision, pause_s=max(0.0, self._pause_until - now))
            self._eval_t = now
            reading = self._reading = self._read_probes()
            note = self._resolve_mode(reading)
            policy = POLICIES[self._eff_mode]
            prev = self._level
            level, why = self._state_from(reading, prev)
            self._level = level
            cap_text = self._adjust_cap(level, prev, now, policy)
            pause_text = self._schedule_pause(level, now, policy)
            threads = blas_threads(reading.cpu_others, usable_cores(), self._threads)
            thread_text = "" if threads == self._threads or threads is None else \
                f"; BLAS threads {self._threads or '-'}→{threads} ({reading.cpu_others:.1f} cores busy elsewhere)"
            self._threads = threads
            decision = Decision(
                state=STATES[level],
                cap=self._cap,
                pause_s=max(0.0, self._pause_until - now),
                mode=self._eff_mode,
                reason=f"{note}{why} → {STATES[level]}: {cap_text}{pause_text}{thread_text}",
                t=now,
                threads=threads,
            )
            self._decision = decision
            self._history.append(decision)
            return decision

    def _resolve_mode(self, reading: Reading) -> str:
        """Set the effective mode; return a note when it changed."""
        if self.mode != "auto":
            eff, why = self.mode, ""
        elif reading.on_battery:
            eff, why = "efficiency", "on battery: "
        elif reading.low_power_mode:
            eff, why = "efficiency", "Low Power Mode: "
        else:
            eff, why = "balanced", "on AC power: "
        if eff == self._eff_mode:
            return ""
        old, self._eff_mode = self._eff_mode, eff
        return f"{why}mode {old}→{eff}; "

    def _state_from(self, reading: Reading, prev: int) -> tuple[int, str]:
        level, why = self.thresholds.assess(reading)
        if level < prev:
            # Cooling: leave a state only once the signal is past the hysteresis margin.
            relaxed, relaxed_why = self.thresholds.assess(reading, relax=True)
            if min(prev, relaxed) > level:
                return min(prev, relaxed), f"{relaxed_why} (cooling, hysteresis)"
        return level, why

    def _adjust_cap(self, level: int, prev: int, now: float, policy: ModePolicy) -> str:
        """AIMD step on ``self._cap``; return the cap part of the reason."""
        top, floor, old = self.mode_max(self._eff_mode), self.min_batch, self._cap
        cap, note = min(old, top), ""  # a mode change lowers the ceiling at once
        since_decrease = now - self._last_decrease_t
        if level == CRITICAL:
            cap, self._last_decrease_t = floor, now
        elif level > prev and level >= policy.decrease_from:
            cap, self._last_decrease_t, note = max(floor, cap // 2), now, " (halved)"
        elif (level >= max(SERIOUS, policy.decrease_from)
              and since_decrease >= policy.repeat_decrease_s):
            cap, self._last_decrease_t = max(floor, cap // 2), now
            note = f" (halved: still {STATES[level]} after {policy.repeat_decrease_s:g}s)"
        elif level <= policy.calm_upto and cap < top:
            wait = policy.increase_s - (now - self._last_adjust_t)
            cap, note = (cap + 1, " (+1)") if wait <= 0 else (cap, f" (+1 in {wait:.1f}s)")
        calm = level <= policy.calm_upto
        if cap != old or not calm:
            self._last_adjust_t = now  # the next +1 waits a full interval of calm
        self._cap = cap
        if cap != old:
            return f"cap {old}→{cap}{note if cap < old or calm else ''}"
        if cap == top and calm:
            return f"cap {cap} ({self._eff_mode} maximum)"
        if cap == floor and not calm:
            return f"cap held at floor {cap}"
        return f"cap held at {cap}{note if calm else ''}"

    def _schedule_pause(self, level: int, now: float, policy: ModePolicy) -> str:
        """Start a cool-down pause when due; return the pause part of the reason."""
        if level == CRITICAL:
            length = policy.pause_s
        elif level == SERIOUS:
            length = policy.serious_pause_s
        else:
            length = 0.0
        if length <= 0:
            self._pause_until = min(self._pause_until, now)  # cooled down: stop pausing
            return ""
        # Duty cycle: after a pause, work_s of decoding before the next one.
        next_pause = self._pause_until + policy.work_s
        if now >= next_pause:
            self._pause_until = now + length
            return f", pause {length:.1f}s"
        if now < self._pause_until:
            return f", pausing {self._pause_until - now:.1f}s more"
        return f", next pause in {next_pause - now:.1f}s"

    def admit(
        self, projected_bytes: int, in_use_bytes: int, active_requests: int | None = None
    ) -> tuple[bool, str]:
        """May a new request start now? Running requests are never affected.

        Uses the reading of the last :meth:`update`. A refused request should wait in
        the queue and ask again after a running request finishes.

        Args:
            projected_bytes: the new request's KV + working memory.
            in_use_bytes: what the engine holds now (weights + running requests' KV).
                It is compared with ``memory_limit_bytes`` only (the user's limit, or
                Metal's recommended working set, pools the weights live in); the system
                readings (psutil's available bytes, macOS's kernel level) already see
                the resident weights, so only ``projected_bytes`` meets them: the
                weights are counted once.
            active_requests: running requests; with 0, system memory pressure is
                waived (there is nothing to wait for), so a refusal then means the
                request cannot fit under ``memory_limit_bytes`` at all.

        Returns:
            (admitted, one-line reason).
        """
        check_int("projected_bytes", projected_bytes, 0)
        check_int("in_use_bytes", in_use_bytes, 0)
        with self._lock:
            limit, r = self.memory_limit_bytes, self._reading
        need, total = fmt_bytes(projected_bytes), projected_bytes + in_use_bytes
        if limit is not None and total > limit:
            alone = " even with nothing else running" if active_requests == 0 else ""
            return False, (f"needs {need} + {fmt_bytes(in_use_bytes)} in use > memory limit "
                           f"{fmt_bytes(limit)}{alone}: waits")
        wait = "waits for a running request to finish"
        pressure, available = r.memory_pressure, r.memory_available_bytes
        if active_requests != 0 and pressure is not None and pressure >= self.admit_pressure:
            return False, f"system memory {pressure:.0%} used ≥ {self.admit_pressure:.0%}: {wait}"
        if active_requests != 0 and r.memory_pressure_level:
            name = ("warn", "critical")[min(r.memory_pressure_level, 2) - 1]
            return False, f"kernel memory pressure {name}: {wait}"
        if active_requests != 0 and available is not None and projected_bytes > available:
            return False, f"needs {need} > {fmt_bytes(available)} available: {wait}"
        limit_text = "" if limit is None else f" of limit {fmt_bytes(limit)}"
        mem_text = "" if pressure is None else f", system memory {pressure:.0%} used"
        return True, f"fits: {fmt_bytes(total)}{limit_text}{mem_text}"

    @property
    def history(self) -> list[tuple[float, str, int, str]]:
        """Past decisions as (t, state, cap, reason), oldest first (for plots)."""
        with self._lock:
            return [(d.t, d.state, d.cap, d.reason) for d in self._history]

    @property
    def last_decision(self) -> Decision | None:
        """The most recent decision (None before the first update)."""
        return self._decision

    def status(self, last: int = 20) -> dict[str, Any]:
        """A snapshot for the API, TUI, ``mlotspark info`` and the bench.

        Args:
            last: how many recent decisions to include (default 20).

        Returns:
            state, cap, mode, effective_mode, reason, pause_s, limits, the last
            reading's known fields, probe errors and the recent decisions.
        """
        with self._lock:
            d, now, tp = self._decision, self._clock(), self.throughput
            recent = list(self._history)[-last:] if last > 0 else []
            return {
                "state": STATES[self._level],
                "cap": self._cap,
                "mode": self.mode,
                "effective_mode": self._eff_mode,
                "reason": d.reason if d else "no update yet",
                "pause_s": max(0.0, self._pause_until - now),
                "max_batch": self.max_batch,
                "min_batch": self.min_batch,
                "mode_max": self.mode_max(self._eff_mode),
                "memory_limit_bytes": self.memory_limit_bytes,
                "blas_threads": self._threads,
                "reading": self._reading.summary(),
                "throughput": tp.history() if tp is not None else {},
                "probe_errors": list(self._probe_errors),
                "updated_at": d.t if d else None,
                "history": [{"t": h.t, "state": h.state, "cap": h.cap, "reason": h.reason}
                            for h in recent],
            }

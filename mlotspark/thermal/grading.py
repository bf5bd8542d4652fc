"""Grading a reading: which signal puts the machine in which state.

States (the names macOS uses) from signals; the worst signal wins:

| signal | fair | serious | critical | leaving a state needs |
|---|---|---|---|---|
| temperature_c (hottest CPU sensor) | ≥ 70 °C | ≥ 80 °C | ≥ 90 °C | 3 °C below |
| speed_limit (pmset CPU_Speed_Limit) | < 100 % | ≤ 80 % | ≤ 50 % | the limit lifted |
| thermal_pressure (macOS notify) | moderate | heavy | trapping, sleeping | the level dropped |
| thermal_warning (pmset) | other > 0 | 5 or 100 | 10 or 110 | the level dropped |
| throttle_evidence (throughput) | ≥ 0.2 | ≥ 0.5 | ≥ 0.9 | 0.1 below the threshold |
| memory_pressure (psutil; not on macOS) | ≥ 93 % | ≥ 97 % | — | 2 points below |
| memory_pressure_level (macOS kernel) | warn | critical | — | the level dropped |
| swap_used_ratio (not on macOS) | ≥ 80 % while memory ≥ 85 % | — | — | |

CPU load and frequency are shown but not graded: both follow our own work and
power-saving policy more than heat. Swap alone is not graded either, because
macOS keeps swap files mostly full in normal use.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mlotspark.thermal.probes import Reading

__all__ = ["STATES", "NOMINAL", "FAIR", "SERIOUS", "CRITICAL", "Thresholds"]

STATES = ("nominal", "fair", "serious", "critical")
NOMINAL, FAIR, SERIOUS, CRITICAL = range(4)
_PRESSURE_NAMES = ("nominal", "moderate", "heavy", "trapping", "sleeping")


def _grade(
    value: float, cuts: Sequence[float | None], higher_is_worse: bool = True
) -> tuple[int, float | None]:
    level, hit = NOMINAL, None
    for i, cut in enumerate(cuts, start=1):
        if cut is not None and (value >= cut if higher_is_worse else value <= cut):
            level, hit = i, cut
    return level, hit


def _warning_level(w: int) -> int:
    # IOKit: 0 normal, 5 / 100 danger or warning, 10 / 110 crisis or critical.
    if w <= 0 or w in (5, 100):
        return NOMINAL if w <= 0 else SERIOUS
    return CRITICAL if w >= 10 else FAIR


@dataclass(frozen=True)
class Thresholds:
    """Where each signal crosses into fair / serious / critical (None: never).

    The ``*_hysteresis`` margins apply only when leaving a state, so a reading that
    hovers at a threshold does not make the cap flap.
    """

    temperature_c: tuple[float | None, float | None, float | None] = (70.0, 80.0, 90.0)
    temperature_hysteresis: float = 3.0
    speed_limit: tuple[float | None, float | None, float | None] = (99.0, 80.0, 50.0)
    throttle_evidence: tuple[float | None, float | None, float | None] = (0.2, 0.5, 0.9)
    evidence_hysteresis: float = 0.1
    memory_pressure: tuple[float | None, float | None, float | None] = (0.93, 0.97, None)
    memory_hysteresis: float = 0.02
    swap_used_ratio: float = 0.80
    swap_with_memory: float = 0.85

    def assess(self, r: Reading, relax: bool = False) -> tuple[int, str]:
        """Grade a reading.

        Args:
            r: the merged reading.
            relax: lower the thresholds by their hysteresis margins (used when cooling).

        Returns:
            (level 0..3, a short phrase naming the worst signal and its threshold).
        """
        found: list[tuple[int, str]] = []

        def graded(value: float | None, cuts: Sequence[float | None], margin: float,
                   text: Callable[[float], str]) -> None:
            if value is not None:
                m = margin if relax else 0.0
                lvl, cut = _grade(value, [None if c is None else c - m for c in cuts])
                if lvl:
                    found.append((lvl, text(cut)))

        graded(r.temperature_c, self.temperature_c, self.temperature_hysteresis,
               lambda c: f"temperature {r.temperature_c:.0f}°C ≥ {c:g}")
        if r.speed_limit is not None:
            lvl, cut = _grade(r.speed_limit, self.speed_limit, higher_is_worse=False)
            if lvl:
                found.append((lvl, f"CPU speed limited to {r.speed_limit:g}% (≤ {cut:g})"))
        if r.thermal_pressure is not None and r.thermal_pressure > 0:
            p = r.thermal_pressure
            name = _PRESSURE_NAMES[p] if p < len(_PRESSURE_NAMES) else str(p)
            found.append((min(p, CRITICAL), f"thermal pressure {name}"))
        if r.thermal_warning is not None and _warning_level(r.thermal_warning):
            w = r.thermal_warning
            found.append((_warning_level(w), f"thermal warning level {w}"))
        graded(r.throttle_evidence, self.throttle_evidence, self.evidence_hysteresis,
               lambda c: f"throughput down at equal batch size "
                         f"(evidence {r.throttle_evidence:.2f} ≥ {c:g})")
        graded(r.memory_pressure, self.memory_pressure, self.memory_hysteresis,
               lambda c: f"memory {r.memory_pressure:.0%} used ≥ {c:.0%}")
        if r.memory_pressure_level:
            name = ("warn", "critical")[min(r.memory_pressure_level, 2) - 1]
            found.append((min(r.memory_pressure_level, 2), f"kernel memory pressure {name}"))
        swap, mem = r.swap_used_ratio, r.memory_pressure
        if (swap is not None and mem is not None
                and swap >= self.swap_used_ratio and mem >= self.swap_with_memory):
            found.append((FAIR, f"swap {swap:.0%} used with memory {mem:.0%} used"))
        if found:
            return max(found, key=lambda f: f[0])  # max keeps the first of the worst
        return NOMINAL, _calm_phrase(r)


def _calm_phrase(r: Reading) -> str:
    parts = [
        (r.temperature_c, "{:.0f}°C"),
        (r.speed_limit, "speed limit {:g}%"),
        (r.throttle_evidence, "throughput steady ({:.2f})"),
        (r.memory_pressure, "memory {:.0%} used"),
        (None if r.memory_pressure_level is None else "normal", "kernel memory pressure {}"),
    ]
    known = [fmt.format(v) for v, fmt in parts if v is not None]
    return "calm (" + (", ".join(known) or "no sensor reports here") + ")"


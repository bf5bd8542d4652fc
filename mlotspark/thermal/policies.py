"""How each governor mode reacts: the table the state machine reads.

| mode | cap ≤ | halves on | grows in | critical pause | serious pause | +1 every |
|---|---|---|---|---|---|---|
| performance | max_batch | serious | nominal, fair | 1 s | — | 2 s |
| balanced | max_batch | fair | nominal | 2 s | — | 5 s |
| efficiency | max(1, max_batch // 4) | fair | nominal | 4 s | 1 s | 10 s |

``auto`` is balanced on AC power and efficiency on battery or in macOS Low Power
Mode; an explicit mode is kept on battery.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlotspark.thermal.grading import FAIR, NOMINAL, SERIOUS

__all__ = ["MODES", "ModePolicy", "POLICIES"]

MODES = ("performance", "balanced", "efficiency", "auto")


@dataclass(frozen=True)
class ModePolicy:
    """How one mode reacts; see the module docstring's table."""

    cap_divisor: int  # mode max = max(1, max_batch // cap_divisor)
    decrease_from: int  # lowest state whose arrival halves the cap
    calm_upto: int  # highest state in which the cap may grow
    pause_s: float  # cool-down pause in critical
    serious_pause_s: float  # pause in serious (0: none)
    work_s: float  # decoding allowed between two pauses
    increase_s: float  # at most one +1 per this many seconds
    repeat_decrease_s: float  # halve again while serious or worse this long


# Positional fields: cap_divisor, decrease_from, calm_upto, pause_s, serious_pause_s,
# work_s, increase_s, repeat_decrease_s.
POLICIES: dict[str, ModePolicy] = {
    "performance": ModePolicy(1, SERIOUS, FAIR, 1.0, 0.0, 4.0, 2.0, 30.0),
    "balanced": ModePolicy(1, FAIR, NOMINAL, 2.0, 0.0, 3.0, 5.0, 15.0),
    "efficiency": ModePolicy(4, FAIR, NOMINAL, 4.0, 1.0, 2.0, 10.0, 10.0),
}

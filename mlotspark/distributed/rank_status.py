"""Each rank's figures, and rank 0's governor reading the other ranks' probes.

Every rank reads its own probes (psutil, pmset ... or the scripted ones a test gives
its ``governor``) into ``RankStatus.read()``; the rows travel to rank 0 in the gathers
of the step protocol (``leader.py``): at the end of each request and about once a second
while requests run. ``RemoteProbe`` hands the other ranks' last readings to rank 0's
thermal governor, merged field by field keeping the worse value, so the hottest machine
sets the batch cap: every token crosses every rank, so the slowest one paces them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psutil

from mlotspark.platform.device import peak_memory_mb
from mlotspark.thermal.governor import STATES, Thresholds
from mlotspark.thermal.probes import Probe, Reading, default_probes
from mlotspark.distributed.group import RankGroup, host_name

#: ``Thresholds.assess`` levels by name, coolest first.
THERMAL_STATES = STATES


class RankStatus:
    """This rank's figures for ``mlotspark info --distributed``, the TUI and rank 0's governor.

    Args:
        group: the rank group.
        layers: this rank's ``(start, end)`` layer range.
        weights_bytes: this rank's resident weight bytes.
        probes: what this rank reads its heat from (default: the platform's probes).
    """

    def __init__(self, group: RankGroup, layers: tuple[int, int], weights_bytes: int,
                 probes: Sequence[Probe] | None = None):
        self.group, self.layers, self.weights_bytes = group, layers, weights_bytes
        self.probes = list(default_probes() if probes is None else probes)
        self.last_step_ms: float | None = None

    def read(self) -> dict:
        """Rank, host, layers, weight bytes, memory, thermal state (with the reading it
        comes from), last step time. JSON-safe."""
        reading = Reading.combine(_read(p) for p in self.probes)
        level, why = Thresholds().assess(reading)
        vm = psutil.virtual_memory()
        return {
            "rank": self.group.rank, "host": host_name(), "layers": list(self.layers),
            "weights_mb": round(self.weights_bytes / 1e6, 1),
            "rss_mb": round(psutil.Process().memory_info().rss / 1e6, 1),
            "peak_mlx_mb": round(peak_memory_mb(), 1),
            "available_mb": round(vm.available / 1e6, 1),
            "thermal": THERMAL_STATES[level], "thermal_reason": why,
            "reading": reading.summary(),
            "last_step_ms": self.last_step_ms,
        }


def _read(probe: Probe) -> Reading:
    try:
        return probe.read()
    except Exception:  # noqa: BLE001  a broken probe must not stop a rank (as in the governor)
        return Reading()


class RemoteProbe:
    """Rank 0's probe of the other ranks: their last reported readings, merged.

    Args:
        rows: returns the latest ``RankStatus.read()`` rows, rank 0 first (or []).
    """

    def __init__(self, rows: Any):
        self.rows = rows

    def read(self) -> Reading:
        """The worse of the other ranks' readings, field by field (empty before any report)."""
        readings = []
        for row in list(self.rows())[1:]:
            known = {k: v for k, v in (row.get("reading") or {}).items() if k in Reading.__dataclass_fields__}
            readings.append(Reading(**known))
        return Reading.combine(readings)


def hottest(ranks: list[dict]) -> tuple[str, str]:
    """The hottest rank's state and a reason naming it: ``hottest: rank 1 (mac2) critical: …``."""
    top = max(ranks, key=lambda r: THERMAL_STATES.index(r.get("thermal", "nominal")))
    reason = f"hottest: rank {top['rank']} ({top['host']}) {top['thermal']}"
    if top.get("thermal_reason"):
        reason += f": {top['thermal_reason']}"
    return top["thermal"], reason

"""One snapshot of the machine's signals (``Reading``) and the ``Probe`` protocol.

A probe returns a :class:`Reading` in which the fields it does not know stay
``None``; ``Reading.merge`` combines several readings into one, keeping the worse
value where two probes report the same field. This module never imports mlx.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any, Protocol

__all__ = ["Probe", "Reading", "clamp01"]


@dataclass
class Reading:
    """One snapshot of the machine's signals; ``None`` means "this probe cannot tell".

    Attributes:
        cpu_load: system-wide CPU utilisation, 0..1.
        cpu_freq_ratio: current / maximum CPU frequency, 0..1.
        temperature_c: hottest CPU sensor in °C.
        on_battery: True when running from the battery (power unplugged).
        battery_percent: battery charge, 0..100.
        memory_pressure: fraction of RAM not available to new allocations, 0..1.
        memory_available_bytes: RAM available to new allocations, in bytes.
        swap_used_ratio: fraction of swap in use, 0..1 (0 when there is no swap).
        speed_limit: macOS ``CPU_Speed_Limit`` in percent; 100 means not limited.
        thermal_warning: macOS thermal warning level (0 normal, 5/100 danger, 10/110 crisis).
        thermal_pressure: macOS thermal pressure level (0 nominal, 1 moderate, 2 heavy,
            3 trapping, 4 sleeping).
        throttle_evidence: 0..1, how strongly throughput at equal batch size has dropped.
        memory_pressure_level: macOS kernel memory pressure (0 normal, 1 warn, 2 critical;
            ``kern.memorystatus_vm_pressure_level``); None elsewhere.
        low_power_mode: macOS Low Power Mode is on (``pmset -g`` ``lowpowermode 1``).
        cpu_others: CPU cores kept busy by other processes (system-wide busy time less
            this process's, per second of wall time), 0..cores.
    """

    cpu_load: float | None = None
    cpu_freq_ratio: float | None = None
    temperature_c: float | None = None
    on_battery: bool | None = None
    battery_percent: float | None = None
    memory_pressure: float | None = None
    memory_available_bytes: int | None = None
    swap_used_ratio: float | None = None
    speed_limit: float | None = None
    thermal_warning: int | None = None
    thermal_pressure: int | None = None
    throttle_evidence: float | None = None
    memory_pressure_level: int | None = None
    low_power_mode: bool | None = None
    cpu_others: float | None = None

    def merge(self, other: Reading) -> Reading:
        """Combine two readings field by field, keeping the worse of two known values.

        Args:
            other: another probe's reading.

        Returns:
            A new Reading; a field known to only one side takes that side's value.
        """
        merged = {}
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            merged[f.name] = a if b is None else b if a is None else _WORSE[f.name](a, b)
        return Reading(**merged)

    @classmethod
    def combine(cls, readings: Iterable[Reading]) -> Reading:
        """Merge any number of readings (an empty Reading when there are none)."""
        out = cls()
        for r in readings:
            out = out.merge(r)
        return out

    def summary(self) -> dict[str, Any]:
        """The known fields as a plain dict (for status pages and logs)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v for k, v in values.items() if v is not None}


# Which of two known values is "worse" for the machine: conservative on purpose, so a
# second probe can only make the governor more careful, never less.
_WORSE: dict[str, Callable[[Any, Any], Any]] = {
    "cpu_load": max,
    "cpu_freq_ratio": min,
    "temperature_c": max,
    "on_battery": lambda a, b: bool(a or b),
    "battery_percent": min,
    "memory_pressure": max,
    "memory_available_bytes": min,
    "swap_used_ratio": max,
    "speed_limit": min,
    "thermal_warning": max,
    "thermal_pressure": max,
    "throttle_evidence": max,
    "memory_pressure_level": max,
    "low_power_mode": lambda a, b: bool(a or b),
    "cpu_others": max,
}


class Probe(Protocol):
    """Anything with ``read() -> Reading``."""

    def read(self) -> Reading: ...


def clamp01(x: float) -> float:
    return min(1.0, max(0.0, float(x)))


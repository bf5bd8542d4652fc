"""Signal sources for the thermal governor: each probe has one method, ``read()``.

A probe returns a :class:`Reading` in which the fields it does not know stay
``None``; ``Reading.merge`` combines several readings into one, keeping the worse
value where two probes report the same field. Probes never raise for a missing
sensor: a machine without a battery or temperature sensors yields ``None`` fields.

| probe | platform | fields |
|---|---|---|
| :class:`PsutilProbe` | any (no memory or swap on macOS) | cpu_load, cpu_freq_ratio, temperature_c, on_battery, |
| | | battery_percent, memory_*, swap_used_ratio |
| :class:`PmsetProbe` (``macos``) | macOS (``pmset -g therm``) | speed_limit, thermal_warning |
| :class:`ThermalPressureProbe` (``macos``) | macOS (notify(3)) | thermal_pressure |
| :class:`MemoryPressureProbe` (``macos``) | macOS (sysctl) | memory_pressure_level |
| :class:`LowPowerProbe` (``macos``) | macOS (``pmset -g``) | low_power_mode |
| :class:`ThroughputProbe` (``throughput``) | any (fed by the engine) | throttle_evidence |
| :class:`ScriptedProbe` | tests and benchmarks | whatever the script says |

This module never imports mlx.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from typing import Any

from mlotspark.thermal.macos import (
    BackgroundProbe,
    LowPowerProbe,
    MemoryPressureProbe,
    PmsetProbe,
    ThermalPressureProbe,
    parse_pmset_lowpower,
    parse_pmset_therm,
)
from mlotspark.thermal.reading import Probe, Reading, clamp01
from mlotspark.thermal.throughput import ThroughputProbe

__all__ = [
    "Probe",
    "Reading",
    "PsutilProbe",
    "PmsetProbe",
    "ThermalPressureProbe",
    "ThroughputProbe",
    "ScriptedProbe",
    "parse_pmset_therm",
    "parse_pmset_lowpower",
    "BackgroundProbe",
    "LowPowerProbe",
    "MemoryPressureProbe",
    "default_probes",
]


#: The shortest window ``cpu_others`` is measured over (a shorter one is mostly noise).
OTHERS_WINDOW_S = 0.2

# Sensor chips that measure the CPU/SoC; other chips (NVMe, Wi-Fi, GPU) run hot on
# their own and would make the governor back off for the wrong reason.
_CPU_CHIP_HINTS = ("coretemp", "k10temp", "zenpower", "cpu", "soc", "pkg", "acpitz")


class PsutilProbe:
    """CPU, temperature, battery, memory and swap signals from psutil.

    Every psutil call is guarded: a call that is missing on this platform or fails
    leaves its fields ``None``.

    On macOS the memory ratio, available bytes and swap are left out: psutil's
    "available" there is ``inactive + free`` (wired, compressed and cached pages count
    as used) and macOS keeps its dynamic swap near full, so both say "full" on a
    healthy Mac; :class:`MemoryPressureProbe` reads the kernel's level instead.

    Args:
        psutil_module: the psutil module to use (default: ``import psutil``); tests
            pass a stand-in to simulate machines without sensors.
        platform: ``sys.platform`` by default.
    """

    def __init__(self, psutil_module: Any = None, platform: str | None = None) -> None:
        self._darwin = (platform or sys.platform) == "darwin"
        if psutil_module is None:
            try:
                import psutil as psutil_module
            except ImportError:  # psutil is a dependency, but a probe must not crash
                psutil_module = None
        self._ps = psutil_module
        # cpu_percent(interval=None) compares with the previous call; the first call
        # returns a meaningless 0.0, so prime it here.
        self._call("cpu_percent", interval=None)
        self._busy = self._busy_seconds()  # (wall, system busy, this process) for cpu_others
        self._measured = False  # no cpu_others figure yet: the first one waits out its window

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self._ps, name, None)  # sensors_* are absent on some platforms
        if fn is None:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception:  # noqa: BLE001  a sensor that fails is a sensor we do not have
            return None

    def read(self) -> Reading:
        """Read psutil's view of the machine now (never raises; blocks only once, for at
        most ``OTHERS_WINDOW_S``, off macOS: see ``_others``).

        Returns:
            A Reading with the fields psutil can report on this machine.
        """
        r = Reading()
        load = self._call("cpu_percent", interval=None)
        if isinstance(load, (int, float)):
            r.cpu_load = clamp01(load / 100.0)
        r.cpu_others = self._others()
        freq = self._call("cpu_freq")
        try:
            if freq is not None and freq.max and freq.max > 0 and freq.current:
                r.cpu_freq_ratio = clamp01(freq.current / freq.max)
        except (AttributeError, TypeError):
            pass
        r.temperature_c = self._temperature()
        batt = self._call("sensors_battery")
        if batt is not None:
            plugged = getattr(batt, "power_plugged", None)
            r.on_battery = None if plugged is None else not plugged
            pct = getattr(batt, "percent", None)
            r.battery_percent = float(pct) if isinstance(pct, (int, float)) else None
        if self._darwin:
            return r
        vm = self._call("virtual_memory")
        try:
            if vm is not None and vm.total > 0:
                r.memory_pressure = clamp01((vm.total - vm.available) / vm.total)
                r.memory_available_bytes = int(vm.available)
        except (AttributeError, TypeError):
            pass
        sw = self._call("swap_memory")
        try:
            if sw is not None:
                r.swap_used_ratio = clamp01(sw.used / sw.total) if sw.total > 0 else 0.0
        except (AttributeError, TypeError):
            pass
        return r

    def _busy_seconds(self) -> tuple[float, float, float] | None:
        """(monotonic now, CPU seconds busy system-wide, CPU seconds of this process)."""
        sys_t = self._call("cpu_times")
        proc = self._call("Process")
        try:
            own = proc.cpu_times() if proc is not None else None
            busy = sum(getattr(sys_t, k, 0.0) or 0.0 for k in ("user", "nice", "system", "irq", "softirq", "steal"))
            return time.monotonic(), float(busy), float(own.user + own.system)
        except Exception:  # noqa: BLE001  no such reading on this platform
            return None

    def _others(self) -> float | None:
        """Cores other processes kept busy since the last reading (None after less than
        ``OTHERS_WINDOW_S``: too short a window to tell).

        Off macOS (where BLAS is Accelerate's, no threads to fit) the first figure waits out
        its window (at most ``OTHERS_WINDOW_S``, once): the engine's first request reads the
        probe right after it was made, and without a figure its first prefill chunk ran at
        OpenBLAS's default threads; beside a busy core that took 269 s for 2,422 tokens
        instead of 13 s (two cores, a long prompt).
        """
        now = self._busy_seconds()
        if not self._measured and not self._darwin and now is not None and self._busy is not None:
            short = OTHERS_WINDOW_S - (now[0] - self._busy[0])
            if short > 0:
                time.sleep(short)  # this process idle meanwhile: what is busy is others
                now = self._busy_seconds()
        last, self._busy = self._busy, (now if now is not None else self._busy)
        if now is None or last is None or now[0] - last[0] < OTHERS_WINDOW_S:
            if now is not None and last is not None:
                self._busy = last  # keep the older start: the window grows to OTHERS_WINDOW_S
            return None
        wall = now[0] - last[0]
        self._measured = True
        return max(0.0, ((now[1] - last[1]) - (now[2] - last[2])) / wall)

    def _temperature(self) -> float | None:
        temps = self._call("sensors_temperatures")
        if not isinstance(temps, dict):
            return None
        best: float | None = None
        for chip, entries in temps.items():
            if not any(h in str(chip).lower() for h in _CPU_CHIP_HINTS):
                continue
            for e in entries or ():
                t = getattr(e, "current", None)
                # Some drivers report 0 or absurd values for absent sensors.
                if isinstance(t, (int, float)) and 0.0 < t < 150.0:
                    best = t if best is None else max(best, float(t))
        return best


class ScriptedProbe:
    """Returns a scripted sequence of readings, then keeps repeating the last one.

    Args:
        readings: Readings, or dicts of Reading fields.
    """

    def __init__(self, readings: Iterable[Reading | dict[str, Any]]) -> None:
        self.readings = [r if isinstance(r, Reading) else Reading(**r) for r in readings]
        self.calls = 0

    def read(self) -> Reading:
        """Return the next scripted reading (the last one once the script runs out)."""
        if not self.readings:
            return Reading()
        r = self.readings[min(self.calls, len(self.readings) - 1)]
        self.calls += 1
        return r


def default_probes(throughput: ThroughputProbe | None = None, platform: str | None = None,
                   machine: str | None = None) -> list[Probe]:
    """The probes the engine uses on this platform.

    Args:
        throughput: the ThroughputProbe the engine records into (a new one by default).
        platform: ``sys.platform`` by default.
        machine: ``platform.machine()`` by default (``arm64``: no ``pmset -g therm``).

    Returns:
        psutil and throughput everywhere; on macOS also the notify thermal pressure
        (the primary signal there), the kernel memory pressure, Low Power Mode and, on
        Intel Macs, ``pmset -g therm``, the last three read on their own threads.
    """
    plat = platform or sys.platform
    probes: list[Probe] = [PsutilProbe(platform=plat), throughput or ThroughputProbe()]
    if plat == "darwin":
        probes += [ThermalPressureProbe(platform=plat), BackgroundProbe(MemoryPressureProbe(), 1.0),
                   BackgroundProbe(LowPowerProbe(platform=plat), 10.0)]
        pmset = PmsetProbe(platform=plat, machine=machine, interval_s=0.0)
        if pmset.enabled:  # Intel Macs only: Apple Silicon's pmset says nothing here
            probes.append(BackgroundProbe(pmset, 5.0))
    return probes

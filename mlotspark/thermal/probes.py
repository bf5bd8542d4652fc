"""Signal sources for the thermal governor: each probe has one method, ``read()``.

A probe returns a :class:`Reading` in which the fields it does not know stay
``None``; ``Reading.merge`` combines several readings into one, keeping the worse
value where two probes report the same field. Probes never raise for a missing
sensor: a machine without a battery or temperature sensors yields ``None`` fields.

| probe | platform | fields |
|---|---|---|
| :class:`PsutilProbe` | any | cpu_load, cpu_freq_ratio, temperature_c, on_battery, |
| | | battery_percent, memory_*, swap_used_ratio |
| :class:`PmsetProbe` | macOS (``pmset -g therm``) | speed_limit, thermal_warning |
| :class:`ThermalPressureProbe` | macOS (notify(3)) | thermal_pressure |
| :class:`ThroughputProbe` | any (fed by the engine) | throttle_evidence |
| :class:`ScriptedProbe` | tests and benchmarks | whatever the script says |

This module never imports mlx.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any, Protocol

__all__ = [
    "Probe",
    "Reading",
    "PsutilProbe",
    "PmsetProbe",
    "ThermalPressureProbe",
    "ThroughputProbe",
    "ScriptedProbe",
    "parse_pmset_therm",
    "default_probes",
]


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
}


class Probe(Protocol):
    """Anything with ``read() -> Reading``."""

    def read(self) -> Reading: ...


def _clamp01(x: float) -> float:
    return min(1.0, max(0.0, float(x)))


# Sensor chips that measure the CPU/SoC; other chips (NVMe, Wi-Fi, GPU) run hot on
# their own and would make the governor back off for the wrong reason.
_CPU_CHIP_HINTS = ("coretemp", "k10temp", "zenpower", "cpu", "soc", "pkg", "acpitz")


class PsutilProbe:
    """CPU, temperature, battery, memory and swap signals from psutil.

    Every psutil call is guarded: a call that is missing on this platform or fails
    leaves its fields ``None``.

    Args:
        psutil_module: the psutil module to use (default: ``import psutil``); tests
            pass a stand-in to simulate machines without sensors.
    """

    def __init__(self, psutil_module: Any = None) -> None:
        if psutil_module is None:
            try:
                import psutil as psutil_module
            except ImportError:  # psutil is a dependency, but a probe must not crash
                psutil_module = None
        self._ps = psutil_module
        # cpu_percent(interval=None) compares with the previous call; the first call
        # returns a meaningless 0.0, so prime it here.
        self._call("cpu_percent", interval=None)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self._ps, name, None)  # sensors_* are absent on some platforms
        if fn is None:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception:  # noqa: BLE001  a sensor that fails is a sensor we do not have
            return None

    def read(self) -> Reading:
        """Read psutil's view of the machine now (never blocks, never raises).

        Returns:
            A Reading with the fields psutil can report on this machine.
        """
        r = Reading()
        load = self._call("cpu_percent", interval=None)
        if isinstance(load, (int, float)):
            r.cpu_load = _clamp01(load / 100.0)
        freq = self._call("cpu_freq")
        try:
            if freq is not None and freq.max and freq.max > 0 and freq.current:
                r.cpu_freq_ratio = _clamp01(freq.current / freq.max)
        except (AttributeError, TypeError):
            pass
        r.temperature_c = self._temperature()
        batt = self._call("sensors_battery")
        if batt is not None:
            plugged = getattr(batt, "power_plugged", None)
            r.on_battery = None if plugged is None else not plugged
            pct = getattr(batt, "percent", None)
            r.battery_percent = float(pct) if isinstance(pct, (int, float)) else None
        vm = self._call("virtual_memory")
        try:
            if vm is not None and vm.total > 0:
                r.memory_pressure = _clamp01((vm.total - vm.available) / vm.total)
                r.memory_available_bytes = int(vm.available)
        except (AttributeError, TypeError):
            pass
        sw = self._call("swap_memory")
        try:
            if sw is not None:
                r.swap_used_ratio = _clamp01(sw.used / sw.total) if sw.total > 0 else 0.0
        except (AttributeError, TypeError):
            pass
        return r

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


_SPEED_LIMIT_RE = re.compile(r"CPU_Speed_Limit\s*=\s*(\d+(?:\.\d+)?)")
_WARNING_LEVEL_RE = re.compile(r"thermal[ _]*(?:warning[ _]*)?level\s*[:=]\s*(\d+)", re.IGNORECASE)


def parse_pmset_therm(text: str) -> Reading:
    """Parse the output of ``pmset -g therm``.

    Args:
        text: the command's stdout. The ``CPU Power notify`` block carries
            ``CPU_Speed_Limit = N``; when several blocks are present the last one is
            the current state. Apple Silicon often prints only
            ``Note: No thermal warning level has been recorded``.

    Returns:
        A Reading with ``speed_limit`` (None when no limit line is present) and
        ``thermal_warning`` (0 when the output says none has been recorded).
    """
    r = Reading()
    limits = _SPEED_LIMIT_RE.findall(text)
    if limits:
        r.speed_limit = float(limits[-1])
    levels = _WARNING_LEVEL_RE.findall(text)
    if levels:
        r.thermal_warning = int(levels[-1])
    elif re.search(r"no thermal warning level has been recorded", text, re.IGNORECASE):
        r.thermal_warning = 0
    return r


class PmsetProbe:
    """macOS CPU speed limit and thermal warning level from ``pmset -g therm``.

    Elsewhere (or when pmset is missing, slow or fails) it returns an empty Reading.

    Args:
        timeout_s: how long pmset may take before its reading is given up.
        interval_s: reuse the last result for this long; pmset is a subprocess and the
            limit changes slowly.
        runner: returns pmset's stdout (default: run the real command); tests inject it.
        platform: ``sys.platform`` by default.
        clock: monotonic seconds, injectable for tests.
    """

    def __init__(
        self,
        timeout_s: float = 2.0,
        interval_s: float = 5.0,
        runner: Callable[[], str] | None = None,
        platform: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self._runner = runner or self._run_pmset
        self._enabled = (platform or sys.platform) == "darwin"
        self._clock = clock
        self._last: tuple[float, Reading] | None = None

    def _run_pmset(self) -> str:
        out = subprocess.run(
            ["pmset", "-g", "therm"], capture_output=True, text=True, timeout=self.timeout_s
        )
        return out.stdout if out.returncode == 0 else ""

    def read(self) -> Reading:
        """Return the parsed pmset reading (empty off macOS or on any failure)."""
        if not self._enabled:
            return Reading()
        now = self._clock()
        if self._last is not None and now - self._last[0] < self.interval_s:
            return self._last[1]
        try:
            reading = parse_pmset_therm(self._runner())
        except FileNotFoundError:
            self._enabled = False  # no pmset on this system: stop trying
            return Reading()
        except Exception:  # noqa: BLE001  timeout or odd output: no reading this time
            reading = Reading()
        self._last = (now, reading)
        return reading


# notify(3) key that carries macOS's thermal pressure (nominal..sleeping); on Apple
# Silicon this is the signal behind ProcessInfo.thermalState, where pmset is often silent.
_THERMAL_PRESSURE_KEY = b"com.apple.system.thermalpressurelevel"


class ThermalPressureProbe:
    """macOS thermal pressure level via libSystem's notify API (ctypes, no PyObjC).

    Returns an empty Reading off macOS or if the API is unavailable.

    Args:
        platform: ``sys.platform`` by default.
    """

    def __init__(self, platform: str | None = None) -> None:
        self._lib: Any = None
        self._token: Any = None
        if (platform or sys.platform) != "darwin":
            return
        try:
            import ctypes

            lib = ctypes.CDLL("/usr/lib/libSystem.B.dylib")
            lib.notify_register_check.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int)]
            lib.notify_register_check.restype = ctypes.c_uint32
            lib.notify_get_state.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
            lib.notify_get_state.restype = ctypes.c_uint32
            token = ctypes.c_int()
            if lib.notify_register_check(_THERMAL_PRESSURE_KEY, ctypes.byref(token)) == 0:
                self._lib, self._token = lib, token
        except Exception:  # noqa: BLE001  no notify API: this probe stays silent
            self._lib = None

    def read(self) -> Reading:
        """Return the current thermal pressure level (empty when unavailable)."""
        if self._lib is None:
            return Reading()
        try:
            import ctypes

            state = ctypes.c_uint64()
            if self._lib.notify_get_state(self._token, ctypes.byref(state)) != 0:
                return Reading()
            return Reading(thermal_pressure=int(state.value))
        except Exception:  # noqa: BLE001
            return Reading()


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
            return _clamp01((drop - self.tolerance) / (self.full_drop - self.tolerance))

    def history(self) -> dict[int, dict[str, float]]:
        """Per batch size: samples, current EWMA and best rate (for status pages)."""
        with self._lock:
            rates = sorted(self._rates.items())
            return {bs: {"n": h.n, "ewma": h.ewma, "best": h.best} for bs, h in rates}

    def read(self) -> Reading:
        """Return a Reading carrying only ``throttle_evidence``."""
        return Reading(throttle_evidence=self.evidence())


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


def default_probes(throughput: ThroughputProbe | None = None) -> list[Probe]:
    """The probes the engine uses on this platform.

    Args:
        throughput: the ThroughputProbe the engine records into (a new one by default).

    Returns:
        psutil and throughput everywhere; pmset and thermal pressure on macOS too.
    """
    probes: list[Probe] = [PsutilProbe(), throughput or ThroughputProbe()]
    if sys.platform == "darwin":
        probes += [PmsetProbe(), ThermalPressureProbe()]
    return probes

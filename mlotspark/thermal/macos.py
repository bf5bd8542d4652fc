"""macOS signal sources: notify(3) thermal pressure, ``pmset``, the kernel's memory pressure.

| probe | reads | how | on the engine thread? |
|---|---|---|---|
| :class:`ThermalPressureProbe` | thermal_pressure (the primary macOS signal) | notify(3), ctypes | yes: one call, no process |
| :class:`LowPowerProbe` | low_power_mode (``pmset -g``) | subprocess | no: wrap in ``BackgroundProbe`` |
| :class:`PmsetProbe` | speed_limit, thermal_warning (``pmset -g therm``) | subprocess, Intel only | no: ``BackgroundProbe`` |
| :class:`MemoryPressureProbe` | memory_pressure_level | sysctlbyname, cached | yes (ctypes; its subprocess fallback runs in ``BackgroundProbe``) |

On Apple Silicon ``pmset -g therm`` prints only "No thermal warning level has been
recorded" whatever the heat, so it is skipped there; ``ProcessInfo.thermalState``
reads the notify key used here. Every probe returns an empty Reading off macOS. A
subprocess forks a process holding gigabytes of Metal mappings: ``BackgroundProbe``
runs such probes on their own thread so the engine thread only reads a cached value.
This module never imports mlx.
"""

from __future__ import annotations

import platform as _platform
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from mlotspark.platform.memory import KernelPressure
from mlotspark.thermal.reading import Probe, Reading

__all__ = ["BackgroundProbe", "LowPowerProbe", "MemoryPressureProbe", "PmsetProbe", "ThermalPressureProbe",
           "parse_pmset_lowpower", "parse_pmset_therm"]

#: kern.memorystatus_vm_pressure_level (1 normal, 2 warn, 4 critical) -> Reading level 0..2.
_KERNEL_LEVELS = {1: 0, 2: 1, 4: 2}
_LOWPOWER_RE = re.compile(r"^\s*lowpowermode\s+(\d+)", re.IGNORECASE | re.MULTILINE)


def parse_pmset_lowpower(text: str) -> Reading:
    """Low Power Mode from the output of ``pmset -g`` (``lowpowermode 1`` when on).

    Returns:
        A Reading with ``low_power_mode`` (None when the line is absent: older macOS).
    """
    found = _LOWPOWER_RE.findall(text)
    return Reading(low_power_mode=bool(int(found[-1]))) if found else Reading()


def _run(args: list[str], timeout_s: float) -> str:
    out = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    return out.stdout if out.returncode == 0 else ""


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
        machine: ``platform.machine()`` by default; on ``arm64`` (Apple Silicon) the
            command says nothing, so the probe stays off.
    """

    def __init__(
        self,
        timeout_s: float = 2.0,
        interval_s: float = 5.0,
        runner: Callable[[], str] | None = None,
        platform: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        machine: str | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self._runner = runner or self._run_pmset
        arm = (machine or _platform.machine()) == "arm64"
        self._enabled = (platform or sys.platform) == "darwin" and not arm
        self._clock = clock
        self._last: tuple[float, Reading] | None = None

    @property
    def enabled(self) -> bool:
        """False off macOS, on Apple Silicon, and once pmset turned out to be missing."""
        return self._enabled

    def _run_pmset(self) -> str:
        return _run(["pmset", "-g", "therm"], self.timeout_s)

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
        lib: a stand-in for libSystem (tests); default the real one.
    """

    def __init__(self, platform: str | None = None, lib: Any = None) -> None:
        self._lib: Any = None
        self._token: Any = None
        if (platform or sys.platform) != "darwin":
            return
        try:
            import ctypes

            lib = lib if lib is not None else ctypes.CDLL("/usr/lib/libSystem.B.dylib")
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


class LowPowerProbe:
    """macOS Low Power Mode from ``pmset -g`` (``lowpowermode 1``): the auto mode then
    runs as efficiency, as on battery. Empty off macOS or when pmset fails.

    Args:
        runner: returns ``pmset -g``'s stdout (default: run it); tests pass a fixture.
        platform: ``sys.platform`` by default.
        timeout_s: how long pmset may take.
    """

    def __init__(self, runner: Callable[[], str] | None = None, platform: str | None = None,
                 timeout_s: float = 2.0) -> None:
        self._runner = runner or (lambda: _run(["pmset", "-g"], timeout_s))
        self._enabled = (platform or sys.platform) == "darwin"

    def read(self) -> Reading:
        """Return ``low_power_mode`` (empty off macOS or on any failure)."""
        if not self._enabled:
            return Reading()
        try:
            return parse_pmset_lowpower(self._runner())
        except FileNotFoundError:
            self._enabled = False
        except Exception:  # noqa: BLE001  a timeout: no reading this time
            pass
        return Reading()


class MemoryPressureProbe:
    """macOS's kernel memory-pressure level (``kern.memorystatus_vm_pressure_level``).

    Replaces psutil's ratio on macOS, where "available" leaves out wired, compressed and
    cached memory. Empty off macOS.

    Args:
        pressure: the cached kernel reader (default: a new ``KernelPressure``).
    """

    def __init__(self, pressure: KernelPressure | None = None) -> None:
        self.pressure = pressure or KernelPressure()

    def read(self) -> Reading:
        """Return ``memory_pressure_level`` 0 normal, 1 warn, 2 critical (empty when unknown)."""
        level, _free = self.pressure.read()
        if level is None:
            return Reading()
        return Reading(memory_pressure_level=_KERNEL_LEVELS.get(level, 2 if level > 4 else 0))


class BackgroundProbe:
    """Runs a slow probe on its own daemon thread; ``read()`` returns its last reading.

    So a subprocess (``pmset``) never runs on the engine thread, which holds the
    engine lock: the engine only copies a cached Reading.

    Args:
        inner: the probe to run.
        interval_s: seconds between two reads of ``inner`` (default 5).
        start: start the thread now (tests call :meth:`refresh` instead).
    """

    def __init__(self, inner: Probe, interval_s: float = 5.0, start: bool = True) -> None:
        self.inner, self.interval_s = inner, interval_s
        self._last = Reading()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.reader_threads: set[str] = set()  # names of the threads that ran ``inner`` (tests)
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name=f"mlotspark-probe-{type(inner).__name__}")
            self._thread.start()

    def refresh(self) -> Reading:
        """Read ``inner`` now, on the calling thread, and keep the result."""
        self.reader_threads.add(threading.current_thread().name)
        try:
            r = self.inner.read()
        except Exception:  # noqa: BLE001  a failing probe leaves the last reading
            return self._last
        with self._lock:
            self._last = r
        return r

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        """End the thread (it is a daemon: the process may also just exit)."""
        self._stop.set()

    def read(self) -> Reading:
        """The last reading ``inner`` gave (empty before its first)."""
        with self._lock:
            return self._last

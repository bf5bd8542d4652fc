"""macOS signal sources: ``pmset -g therm`` and the notify(3) thermal pressure level.

Both return an empty Reading off macOS. This module never imports mlx.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from mlotspark.thermal.reading import Reading

__all__ = ["PmsetProbe", "ThermalPressureProbe", "parse_pmset_therm"]


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


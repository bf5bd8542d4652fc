"""Which memory signal and which budget are in force: unified memory on a Mac, RAM elsewhere.

On macOS psutil's "available" is ``inactive + free``: the wired model, compressed
pages and file cache all count as used, and macOS keeps its dynamic swap near full,
so a ratio from psutil says "full" on a healthy 16 GB Mac. The kernel's own signal is
``kern.memorystatus_vm_pressure_level`` (what ``memory_pressure`` prints): 1 normal,
2 warn, 4 critical. It is read with ``sysctlbyname`` through ctypes (no process), with a
``sysctl -n`` subprocess as the fallback, and cached for ``ttl_s``.

Budgets (what KV may take):

| where | pool | KV budget | weights |
|---|---|---|---|
| a memory limit given | the limit | limit − weights | counted in the pool |
| Metal | ``max_recommended_working_set_size`` | working set − weights | counted in the pool |
| elsewhere | memory available now | half of it | already resident: not subtracted again |

This module never imports mlx at import time.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mlotspark.options import check_int

__all__ = ["PRESSURE_NAMES", "apply_memory_limit", "KernelPressure", "MemoryBudget", "memory_budget", "read_sysctl_int",
           "kernel_pressure", "metal_available", "metal_working_set"]

#: kern.memorystatus_vm_pressure_level values (dispatch's memory-pressure levels).
PRESSURE_NAMES = {1: "normal", 2: "warn", 4: "critical"}
PRESSURE_SYSCTL = "kern.memorystatus_vm_pressure_level"
FREE_SYSCTL = "kern.memorystatus_level"  # "System-wide memory free percentage" of memory_pressure
AVAILABLE_SHARE = 0.5  # off Metal, one request's KV may take this share of the memory available now
_LIBSYSTEM = "/usr/lib/libSystem.B.dylib"


def metal_available() -> bool:
    """Whether MLX runs on a Metal GPU (False on any error, and on Linux)."""
    try:
        import mlx.core as mx

        return bool(mx.metal.is_available())
    except Exception:  # noqa: BLE001  an mlx build without metal, or no device
        return False


def metal_working_set() -> int | None:
    """``max_recommended_working_set_size`` in bytes (None off Metal or when MLX cannot say)."""
    try:
        import mlx.core as mx

        # mx.device_info() replaced mx.metal.device_info() in newer MLX; accept both.
        getter = getattr(mx, "device_info", None) or mx.metal.device_info
        value = int(dict(getter()).get("max_recommended_working_set_size") or 0)
    except Exception:  # noqa: BLE001
        return None
    return value or None


def _sysctl_ctypes(name: str, lib: Any = None) -> int | None:
    import ctypes

    lib = lib or ctypes.CDLL(_LIBSYSTEM)
    value, size = ctypes.c_int64(0), ctypes.c_size_t(8)
    if lib.sysctlbyname(name.encode(), ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0)) != 0:
        return None
    raw = value.value
    return raw & 0xFFFFFFFF if size.value == 4 else raw  # a 4-byte int fills the low half


def _sysctl_subprocess(name: str) -> int | None:
    out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2.0)
    text = out.stdout.strip()
    return int(text) if out.returncode == 0 and text.lstrip("-").isdigit() else None


def read_sysctl_int(name: str, *, lib: Any = None,
                    runner: Callable[[str], int | None] | None = None) -> int | None:
    """An integer sysctl: ``sysctlbyname`` through ctypes, else ``sysctl -n`` (macOS only).

    Args:
        name: e.g. ``kern.memorystatus_vm_pressure_level``.
        lib: a stand-in for libSystem (tests); default the real one.
        runner: the subprocess fallback (tests); default ``sysctl -n``.

    Returns:
        The value, or None when neither way can read it.
    """
    try:
        got = _sysctl_ctypes(name, lib)
        if got is not None:
            return got
    except Exception:  # noqa: BLE001  no libSystem (not a Mac) or no such symbol: try the command
        pass
    try:
        return (runner or _sysctl_subprocess)(name)
    except Exception:  # noqa: BLE001  no sysctl, a timeout: no reading
        return None


class KernelPressure:
    """macOS's memory-pressure level and free percentage, read cheaply and cached.

    Args:
        platform: ``sys.platform`` by default; anything but ``darwin`` reads nothing.
        reader: ``name -> int | None`` (default :func:`read_sysctl_int`); tests pass fixtures.
        ttl_s: a reading is reused for this long (default 1 s; the level changes slowly).
        clock: monotonic seconds.
    """

    def __init__(self, platform: str | None = None, reader: Callable[[str], int | None] | None = None,
                 ttl_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.enabled = (platform or sys.platform) == "darwin"
        self._reader = reader or read_sysctl_int
        self.ttl_s, self._clock = ttl_s, clock
        self._cache: tuple[float, int | None, int | None] | None = None
        self._lock = threading.Lock()

    def read(self) -> tuple[int | None, int | None]:
        """(pressure level 1/2/4, free percentage 0..100); (None, None) off macOS."""
        if not self.enabled:
            return None, None
        with self._lock:
            now = self._clock()
            if self._cache is None or now - self._cache[0] >= self.ttl_s:
                self._cache = (now, self._reader(PRESSURE_SYSCTL), self._reader(FREE_SYSCTL))
            return self._cache[1], self._cache[2]


_SHARED: KernelPressure | None = None


def kernel_pressure() -> KernelPressure:
    """The process's shared, cached reader (one sysctl per second at most)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = KernelPressure()
    return _SHARED


@dataclass(frozen=True)
class MemoryBudget:
    """Where KV memory comes from on this machine, and how much of it one request may take.

    Attributes:
        signal: the memory signal the governor reads (``kernel pressure level`` on
            macOS, ``psutil available memory`` elsewhere).
        source: what the pool is: ``memory limit``, ``Metal recommended working set`` or
            ``available memory``.
        pool_bytes: the pool's size.
        weights_bytes: the model's bytes.
        kv_bytes: what KV may take: pool − weights, or a share of available memory.
        admission_limit_bytes: what weights + projected KV must stay under (None: the
            system's available memory decides, request by request).
    """

    signal: str
    source: str
    pool_bytes: int
    weights_bytes: int
    kv_bytes: int
    admission_limit_bytes: int | None

    def describe(self) -> str:
        """One line for ``mlotspark info`` and the engine's status."""
        mb = 1 << 20
        how = (f"{self.source} {self.pool_bytes // mb} MB − weights {self.weights_bytes // mb} MB"
               if self.admission_limit_bytes is not None else
               f"{AVAILABLE_SHARE:g} × {self.source} {self.pool_bytes // mb} MB (weights already resident)")
        return f"KV budget {self.kv_bytes // mb} MB = {how}; memory signal: {self.signal}"


def memory_budget(weights_bytes: int = 0, limit_bytes: int | None = None, *, platform: str | None = None,
                  metal: bool | None = None, working_set: int | None = None,
                  available: int | None = None) -> MemoryBudget:
    """The budget in force (see the module table).

    Args:
        weights_bytes: the loaded model's bytes (0 before a model is loaded).
        limit_bytes: the user's memory limit, if any: it wins.
        platform: ``sys.platform`` by default (decides the signal).
        metal: whether MLX runs on Metal (default: ask MLX).
        working_set: ``max_recommended_working_set_size`` (default: ask MLX on Metal).
        available: memory available now (default: psutil).

    Returns:
        The MemoryBudget.
    """
    darwin = (platform or sys.platform) == "darwin"
    signal = (f"kernel pressure level ({PRESSURE_SYSCTL})" if darwin
              else "psutil available memory (ratio and bytes)")
    if limit_bytes:
        return MemoryBudget(signal, "memory limit", int(limit_bytes), weights_bytes,
                            max(int(limit_bytes) - weights_bytes, 0), int(limit_bytes))
    if metal is None:
        metal = metal_available()
    if metal and working_set is None:
        working_set = metal_working_set()
    if metal and working_set:
        return MemoryBudget(signal, "Metal recommended working set", int(working_set), weights_bytes,
                            max(int(working_set) - weights_bytes, 0), int(working_set))
    if available is None:
        import psutil

        available = int(psutil.virtual_memory().available)
    return MemoryBudget(signal, "available memory", int(available), weights_bytes,
                        int(available * AVAILABLE_SHARE), None)


def apply_memory_limit(limit_bytes: int) -> int | None:
    """Tell MLX's allocator to stay under a limit (``mx.set_memory_limit``).

    Args:
        limit_bytes: the limit in bytes (> 0).

    Returns:
        The previous limit, or None where MLX or the call is unavailable.
    """
    check_int("memory limit", limit_bytes, 1)
    try:
        import mlotspark  # noqa: F401  resolves OpenBLAS before mlx loads
        import mlx.core as mx

        # Top-level since MLX 0.2x; older releases had it under mx.metal.
        setter = getattr(mx, "set_memory_limit", None)
        setter = setter or getattr(getattr(mx, "metal", None), "set_memory_limit", None)
        if setter is None:
            return None
        return int(setter(limit_bytes))
    except Exception:  # noqa: BLE001  an allocator without limits is not an error here
        return None

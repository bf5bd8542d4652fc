"""What machine we run on: MLX device, BLAS, CPU, memory (for ``mlotspark info``).

Metal-only calls are guarded by ``mx.metal.is_available()`` (DESIGN §2): the same
code runs on the Linux CPU backend, where they are no-ops.
"""

from __future__ import annotations

import ctypes
import functools
import platform
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from mlotspark.platform import blas  # the package __init__ has already resolved BLAS before mlx
from mlotspark.platform.memory import kernel_pressure, memory_budget

import psutil  # noqa: E402

_MB = 1024 * 1024


def _mx() -> Any:
    # Imported on first use: ``mlotspark info`` and ``--help`` must start without MLX (~1 s).
    import mlx.core as mx

    return mx


def _guessed_device() -> str:
    """The device MLX would pick, said without importing MLX (for ``mlotspark info``)."""
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return "gpu (Metal)"
    cuda = any((d.metadata["Name"] or "").lower().startswith("mlx-cuda") for d in metadata.distributions())
    return "gpu (CUDA)" if cuda else "cpu"


def current_device() -> str:
    """``cpu``, ``gpu (Metal)``, ``gpu (CUDA)``: MLX's device when MLX is imported, else what
    it would pick, said without importing it (light commands such as ``info`` stay light)."""
    return _device_name() if "mlx.core" in sys.modules else _guessed_device()


def is_metal() -> bool:
    """Whether MLX can use a Metal GPU (False on Linux and on any error)."""
    try:
        return bool(_mx().metal.is_available())
    except Exception:  # an mlx build without the metal module, or no device
        return False


def _metal_info() -> dict[str, Any]:
    # mx.device_info() replaced mx.metal.device_info() in newer MLX; accept both.
    mx = _mx()
    getter = getattr(mx, "device_info", None) or mx.metal.device_info
    try:
        return dict(getter())
    except Exception:
        return {}


#: the buffer cache keeps this share of what is wired, within [CACHE_MIN, CACHE_MAX]: steps free
#: and reallocate buffers of the same shapes, so a slice covers a batch's temporaries and KV
#: growth; the rest of MLX's default (its whole memory limit) would sit idle in unified memory.
CACHE_SHARE, CACHE_MIN, CACHE_MAX = 1 / 8, 256 * _MB, 2048 * _MB


@dataclass
class MetalLimits:
    """The wired and cache limits an engine set, and what they were before (``restore``)."""

    wired_bytes: int
    cache_bytes: int
    previous_wired: int | None
    previous_cache: int | None

    def restore(self) -> None:
        """Put back the limits found before (at engine close); waits for queued work first,
        as mlx-lm does: the wired limit must not change under a running step."""
        mx = _mx()
        try:
            mx.synchronize()
        except Exception:  # noqa: BLE001  nothing to wait for on some builds
            pass
        if self.previous_wired is not None:
            mx.set_wired_limit(int(self.previous_wired))
        if self.previous_cache is not None:
            mx.set_cache_limit(int(self.previous_cache))


def configure_metal_limits(weights_bytes: int = 0, kv_bytes: int | None = None) -> MetalLimits | None:
    """Wire what the model and its KV need, and bound MLX's buffer cache (Metal only).

    Wired buffers are not paged out between requests, which keeps the first token fast
    after a pause; wiring the whole recommended working set (what this did before) keeps
    gigabytes from every other app for the engine's life. Like mlx-lm's ``wired_limit``,
    the previous limits come back with :meth:`MetalLimits.restore`.

    Args:
        weights_bytes: the model's bytes.
        kv_bytes: the most KV the engine may hold (None with no weights: the whole
            recommended working set, the old behaviour).

    Returns:
        The limits set, or None off Metal (where this does nothing).
    """
    if not is_metal():
        return None
    working_set = int(_metal_info().get("max_recommended_working_set_size") or 0)
    if not working_set:
        return None
    need = weights_bytes + (kv_bytes or 0)
    # MLX refuses a wired limit above the recommended working set.
    wired = working_set if need <= 0 else min(working_set, need)
    cache = int(min(max(wired * CACHE_SHARE, CACHE_MIN), CACHE_MAX))
    mx = _mx()
    previous_wired = mx.set_wired_limit(wired)
    previous_cache = mx.set_cache_limit(cache) if hasattr(mx, "set_cache_limit") else None
    return MetalLimits(wired, cache, previous_wired, previous_cache)


def release_idle_memory() -> None:
    """Give MLX's cached buffers back to the system (the engine or the server went idle): on a
    unified-memory Mac other apps get them; the next request reallocates what it needs. Then
    hand the C heap's free pages back too (``trim_heap``)."""
    try:
        _mx().clear_cache()
    except Exception:  # noqa: BLE001  an MLX without clear_cache: nothing is held back then
        pass
    trim_heap()


def trim_heap() -> bool:
    """Return the free pages of the C heap to the system: glibc's ``malloc_trim(0)``.

    glibc keeps what a burst of threads freed in its per-thread arenas: measured, three rounds
    of 64 concurrent streams left ``mlotspark serve``'s RSS -0.3% to +29% above its level
    before, once idle (five runs); trimmed, +0.3% to +1.1%. On macOS, musl or any libc
    without ``malloc_trim`` this does nothing. It walks every arena (1-10 ms), so call it
    when idle.

    Returns:
        True when memory was handed back (glibc said so).
    """
    fn = _malloc_trim()
    return bool(fn(0)) if fn is not None else False


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim`` in the libc this process runs with, or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def _device_name() -> str:
    mx = _mx()
    dev = mx.default_device()
    if dev.type == mx.gpu:
        if is_metal():
            return "gpu (Metal)"
        cuda = getattr(mx, "cuda", None)
        return "gpu (CUDA)" if cuda is not None and cuda.is_available() else "gpu"
    return "cpu"


def _cpu_name() -> str:
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True, text=True, timeout=5,
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    elif sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                for line in f:
                    if line.lower().startswith(("model name", "hardware")) and ":" in line:
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
    return platform.processor() or platform.machine() or "unknown"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def peak_memory_mb() -> float:
    """MLX's peak memory since the last reset, in MB (0 where MLX cannot say)."""
    try:
        return _mx().get_peak_memory() / 1e6
    except AttributeError:  # older MLX
        return 0.0


def device_info() -> dict[str, Any]:
    """Facts about this machine and install, for ``mlotspark info`` and bug reports.

    MLX is not imported for it: before a model is loaded, ``device`` and
    ``metal_available`` are what MLX would use, said from the platform and the install.

    Returns:
        A flat dict with ``device``, ``metal_available``, ``blas``, ``mlx_version``,
        ``mlx_lm_version``, ``python``, ``platform``, ``cpu``, ``cores_logical``,
        ``cores_physical``, ``memory_total_mb``, ``memory_available_mb``,
        ``memory_signal`` and ``kv_budget`` (which signal and budget are in force,
        ``platform.memory``); on Metal also ``gpu`` and ``gpu_working_set_mb``; on
        macOS ``memory_pressure`` (the kernel's level and free percentage).
    """
    vm = psutil.virtual_memory()
    loaded = "mlx.core" in sys.modules
    device = current_device()
    info: dict[str, Any] = {
        "device": device,
        "metal_available": is_metal() if loaded else device == "gpu (Metal)",
        "blas": blas.BLAS_IN_USE,
        "mlx_version": _version("mlx"),
        "mlx_lm_version": _version("mlx-lm"),  # metadata, not import: mlx_lm loads transformers
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cores_logical": psutil.cpu_count(logical=True) or 0,
        "cores_physical": psutil.cpu_count(logical=False) or 0,
        "memory_total_mb": vm.total // _MB,
        "memory_available_mb": vm.available // _MB,
    }
    if info["metal_available"]:
        metal = _metal_info()
        info["gpu"] = metal.get("device_name") or metal.get("architecture") or "Metal GPU"
        info["gpu_working_set_mb"] = int(metal.get("max_recommended_working_set_size", 0)) // _MB
    budget = memory_budget(metal=bool(info["metal_available"]), available=int(vm.available),
                           working_set=(info.get("gpu_working_set_mb") or 0) * _MB or None)
    info["memory_signal"] = budget.signal
    level, free = kernel_pressure().read()
    if level is not None or free is not None:
        from mlotspark.platform.memory import PRESSURE_NAMES

        info["memory_pressure"] = f"{PRESSURE_NAMES.get(level, level)}, {free}% free (kernel)"
    info["kv_budget"] = budget.describe().split("; memory signal")[0] + " (before a model is loaded)"
    info["cascade_episodic_budget"] = ("the KV budget, per request, less 10% of a fixed pool (Metal's working "
                                       "set, a memory limit); blocks past it go 8-bit, then spill to disk")
    return info


def format_info(info: dict[str, Any] | None = None) -> str:
    """Aligned ``key: value`` lines of ``device_info()`` (computed if not given)."""
    info = device_info() if info is None else info
    width = max((len(k) for k in info), default=0) + 1
    lines = []
    for key, value in info.items():
        if isinstance(value, bool):
            value = "yes" if value else "no"
        lines.append(f"{key + ':':<{width}} {value}")
    return "\n".join(lines)


__all__ = ["MetalLimits", "configure_metal_limits", "current_device", "device_info", "format_info", "is_metal", "peak_memory_mb",
           "release_idle_memory", "trim_heap"]

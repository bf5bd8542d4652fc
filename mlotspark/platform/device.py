"""What machine we run on: MLX device, BLAS, CPU, memory (for ``mlotspark info``).

Metal-only calls are guarded by ``mx.metal.is_available()`` (DESIGN §2): the same
code runs on the Linux CPU backend, where they are no-ops.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from importlib import metadata
from typing import Any

from mlotspark.platform import blas  # the package __init__ has already resolved BLAS before mlx

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


def configure_metal_limits() -> None:
    """Let MLX keep up to the recommended working set wired in memory (Metal only).

    Wired buffers are not paged out between requests, which keeps the first token
    fast after a pause; on the CPU backend this does nothing.
    """
    if not is_metal():
        return
    limit = _metal_info().get("max_recommended_working_set_size")
    if limit:
        _mx().set_wired_limit(int(limit))


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
        ``cores_physical``, ``memory_total_mb`` and ``memory_available_mb``; on
        Metal also ``gpu`` and ``gpu_working_set_mb``.
    """
    vm = psutil.virtual_memory()
    loaded = "mlx.core" in sys.modules
    device = _device_name() if loaded else _guessed_device()
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


__all__ = ["configure_metal_limits", "device_info", "format_info", "is_metal", "peak_memory_mb"]

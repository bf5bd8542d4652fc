"""Memory admission helpers: byte formatting, argument checks, MLX's allocator limit."""

from __future__ import annotations

from typing import Any

from mlotspark.errors import OptionError

__all__ = ["apply_memory_limit", "fmt_bytes", "check_int"]


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def check_int(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise OptionError(f"{name} must be an integer ≥ {lo}, got {value!r}")
    return value


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

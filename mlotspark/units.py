"""Byte counts as people read them (``1.5 GiB``), for messages and status lines."""

from __future__ import annotations

__all__ = ["fmt_bytes"]


def fmt_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit it reaches, one decimal (``"1.5 GiB"``, ``"12 B"``)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"

"""Byte counts as people read them (``1.5 GiB``) and write them (``4GB``, ``512MiB``),
for messages, status lines and the size options (``--memory-limit``, ``--store-budget``)."""

from __future__ import annotations

import numbers
import re

from mlotspark.errors import OptionError

__all__ = ["fmt_bytes", "parse_bytes"]

# A number, then an optional unit: k/m/g/t, each with an optional "i" and "b" (case free).
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(?:([kmgt])i?b?|b?)\s*$", re.IGNORECASE)


def fmt_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit it reaches, one decimal (``"1.5 GiB"``, ``"12 B"``)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def parse_bytes(value: int | float | str, what: str = "size", allow_zero: bool = False) -> int:
    """Bytes of a size given as a whole number (``8e9`` too) or as ``4GB``, ``512 MiB``,
    ``1.5g``, ``4096``.

    Every unit is a power of 1024 (``GB`` and ``GiB`` alike), as memory is counted and as
    ``fmt_bytes`` prints it, so one spelling means one size in every option.

    Args:
        what: the option's name, for the error.
        allow_zero: 0 is a valid size (a budget of none).

    Raises:
        OptionError: not a size, or not positive (zero where ``allow_zero``), naming ``what``.
    """
    hint = "give bytes or a size like 8GB, 512MiB"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        n = int(value)
    elif not isinstance(value, str):
        raise OptionError(f"invalid {what} {value!r}: {hint}")
    else:
        m = _SIZE.match(value)
        if m is None:
            raise OptionError(f"invalid {what} {value!r}: {hint}")
        power = "kmgt".index(m.group(2).lower()) + 1 if m.group(2) else 0
        n = int(float(m.group(1)) * 1024 ** power)
    if n < 0 or (n == 0 and not allow_zero):
        raise OptionError(f"invalid {what} {value!r}: must be {'>= 0' if allow_zero else '> 0'}")
    return n

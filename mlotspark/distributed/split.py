"""Which layers each rank runs: in proportion to its free memory, or evenly."""

from __future__ import annotations

from mlotspark.errors import DistributedError, OptionError

SPLITS = ("memory", "even")


def plan_layers(n_layers: int, free_bytes: list[int], how: str = "memory") -> list[tuple[int, int]]:
    """Contiguous layer ranges ``[start, end)``, one per rank, rank 0 first.

    ``memory`` gives each rank layers in proportion to the memory it has free
    (largest remainders round up); ``even`` splits as evenly as the count allows,
    the extra layers going to the lowest ranks. Every rank gets at least one layer.

    Args:
        n_layers: the model's transformer layers.
        free_bytes: each rank's available memory, in rank order.
        how: ``memory`` or ``even``.

    Returns:
        One ``(start, end)`` per rank; together they cover ``range(n_layers)`` in order.

    Raises:
        OptionError: an unknown split.
        DistributedError: more ranks than layers.
    """
    if how not in SPLITS:
        raise OptionError(f"invalid split {how!r}: choose one of {', '.join(SPLITS)}")
    n = len(free_bytes)
    if n < 1 or n > n_layers:
        raise DistributedError(f"cannot split {n_layers} layers over {n} ranks: each rank needs a layer")
    if how == "even" or sum(free_bytes) <= 0:
        counts = [n_layers // n + (1 if r < n_layers % n else 0) for r in range(n)]
    else:
        total = float(sum(max(b, 0) for b in free_bytes))
        # One layer each first, the rest by share of free memory.
        rest = n_layers - n
        exact = [rest * max(b, 0) / total for b in free_bytes]
        counts = [1 + int(e) for e in exact]
        left = n_layers - sum(counts)
        by_remainder = sorted(range(n), key=lambda r: (-(exact[r] - int(exact[r])), r))
        for r in by_remainder[:left]:
            counts[r] += 1
    plan, start = [], 0
    for c in counts:
        plan.append((start, start + c))
        start += c
    return plan

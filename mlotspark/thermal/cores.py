"""How many CPU cores the engine's BLAS threads take: the cores other processes leave free.

OpenBLAS's threads wait for each other at the end of every product. When another
process holds one of two cores, the thread that waits behind it stalls every product
for a scheduler time slice: measured on this project's 2-core VM with other work running
(load ~6), a (256 x 896) @ (896 x 896) GEMM took 17 ms on one thread and 68 ms on two, and
the NumPy step's 150 sgemv per token went from 30 ms to 720 ms once. On an idle machine two
threads are faster (decode 27.1 vs 21.1 tok/s, same run). So the thread count follows the
cores other processes leave free (``Reading.cpu_others``), with a margin against flapping.

This module never imports mlx; the scheduler applies the count (``platform.blas.fit_threads``).
"""

from __future__ import annotations

import os

__all__ = ["HYSTERESIS", "blas_threads", "usable_cores"]

#: Cores of other work past the half-core mark before the count changes (no flapping
#: on a reading that sits at the edge).
HYSTERESIS = 0.15


def blas_threads(others: float | None, cores: int, current: int | None) -> int | None:
    """The BLAS thread count for a machine with ``cores`` cores, ``others`` of them busy
    with other processes.

    Args:
        others: ``Reading.cpu_others`` (None: not known, keep ``current``).
        cores: logical CPUs of the machine (>= 1).
        current: the count in force (None: none chosen yet).

    Returns:
        ``round(cores - others)`` clamped to [1, cores], kept at ``current`` while the
        reading is within :data:`HYSTERESIS` of the edge; None when nothing is known.
    """
    cores = max(1, int(cores))
    if others is None:
        return current
    free = cores - max(0.0, float(others))
    want = min(cores, max(1, int(free + 0.5)))
    if current is None or want == current:
        return want
    edge = current - 0.5 if want < current else current + 0.5  # where the count last flipped
    return want if abs(free - edge) > HYSTERESIS else current


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one: a container
    or ``taskset`` can allow fewer than the machine has), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS has no affinity mask
        return max(1, os.cpu_count() or 1)

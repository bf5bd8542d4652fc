"""Resolve a fast BLAS before MLX loads (Linux CPU backend only).

The Linux ``mlx-cpu`` wheel links a reference BLAS (~5 GFLOP/s GEMM). Loading an
OpenBLAS with RTLD_GLOBAL *before* ``import mlx.core`` makes MLX's ``cblas_*``
calls resolve to it (~200 GFLOP/s here); loading it after the import has no effect,
so ``mlotspark/__init__.py`` imports this module first of all.

Order: ``$MLOTSPARK_BLAS`` (a path, or ``none`` to keep the reference BLAS), the
pip package ``cmeel-openblas`` (no root needed; fastest measured here), then
Debian's ``libopenblas0-pthread``.
"""

from __future__ import annotations

import ctypes
import os
import sys
import sysconfig
from pathlib import Path

#: The library that was loaded, or a short reason why none was.
BLAS_IN_USE: str = "platform default"
_LIB: ctypes.CDLL | None = None  # the OpenBLAS loaded here, for set_blas_threads


def _candidates() -> list[Path]:
    found: list[Path] = []
    for key in ("purelib", "platlib"):
        lib = Path(sysconfig.get_paths()[key]) / "cmeel.prefix" / "lib" / "libopenblas.so.0"
        if lib not in found:
            found.append(lib)
    found += [
        Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"),
        Path("/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0"),
        Path("/usr/lib64/libopenblas.so.0"),
    ]
    return found


def resolve_blas() -> str:
    """Load the first fast BLAS found (Linux only) and return what is in use."""
    global BLAS_IN_USE
    if not sys.platform.startswith("linux"):
        # macOS: MLX uses Accelerate / Metal; nothing to do.
        BLAS_IN_USE = "Accelerate (macOS)" if sys.platform == "darwin" else "platform default"
        return BLAS_IN_USE
    if "mlx.core" in sys.modules:
        BLAS_IN_USE = "reference (mlx imported before mlotspark)"
        import warnings

        warnings.warn(
            "mlx was imported before mlotspark, so MLX keeps its reference BLAS (matrix products "
            "~40x slower on this CPU): import mlotspark first",
            RuntimeWarning,
            stacklevel=2,
        )
        return BLAS_IN_USE
    wanted = os.environ.get("MLOTSPARK_BLAS", "").strip()
    if wanted.lower() == "none":
        BLAS_IN_USE = "reference (MLOTSPARK_BLAS=none)"
        return BLAS_IN_USE
    paths = [Path(wanted)] if wanted else _candidates()
    for path in paths:
        if path.is_file():
            try:
                lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            global _LIB
            _LIB = lib
            BLAS_IN_USE = f"OpenBLAS ({path})"
            return BLAS_IN_USE
    BLAS_IN_USE = "reference (no OpenBLAS found; pip install cmeel-openblas)"
    return BLAS_IN_USE


def set_blas_threads(n: int) -> bool:
    """Set the loaded OpenBLAS's thread count (several ranks on one machine share its cores).

    Args:
        n: threads, >= 1.

    Returns:
        True when an OpenBLAS loaded here took the setting.
    """
    fn = getattr(_LIB, "openblas_set_num_threads", None) if _LIB is not None else None
    if fn is None:
        return False
    fn(max(1, int(n)))
    return True


resolve_blas()

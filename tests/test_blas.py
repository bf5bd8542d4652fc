"""The fast BLAS on a fresh machine: every dependency resolves inside the venv.

A fresh machine has no ``libgfortran.so.5``; an install that is fast only because
this machine has one must fail ``test_fast_blas_needs_nothing_outside_the_venv``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlotspark.platform import blas

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the BLAS preload is Linux only")

# What a fresh Linux machine always has: glibc (libmvec, its vector math, is part of it:
# cmeel-openblas 0.3.29 links it), libgcc and the loader.
SYSTEM_ALLOWED = ("linux-vdso.so", "ld-linux", "libc.so", "libm.so", "libmvec.so", "libpthread.so", "libdl.so",
                  "librt.so", "libgcc_s.so")

PROBE = r"""
import ctypes, json, sys
import mlotspark
from mlotspark.platform import blas
import mlx.core as mx
a = mx.ones((64, 64)); mx.eval(a @ a)
# Which library answers MLX's cblas_sgemm: the first definition in the global scope.
class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
libc = ctypes.CDLL(None)
addr = ctypes.cast(libc.cblas_sgemm, ctypes.c_void_p)
info = DlInfo()
libc.dladdr(addr, ctypes.byref(info))
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if ".so" in l.split()[-1]})
print(json.dumps({"in_use": blas.BLAS_IN_USE, "path": str(blas.BLAS_PATH), "note": blas.BLAS_NOTE,
                  "sgemm_from": info.fname.decode(), "maps": maps}))
"""


def _inside(path: str, root: Path) -> bool:
    return Path(os.path.realpath(path)).is_relative_to(root)


def _deps_inside(lib: str, venv: Path, env: dict, also: tuple = ()) -> None:
    """ldd: each dependency of ``lib`` resolves, to the venv or to glibc/libgcc (or ``also``)."""
    ldd = subprocess.run(["ldd", lib], capture_output=True, text=True, timeout=60, env=env)
    assert ldd.returncode == 0, ldd.stderr
    for line in ldd.stdout.splitlines():
        assert "not found" not in line, line
        name, _, rest = line.strip().partition(" => ")
        target = rest.split(" (")[0].strip() if rest else name.split(" (")[0].strip()
        if not target.startswith("/"):
            continue  # linux-vdso has no file
        assert _inside(target, venv) or Path(target).name.startswith(SYSTEM_ALLOWED + also), line


@linux
def test_fast_blas_needs_nothing_outside_the_venv():
    """MLX's cblas_sgemm is OpenBLAS's, and that library's dependencies all live in the venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("MLOTSPARK_BLAS", "LD_LIBRARY_PATH", "LD_PRELOAD")}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    venv = Path(os.path.realpath(sys.prefix))
    assert not got["in_use"].startswith("reference"), got["in_use"]
    assert "system libraries" not in got["in_use"], f"fast only thanks to the system: {got['note']}"
    assert _inside(got["path"], venv), got["path"]
    assert "openblas" in got["sgemm_from"] and _inside(got["sgemm_from"], venv), got["sgemm_from"]
    _deps_inside(got["path"], venv, env)
    # NumPy's own OpenBLAS (the one-token decode step's sgemv, models/cpu/cpu_step.py) too.
    import numpy

    numpy_blas = sorted((Path(numpy.__file__).parent.parent / "numpy.libs").glob("libscipy_openblas*"))
    for lib in numpy_blas:  # its libgfortran asks for zlib, which Python's own zlib module needs too
        _deps_inside(str(lib), venv, env, also=("libz.so",))
    # And what the process really mapped: no libgfortran/libquadmath/OpenBLAS from the system.
    for mapped in got["maps"]:
        if any(k in Path(mapped).name for k in ("gfortran", "quadmath", "openblas")):
            assert _inside(mapped, venv), mapped


@linux
def test_private_copy_is_reused_then_rebuilt_when_its_source_changes(tmp_path):
    target = tmp_path / "blas"
    lib = blas.build_private_openblas(target)
    assert (target / "libgfortran.so.5").is_file()
    first = lib.stat().st_mtime_ns
    assert blas.build_private_openblas(target).stat().st_mtime_ns == first  # reused
    stamp = target / "source.json"
    stamp.write_text(json.dumps({"an older wheel": [1, 2]}))
    blas.build_private_openblas(target)
    assert json.loads(stamp.read_text()) != {"an older wheel": [1, 2]}  # rebuilt
    assert not list(tmp_path.glob("blas.tmp-*")) and not list(tmp_path.glob("blas.old-*"))


@linux
def test_missing_patchelf_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(blas, "patchelf_binary", lambda: None)
    with pytest.raises(blas.BlasSetupError, match="patchelf is not installed"):
        blas.build_private_openblas(tmp_path / "blas")


def test_warning_only_for_the_reference_blas(monkeypatch):
    monkeypatch.setattr(blas, "BLAS_IS_REFERENCE", False)
    assert blas.blas_warning() is None
    monkeypatch.delenv("MLOTSPARK_BLAS", raising=False)
    monkeypatch.setattr(blas, "BLAS_IS_REFERENCE", True)
    monkeypatch.setattr(blas, "BLAS_IN_USE", "reference (no usable OpenBLAS: patchelf is not installed)")
    line = blas.blas_warning()
    assert "reference BLAS" in line and "patchelf is not installed" in line and "fix: pip install" in line
    monkeypatch.setattr(blas, "BLAS_IN_USE", "reference (MLOTSPARK_BLAS=none)")
    assert blas.blas_warning() is None  # the user asked for it


@linux
def test_cli_says_it_once_when_only_the_reference_blas_loads(tmp_path):
    env = dict(os.environ, MLOTSPARK_BLAS=str(tmp_path / "missing.so"), MLOTSPARK_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "mlotspark", "memory", "list"], capture_output=True,
                         text=True, timeout=120, env=env)
    warnings = [l for l in out.stderr.splitlines() if "reference BLAS" in l]
    assert len(warnings) == 1 and warnings[0].startswith("mlotspark: warning:"), out.stderr
    assert "MLOTSPARK_BLAS" in warnings[0]


def test_stats_panel_shows_the_warning():
    from tui.backend import MachineFigures
    from tui.widgets.stats import machine_text

    assert "BLAS" not in machine_text(MachineFigures(blas_warning=None), None, None).plain
    text = machine_text(MachineFigures(blas_warning="slow reference BLAS in use; fix: x"), None, None).plain
    assert "slow reference BLAS" in text and "fix: x" in text


@pytest.mark.skipif(sys.platform != "linux", reason="NumPy's Linux wheels bundle OpenBLAS; macOS's use Accelerate")
def test_numpy_blas_threads_are_set_unless_the_user_chose(monkeypatch):
    import ctypes
    import glob

    import numpy

    libs = glob.glob(str(Path(numpy.__file__).parent.parent / "numpy.libs" / "libscipy_openblas*"))
    if not libs:
        pytest.skip("this NumPy does not bundle scipy-openblas")
    get = getattr(ctypes.CDLL(libs[0]), "scipy_openblas_get_num_threads64_", None)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert blas.set_numpy_blas_threads(1)
    if get is not None:
        assert get() == 1
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert not blas.set_numpy_blas_threads(1)  # the user's explicit setting wins


def test_a_build_for_another_cpu_is_refused_with_its_reason():
    """cmeel's wheels are built for one CPU: 0.3.31's SKYLAKEX kernels died with SIGILL on an
    AVX2-only EPYC. A build is refused when its target needs flags this CPU lacks."""
    skylakex = "OpenBLAS 0.3.31 NO_AFFINITY SKYLAKEX MAX_THREADS=64"
    avx2_only = {"sse4_2", "avx", "avx2", "fma"}
    why = blas.runs_here(skylakex, avx2_only)
    assert why and "SKYLAKEX" in why and "avx512f" in why
    assert blas.runs_here(skylakex, avx2_only | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}) is None
    assert blas.runs_here("OpenBLAS 0.3.29 NO_AFFINITY ZEN MAX_THREADS=64", avx2_only) is None
    assert "avx2" in blas.runs_here("OpenBLAS 0.3.29 NO_AFFINITY ZEN MAX_THREADS=64", {"sse4_2", "avx"})
    assert blas.runs_here("OpenBLAS 0.3.26 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64", set()) is None
    assert blas.runs_here(skylakex, None) is None  # flags unknown: not refused


REFUSED = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("blas_alone", sys.argv[1])
blas = importlib.util.module_from_spec(spec); spec.loader.exec_module(blas)
blas.cpu_flags = lambda: {"sse2", "sse4_2"}  # a CPU without AVX: no x86 OpenBLAS build fits
in_use = blas.resolve_blas()
import mlx.core as mx
a = mx.ones((64, 64)); total = (a @ a).sum().item()  # MLX's own BLAS answers: no SIGILL
print(json.dumps({"in_use": in_use, "warning": blas.blas_warning(), "total": total}))
"""


MISSING_LIB = r"""
import importlib.util, json, shutil, subprocess, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("blas_alone", sys.argv[1])
blas = importlib.util.module_from_spec(spec); spec.loader.exec_module(blas)
built = blas.build_private_openblas()
broken = Path(sys.argv[2]) / "libopenblas.so.0"  # a copy that needs a library no machine has
shutil.copytree(built.parent, broken.parent, dirs_exist_ok=True)
subprocess.run([blas.patchelf_binary(), "--add-needed", "libmlotspark-absent.so.1", str(broken)], check=True)
blas.build_private_openblas = lambda: broken
blas.SYSTEM_OPENBLAS = ()
blas.cmeel_openblas = lambda: None
in_use = blas.resolve_blas()
print(json.dumps({"in_use": in_use, "warning": blas.blas_warning()}))
"""


@linux
def test_a_missing_system_library_is_named_with_the_fix(tmp_path):
    """A machine without a library the OpenBLAS copy needs (glibc's libmvec, say): the
    reference BLAS stays, and the warning names the library the loader could not find."""
    env = {k: v for k, v in os.environ.items() if k != "MLOTSPARK_BLAS"}
    done = subprocess.run([sys.executable, "-c", MISSING_LIB, blas.__file__, str(tmp_path)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["in_use"].startswith("reference") and "libmlotspark-absent.so.1" in got["in_use"], got["in_use"]
    assert "install the system library it names" in got["warning"], got["warning"]


@linux
def test_mlx_keeps_its_own_blas_when_no_build_fits_this_cpu():
    """A CPU the installed OpenBLAS was not built for: MLX keeps its reference BLAS (slow,
    said once with the fix) instead of dying in its first matrix product."""
    env = {k: v for k, v in os.environ.items() if k != "MLOTSPARK_BLAS"}
    done = subprocess.run([sys.executable, "-c", REFUSED, blas.__file__], capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["total"] == 64 * 64 * 64
    assert got["in_use"].startswith("reference") and "this CPU lacks" in got["in_use"], got["in_use"]
    assert "slow reference BLAS" in got["warning"] and "cmeel-openblas==" in got["warning"]

"""Hardware probe: GEMM GFLOP/s in MLX (float32, CPU) for each BLAS mlotspark can resolve, side by side.

Each option runs in its own process (a BLAS must be loaded before ``import mlx.core``,
and cannot be swapped after). Options: the private venv-contained OpenBLAS (what
mlotspark uses), cmeel's library as installed (needs the system's libgfortran), and
MLX's reference BLAS. Usage::

    flock /tmp/mlotspark-bench.lock .venv/bin/python benchmarks/blas_gemm.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, os, statistics, sys, time
import mlotspark
from mlotspark.platform import blas
import mlx.core as mx
mx.set_default_device(mx.cpu)
reps = int(sys.argv[1]); out = {"blas": blas.BLAS_IN_USE}
for n in (1024, 2048):
    a = mx.random.normal((n, n)); b = mx.random.normal((n, n)); mx.eval(a, b); mx.eval(a @ b)
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); mx.eval(a @ b); ts.append(time.perf_counter() - t)
    out[n] = 2 * n ** 3 / statistics.median(ts) / 1e9
print(json.dumps(out))
"""


def run(label: str, env_blas: str | None, reps: int) -> dict:
    env = dict(os.environ)
    env.pop("MLOTSPARK_BLAS", None)
    if env_blas is not None:
        env["MLOTSPARK_BLAS"] = env_blas
    out = subprocess.run([sys.executable, "-c", CHILD, str(reps)], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return {"label": label, "error": out.stderr.strip().splitlines()[-1]}
    return {"label": label, **json.loads(out.stdout.strip().splitlines()[-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    from mlotspark.platform import blas  # only to find the paths; the children load

    options = [("private venv copy (mlotspark default)", None)]
    cmeel = blas.cmeel_openblas()
    if cmeel:
        options.append(("cmeel as installed (system libgfortran)", str(cmeel)))
    options.append(("MLX reference BLAS", "none"))
    print(f"{'option':<42} {'GFLOP/s n=1024':>15} {'n=2048':>8}  library")
    for label, env_blas in options:
        r = run(label, env_blas, args.reps if env_blas != "none" else 1)
        if "error" in r:
            print(f"{label:<42} {'fails':>15} {'':>8}  {r['error']}")
        else:
            print(f"{label:<42} {r['1024']:>15.1f} {r['2048']:>8.1f}  {r['blas']}")


if __name__ == "__main__":
    main()

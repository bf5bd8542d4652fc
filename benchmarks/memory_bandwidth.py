"""Hardware probe: how fast this machine can read weights, the ceiling of one-token decode.

A decode step reads every weight once, so tokens/s ≤ read bandwidth ÷ weight bytes. This
measures the best read rate a process gets here, three ways, on 1 GB of float32 (far past
the caches), median of ``--reps``, at the default thread counts:

- ``numpy sum``: a plain streaming read (one thread);
- ``numpy W@x``: OpenBLAS sgemv, what our CPU step does per matrix;
- ``mlx W@x``: MLX's CPU matmul of one vector.

and prints, for the weight sizes given, the decode rate that bandwidth allows.

    flock /tmp/mlotspark-bench.lock .venv/bin/python benchmarks/memory_bandwidth.py \
        --model smollm2-135m=538 gemma3-270m=1072 qwen2.5-coder-0.5b=2521
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlotspark  # noqa: F401  isort: skip  (OpenBLAS before MLX)
import mlx.core as mx
import numpy as np


def timed(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=1.0, help="bytes read per pass, in GB (default 1)")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--model", nargs="*", default=[], metavar="NAME=MB", help="weight sizes to turn into ceilings")
    args = p.parse_args()
    cols = 4096
    rows = int(args.gb * 1e9 / 4 / cols)
    w = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    x = np.ones(cols, np.float32)
    nbytes = w.nbytes
    wm, xm = mx.array(w), mx.array(x)
    mx.eval(wm, xm)
    rates = {
        "numpy sum": nbytes / timed(lambda: w.sum(), args.reps) / 1e9,
        "numpy W@x (OpenBLAS sgemv)": nbytes / timed(lambda: w @ x, args.reps) / 1e9,
        "mlx W@x (CPU)": nbytes / timed(lambda: mx.eval(wm @ xm), args.reps) / 1e9,
    }
    print(f"read {nbytes / 1e9:.2f} GB per pass, median of {args.reps}")
    for name, gbs in rates.items():
        print(f"  {name:28s} {gbs:6.1f} GB/s")
    best = max(rates.values())
    for spec in args.model:
        name, _, mb = spec.partition("=")
        print(f"  {name}: {float(mb):.0f} MB of weights -> at most {best * 1e3 / float(mb):.1f} tok/s at {best:.1f} GB/s")


if __name__ == "__main__":
    main()

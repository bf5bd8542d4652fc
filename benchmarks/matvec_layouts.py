"""Hardware probe: GB/s of one-token matrix products in MLX (CPU + OpenBLAS), per layout and shape.

For the default model's weight shapes, each product streams distinct weights (copies
past the 32 MB L3, as a decode step does), interleaved, median of ``--reps``:

- ``x@W.T``: what ``nn.Linear`` does (sgemm, one row);
- ``W@x``: the other orientation (``models/matvec.py``);
- the tied 49152x576 output layer in row blocks: ``x @ block.T`` batched, and
  ``block @ x`` with the vector tiled (a broadcast one is folded into one big sgemm).

    OPENBLAS_NUM_THREADS=1 flock /tmp/mlotspark-bench.lock .venv/bin/python benchmarks/matvec_layouts.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import mlotspark  # noqa: F401  isort: skip  (OpenBLAS before MLX)
import mlx.core as mx


def streams(rows: int, cols: int, total: float = 150e6) -> list[mx.array]:
    """Distinct (rows, cols) weights, ~``total`` bytes in all (past the caches)."""
    n = max(1, int(total // (rows * cols * 4)))
    ws = [mx.random.normal((rows, cols)) for _ in range(n)]
    mx.eval(ws)
    return ws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    cases = []
    for k in (576, 1536):
        for n in (192, 576, 1024, 1536, 2048, 3072):
            ws = streams(n, k)
            x = mx.random.normal((1, 1, k))
            col = x.reshape(k, 1)
            cases.append((f"{n}x{k} x@W.T", ws, lambda ws=ws, x=x: [x @ w.T for w in ws]))
            cases.append((f"{n}x{k} W@x", ws, lambda ws=ws, col=col: [w @ col for w in ws]))
    out = mx.random.normal((49152, 576))
    row = mx.random.normal((1, 576))
    mx.eval(out, row)
    cases.append(("49152x576 x@W.T", [out], lambda: row @ out.T))
    for c in (512, 1024, 1536):
        b = 49152 // c
        tiled = mx.repeat(row.reshape(1, 576, 1), b, axis=0)
        cases.append((f"49152x576 x@block.T /{c}", [out], lambda c=c, b=b: row @ out.reshape(b, c, 576).swapaxes(1, 2)))
        cases.append((f"49152x576 block@x tiled /{c}", [out], lambda c=c, b=b, t=tiled: out.reshape(b, c, 576) @ t))
    times: dict[str, list[float]] = {name: [] for name, _, _ in cases}
    for rep in range(args.reps + 1):
        for name, _, fn in cases:
            t = time.perf_counter()
            mx.eval(fn())
            if rep:  # the first round warms up
                times[name].append(time.perf_counter() - t)
    print(f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}; median of {args.reps}; GB/s of weights read")
    for name, ws, _ in cases:
        gbs = sum(w.nbytes for w in ws) / statistics.median(times[name]) / 1e9
        print(f"{name:<30} {gbs:6.1f}")


if __name__ == "__main__":
    main()

"""Model load times in fresh processes (no suite: a suite runs inside one loaded engine).

First load (GGUF conversion) vs second load (from the conversion cache), per model;
with ``--compare mlx-lm``, a later load through ``Engine.load`` beside ``mlx_lm.load`` of the
same weights (an mlx-lm directory written once, float32 as ours run on the CPU).

Each load runs in a fresh Python process (so no page of the first load is reused by
the second in-process) and times the load call only, not the Python start-up.
"First" empties the model's cache entry (conversion, tokenizer and, on the CPU, float32
cache) before each run; "second" keeps it. The compared loads alternate, ours first in odd
repetitions, after one load of ours that fills the caches; the phases of ours (read, widen,
tokenizer, materialize, and write when it wrote the float32 cache) come from
``LoadedModel.extra["load"]``.

Usage: python benchmarks/gguf_load.py MODEL [MODEL ...] [--repetitions 3] [--compare mlx-lm]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys

_CHILD = r"""
import json, sys, time
import mlotspark
from mlotspark.models import catalogue, loader
src = catalogue.resolve(sys.argv[1], pull=False)
t = time.perf_counter()
loaded = loader.load(src, progress=False)
print(json.dumps({"seconds": time.perf_counter() - t, "weights": loaded.weights,
                  "load": loaded.extra.get("load"), "formats": loaded.extra.get("gguf_types")}))
"""


_ENGINE = r"""
import json, sys, time
import mlotspark
from mlotspark import Engine
t = time.perf_counter()
engine = Engine.load(sys.argv[1], progress=False)
took = time.perf_counter() - t
print(json.dumps({"seconds": took, "load": engine.loaded.extra.get("load")}))
engine.close()
"""

_MLX_LM = r"""
import json, sys, time
import mlotspark  # the same BLAS as ours
from mlx_lm import load
t = time.perf_counter()
model, tokenizer = load(sys.argv[1])
print(json.dumps({"seconds": time.perf_counter() - t}))
"""


def _run(model: str, child: str = _CHILD) -> dict:
    out = subprocess.run([sys.executable, "-c", child, model], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compare(model: str, repetitions: int) -> None:
    """``Engine.load`` (a later load: the conversion cache is there) beside ``mlx_lm.load``."""
    import tempfile
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from mlotspark.bench.serve import write_mlx_lm_dir

    _run(model, _ENGINE)  # the conversion cache, if this machine has none yet
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_mlx_lm_dir(model, Path(tmp))
        ours, theirs = [], []
        for i in range(repetitions):
            for side in (("ours", "mlx-lm") if i % 2 == 0 else ("mlx-lm", "ours")):
                if side == "ours":
                    ours.append(_run(model, _ENGINE))
                else:
                    theirs.append(_run(str(folder), _MLX_LM))
    o = statistics.median(r["seconds"] for r in ours)
    t = statistics.median(r["seconds"] for r in theirs)
    runs = lambda rs: ", ".join(f"{r['seconds']:.2f}" for r in rs)  # noqa: E731
    print(f"{model}: Engine.load median {o:.2f} s (runs {runs(ours)}), mlx_lm.load median {t:.2f} s (runs {runs(theirs)})")
    print(f"  ours / mlx-lm = {o / t:.2f}x (< 1: ours faster); our phases, last run: {ours[-1]['load'].get('phases')}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--repetitions", "-r", type=int, default=3)
    ap.add_argument("--compare", choices=["mlx-lm"], default=None)
    args = ap.parse_args()
    if args.compare:
        for model in args.models:
            compare(model, args.repetitions)
        return
    import mlotspark  # noqa: F401  (OpenBLAS before mlx)
    from mlotspark.models import catalogue, gguf_convert

    for model in args.models:
        path = catalogue.resolve(model, pull=False).path
        first, second = [], []
        for _ in range(args.repetitions):
            shutil.rmtree(gguf_convert.cache_dir(path), ignore_errors=True)
            first.append(_run(model))
            second.append(_run(model))
        f = statistics.median(r["seconds"] for r in first)
        s = statistics.median(r["seconds"] for r in second)
        print(f"{model}: reader {first[0]['load']}, formats {first[0]['formats']}")
        runs1 = ", ".join(f"{r['seconds']:.2f}" for r in first)
        runs2 = ", ".join(f"{r['seconds']:.2f}" for r in second)
        print(f"  first load  median {f:6.2f} s  (runs {runs1})")
        print(f"  second load median {s:6.2f} s  (runs {runs2})")
        print(f"  first / second = {f / s:.1f}x")


if __name__ == "__main__":
    main()

"""First load (GGUF conversion) vs second load (from the conversion cache), per model.

Each load runs in a fresh Python process (so no page of the first load is reused by
the second in-process) and times ``loader.load`` only, not the Python start-up.
"First" empties the model's conversion cache before each run; "second" keeps it.

Usage: python benchmarks/gguf_load.py MODEL [MODEL ...] [--repetitions 3]
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


def _run(model: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, model], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--repetitions", "-r", type=int, default=3)
    args = ap.parse_args()
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

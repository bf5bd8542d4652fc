"""Is the GGUF tokenizer cache worth it? Build the tokenizer a GGUF file describes
with no cache, then read it back from its cache, interleaved; median seconds of N.

    flock /tmp/mlotspark-bench.lock .venv/bin/python benchmarks/tokenizer_cache.py [MODEL] [N]

MODEL: an alias or a .gguf path (default: the default model).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlotspark  # noqa: F401  (OpenBLAS before MLX)
import mlx.core as mx

from mlotspark.models.hub import catalogue
from mlotspark.models.tokenizer import load_gguf_tokenizer


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else None
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    path = Path(catalogue.resolve(model, pull=False).path)
    _, meta = mx.load(str(path), return_metadata=True)
    vocab = len(meta["tokenizer.ggml.tokens"])
    built, hit = [], []
    with tempfile.TemporaryDirectory() as d:
        cache = Path(d) / "tokenizer.json"
        load_gguf_tokenizer(meta, cache)  # writes the cache (not timed)
        for _ in range(n):
            t = time.perf_counter()
            a = load_gguf_tokenizer(meta)  # built from the metadata
            built.append(time.perf_counter() - t)
            t = time.perf_counter()
            b = load_gguf_tokenizer(meta, cache)  # read back from the cache
            hit.append(time.perf_counter() - t)
            assert a.encode("Hello, world! 12345") == b.encode("Hello, world! 12345")
        size = cache.stat().st_size
    mb, mh = statistics.median(built), statistics.median(hit)
    print(f"{path.name}: {vocab:,} tokens, cache {size / 1e6:.1f} MB")
    print(f"built from metadata  median {mb:.3f} s  (min {min(built):.3f}, n={n})")
    print(f"read from the cache  median {mh:.3f} s  (min {min(hit):.3f}, n={n})")
    print(f"saved per load       {mb - mh:+.3f} s ({mb / mh:.2f}x)")


if __name__ == "__main__":
    main()

"""What storing episodic blocks costs by block kind (no suite: the store alone, no model).

The question it answers: does ``auto`` (float16, re-stored 8-bit past the budget) cost
more than storing 8-bit from the start? Blocks of one model's shape (default Qwen2.5-0.5B:
24 layers, 2 KV heads, head dim 64, 32-token blocks) are added as a prefill adds them
(``add_many`` per layer per piece), every payload evaluated per piece, and the kinds run
interleaved, medians of ``--reps``:

    python benchmarks/store_kinds.py --tokens 65536 --reps 3

Not a claim about a user's prefill (that is the model's time, far larger): it isolates
the store's own cost.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlotspark  # noqa: F401  (first: it picks MLX's BLAS before mlx is imported)
import mlx.core as mx

from mlotspark.memory.cascade.blocks import EpisodicStore


def run(kind: str, budget: int, tokens: int, layers: int, heads: int, block: int, dim: int, piece: int) -> tuple[float, EpisodicStore]:
    store = EpisodicStore(kind, budget, summary_rows=2)
    n = piece // block
    k = mx.random.normal((n, heads, block, dim)).astype(mx.float16)
    v = mx.random.normal((n, heads, block, dim)).astype(mx.float16)
    mx.eval(k, v)
    t = time.perf_counter()
    for p in range(tokens // piece):
        new = []
        for layer in range(layers):
            new += store.add_many(layer, p * n, p * piece, k, v)
        mx.eval([a for b in new for a in (b.payload or {}).values()])
    mx.synchronize()
    return time.perf_counter() - t, store


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=65536)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--piece", type=int, default=4096, help="tokens added per layer at once (a prefill piece)")
    p.add_argument("--budget-share", type=float, default=0.7,
                   help="auto's budget as a share of the float16 payload bytes (so part is re-stored)")
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    f16 = a.tokens // a.block_size * a.layers * 2 * a.kv_heads * a.block_size * a.head_dim * 2
    cases = [("float16", 10**15), ("q8", 10**15), ("auto", int(f16 * a.budget_share))]
    times: dict[str, list[float]] = {kind: [] for kind, _ in cases}
    last: dict[str, EpisodicStore] = {}
    for _ in range(a.reps):
        for kind, budget in cases:  # interleaved
            dt, store = run(kind, budget, a.tokens, a.layers, a.kv_heads, a.block_size, a.head_dim, a.piece)
            times[kind].append(dt)
            last[kind] = store
            store.close()
    print(f"{a.tokens} tokens, {a.layers} layers x {a.kv_heads} KV heads x {a.block_size} x {a.head_dim}, "
          f"float16 payload {f16 / 1e6:.0f} MB, median of {a.reps}:")
    for kind, budget in cases:
        s = last[kind]
        shown = "none" if budget >= 10**15 else f"{budget / 1e6:.0f} MB"
        print(f"  {kind:8s} budget {shown:>8s}: {statistics.median(times[kind]):6.2f} s "
              f"(resident {s.resident_bytes / 1e6:.0f} MB, re-stored 8-bit {s.counters.compressed}, "
              f"spilled {s.counters.spills})")


if __name__ == "__main__":
    main()

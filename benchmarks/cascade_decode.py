"""Decode ms/token and peak memory against context length: cascade vs full attention.

    python benchmarks/cascade_decode.py --lengths 1024 2048 4096 8192 16384 32768 \\
        --full-max 8192 --decode 32 --out decode.jsonl

For each length a filler prompt is prefilled (chunks of 512), then ``--decode``
tokens are decoded greedily without stopping at EOS. Reported: the median decode
ms/token (the first step excluded), MLX's peak memory over the whole run (weights
included), and the cache's own bytes. The cascade's curve should stay flat; full
attention's grows with the length. Only same-run ratios mean anything on a shared
machine (DESIGN §7).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import mlotspark  # noqa: F401  (OpenBLAS before MLX: after it, MLX keeps its reference BLAS)
import mlx.core as mx
from cascade_common import FILLER, command_line, emit, load_engine, make_cache, run_greedy

from mlotspark.memory.cascade import CascadeConfig, cascade_stats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--lengths", type=int, nargs="*", default=[1024, 2048, 4096, 8192, 16384, 32768])
    p.add_argument("--full-max", type=int, default=8192, help="longest context run with full attention")
    p.add_argument("--decode", type=int, default=32)
    p.add_argument("--window", type=int, default=None, help="default: CascadeConfig.for_model")
    p.add_argument("--top-k-blocks", type=int, default=None)
    p.add_argument("--routing", default=None, help="default: the config's")
    p.add_argument("--budget-mb", type=float, default=None, help="episodic_budget_mb (default: the config's)")
    p.add_argument("--modes", nargs="*", default=["cascade", "full"])
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()

    engine = load_engine(args.model)
    overrides = {"routing": args.routing} if args.routing else {}
    if args.window:
        overrides["window"] = args.window
    if args.top_k_blocks is not None:
        overrides["top_k"] = args.top_k_blocks
    if args.budget_mb is not None:
        overrides["episodic_budget_mb"] = args.budget_mb
    config = CascadeConfig.for_model(engine.loaded.context_length, **overrides)
    emit({"command": command_line(), "config": config.to_dict(), "model": engine.model_name, "weights": engine.loaded.weights}, args.out)
    unit = engine.encode(FILLER, raw=True)
    rows = {}
    for n in args.lengths:
        ids = (unit * (n // len(unit) + 1))[:n]
        for mode in args.modes:
            if mode == "full" and n > args.full_max:
                continue
            cache = make_cache(engine, mode, config)
            run = run_greedy(engine, ids, cache, max_tokens=args.decode + 1, chunk=args.chunk, stop=False)
            ms = statistics.median(run.decode_ms[1:])
            extra = {}
            if mode == "cascade":
                s = cascade_stats(cache)
                cache_mb = (s["bytes"]["working"] + s["bytes"]["summaries"] + s["bytes"]["episodic_memory"]) / 1e6
                extra = {"disk_mb": round(s["bytes"]["episodic_disk"] / 1e6, 1), "blocks_on_disk": s["blocks"]["on_disk"],
                         "routed_calls": s["retrieval"]["routed_calls"], "loads": s["store"]["loads"]}
            else:
                cache_mb = sum(c.nbytes for c in cache) / 1e6
            rows[(n, mode)] = (ms, run.peak_mb)
            emit({"length": n, "mode": mode, "decode_ms": round(ms, 2), "peak_mb": round(run.peak_mb, 1),
                  "cache_mb": round(cache_mb, 1), "prefill_s": round(run.prefill_s, 1), **extra}, args.out)
            del cache
            mx.clear_cache()
    base = rows.get((args.lengths[0], "cascade"))
    print("\n| context | cascade ms/tok | x first | cascade peak MB | full ms/tok | full peak MB |")
    print("|---|---|---|---|---|---|")
    for n in args.lengths:
        c, f = rows.get((n, "cascade")), rows.get((n, "full"))
        ratio = f"{c[0] / base[0]:.2f}" if c and base else "n/a"
        cells = [f"{c[0]:.1f}" if c else "n/a", ratio, f"{c[1]:.0f}" if c else "n/a",
                 f"{f[0]:.1f}" if f else "n/a", f"{f[1]:.0f}" if f else "n/a"]
        print(f"| {n} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()

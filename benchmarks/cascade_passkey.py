"""Passkey retrieval through the memory cascade, sinks + window only, and full attention.

A 5-digit key is planted at a depth in repeated filler; the model is asked for it
(chat template, greedy). Accuracy per prompt length and mode; depths spread evenly
over the filler, keys random (seeded).

    python benchmarks/cascade_passkey.py --window 512 --multiples 2 4 8 16 \\
        --lengths 16384 32768 --trials 10 --out passkey.jsonl

Modes: ``cascade`` (the config from the flags), ``streaming`` (the same with
top_k 0: sinks + window, StreamingLLM), ``full`` (plain KV; only for lengths below
the model's trained context). Each trial prints a JSON line; a markdown table ends
the run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

from cascade_common import command_line, emit, load_engine, make_cache, passkey_cases, passkey_prompt, run_greedy

from mlotspark.memory.cascade import CascadeConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--sinks", type=int, default=64)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--top-k-blocks", type=int, default=8)
    p.add_argument("--routing", default="hybrid")
    p.add_argument("--block-kind", default="float16")
    p.add_argument("--representation", default="minmax")
    p.add_argument("--multiples", type=int, nargs="*", default=[2, 4, 8, 16], help="prompt lengths as multiples of the window")
    p.add_argument("--lengths", type=int, nargs="*", default=[16384, 32768], help="further prompt lengths in tokens")
    p.add_argument("--modes", nargs="*", default=["cascade", "streaming", "full"])
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk (tokens per forward pass)")
    p.add_argument("--out", type=Path, default=None, help="append JSON lines here")
    args = p.parse_args()

    engine = load_engine(args.model)
    trained = engine.loaded.context_length
    config = CascadeConfig(
        window=args.window,
        sinks=args.sinks,
        block_size=args.block_size,
        top_k=args.top_k_blocks,
        routing=args.routing,
        block_kind=args.block_kind,
        representation=args.representation,
    )
    emit({"command": command_line(), "config": config.to_dict(), "model": engine.model_name, "weights": engine.loaded.weights}, args.out)
    lengths = [m * args.window for m in args.multiples] + list(args.lengths)
    hits: dict[tuple[int, str], list[bool]] = defaultdict(list)
    for n in lengths:
        for key, depth in passkey_cases(args.trials, seed=n):
            ids = passkey_prompt(engine, n, depth, key)
            for mode in args.modes:
                if mode == "full" and len(ids) + 16 > trained:
                    continue  # past the trained context full attention is not a fair reference
                t0 = time.perf_counter()
                run = run_greedy(engine, ids, make_cache(engine, mode, config), max_tokens=12, chunk=args.chunk)
                ok = str(key) in run.text
                hits[(n, mode)].append(ok)
                emit(
                    {"length": n, "tokens": len(ids), "mode": mode, "depth": round(depth, 3), "key": key,
                     "ok": ok, "answer": run.text.strip()[:48], "s": round(time.perf_counter() - t0, 1),
                     "prefill_tps": round(len(ids) / run.prefill_s, 1),
                     "decode_ms": round(statistics.median(run.decode_ms), 1) if run.decode_ms else None,
                     "peak_mb": round(run.peak_mb, 1)},
                    args.out,
                )
    print(f"\n| prompt tokens | x window | {' | '.join(args.modes)} |")
    print("|---|---|" + "---|" * len(args.modes))
    for n in lengths:
        cells = []
        for mode in args.modes:
            h = hits.get((n, mode))
            cells.append(f"{sum(h)}/{len(h)}" if h else "n/a")
        print(f"| {n} | {n / args.window:g} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()

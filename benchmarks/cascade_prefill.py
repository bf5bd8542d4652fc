"""Prefill tok/s against prompt length: the cascade (several chunk sizes) vs full attention.

    python benchmarks/cascade_prefill.py --lengths 4096 8192 --modes cascade full \\
        --step 2048 --cascade-chunk 256 1024 --reps 3 --out prefill.jsonl

A filler prompt of each length is fed in forward passes of ``--step`` tokens (the
engine's ``prefill_chunk``, mlx-lm's ``prefill_step_size``), evaluating the caches
after each pass as ``generate_step`` does; the cascade attends each pass in pieces
of its ``chunk`` (0 = the window). Modes: ``full`` (plain KV cache), ``cascade``,
``per-block`` (the cascade with the round-4 eviction, one store/summary/index call
per block: the before of issue 12 round 5, measured in the same process). Reported:
median prefill seconds and tok/s over ``--reps`` runs, and each cascade run's speed
over full attention's of the same length and step. Only same-run ratios mean
anything on a shared machine (DESIGN §7).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import mlotspark  # noqa: F401  (OpenBLAS before MLX)
import mlx.core as mx
from cascade_common import FILLER, command_line, emit, load_engine

from mlotspark.memory.cascade import CascadeCache, CascadeConfig, make_cascade_cache
from mlotspark.memory.cascade.routing import summarize


def per_block_evict(self: CascadeCache) -> None:
    """``CascadeCache._evict`` as it was in round 4: one ``store.add``, ``summarize`` and
    ``index.add`` per block (``tests/test_cascade_evict.py`` checks the batched path
    leaves the same state)."""
    B, W = self.config.block_size, self.config.window
    n_out = -(-(self.n_window - W) // B)
    start = self.offset - self.n_window
    sealed = []
    for j in range(n_out):
        bk = self.win_k[0, :, j * B : (j + 1) * B, :]
        bv = self.win_v[0, :, j * B : (j + 1) * B, :]
        block = self.store.add(self.layer, self.n_blocks, start + j * B, bk, bv)
        self.index.add(summarize(bk, self.config.representation))
        self.n_blocks += 1
        if block.payload is not None:
            sealed += list(block.payload.values())
    if sealed:
        mx.async_eval(sealed)
    self._drop_from_window(n_out * B)


def prefill(model, ids: list[int], cache: list, step: int) -> float:
    """Seconds to feed ``ids`` through ``model`` in passes of ``step`` tokens."""
    t0 = time.perf_counter()
    for i in range(0, len(ids), step):
        model(mx.array(ids[i : i + step])[None], cache=cache)  # logits never evaluated, as in prefill
        mx.eval([c.state for c in cache])
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--modes", nargs="+", default=["cascade", "full"], choices=["cascade", "per-block", "full"])
    p.add_argument("--step", type=int, nargs="+", default=[512], help="tokens per forward pass (prefill_chunk)")
    p.add_argument("--cascade-chunk", type=int, nargs="+", default=[None],
                   help="CascadeConfig.chunk values (0 = window; default: for_model's)")
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()

    engine = load_engine(args.model)
    model = engine.loaded.runner  # what the engine calls (models/execution.py)
    base = CascadeConfig.for_model(engine.loaded.context_length)
    emit({"command": command_line(), "config": base.to_dict(), "model": engine.model_name, "weights": engine.loaded.weights}, args.out)
    unit = engine.encode(FILLER, raw=True)
    fast_evict = CascadeCache._evict
    rows = []
    for n in args.lengths:
        ids = (unit * (n // len(unit) + 1))[:n]
        for step in args.step:
            full_s = None
            for mode in args.modes:
                for cchunk in [None] if mode == "full" else args.cascade_chunk:
                    given = {} if cchunk is None else {"chunk": cchunk}
                    config = CascadeConfig.for_model(engine.loaded.context_length, **given)
                    CascadeCache._evict = per_block_evict if mode == "per-block" else fast_evict
                    times = []
                    try:
                        for _ in range(args.reps):
                            cache = model.make_cache() if mode == "full" else make_cascade_cache(model.model, config, attention=model.attention)
                            times.append(prefill(model, ids, cache, step))
                            del cache
                            mx.clear_cache()
                    finally:
                        CascadeCache._evict = fast_evict
                    s = statistics.median(times)
                    if mode == "full":
                        full_s = s
                    row = {"length": n, "mode": mode, "step": step, "cascade_chunk": config.max_chunk if mode != "full" else None,
                           "prefill_s": round(s, 2), "tok_s": round(n / s, 1), "runs_s": [round(t, 2) for t in times]}
                    rows.append(row)
                    emit(row, args.out)
            for row in rows:
                if row["length"] == n and row["step"] == step and full_s and row["mode"] != "full":
                    row["x_full"] = round(full_s / row["prefill_s"], 2)
    print("\n| tokens | mode | step | cascade chunk | prefill s | tok/s | x full |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['length']} | {r['mode']} | {r['step']} | {r['cascade_chunk'] or '-'} | {r['prefill_s']} | {r['tok_s']} | {r.get('x_full', '-')} |")


if __name__ == "__main__":
    main()

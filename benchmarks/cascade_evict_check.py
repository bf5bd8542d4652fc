"""Greedy tokens through the cascade with the batched eviction vs the per-block one.

    python benchmarks/cascade_evict_check.py --lengths 4096 8192 --tokens 16

A passkey prompt of each length (key at a third of the filler) is answered greedily
through the default cascade twice in one process: with ``CascadeCache._evict`` as
shipped (a call's blocks stored, summarised and indexed at once) and with the round-4
per-block eviction. The tokens must be the same; the answer is printed too.
"""

from __future__ import annotations

import argparse

import mlotspark  # noqa: F401  (OpenBLAS before MLX)
from cascade_common import command_line, emit, load_engine, make_cache, passkey_prompt, run_greedy
from cascade_prefill import per_block_evict

from mlotspark.memory.cascade import CascadeCache, CascadeConfig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--key", type=int, default=52817)
    args = p.parse_args()
    engine = load_engine(args.model)
    config = CascadeConfig.for_model(engine.loaded.context_length)
    emit({"command": command_line(), "config": config.to_dict(), "model": engine.model_name}, None)
    batched = CascadeCache._evict
    same = True
    for n in args.lengths:
        ids = passkey_prompt(engine, n, depth=1 / 3, key=args.key)
        runs = {}
        for mode, evict in (("batched", batched), ("per-block", per_block_evict)):
            CascadeCache._evict = evict
            try:
                runs[mode] = run_greedy(engine, ids, make_cache(engine, "cascade", config), args.tokens, chunk=2048, stop=False)
            finally:
                CascadeCache._evict = batched
        equal = runs["batched"].tokens == runs["per-block"].tokens
        same &= equal
        emit({"length": len(ids), "tokens_equal": equal, "answer": runs["batched"].text,
              "per_block_answer": runs["per-block"].text, "key_found": str(args.key) in runs["batched"].text}, None)
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()

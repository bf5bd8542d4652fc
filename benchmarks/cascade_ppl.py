"""Perplexity of a long text: memory cascade vs full attention (and sinks + window).

    python benchmarks/cascade_ppl.py --tokens 8192 --window 512 --out ppl.jsonl

The text is Python's own documentation topics (``pydoc_data.topics``, shipped with
every CPython, PSF license): long English prose with code, the same on every
machine and nothing to download. The first ``--tokens`` tokens (raw, no chat
template) are fed in chunks of 512 through each cache; perplexity is reported over
all tokens and over the tokens past ``sinks + window`` (where the modes differ).
Keep ``--tokens`` below the trained context so full attention is the reference.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import mlotspark  # noqa: F401  (OpenBLAS before MLX: after it, MLX keeps its reference BLAS)
import mlx.core as mx
import mlx.nn as nn
from cascade_common import command_line, emit, load_engine, make_cache

from mlotspark.memory.cascade import CascadeConfig


def long_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def nll(engine, ids: list[int], cache: list, chunk: int) -> list[float]:
    """Negative log-likelihood of ids[1:], fed in chunks through ``cache``."""
    model, out = engine.loaded.model, []
    x = mx.array(ids)
    for i in range(0, len(ids) - 1, chunk):
        inp = x[i : min(i + chunk, len(ids) - 1)]
        logits = model(inp[None], cache=cache)[0]  # (L, V)
        target = x[i + 1 : i + 1 + inp.size]
        loss = nn.losses.cross_entropy(logits.astype(mx.float32), target)
        mx.eval(loss, [c.state for c in cache])
        out += loss.tolist()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--sinks", type=int, default=64)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--top-k-blocks", type=int, default=8)
    p.add_argument("--routing", default="hybrid")
    p.add_argument("--block-kind", default="float16")
    p.add_argument("--modes", nargs="*", default=["full", "cascade", "streaming"])
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()

    engine = load_engine(args.model)
    config = CascadeConfig(window=args.window, sinks=args.sinks, block_size=args.block_size,
                           top_k=args.top_k_blocks, routing=args.routing, block_kind=args.block_kind)
    ids = engine.encode(long_text(), raw=True)[: args.tokens]
    emit({"command": command_line(), "config": config.to_dict(), "tokens": len(ids), "model": engine.model_name}, args.out)
    far = config.sinks + config.window
    rows = {}
    for mode in args.modes:
        losses = nll(engine, ids, make_cache(engine, mode, config), args.chunk)
        ppl_all = math.exp(sum(losses) / len(losses))
        tail = losses[far:]
        ppl_far = math.exp(sum(tail) / len(tail)) if tail else float("nan")
        rows[mode] = (ppl_all, ppl_far)
        emit({"mode": mode, "ppl": round(ppl_all, 3), "ppl_past_window": round(ppl_far, 3), "tokens": len(ids)}, args.out)
    print(f"\n| mode | ppl (all {len(ids)} tokens) | ppl (tokens past sinks + window = {far}) |")
    print("|---|---|---|")
    for mode, (a, f) in rows.items():
        print(f"| {mode} | {a:.3f} | {f:.3f} |")


if __name__ == "__main__":
    main()

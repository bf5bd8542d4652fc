"""Peak memory of the question pass at 1M tokens on a random model (no suite: a side path no real model reaches here).

A random llama-family model with the KV shape of Qwen2.5-Coder-0.5B (2 KV heads of 64) and
few layers is prefilled through the cascade directly (``model(tokens, cache=...)``, pieces of
the window) and then runs the question pass (``prepare_decode``), so the pass's memory at 1M
tokens can be checked on the CPU in minutes. It says nothing about answers; the user-path
figures are ``ruler.py``'s (RESULTS "Long context").

    python benchmarks/question_pass_memory.py --tokens 1048576 --layers 2 --window 512 --block-kind q8
"""

from __future__ import annotations

import argparse
import time

import mlotspark  # noqa: F401  (OpenBLAS before MLX)
import mlx.core as mx

from mlotspark.memory.cascade import BLOCK_KINDS, CascadeConfig, make_cascade_cache
from mlotspark.models import llama


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=1 << 20)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--block-kind", default="q8", choices=BLOCK_KINDS)
    p.add_argument("--step", type=int, default=65536, help="tokens per prefill call (progress lines)")
    args = p.parse_args()
    cfg = dict(model_type="llama", hidden_size=128, num_hidden_layers=args.layers, intermediate_size=128,
               num_attention_heads=2, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=512,
               max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True)
    mx.random.seed(0)
    model = llama.Model(llama.ModelArgs.from_dict(cfg))
    mx.eval(model.parameters())
    config = CascadeConfig.for_model(32768, window=args.window, chunk=0, block_kind=args.block_kind,
                                     episodic_budget_mb=1e9)  # all in memory: the pass's own peak
    caches = make_cascade_cache(model, config)
    ids = mx.random.randint(0, 512, (args.tokens,)).tolist()
    t0 = time.perf_counter()
    for i in range(0, len(ids), args.step):
        out = model(mx.array(ids[i : i + args.step])[None], cache=caches)
        mx.eval(out[:, -1], [c.state for c in caches])
        print(f"{min(i + args.step, len(ids)):>9} tokens  {time.perf_counter() - t0:7.1f} s  "
              f"active {mx.get_active_memory() / 1e9:.2f} GB  peak {mx.get_peak_memory() / 1e9:.2f} GB", flush=True)
    prefill_peak = mx.get_peak_memory()
    t = time.perf_counter()
    caches[0].prepare_decode(model, caches, ids)
    print(f"question pass: {time.perf_counter() - t:.1f} s, passes {caches[0].question.passes}, "
          f"peak {mx.get_peak_memory() / 1e9:.2f} GB (prefill's {prefill_peak / 1e9:.2f} GB), "
          f"{caches[0].n_blocks} blocks a layer")


if __name__ == "__main__":
    main()

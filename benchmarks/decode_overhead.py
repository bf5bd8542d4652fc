"""Per-token cost of a decode step on a narrow twin (no suite: a diagnostic of the step, host time vs the whole step).

Models sharing the same float32 weights in one process: mlx-lm's llama class (the
yardstick) and ours under each execution strategy (``models/execution.py``): cpu (the
NumPy step, ``models/cpu/cpu_step.py``, the CPU default; and without it, one-token products
through ``models/cpu/matvec.py``), plain (``x @ W.T`` op by op) and gpu (the compiled decode
pieces, the default on a GPU). For each repetition,
interleaved:

- host ms/token: building one decode step's graph (model call + argmax), not evaluated;
  that is what ``mx.compile`` can remove, and what decides speed on Metal for small models.
  The NumPy step has no graph: its model call *is* the step, so this column is not
  comparable for it; see the next one;
- overhead ms/token: one whole step (built and run) of a twin of the same architecture
  (same layers, heads, ops) with every width cut to 64 and a 256-token vocabulary, so
  the arithmetic is ~0 and what is left is each path's per-op cost (Python, graph,
  dispatch): comparable across all paths;
- decode tok/s: mlx-lm's ``generate_step`` (its async_eval pipeline, greedy) for
  ``--tokens`` tokens after a chat prompt;
- share of the bandwidth limit: weight bytes per token x tok/s, over what NumPy's
  ``sgemv`` streams from the output layer's matrix (larger than the caches) in this run.

Medians over ``--reps`` repetitions; greedy tokens are checked equal across all.

    flock /tmp/mlotspark-bench.lock .venv/bin/python benchmarks/decode_overhead.py [--reps 5] [--tokens 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import mlotspark  # noqa: F401  isort: skip  (OpenBLAS before MLX)
import mlx.core as mx
from mlx_lm.generate import generate_step

from mlotspark.models import loader
from mlotspark.models.hub import catalogue
from mlotspark.models.execution import CpuRunner, Runner, prepare
from mlotspark.models.mlx_lm_twin import mlx_lm_twin
from mlotspark.platform import blas

PROMPT = "What is the capital of France? Answer in a few sentences."


def host_ms(model, prompt: mx.array, steps: int = 24) -> float:
    """Median ms to build (not run) one decode step's graph, the cache at the prompt."""
    cache = model.make_cache() if hasattr(model, "make_cache") else None
    if cache is None:
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(model)
    mx.eval(model(prompt[None], cache))
    tok = mx.array([[5]])
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        y = mx.argmax(model(tok, cache)[:, -1, :], axis=-1)
        times.append(time.perf_counter() - t)
        mx.eval(y)  # outside the timed part: compute is not host overhead
    return 1e3 * statistics.median(times)


def overhead_ms(make, loaded, steps: int = 24) -> float:
    """Median ms of one whole decode step of a narrow twin (same layers and ops, widths 64):
    the per-op cost of a path with ~no arithmetic."""
    from mlotspark.models.llama import Model, ModelArgs

    cfg = dict(loaded.model.args.__dict__)
    cfg.pop("extra", None)
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    cfg.update(hidden_size=16 * heads, head_dim=16, intermediate_size=64, vocab_size=256,
               num_key_value_heads=kv, rope_freq_factors=None)
    ours = make()
    if isinstance(ours, Runner) and isinstance(ours.model, Model):
        model = Model(ModelArgs.from_dict(cfg))
        mx.eval(model.parameters())
        # the same runner, fused as the loader leaves ours
        narrow = prepare(model, CpuRunner(numpy_step=ours.numpy_step) if ours.name == "cpu" else ours.name)
    else:  # mlx-lm's class
        from mlx_lm.models import llama as mlx_lm_llama

        narrow = mlx_lm_llama.Model(mlx_lm_llama.ModelArgs.from_dict(cfg))
        mx.eval(narrow.parameters())
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(narrow)
    mx.eval(narrow(mx.array([[1] * 40]), cache))
    times = []
    for i in range(steps + 4):
        t = time.perf_counter()
        y = mx.argmax(narrow(mx.array([[i % 256]]), cache)[:, -1, :], axis=-1)
        mx.eval(y)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times[4:])


def sgemv_gbs(loaded, reps: int = 9) -> float:
    """GB/s that NumPy's sgemv streams from the largest weight matrix (the output layer)."""
    import numpy as np

    from mlx.utils import tree_flatten

    w = max((v for _, v in tree_flatten(loaded.model.parameters()) if v.ndim == 2), key=lambda v: v.size)
    a = np.asarray(w.astype(mx.float32)) if w.dtype != mx.float32 else np.asarray(w)
    x = np.ones(a.shape[1], np.float32)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        a @ x
        times.append(time.perf_counter() - t)
    return a.nbytes / statistics.median(times) / 1e9


def decode(model, prompt: mx.array, n: int) -> tuple[float, list[int]]:
    """tok/s of n greedy tokens through generate_step (first token excluded), and the tokens."""
    toks, t_first = [], None
    for tok, _ in generate_step(prompt, model, max_tokens=n):
        toks.append(int(tok))
        if t_first is None:
            t_first = time.perf_counter()
    return (len(toks) - 1) / (time.perf_counter() - t_first), toks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--model", default=None, help="alias, .gguf or model directory (default: the default model)")
    ap.add_argument("--weights", default="float32", help="weight format (default float32; 'auto' on a GPU = as stored)")
    args = ap.parse_args()
    loaded = loader.load(catalogue.resolve(args.model, pull=False, progress=False), weights=args.weights)
    on_gpu = mx.default_device().type == mx.DeviceType.gpu
    ours, twin = loaded.model, mlx_lm_twin(loaded)
    prompt = mx.array(loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True))

    def ours_with(strategy):
        def make():  # the loader fused the weights already: they stay fused across runners
            return prepare(ours, strategy() if callable(strategy) else strategy)
        return make

    runs = {
        "mlx-lm": lambda: twin,
        "ours, plain (x@W.T)": ours_with("plain"),  # x @ W.T products, no fused step
        "ours, gpu (pieces)": ours_with("gpu"),  # the GPU strategy
    }
    if not on_gpu:  # models/cpu/cpu_step.py and models/cpu/matvec.py are CPU (OpenBLAS) paths
        runs["ours, cpu (NumPy step)"] = ours_with(lambda: CpuRunner(fuse=False))  # the CPU default now
        runs["ours, cpu, no NumPy (matvec)"] = ours_with(lambda: CpuRunner(fuse=False, numpy_step=False))  # the MLX step with matvec layouts
    for make in runs.values():  # warm-up: compile, first allocations
        decode(make(), prompt, 8)
    host = {k: [] for k in runs}
    over = {k: [] for k in runs}
    tps = {k: [] for k in runs}
    gbs = []
    tokens = {}
    for _ in range(args.reps):
        if not on_gpu:
            gbs.append(sgemv_gbs(loaded))
        for name, make in runs.items():
            host[name].append(host_ms(make(), prompt))
            over[name].append(overhead_ms(make, loaded))
            rate, toks = decode(make(), prompt, args.tokens)
            tps[name].append(rate)
            tokens[name] = toks
    where = f"device {mx.default_device()}" if on_gpu else (
        f"BLAS: {blas.BLAS_IN_USE}; OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
    print(f"{where}; {args.reps} reps, {args.tokens} tokens; weights {loaded.nbytes() / 1e6:.0f} MB {args.weights}")
    base = statistics.median(tps["mlx-lm"])
    bw = statistics.median(gbs) if gbs else float("nan")
    if gbs:
        print(f"NumPy sgemv on the largest weight: {bw:.1f} GB/s (the bandwidth limit below)")
    print(f"{'':<26} {'host ms/token':>14} {'overhead ms':>12} {'decode tok/s':>13} {'vs mlx-lm':>10} {'of bw limit':>12}")
    for name in runs:
        t = statistics.median(tps[name])
        share = loaded.nbytes() * t / 1e9 / bw
        print(f"{name:<26} {statistics.median(host[name]):>14.2f} {statistics.median(over[name]):>12.2f} "
              f"{t:>13.1f} {t / base:>9.2f}x {share:>11.0%}")
    same = len({tuple(t) for t in tokens.values()}) == 1
    print("greedy tokens identical across all:", same)


if __name__ == "__main__":
    main()

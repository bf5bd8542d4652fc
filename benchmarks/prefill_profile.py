"""Profile of MLX's CPU prefill ops (no suite: it times ops one by one; `--suite pp` gives the total).

Loads the default model in float32 and (1) times one ``-L``-token forward pass op by op
(each op evaluated alone: GEMMs q/k/v/o/gate/up/down with their GFLOP/s, attention,
RMSNorm, RoPE, ``silu * up``, residuals), with MLX's ops and with ``models/cpu/prefill_ops.py``;
(2) times whole forward passes (prefill into a fresh KV cache, the logits never
evaluated, as both engines prefill) of our model in each variant against mlx-lm's
llama class on the same weights, interleaved in one process, medians::

    OPENBLAS_NUM_THREADS=1 flock /tmp/mlotspark-bench.lock .venv/bin/python benchmarks/prefill_profile.py [-L 511] [--reps 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlotspark  # noqa: F401  isort: skip  (OpenBLAS before MLX)
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from mlotspark.models import loader
from mlotspark.models.hub import catalogue
from mlotspark.models.cpu import prefill_ops
from mlotspark.models.mlx_lm_twin import mlx_lm_twin

VARIANTS = {  # name -> (prefill_ops.ENABLED, prefill_ops.EXPLICIT_SOFTMAX)
    "MLX ops (before)": (False, False),
    "blocked SDPA + fast silu (default)": (True, False),
    "blocked explicit softmax + fast silu": (True, True),
}


def set_variant(name: str) -> None:
    prefill_ops.ENABLED, prefill_ops.EXPLICIT_SOFTMAX = VARIANTS[name]


def forward_s(model, ids: mx.array, ref: bool) -> float:
    cache = make_prompt_cache(model) if ref else model.make_cache()
    t = time.perf_counter()
    model(ids, cache=cache)
    mx.eval([c.state for c in cache])
    return time.perf_counter() - t


def profile(model, ids: mx.array, reps: int) -> dict[str, float]:
    """Seconds per forward pass by op category, each op evaluated on its own."""
    times: dict[str, float] = {}

    def op(name, fn, *args):
        mx.eval(*args)
        t = time.perf_counter()
        y = fn(*args)
        mx.eval(y)
        times[name] = times.get(name, 0.0) + time.perf_counter() - t
        return y

    L = ids.shape[1]
    for rep in range(reps + 1):
        if rep == 1:
            times.clear()  # the first pass warms up
        h = model.model.embed_tokens(ids)
        for layer in model.model.layers:
            a, mlp = layer.self_attn, layer.mlp
            x = op("RMSNorm", layer.input_layernorm, h)
            q = op("GEMM q", a.q_proj, x).reshape(1, L, a.n_heads, -1).transpose(0, 2, 1, 3)
            k = op("GEMM k", a.k_proj, x).reshape(1, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
            v = op("GEMM v", a.v_proj, x).reshape(1, L, a.n_kv_heads, -1).transpose(0, 2, 1, 3)
            q, k = op("RoPE", a.rope, q), op("RoPE", a.rope, k)
            o = op("attention", lambda q, k, v: a.attend(q, k, v, mask="causal", cache=_Rotated()), q, k, v)
            o = op("GEMM o", a.output, o)
            h = op("residual", lambda x, y: x + y, h, o)
            x = op("RMSNorm", layer.post_attention_layernorm, h)
            g, u = op("GEMM gate", mlp.gate_proj, x), op("GEMM up", mlp.up_proj, x)
            if prefill_ops.ENABLED:  # the CPU strategy's forms (this runs on the CPU backend)
                s = op("silu * up", prefill_ops.silu_mul, g, u)
            else:
                s = op("silu * up", lambda g, u: nn.silu(g) * u, g, u)
            h = op("residual", lambda x, y: x + y, h, op("GEMM down", mlp.down_proj, s))
    return {k: v / reps for k, v in times.items()}


class _Rotated:
    """A stand-in cache for ``Attention.attend``: q, k arrive rotated, no past."""

    def attend(self, q, k, v, *, rope, scale, mask):
        if prefill_ops.ENABLED:
            return prefill_ops.causal_attention(q, k, v, scale=scale)
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-L", type=int, default=511, help="prompt tokens per pass (default 511: pp512 less the step token)")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    loaded = loader.load(catalogue.resolve(None, pull=False, progress=False), weights="float32")
    ours, twin = loaded.model, mlx_lm_twin(loaded)
    cfg = loaded.config
    d, f, L = cfg["hidden_size"], cfg["intermediate_size"], args.L
    kv = cfg["num_key_value_heads"] * d // cfg["num_attention_heads"]
    macs = {"GEMM q": d * d, "GEMM k": d * kv, "GEMM v": d * kv, "GEMM o": d * d,
            "GEMM gate": d * f, "GEMM up": d * f, "GEMM down": d * f}
    n_layers = cfg["num_hidden_layers"]
    ids = mx.random.randint(0, cfg["vocab_size"], (1, L))
    for name in ("MLX ops (before)", "blocked SDPA + fast silu (default)"):
        set_variant(name)
        prof = profile(ours, ids, args.reps)
        total = sum(prof.values())
        print(f"\n{name}: op by op {total * 1e3:.0f} ms per {L}-token pass")
        for k, s in sorted(prof.items(), key=lambda kv: -kv[1]):
            rate = f"  {2 * macs[k] * L * n_layers / s / 1e9:.0f} GFLOP/s" if k in macs else ""
            print(f"  {k:12s} {s * 1e3:7.1f} ms {100 * s / total:5.1f}%{rate}")
        gemm = sum(s for k, s in prof.items() if k in macs)
        print(f"  GEMMs {gemm * 1e3:.0f} ms at {2 * sum(macs.values()) * L * n_layers / gemm / 1e9:.0f} GFLOP/s")
    names = list(VARIANTS)
    for name in names:  # warm-up, compiles included
        set_variant(name)
        forward_s(loaded.runner, ids, False)  # the runner's caches get its attention
    forward_s(twin, ids, True)
    got: dict[str, list[float]] = {n: [] for n in names + ["mlx-lm"]}
    for rep in range(args.reps):
        order = names + ["mlx-lm"]
        for name in order if rep % 2 == 0 else order[::-1]:
            if name == "mlx-lm":
                got[name].append(forward_s(twin, ids, True))
            else:
                set_variant(name)
                got[name].append(forward_s(loaded.runner, ids, False))
    ref = statistics.median(got["mlx-lm"])
    print(f"\nwhole {L}-token prefill pass, medians of {args.reps}, interleaved:")
    print(f"  {'mlx-lm':38s} {ref * 1e3:7.0f} ms  {L / ref:6.1f} tok/s  1.00x")
    for name in names:
        t = statistics.median(got[name])
        print(f"  {name:38s} {t * 1e3:7.0f} ms  {L / t:6.1f} tok/s  {ref / t:.2f}x")
    set_variant("blocked SDPA + fast silu (default)")
    a, b = ours(ids), twin(ids)
    print(f"logits vs mlx-lm: max |diff| {mx.abs(a - b).max().item():.2e}, "
          f"argmax equal at every position: {mx.array_equal(a.argmax(-1), b.argmax(-1)).item()}")


if __name__ == "__main__":
    main()

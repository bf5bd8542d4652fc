"""Issue 12: per-token overhead of two versions of the NumPy decode step, in one process.

Both steps run a narrow twin of the default model's architecture (30 layers, 9 heads over 3
KV heads, every width cut to 64 or 144, 256-token vocabulary: the arithmetic ~0, what is left is
each step's per-call cost), interleaved repetition by repetition; the old one on the separate
q/k/v and gate/up weights, the new one on the same values fused as ``execution.fuse_projections``
leaves them (the loader's form). Prints medians and the new/old ratio, and checks the logits agree.

    git worktree add /tmp/old-step <commit>
    flock /tmp/mlotspark-bench.lock python benchmarks/cpu_step_ab.py --old /tmp/old-step/mlotspark/models/cpu/cpu_step.py [--old-fused]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import mlotspark  # noqa: F401  isort: skip  (OpenBLAS before MLX)
import mlx.core as mx
import numpy as np

from mlotspark.models.cpu import cpu_step
from mlotspark.models.execution import fuse_projections
from mlotspark.models.llama import Model, ModelArgs

NARROW = dict(num_hidden_layers=30, hidden_size=144, num_attention_heads=9, num_key_value_heads=3,
              head_dim=16, intermediate_size=64, vocab_size=256, rms_norm_eps=1e-5, model_type="llama",
              tie_word_embeddings=True, rope_theta=100000.0)


def one_rep(plan, model, steps: int) -> tuple[float, np.ndarray]:
    """Median ms of ``steps`` one-token steps after a 40-token prompt, and the last logits."""
    cache = model.make_cache()
    mx.eval(model(mx.array([[1] * 40]), cache))
    times = []
    for i in range(steps):
        t = time.perf_counter()
        y = plan(i % 256, cache)
        mx.eval(y)
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times[4:]), np.array(y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="path of the old cpu_step.py")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--old-fused", action="store_true", help="the old step reads the fused weights too")
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("old_cpu_step", args.old)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    separate = Model(ModelArgs.from_dict(NARROW))
    mx.eval(separate.parameters())
    fused = Model(ModelArgs.from_dict(NARROW))
    fused.update(separate.parameters())
    mx.eval(fused.parameters())
    fuse_projections(fused)
    if args.old_fused:
        separate = fused
    plans = old.CpuStep.build(separate), cpu_step.CpuStep.build(fused)
    t_old, t_new = [], []
    for _ in range(args.reps):
        a, ya = one_rep(plans[0], separate, args.steps)
        b, yb = one_rep(plans[1], fused, args.steps)
        t_old.append(a)
        t_new.append(b)
    print(f"max |logit difference| {float(np.abs(ya - yb).max()):.1e}")
    print(f"old {statistics.median(t_old):.3f} ms, new {statistics.median(t_new):.3f} ms per step; "
          f"new/old {statistics.median(t_new) / statistics.median(t_old):.3f} "
          f"(median of the per-repetition ratios {statistics.median(b / a for a, b in zip(t_old, t_new)):.3f})")


if __name__ == "__main__":
    main()

"""Hardware probe: what one-token attention costs over a padded KV buffer with a mask vs the exact slice.

The whole-step compiled decode (``models/compiled_step.py``, since deleted: it measured
slower than the per-layer pieces) attended over the cache's whole buffer and hid the
positions past the offset with a mask, because a compiled step cannot slice at a
data-dependent length. This times, for one token and the default model's shapes
(9 query heads, 3 KV heads, head 64), per layer call:

- ``slice``: ``mx.fast.scaled_dot_product_attention`` on ``keys[..., :n, :]`` (the op-by-op path);
- ``additive``: the whole buffer with an additive float mask (what compiled_step did);
- ``bool``: the whole buffer with a boolean mask;
- ``manual``: scores, softmax and the weighted sum written out, with the additive mask.

Medians of ``--reps`` timings of 30 chained calls (one per layer) evaluated together.

    python benchmarks/sdpa_mask.py [--dtype float16] [--lengths 165 1000 4000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--lengths", type=int, nargs="*", default=[165, 1000, 4000])
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    dt = getattr(mx, args.dtype)
    H, KV, D, layers, scale = 9, 3, 64, 30, 64**-0.5
    print(f"device {mx.default_device()}, {args.dtype}, {layers} layers per timing, median of {args.reps}")
    print(f"{'live positions':>15} {'buffer':>7} " + " ".join(f"{k:>10}" for k in ("slice", "additive", "bool", "manual")) + "  (ms)")
    for n in args.lengths:
        cap = ((n + 255) // 256) * 256
        q = mx.random.normal((1, H, 1, D)).astype(dt)
        ks = [mx.random.normal((1, KV, cap, D)).astype(dt) for _ in range(layers)]
        vs = [mx.random.normal((1, KV, cap, D)).astype(dt) for _ in range(layers)]
        live = mx.arange(cap) < n
        add = mx.where(live, 0.0, -mx.inf).astype(dt)

        def manual(q, k, v, m):
            qg = q.reshape(1, KV, H // KV, 1, D)
            s = (qg @ k[:, :, None].swapaxes(-1, -2)) * scale + m
            return (mx.softmax(s.astype(mx.float32), axis=-1).astype(dt) @ v[:, :, None]).reshape(1, H, 1, D)

        variants = {
            "slice": lambda q, k, v: mx.fast.scaled_dot_product_attention(q, k[..., :n, :], v[..., :n, :], scale=scale),
            "additive": lambda q, k, v: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=add),
            "bool": lambda q, k, v: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=live),
            "manual": lambda q, k, v: manual(q, k, v, add),
        }
        ref = variants["slice"](q, ks[0], vs[0])
        times = {}
        for name, f in variants.items():
            err = float(mx.abs(f(q, ks[0], vs[0]).astype(mx.float32) - ref.astype(mx.float32)).max())
            assert err < 2e-2, (name, err)

            def chain():
                x = q
                for k, v in zip(ks, vs):
                    x = f(x, k, v)
                return x

            mx.eval(chain())
            ts = []
            for _ in range(args.reps):
                t = time.perf_counter()
                mx.eval(chain())
                ts.append(time.perf_counter() - t)
            times[name] = 1e3 * statistics.median(ts)
        print(f"{n:>15} {cap:>7} " + " ".join(f"{times[k]:>10.3f}" for k in variants))


if __name__ == "__main__":
    main()

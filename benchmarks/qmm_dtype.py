"""Hardware probe: float32 vs float16 activations through MLX's CPU quantized_matmul (8 x 576 by 1536 x 576, 4-bit, group 32): median of 5 (benchmarks/figures/mac.md)."""
import statistics, time
import mlotspark  # noqa: F401  (OpenBLAS before MLX)
import mlx.core as mx
w = mx.random.normal((1536, 576)); wq, s, b = mx.quantize(w, group_size=32, bits=4)
res = {}
for dt in (mx.float32, mx.float16):
    x = mx.random.normal((8, 576)).astype(dt); s2, b2 = s.astype(dt), b.astype(dt); mx.eval(x, s2, b2)
    ts = []
    for _ in range(5):
        t = time.perf_counter(); mx.eval(mx.quantized_matmul(x, wq, s2, b2, transpose=True, group_size=32, bits=4)); ts.append(time.perf_counter() - t)
    res[str(dt)] = statistics.median(ts)
print(res, "ratio f16/f32 = %.1f" % (res["mlx.core.float16"] / res["mlx.core.float32"]))

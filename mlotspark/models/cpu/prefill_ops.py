"""Prefill (many tokens at once) on the CPU backend: the work around the GEMMs, made cheaper.

A 511-token prefill of the default model in float32 on this CPU spent ~0.56 s in OpenBLAS GEMMs (at ~190 GFLOP/s, the single-core
peak) but ~0.93 s in MLX's CPU attention and ~0.34 s in ``silu(gate) * up``. Both are
bound by ``exp``: MLX's CPU backend computes it one element at a time with the C library
(~10 ns per element here), against ~0.3 ns per element for a vectorised multiply.
Two changes, each measured against the same OpenBLAS:

- ``causal_attention``: causal attention in query blocks, each attending only to the
  keys it can see, so the masked upper triangle (about half the scores, and their
  ``exp``) is never computed; the softmax written out with ``fast_exp`` (below), the
  scores and weighted values as OpenBLAS matmuls per KV head.
- ``silu_mul``: ``silu(g) * u`` with ``fast_exp``: ``exp`` as a polynomial (range reduction to
  ``2^n * 2^f``, |f| <= 1/2, degree-7 Taylor series, relative error ~1e-7, about
  float32's rounding), compiled into one vectorised loop.

Neither is used for one-token decode steps or on a GPU (where ``exp`` is fast): they are
forms of the CPU runner (``models/execution.py``), whose caches get ``cpu_attention`` as
their attention when they are made and whose MLPs get ``silu_mul`` at load.
"""

from __future__ import annotations

import math
from typing import Any

import mlx.core as mx

__all__ = ["ATTENTION_BLOCK", "attention", "causal_attention", "cpu_attention", "fast_exp", "silu_mul"]

#: Queries per block of ``causal_attention``. Measured for 511 tokens, 9 heads
#: (benchmarks/prefill_profile.py): 64 -> 17 ms per layer, 128 -> 19, 256 -> 26, one
#: masked call 29. Smaller blocks skip more of the triangle but call more often.
ATTENTION_BLOCK = 64

#: Softmax inside ``causal_attention`` written out with ``fast_exp`` (scores and
#: weighted values by OpenBLAS matmuls) instead of MLX's CPU SDPA per block, whose
#: softmax calls the C library's ``exp`` per score: a 511-token pass 894 ms against
#: 1312 ms (mlx-lm 1651 ms).
EXPLICIT_SOFTMAX = True

_LOG2E = 1.0 / math.log(2.0)
# ln(2)^k / k! for k = 7..0: 2^f = exp(f ln 2) as a Taylor series, Horner order.
_POLY = [math.log(2.0) ** k / math.factorial(k) for k in range(7, -1, -1)]


#: Master switch (benchmarks/prefill_profile.py turns it off to time MLX's own ops).
ENABLED = True

def fast_exp(x: mx.array) -> mx.array:
    """``exp(x)`` for float32 from vectorisable operations.

    ``exp(x) = 2^n * 2^f`` with ``n = round(x log2 e)`` and ``|f| <= 1/2``; ``2^f`` by a
    degree-7 polynomial (truncation error < 2e-8 relative), ``2^n`` by writing ``n + 127``
    into the exponent bits. Inputs are clipped to [-87, 88], so the result stays a
    normal float: ``exp(-inf)`` gives ~1e-38 instead of 0 (callers add or divide by it).

    Args:
        x: float32 array.

    Returns:
        An array of ``x``'s shape, within ~1e-7 relative of ``mx.exp(x)`` (for |x| <= 87).
    """
    y = mx.clip(x, -87.0, 88.0) * _LOG2E
    n = mx.round(y)
    f = y - n
    p = _POLY[0]
    for c in _POLY[1:]:
        p = p * f + c
    scale = mx.view(mx.left_shift(n.astype(mx.int32) + 127, 23), mx.float32)
    return p * scale


def _silu_mul(g: mx.array, u: mx.array) -> mx.array:
    return g * u / (1.0 + fast_exp(-g))


#: ``silu(g) * u`` as one compiled loop (not shapeless: ``mx.view`` cannot infer shapes; a new
#: chunk length retraces in ~ms, the C++ kernel itself is built once and cached by MLX).
_silu_mul_compiled = mx.compile(_silu_mul)


def silu_mul(g: mx.array, u: mx.array) -> mx.array:
    """``silu(g) * u`` (the gated MLP's activation) with ``fast_exp``.

    Args:
        g: gate projection, float32.
        u: up projection, same shape.

    Returns:
        ``g * sigmoid(g) * u`` within ~1e-6 relative of ``nn.silu(g) * u``.
    """
    if g.dtype != mx.float32:  # the bit trick is float32's; others keep MLX's exp
        return g * mx.sigmoid(g) * u
    return _silu_mul_compiled(g, u)


def causal_attention(q: mx.array, k: mx.array, v: mx.array, *, scale: float, block: int = ATTENTION_BLOCK) -> mx.array:
    """Causal attention of the last ``L`` positions, skipping what the mask hides.

    The queries are the newest ``L`` of the ``T`` keys (MLX's ``mask="causal"``
    convention: query ``i`` sees keys ``0 .. T - L + i``). Each block of queries attends
    to the keys up to its own last position only, with the causal mask inside.

    Args:
        q: queries (B, Hq, L, D), already rotated.
        k, v: keys and values (B, Hkv, T, D), T >= L, Hq a multiple of Hkv.
        scale: score scale (usually D ** -0.5).
        block: queries per block (default ``ATTENTION_BLOCK``).

    Returns:
        (B, Hq, L, D), equal to ``scaled_dot_product_attention(..., mask="causal")`` up
        to float32 summation order.
    """
    L, T = q.shape[2], k.shape[2]
    if L <= block:
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")
    past = T - L
    if EXPLICIT_SOFTMAX and q.dtype == mx.float32:
        return _explicit(q, k, v, scale, block, past)
    outs: list[Any] = []
    for s in range(0, L, block):
        e = min(L, s + block)
        outs.append(mx.fast.scaled_dot_product_attention(
            q[:, :, s:e], k[:, :, : past + e], v[:, :, : past + e], scale=scale, mask="causal"))
    return mx.concatenate(outs, axis=2)


def attention(q: mx.array, k: mx.array, v: mx.array, *, scale: float, mask: Any = None) -> mx.array:
    """MLX's ``scaled_dot_product_attention``: the attention a cache gets by default.

    Args:
        q: rotated queries (B, Hq, L, D); k, v: every key and value attended (B, Hkv, T, D).
        scale: score scale; mask: MLX's mask argument (``"causal"``, an array or None).

    Returns:
        (B, Hq, L, D).
    """
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


def cpu_attention(q: mx.array, k: mx.array, v: mx.array, *, scale: float, mask: Any = None) -> mx.array:
    """``attention`` with a ``"causal"`` mask going through ``causal_attention``: the
    attention of the caches the CPU runner makes (same arguments, same result up to
    float32 summation order)."""
    if isinstance(mask, str) and mask == "causal" and ENABLED:
        return causal_attention(q, k, v, scale=scale)
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)


_shifted_exp = mx.compile(lambda s, m: fast_exp(s - m))


def _explicit(q: mx.array, k: mx.array, v: mx.array, scale: float, block: int, past: int) -> mx.array:
    """``causal_attention`` with the softmax written out: scores and weighted values as
    batched matmuls per KV head (the query heads sharing it stacked), ``fast_exp``."""
    B, H, L, D = q.shape
    Hk = k.shape[1]
    qs = (q * scale).reshape(B, Hk, H // Hk, L, D)
    outs: list[Any] = []
    for s in range(0, L, block):
        e = min(L, s + block)
        keys, values = k[:, :, None, : past + e], v[:, :, None, : past + e]
        scores = qs[:, :, :, s:e] @ keys.swapaxes(-1, -2)  # (B, Hk, rep, n, past + e)
        seen = mx.arange(past + e)[None] <= (past + s + mx.arange(e - s))[:, None]
        scores = mx.where(seen, scores, -mx.inf)
        w = _shifted_exp(scores, scores.max(-1, keepdims=True))
        outs.append((w @ values) / w.sum(-1, keepdims=True))
    return mx.concatenate(outs, axis=3).reshape(B, H, L, D)

"""One-token matrix-vector products in the form OpenBLAS runs fastest (CPU decode).

MLX's CPU backend sends every float32 matmul to ``cblas_sgemm``; it has no GEMV path.
For one decoded token ``x @ W.T`` is an sgemm with one row, and OpenBLAS runs it
one of two ways (measured here; ``git show bce40ee:benchmarks/history/RESULTS-rounds-1-6.md``):

- up to 1e6 multiply-adds (``M*N*K``) it takes its small-matrix kernel, which
  streams the weights at ~3x the speed; but ``x @ W.T`` is its "TN" case, which it
  refuses past 1200 outputs (OpenBLAS ``sgemm_small_kernel_permit_skylakex.c``), so
  the MLP's 1536-row weights miss it in that orientation and take it as ``W @ x``;
- past that it packs the weights before multiplying: ~1/3 of the bandwidth. The tied
  49152x576 output layer (113 MB, a fifth of the model) always went that way.

So a one-token product is written ``W @ x``, and a weight past the limit is split into
row blocks under it, one batched matmul (each block one small sgemm). The reshape of
a contiguous weight is a view: no copy of the weights, same RAM. The vector is tiled
across the blocks on purpose: with a broadcast (stride 0) vector MLX folds the batch
back into one large sgemm. Numerics differ from ``x @ W.T`` only in summation order
(~1e-5 on logits).

Metal and CUDA have real GEMV kernels for one-row matmuls in either orientation, so
this form is used on the CPU only (the CPU execution strategy, ``models/execution.py``).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

#: Most multiply-adds one sgemm may take and still run OpenBLAS's small-matrix kernel
#: (its x86-64 permit function refuses ``M*N*K`` past 100^3).
SMALL_GEMM = 1_000_000


def block_rows(n: int, k: int, limit: int = SMALL_GEMM) -> int:
    """Rows per block so that a (rows, k) block stays under ``limit`` multiply-adds.

    Prefers a divisor of ``n`` (one batched matmul, no remainder) among the next few
    block counts.

    Args:
        n: rows of the weight.
        k: columns of the weight (the input size).
        limit: the most multiply-adds per block (default ``SMALL_GEMM``).

    Returns:
        Rows per block, at least 1; ``n`` when the whole weight fits.
    """
    most = max(1, limit // max(1, k))
    if n <= most:
        return n
    blocks = -(-n // most)
    for b in range(blocks, blocks + 16):
        if n % b == 0:
            return n // b
    return most


def matvec(weight: mx.array, x: mx.array) -> mx.array:
    """``x @ weight.T`` for one token, as ``weight @ x`` in small-kernel blocks.

    Args:
        weight: (N, K) row-contiguous weight (a loaded parameter; a strided view
            would be copied by the reshape).
        x: (..., K) holding a single row (``x.size == K``).

    Returns:
        ``x.shape[:-1] + (N,)``.
    """
    n, k = weight.shape
    lead = x.shape[:-1]
    col = x.reshape(k, 1)
    rows = block_rows(n, k)
    if rows == n:
        return (weight @ col).reshape(*lead, n)
    blocks = n // rows
    body = blocks * rows
    # (blocks, rows, K) @ (blocks, K, 1): a real (tiled) vector keeps the batch apart.
    tiled = mx.repeat(col[None], blocks, axis=0)
    out = (weight[:body].reshape(blocks, rows, k) @ tiled).reshape(body)
    if body < n:
        out = mx.concatenate([out, (weight[body:] @ col).reshape(n - body)])
    return out.reshape(*lead, n)


class MatvecLinear(nn.Linear):
    """``nn.Linear`` whose one-token calls go through ``matvec``.

    Same parameters as ``nn.Linear`` (so weights, ``nn.quantize`` and sharding see a
    Linear). The model never builds one: the CPU execution strategy turns a loaded
    model's ``nn.Linear`` layers into these (``models/execution.py``).
    """

    def __call__(self, x: mx.array) -> mx.array:
        if x.size == x.shape[-1]:
            y = matvec(self.weight, x)
            return y + self.bias if "bias" in self else y
        return super().__call__(x)


class MatvecEmbedding(nn.Embedding):
    """``nn.Embedding`` whose tied output layer (``as_linear``) takes one token through
    ``matvec``: that 49152x576 weight (113 MB, a fifth of the default model) is past
    OpenBLAS's small-kernel limit in either orientation. Set by the CPU strategy too."""

    def as_linear(self, x: mx.array) -> mx.array:
        if x.size == x.shape[-1]:
            return matvec(self.weight, x)
        return super().as_linear(x)

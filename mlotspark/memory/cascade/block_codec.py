"""How a block's keys and values are packed: float16, or quantized along D (q8 / q4).

A block is ``(Hkv, B, D)`` keys or values of one layer; ``encode`` packs one block,
``encode_blocks`` many in one op per stored array, ``decode`` unpacks; the store
(``blocks.py``) decides which kind each block gets and when.
"""

from __future__ import annotations

import mlx.core as mx

from mlotspark.errors import StoreError

_BITS = {"q8": 8, "q4": 4}
#: How a block's payload can be stored (``auto`` is a policy over the first two).
STORED_KINDS = ("float16", "q8", "q4")


def quant_group(n: int) -> int | None:
    """Quantization group size for ``n`` elements per KV head, None if none fits."""
    return next((g for g in (64, 32) if n % g == 0), None)


def encode(x: mx.array, kind: str) -> dict[str, mx.array]:
    """Pack ``x`` (Hkv, B, D) for storage.

    Quantized kinds group along the flattened (B * D) row of each KV head, so a
    group is one token's D values when D is 64 (and spans tokens when D is smaller).

    Args:
        x: keys or values of one block.
        kind: ``float16 | q8 | q4``.

    Returns:
        ``{"w": float16 (Hkv, B, D)}`` or the quantized triple ``{"w", "scales", "biases"}``.
    """
    if kind == "float16":
        return {"w": x.astype(mx.float16)}
    H, B, D = x.shape
    g = quant_group(B * D)
    if g is None:
        raise StoreError(f"cannot quantize blocks of {B} x {D} values: need a multiple of 32")
    w, scales, biases = mx.quantize(x.reshape(H, B * D), group_size=g, bits=_BITS[kind])
    return {"w": w, "scales": scales, "biases": biases}


def encode_blocks(x: mx.array, kind: str) -> dict[str, mx.array]:
    """Pack ``n`` blocks at once, ``x`` (n, Hkv, B, D): ``encode`` of each block, in
    one op per stored array instead of one per block.

    Quantization groups lie within a row of one KV head of one block, so row ``j *
    Hkv + h`` of the result is exactly what ``encode(x[j])`` gives for head ``h``.

    Returns:
        The arrays of ``encode`` with ``n * Hkv`` leading rows, block-major.
    """
    n, H, B, D = x.shape
    if kind == "float16":
        return {"w": x.astype(mx.float16).reshape(n * H, B, D)}
    g = quant_group(B * D)
    if g is None:
        raise StoreError(f"cannot quantize blocks of {B} x {D} values: need a multiple of 32")
    w, scales, biases = mx.quantize(x.reshape(n * H, B * D), group_size=g, bits=_BITS[kind])
    return {"w": w, "scales": scales, "biases": biases}


def split_blocks(a: mx.array, n: int) -> list[mx.array]:
    """``a`` cut into ``n`` equal groups of leading rows (views, no copy).

    MLX makes one ``Split`` op for up to 10 pieces but one ``Slice`` op per piece past
    that, so more pieces are cut in levels of at most 10 (16 blocks: 3 ops, not 16).
    """
    if n <= 10:
        return mx.split(a, n, axis=0) if n > 1 else [a]
    k = min(10, -(-n // 10))
    bounds = [n * i // k for i in range(k + 1)]
    rows = a.shape[0] // n
    parts = mx.split(a, [b * rows for b in bounds[1:-1]], axis=0)
    return [x for p, lo, hi in zip(parts, bounds, bounds[1:]) for x in split_blocks(p, hi - lo)]


def decode(packed: dict[str, mx.array], kind: str, dtype: mx.Dtype, shape: tuple[int, int, int]) -> mx.array:
    """Inverse of ``encode``: (Hkv, B, D) = ``shape`` in ``dtype``."""
    if kind == "float16":
        return packed["w"].astype(dtype)
    H, T, D = shape
    g = packed["w"].shape[-1] * 32 // _BITS[kind] // packed["scales"].shape[-1]
    x = mx.dequantize(packed["w"], packed["scales"], packed["biases"], group_size=g, bits=_BITS[kind])
    return x.reshape(shape).astype(dtype)

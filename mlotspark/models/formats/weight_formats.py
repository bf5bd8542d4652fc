"""What precision each GGUF format runs at, and re-quantization to MLX's affine format.

The rule (issue "Runs the GGUF files people actually download"):

- CPU backend, ``--weights auto``: every tensor runs as float32 (only float32 reaches
  BLAS there; DESIGN §2), whatever the file stored.
- Metal / CUDA (or ``--weights quantized``): Q4_0 / Q4_1 / Q8_0 read by MLX itself
  stay MLX-quantized as stored (exact). Formats MLX cannot unpack are dequantized by
  ``gguf`` and re-quantized with ``mx.quantize`` (affine, group 32): formats of 4
  bits or fewer to 4-bit, which loses nothing the file had not already lost at that
  width; 5- to 8-bit formats (Q5_*, Q6_K, Q8_0) to 8-bit, so they keep their
  precision instead of dropping to 4-bit.
- float16 / bfloat16 / float32 requested: everything dequantized to that dtype.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

GROUP_SIZE = 32  # matches the 32-element blocks of the legacy formats and K-quant sub-blocks

#: MLX affine bits a dequantized GGUF format is re-quantized to.
REQUANT_BITS: dict[str, int] = {
    **dict.fromkeys(["Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K", "IQ4_NL", "IQ4_XS",
                     "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
                     "TQ1_0", "TQ2_0", "MXFP4"], 4),
    **dict.fromkeys(["Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "Q8_1", "Q8_K"], 8),
}
FLOAT_TYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float32"}
# general.file_type values of files whose 4-bit blocks MLX unpacks (llama.cpp LlamaFileType).
_FILE_TYPE_4BIT = {2: "Q4_0", 3: "Q4_1"}
_NATIVE_FILE_TYPES = {0, 1, 2, 3, 7}  # ALL_F32, MOSTLY_F16, MOSTLY_Q4_0, MOSTLY_Q4_1, MOSTLY_Q8_0


def mlx_reads_exactly(tensors: dict[str, mx.array], meta: dict[str, Any]) -> bool:
    """Whether what ``mx.load`` returned is the file's own values, so its fast path holds.

    MLX also "reads" BF16 tensors, as float16 (narrower range). Its result counts
    only for files whose ``general.file_type`` is one of the types it unpacks, or
    that name none and hold no float16 array (which could have been BF16).
    """
    ft = meta.get("general.file_type")
    ft = int(ft.item()) if isinstance(ft, mx.array) else ft
    if ft is not None:
        return ft in _NATIVE_FILE_TYPES
    return not any(w.dtype == mx.float16 for k, w in tensors.items() if not k.endswith((".scales", ".biases")))


def native_types(tensors: dict[str, mx.array], meta: dict[str, Any]) -> dict[str, str]:
    """GGML type names of a file ``mx.load`` read, from what it returned.

    MLX hands Q4_0/Q4_1/Q8_0 back as (weight, scales, biases) triples: bits from the
    shapes, and Q4_0 vs Q4_1 from ``general.file_type`` (both unpack the same way).
    """
    ft = meta.get("general.file_type")
    ft = int(ft.item()) if isinstance(ft, mx.array) else ft
    out = {}
    for name, w in tensors.items():
        if name.endswith((".scales", ".biases")):
            continue
        prefix = name.rsplit(".", 1)[0]
        scales = tensors.get(prefix + ".scales")
        if scales is not None:
            bits = w.shape[-1] * 32 // (scales.shape[-1] * GROUP_SIZE)
            out[name] = "Q8_0" if bits == 8 else _FILE_TYPE_4BIT.get(ft, "Q4_0/Q4_1")
        else:
            out[name] = {mx.float16: "F16", mx.bfloat16: "BF16"}.get(w.dtype, "F32")
    return out


def precision(gguf_type: str, fmt: str, *, native: bool) -> str:
    """How tensors stored as ``gguf_type`` run in weight format ``fmt``.

    Args:
        gguf_type: GGML type name (``Q4_K``, ``F32`` ...).
        fmt: the weight format in use (``quantized`` | ``float32`` | ``float16`` | ``bfloat16``).
        native: the file was read by MLX itself (its quantized tensors kept as stored).

    Returns:
        A short phrase, e.g. ``"MLX affine 8-bit (re-quantized, group 32)"``.
    """
    if gguf_type in FLOAT_TYPES:
        if fmt != "quantized":
            return fmt
        # beside re-quantized layers the rest runs in bfloat16 (float16 overflows in Gemma 3)
        return FLOAT_TYPES[gguf_type] if native else "bfloat16"
    if fmt != "quantized":
        how = "unpacked by MLX" if native else "dequantized by gguf"
        return f"{fmt} ({how})"
    if native:
        bits = 8 if gguf_type == "Q8_0" else 4
        return f"MLX affine {bits}-bit (as stored, group {GROUP_SIZE})"
    return f"MLX affine {REQUANT_BITS.get(gguf_type, 8)}-bit (re-quantized, group {GROUP_SIZE})"


def precision_table(types: dict[str, str], fmt: str, *, native: bool) -> dict[str, str]:
    """GGML type -> run precision for every type in ``types`` (tensor name -> type)."""
    return {t: precision(t, fmt, native=native) for t in sorted(set(types.values()))}


def format_precision(table: dict[str, str]) -> list[str]:
    """One line per format: ``Q4_K -> float32 (dequantized by gguf)``."""
    width = max((len(t) for t in table), default=0)
    return [f"{t:<{width}} -> {p}" for t, p in table.items()]


def requantize(model: nn.Module, module_types: dict[str, str]) -> int:
    """Quantize ``model``'s float Linear / Embedding layers per their GGUF type.

    Args:
        model: a model holding dequantized float weights.
        module_types: module path -> GGML type name of its ``weight``; float types
            and modules not listed stay float.

    Returns:
        The number of layers quantized.
    """
    count = 0

    def predicate(path: str, module: nn.Module) -> Any:
        nonlocal count
        gtype = module_types.get(path)
        if gtype is None or gtype in FLOAT_TYPES or not hasattr(module, "to_quantized"):
            return False
        if module.weight.shape[-1] % GROUP_SIZE:
            return False  # mx.quantize needs whole groups along the input dimension
        count += 1
        return {"group_size": GROUP_SIZE, "bits": REQUANT_BITS.get(gtype, 8)}

    nn.quantize(model, class_predicate=predicate)
    return count


__all__ = [
    "FLOAT_TYPES",
    "GROUP_SIZE",
    "REQUANT_BITS",
    "format_precision",
    "native_types",
    "precision",
    "precision_table",
    "requantize",
]

"""Tiny GGUF files of every quantization, written with llama.cpp's ``gguf.GGUFWriter``.

gguf-py quantizes the legacy formats itself (``gguf.quants.quantize``) but not the
K-quants or IQ4: those tensors are hand-packed blocks of random bits with sane fp16
scales, and the reference values come from ``gguf.quants.dequantize`` of the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import mlotspark  # noqa: F401  (OpenBLAS before mlx)
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from tiny import _byte_tokens

Q = GGMLQuantizationType
QUANTIZABLE = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
HAND_PACKED = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"]
# Byte offsets of the fp16 scale fields in one block (ggml-common.h layouts).
_FP16_FIELDS = {
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ4_NL": (0,), "IQ4_XS": (0,),
}

# general.file_type as llama.cpp's quantize writes it (the K-quants as their _M mixes).
_FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
               "Q3_K": 12, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "IQ4_NL": 25, "IQ4_XS": 30, "BF16": 32}

# Shapes: inner dimensions are multiples of 256, the K-quant super-block.
SHAPES = dict(hidden=256, ffn=512, heads=4, kv_heads=2, head_dim=64, vocab=300, layers=1)


def encode(values: np.ndarray, qtype: str, rng: np.random.Generator) -> np.ndarray:
    """Bytes (or floats) of ``values`` stored as ``qtype``; K-quants ignore ``values``
    and get random blocks."""
    if qtype in QUANTIZABLE:
        return quantize(values, Q[qtype])
    block, size = GGML_QUANT_SIZES[Q[qtype]]
    rows, cols = values.shape
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for off in _FP16_FIELDS[qtype]:
        scale = (rng.random((rows, cols // block)) * 2e-4 + 1e-4).astype(np.float16)  # |w| ~ 0.05, as in real models
        raw[:, :, off:off + 2] = scale[..., None].view(np.uint8).reshape(rows, cols // block, 2)
    return raw.reshape(rows, cols // block * size)


def decode(stored: np.ndarray, qtype: str) -> np.ndarray:
    """What gguf-py reads back from ``stored`` (float32)."""
    if qtype == "F32":
        return stored.astype(np.float32)
    if qtype == "F16":
        return stored.astype(np.float32)
    return dequantize(stored, Q[qtype]).astype(np.float32)


def _tokenizer(w: GGUFWriter, vocab: int) -> None:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = specials + _byte_tokens()
    tokens += [f"<unused{i}>" for i in range(vocab - len(tokens) - 1)] + ["hi"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * 3 + [1] * (vocab - 3))
    w.add_token_merges(["h i"])  # the writer drops an empty list
    w.add_eos_token_id(2)
    w.add_bos_token_id(1)
    w.add_add_bos_token(False)


def layer_tensors(arch: str, s: dict, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Float32 values of every tensor of a tiny ``arch`` model, by GGUF name."""
    h, f, hd = s["hidden"], s["ffn"], s["head_dim"]
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    out = {"token_embd.weight": rng.normal(0, 0.5, (s["vocab"], h)), "output_norm.weight": 1 + rng.normal(0, 0.1, h)}
    for i in range(s["layers"]):
        b = f"blk.{i}."
        out[b + "attn_norm.weight"] = 1 + rng.normal(0, 0.1, h)
        out[b + "ffn_norm.weight"] = 1 + rng.normal(0, 0.1, h)
        out[b + "attn_output.weight"] = rng.normal(0, 0.05, (h, q))
        out[b + "ffn_down.weight"] = rng.normal(0, 0.05, (h, f))
        if arch == "phi3":
            out[b + "attn_qkv.weight"] = rng.normal(0, 0.05, (q + 2 * kv, h))
            out[b + "ffn_up.weight"] = rng.normal(0, 0.05, (2 * f, h))
            continue
        out[b + "attn_q.weight"] = rng.normal(0, 0.05, (q, h))
        out[b + "attn_k.weight"] = rng.normal(0, 0.05, (kv, h))
        out[b + "attn_v.weight"] = rng.normal(0, 0.05, (kv, h))
        out[b + "ffn_gate.weight"] = rng.normal(0, 0.05, (f, h))
        out[b + "ffn_up.weight"] = rng.normal(0, 0.05, (f, h))
        if arch == "gemma3":
            out[b + "attn_q_norm.weight"] = 1 + rng.normal(0, 0.1, hd)
            out[b + "attn_k_norm.weight"] = 1 + rng.normal(0, 0.1, hd)
            out[b + "post_attention_norm.weight"] = 1 + rng.normal(0, 0.1, h)
            out[b + "post_ffw_norm.weight"] = 1 + rng.normal(0, 0.1, h)
    return {k: v.astype(np.float32) for k, v in out.items()}


def write_header(w: GGUFWriter, arch: str, s: dict, qtype: str, context: int = 512) -> None:
    """The hyperparameters of a tiny model of shapes ``s`` (the test models share them)."""
    w.add_file_type(_FILE_TYPES[qtype])
    w.add_block_count(s["layers"])
    w.add_context_length(context)
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_layer_norm_rms_eps(1e-6 if arch == "gemma3" else 1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(s["vocab"])
    if arch == "gemma3":
        w.add_sliding_window(4)  # shorter than the test prompts
    if arch == "phi3":
        w.add_rope_dimension_count(s["head_dim"])


def write_tiny(path: Path, arch: str = "llama", qtype: str = "Q4_K", seed: int = 0,
               last: str | None = None, **meta_overrides) -> tuple[Path, dict[str, np.ndarray]]:
    """Write a tiny ``arch`` GGUF whose matrices are stored as ``qtype`` (norms F32).

    Args:
        last: a tensor name to write last (to truncate it in a test).

    Returns:
        ``(path, reference)``: the file and the float32 values gguf-py reads back,
        by GGUF tensor name.
    """
    rng = np.random.default_rng(seed)
    s = dict(SHAPES)
    if arch == "gemma3":
        s["layers"] = 6  # five sliding-window layers and one global, as Gemma 3 alternates
    values = layer_tensors(arch, s, rng)
    w = GGUFWriter(str(path), arch)
    w.add_name("tiny")
    write_header(w, arch, s, qtype)
    for key, v in meta_overrides.items():
        if isinstance(v, float):
            w.add_float32(key, v)
        elif isinstance(v, int):
            w.add_int32(key, v)
        else:
            w.add_string(key, v)
    _tokenizer(w, s["vocab"])
    reference = {}
    names = sorted(values, key=lambda n: n == last)
    for name in names:
        v = values[name]
        t = "F32" if v.ndim == 1 else qtype
        stored = encode(v, t, rng)
        reference[name] = decode(stored, t).reshape(v.shape)
        if t in ("F32", "F16"):
            w.add_tensor(name, stored)
        else:
            w.add_tensor(name, stored, raw_dtype=Q[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path), reference

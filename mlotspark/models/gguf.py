"""GGUF files: model config from metadata, weight names mapped to ours.

MLX reads GGUF itself (``mx.load(path, return_metadata=True)``): Q4_0/Q4_1/Q8_0
tensors arrive as quantized triples (``weight`` uint32, ``scales``, ``biases``,
group size 32); other types arrive dequantized. Bits are derived per tensor from
the shapes, since one file may mix them (the default model: 4-bit blocks, 8-bit
token embedding).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlotspark.errors import ModelFormatError
from mlotspark.models.gguf_check import check_gguf

GGUF_MAGIC = b"GGUF"
GGUF_GROUP_SIZE = 32  # block size of the Q4_0 / Q4_1 / Q8_0 formats MLX unpacks

# GGUF architectures our llama-family model runs, with their RoPE style: llama.cpp
# permutes Q/K of `llama` checkpoints for interleaved RoPE; qwen2/qwen3 use NeoX.
ARCHITECTURES = {"llama": True, "qwen2": False, "qwen3": False}

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLK = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|scales|biases|bias)$")
_TOP = re.compile(r"^([a-z_]+)\.(weight|scales|biases|bias)$")


def check_magic(path: Path) -> None:
    """Raise ModelFormatError unless ``path`` starts with the GGUF magic."""
    with open(path, "rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise ModelFormatError(f"{path} is not a GGUF file (starts with {head!r}, expected b'GGUF')")


def read_gguf(path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """Read tensors and metadata.

    Raises:
        ModelFormatError: missing magic, truncated or unreadable file.
    """
    path = Path(path)
    check_gguf(path)  # counts and offsets against the file size, before MLX trusts them
    try:
        weights, meta = mx.load(str(path), return_metadata=True)
    except Exception as e:  # MLX raises RuntimeError/ValueError with a C++ message
        raise ModelFormatError(f"cannot read GGUF {path}: {e}") from e
    return weights, meta


def _scalar(meta: dict, key: str, default: Any = None) -> Any:
    v = meta.get(key, default)
    if isinstance(v, mx.array):
        v = v.item() if v.size == 1 else v.tolist()
    return v


def gguf_config(meta: dict, weights: dict[str, mx.array]) -> dict:
    """Model config (mlx-lm / HF names) from GGUF metadata.

    Raises:
        ModelFormatError: unsupported architecture or missing keys.
    """
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelFormatError(
            f"unsupported GGUF architecture {arch!r} (supported: {', '.join(ARCHITECTURES)})"
        )

    def need(key: str) -> Any:
        v = _scalar(meta, f"{arch}.{key}")
        if v is None:
            raise ModelFormatError(f"GGUF metadata lacks {arch}.{key}")
        return v

    n_heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    head_dim = _scalar(meta, f"{arch}.attention.key_length") or hidden // n_heads
    vocab = _scalar(meta, f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(meta.get("tokenizer.ggml.tokens", [])) or None
    if vocab is None:
        raise ModelFormatError("GGUF metadata has neither vocab_size nor tokenizer tokens")
    config = {
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": int(need("block_count")),
        "intermediate_size": int(need("feed_forward_length")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(_scalar(meta, f"{arch}.attention.head_count_kv", n_heads)),
        "head_dim": int(head_dim),
        "rms_norm_eps": float(_scalar(meta, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(_scalar(meta, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_scalar(meta, f"{arch}.context_length", 4096)),
        "vocab_size": int(vocab),
        "rope_traditional": ARCHITECTURES[arch],
        "tie_word_embeddings": "output.weight" not in weights,
    }
    scale = _scalar(meta, f"{arch}.rope.scaling.type")
    if scale == "linear":
        config["rope_scaling"] = {
            "type": "linear",
            "factor": float(_scalar(meta, f"{arch}.rope.scaling.factor", 1.0)),
        }
    return config


def map_weight_names(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Rename GGUF tensors to our model's parameter names (``model.layers.N...``).

    Raises:
        ModelFormatError: a tensor name we do not know.
    """
    out: dict[str, mx.array] = {}
    for name, w in weights.items():
        if m := _BLK.match(name):
            layer, part, kind = m.groups()
            if part not in _LAYER_NAMES:
                raise ModelFormatError(f"unknown GGUF tensor {name!r}")
            out[f"model.layers.{layer}.{_LAYER_NAMES[part]}.{kind}"] = w
        elif (m := _TOP.match(name)) and m.group(1) in _TOP_NAMES:
            out[f"{_TOP_NAMES[m.group(1)]}.{m.group(2)}"] = w
        elif name.startswith("rope_freqs"):
            continue  # llama3 rope factors; handled by rope_scaling when present
        else:
            raise ModelFormatError(f"unknown GGUF tensor {name!r}")
    return out


def quantized_modules(weights: dict[str, mx.array]) -> dict[str, tuple[int, int]]:
    """Map module path -> (group_size, bits) for every quantized triple."""
    found = {}
    for name, scales in weights.items():
        if not name.endswith(".scales"):
            continue
        prefix = name[: -len(".scales")]
        w = weights[prefix + ".weight"]
        in_features = scales.shape[-1] * GGUF_GROUP_SIZE
        bits = w.shape[-1] * 32 // in_features
        found[prefix] = (GGUF_GROUP_SIZE, int(bits))
    return found

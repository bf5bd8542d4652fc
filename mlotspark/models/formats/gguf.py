"""GGUF files: model config from metadata, weight names mapped to ours.

Architectures: ``llama`` (also Mistral and Llama 3.x files, whose ``llama3`` RoPE
scaling llama.cpp bakes into a ``rope_freqs`` tensor), ``qwen2``, ``qwen3`` on our
llama-family model; ``gemma3`` and ``phi3`` on mlx-lm's classes (``ARCHITECTURES``).

MLX reads GGUF itself (``mx.load(path, return_metadata=True)``): Q4_0/Q4_1/Q8_0
tensors arrive as quantized triples (``weight`` uint32, ``scales``, ``biases``,
group size 32); other types arrive dequantized. Bits are derived per tensor from
the shapes, since one file may mix them (the default model: 4-bit blocks, 8-bit
token embedding).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import mlx.core as mx

from mlotspark.errors import ModelFormatError
from mlotspark.models.formats.gguf_check import check_gguf

GGUF_GROUP_SIZE = 32  # block size of the Q4_0 / Q4_1 / Q8_0 formats MLX unpacks


@dataclass(frozen=True)
class GGUFArch:
    """How one GGUF architecture maps onto a model class.

    Args:
        model_type: the mlx-lm / HF ``model_type`` of the config we build.
        ours: runs on our llama-family model (``models.llama``, memory cascade);
            else on mlx-lm's class for ``model_type`` (full attention only).
        rope_traditional: interleaved RoPE; llama.cpp permutes Q/K of ``llama``
            checkpoints for it, every other architecture here uses NeoX RoPE.
        layer_names: GGUF per-layer tensor name -> our parameter path.
        norm_shift: added to every ``*norm.weight``: llama.cpp stores gemma's norms
            as ``1 + w`` while mlx-lm's gemma RMSNorm multiplies by ``1 + w`` itself.
    """

    model_type: str
    ours: bool
    rope_traditional: bool
    layer_names: dict[str, str]
    norm_shift: float = 0.0


_LLAMA_LAYERS = {
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
_GEMMA3_LAYERS = {
    **_LLAMA_LAYERS,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_PHI3_LAYERS = {
    "attn_qkv": "self_attn.qkv_proj",  # fused in both llama.cpp and mlx-lm
    "attn_output": "self_attn.o_proj",
    "ffn_up": "mlp.gate_up_proj",  # gate and up fused, gate first
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

#: GGUF ``general.architecture`` values we load.
ARCHITECTURES: dict[str, GGUFArch] = {
    "llama": GGUFArch("llama", True, True, _LLAMA_LAYERS),  # also Mistral/Llama-3 GGUFs
    "qwen2": GGUFArch("qwen2", True, False, _LLAMA_LAYERS),
    "qwen3": GGUFArch("qwen3", True, False, _LLAMA_LAYERS),
    "gemma3": GGUFArch("gemma3_text", False, False, _GEMMA3_LAYERS, norm_shift=-1.0),
    "phi3": GGUFArch("phi3", False, False, _PHI3_LAYERS),
}

_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLK = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|scales|biases|bias)$")
_TOP = re.compile(r"^([a-z_]+)\.(weight|scales|biases|bias)$")
# Tensors that carry RoPE frequencies, read into the config rather than loaded.
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


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


def architecture(meta: Mapping[str, Any], path: Path | str = "") -> GGUFArch:
    """The ``GGUFArch`` of a file's ``general.architecture``.

    Raises:
        ModelFormatError: an architecture we do not load (naming it and the file).
    """
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        where = f"{path}: " if path else ""
        raise ModelFormatError(
            f"{where}unsupported GGUF architecture {arch!r} (supported: {', '.join(ARCHITECTURES)})"
        )
    return ARCHITECTURES[arch]


def gguf_config(meta: Mapping[str, Any], weights: Mapping[str, Any], path: Path | str = "") -> dict:
    """Model config (mlx-lm / HF names) from GGUF metadata.

    Args:
        meta: GGUF metadata.
        weights: the file's tensors by GGUF name (for ``output.weight`` and RoPE tensors).
        path: the file, for error messages.

    Raises:
        ModelFormatError: unsupported architecture or missing keys.
    """
    spec = architecture(meta, path)
    arch = meta["general.architecture"]

    def need(key: str) -> Any:
        v = _scalar(meta, f"{arch}.{key}")
        if v is None:
            raise ModelFormatError(f"{path or 'GGUF'}: metadata lacks {arch}.{key}")
        return v

    n_heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    head_dim = int(_scalar(meta, f"{arch}.attention.key_length") or hidden // n_heads)
    vocab = _scalar(meta, f"{arch}.vocab_size")
    if vocab is None:
        vocab = len(meta.get("tokenizer.ggml.tokens", [])) or None
    if vocab is None:
        raise ModelFormatError(f"{path or 'GGUF'}: metadata has neither vocab_size nor tokenizer tokens")
    context = int(_scalar(meta, f"{arch}.context_length", 4096))
    config = {
        "model_type": spec.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": int(need("block_count")),
        "intermediate_size": int(need("feed_forward_length")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(_scalar(meta, f"{arch}.attention.head_count_kv", n_heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(_scalar(meta, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(_scalar(meta, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": context,
        "vocab_size": int(vocab),
        "rope_traditional": spec.rope_traditional,
        "tie_word_embeddings": "output.weight" not in weights,
    }
    scale = _scalar(meta, f"{arch}.rope.scaling.type")
    if scale == "linear":
        config["rope_scaling"] = {
            "type": "linear",
            "factor": float(_scalar(meta, f"{arch}.rope.scaling.factor", 1.0)),
        }
    if "rope_freqs.weight" in weights:
        # Llama 3.x: llama.cpp bakes the `llama3` rope_scaling into per-frequency divisors.
        config["rope_freq_factors"] = _floats(weights["rope_freqs.weight"])
    if arch == "gemma3":
        _gemma3(config, meta, n_heads)
    elif arch == "phi3":
        _phi3(config, meta, weights)
    return config


def _gemma3(config: dict, meta: Mapping[str, Any], n_heads: int) -> None:
    """Gemma 3 facts llama.cpp does not store but hard-codes (src/llama-model.cpp)."""
    pattern = _scalar(meta, "gemma3.attention.sliding_window_pattern")
    config.update(
        sliding_window=int(_scalar(meta, "gemma3.attention.sliding_window", 512)),
        # every 6th layer is global; the others attend to a sliding window
        sliding_window_pattern=int(pattern) if isinstance(pattern, int) and pattern > 0 else 6,
        rope_local_base_freq=10000.0,
        # llama.cpp: 1/sqrt(head_dim), except Gemma 3 27B (62 layers): 1/sqrt(hidden/heads)
        query_pre_attn_scalar=float(
            config["hidden_size"] // n_heads if config["num_hidden_layers"] == 62 else config["head_dim"]
        ),
    )


def _phi3(config: dict, meta: Mapping[str, Any], weights: Mapping[str, Any]) -> None:
    rot = _scalar(meta, "phi3.rope.dimension_count")
    if rot:
        config["partial_rotary_factor"] = int(rot) / config["head_dim"]
    orig = _scalar(meta, "phi3.rope.scaling.original_context_length")
    if orig:
        config["original_max_position_embeddings"] = int(orig)
    if "rope_factors_long.weight" in weights:
        config["rope_scaling"] = {
            "type": "longrope",
            "long_factor": _floats(weights["rope_factors_long.weight"]),
            "short_factor": _floats(weights.get("rope_factors_short.weight", weights["rope_factors_long.weight"])),
        }


def _floats(a: Any) -> list[float]:
    return [float(x) for x in (a.astype(mx.float32).tolist() if isinstance(a, mx.array) else list(a))]


def rename(name: str, arch: str = "llama") -> str | None:
    """Our parameter name for GGUF tensor ``name`` of ``arch``; None for RoPE tensors.

    Raises:
        ModelFormatError: a tensor name we do not know.
    """
    spec = ARCHITECTURES[arch]
    if m := _BLK.match(name):
        layer, part, kind = m.groups()
        if part in spec.layer_names:
            return f"model.layers.{layer}.{spec.layer_names[part]}.{kind}"
    elif (m := _TOP.match(name)) and m.group(1) in _TOP_NAMES:
        return f"{_TOP_NAMES[m.group(1)]}.{m.group(2)}"
    elif name in ROPE_TENSORS:
        return None
    raise ModelFormatError(f"unknown GGUF tensor {name!r} for architecture {arch!r}")


def map_weight_names(weights: dict[str, mx.array], arch: str = "llama") -> dict[str, mx.array]:
    """Rename GGUF tensors to the parameter names of ``arch``'s model (``model.layers.N...``).

    Norm weights get the architecture's ``norm_shift``; RoPE frequency tensors are
    left out (``gguf_config`` reads them).

    Raises:
        ModelFormatError: a tensor name we do not know.
    """
    shift = ARCHITECTURES[arch].norm_shift
    out: dict[str, mx.array] = {}
    for name, w in weights.items():
        key = rename(name, arch)
        if key is None:
            continue
        if shift and key.endswith("norm.weight"):
            w = (w.astype(mx.float32) + shift).astype(w.dtype)
        out[key] = w
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

"""The model zoo: a tiny random model of every architecture and variant we document,
in every container a user brings (docs/models.md).

Variants (``VARIANTS``): llama (plain), llama3 (a ``rope_freqs`` tensor in GGUF, as
llama.cpp writes every Llama 3.x file; ``rope_scaling: {"rope_type": "llama3"}`` in a
directory, as mlx-community ships them), qwen2 (q/k/v biases), qwen3 (q/k norms),
gemma3 (five sliding-window layers and a global one), phi3 (plain) and phi3-longrope
(long/short RoPE factors).

Containers (``CONTAINERS``): ``gguf`` (each variant in another quantization, see
``GGUF_TYPES``), ``hf`` (config.json, model.safetensors, tokenizer.json: a Hugging Face
directory), ``mlx4`` and ``mlx8`` (mlx-lm directories quantized to 4 and 8 bits).
The GGUF is written first with ``gguf.GGUFWriter``; the directories take the same
float32 values and the tokenizer our GGUF reader builds (saved with ``save_pretrained``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlotspark  # noqa: F401  (OpenBLAS before mlx)
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from gguf import GGUFWriter
from mlx.utils import tree_flatten

from tiny_gguf import SHAPES, Q, _tokenizer, decode, encode, layer_tensors, write_header

#: variant -> GGUF architecture
VARIANTS = {
    "llama": "llama",
    "llama3": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma3": "gemma3",
    "phi3": "phi3",
    "phi3-longrope": "phi3",
}
CONTAINERS = ("gguf", "hf", "mlx4", "mlx8")
# One quantization per variant, so the zoo covers MLX's own GGUF reader (Q4_0, Q8_0,
# Q4_1, F16) and gguf-py's (K-quants) without writing every pair.
GGUF_TYPES = {
    "llama": "Q4_0", "llama3": "Q4_K", "qwen2": "Q8_0", "qwen3": "Q6_K",
    "gemma3": "Q5_K", "phi3": "F16", "phi3-longrope": "Q4_1",
}
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_ORIGINAL_CONTEXT = 128  # the "trained" context of the scaled RoPE variants (the files say 512)


def _shapes(variant: str) -> dict:
    s = dict(SHAPES)
    if variant == "gemma3":
        s["layers"] = 6  # five sliding-window layers and one global, as Gemma 3 alternates
    return s


def _values(variant: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Float32 values of every tensor, by GGUF name (RoPE tables included)."""
    arch = VARIANTS[variant]
    s = _shapes(variant)
    base = "gemma3" if arch == "gemma3" else ("phi3" if arch == "phi3" else "llama")
    values = layer_tensors(base, s, rng)
    hd, half = s["head_dim"], s["head_dim"] // 2
    for i in range(s["layers"]):
        b = f"blk.{i}."
        if arch == "qwen2":
            values[b + "attn_q.bias"] = rng.normal(0, 0.1, s["heads"] * hd)
            values[b + "attn_k.bias"] = rng.normal(0, 0.1, s["kv_heads"] * hd)
            values[b + "attn_v.bias"] = rng.normal(0, 0.1, s["kv_heads"] * hd)
        if arch == "qwen3":
            values[b + "attn_q_norm.weight"] = 1 + rng.normal(0, 0.1, hd)
            values[b + "attn_k_norm.weight"] = 1 + rng.normal(0, 0.1, hd)
    if variant == "llama3":
        values["rope_freqs.weight"] = np.asarray(_llama3_factors(hd, 10000.0))
    if variant == "phi3-longrope":
        values["rope_factors_long.weight"] = 1 + rng.random(half) * 3
        values["rope_factors_short.weight"] = 1 + rng.random(half) * 0.5
    return {k: np.asarray(v, dtype=np.float32) for k, v in values.items()}


def _llama3_factors(head_dim: int, base: float) -> list[float]:
    """llama.cpp's ``rope_freqs`` for ``_LLAMA3_SCALING`` (per-frequency divisors)."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * np.pi * base ** (i / head_dim)
        low, high = _ORIGINAL_CONTEXT / 1.0, _ORIGINAL_CONTEXT / 4.0
        if wavelen < high:
            out.append(1.0)
        elif wavelen > low:
            out.append(8.0)
        else:
            smooth = (_ORIGINAL_CONTEXT / wavelen - 1.0) / (4.0 - 1.0)
            out.append(1.0 / ((1 - smooth) / 8.0 + smooth))
    return out


_LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": _ORIGINAL_CONTEXT}


def write_gguf(path: Path, variant: str, qtype: str | None = None, seed: int = 0, context: int = 512) -> Path:
    """A tiny GGUF of ``variant`` with its matrices stored as ``qtype`` (default ``GGUF_TYPES``),
    trained to ``context`` tokens."""
    arch, qtype = VARIANTS[variant], qtype or GGUF_TYPES[variant]
    rng = np.random.default_rng(seed)
    s = _shapes(variant)
    values = _values(variant, rng)
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{variant}")
    write_header(w, arch, s, qtype, context)
    if variant == "phi3-longrope":
        w.add_uint32("phi3.rope.scaling.original_context_length", _ORIGINAL_CONTEXT)
    _tokenizer(w, s["vocab"])
    w.add_chat_template(CHATML)
    for name, v in values.items():
        t = "F32" if v.ndim == 1 else qtype
        stored = encode(v, t, rng)
        if t in ("F32", "F16"):
            w.add_tensor(name, stored)
        else:
            w.add_tensor(name, stored, raw_dtype=Q[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def _hf_config(variant: str) -> dict:
    arch, s = VARIANTS[variant], _shapes(variant)
    config = {
        "model_type": {"gemma3": "gemma3_text"}.get(arch, arch),
        "hidden_size": s["hidden"], "num_hidden_layers": s["layers"], "intermediate_size": s["ffn"],
        "num_attention_heads": s["heads"], "num_key_value_heads": s["kv_heads"], "head_dim": s["head_dim"],
        "vocab_size": s["vocab"], "max_position_embeddings": 512, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6 if arch == "gemma3" else 1e-5, "tie_word_embeddings": True,
        "eos_token_id": 2, "bos_token_id": 1,
    }
    if variant == "llama3":
        config["rope_scaling"] = dict(_LLAMA3_SCALING)
    if arch == "gemma3":
        config.update(sliding_window=4, sliding_window_pattern=6, query_pre_attn_scalar=s["head_dim"],
                      rope_local_base_freq=10000.0)
    if variant == "phi3-longrope":
        rng = np.random.default_rng(1)
        half = s["head_dim"] // 2
        config["original_max_position_embeddings"] = _ORIGINAL_CONTEXT
        config["rope_scaling"] = {"type": "longrope", "long_factor": list(1 + rng.random(half) * 3),
                                  "short_factor": list(1 + rng.random(half) * 0.5)}
    return config


def write_hf_dir(directory: Path, variant: str, seed: int = 0) -> Path:
    """A Hugging Face directory of ``variant``: config.json, model.safetensors, tokenizer files."""
    from mlotspark.models.formats import gguf
    from mlotspark.models.tokenizer import load_gguf_tokenizer

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arch = VARIANTS[variant]
    values = _values(variant, np.random.default_rng(seed))
    # GGUF names -> HF names; gemma's norms lose llama.cpp's "+1" (HF stores w, not 1 + w).
    weights = gguf.map_weight_names({k: mx.array(v) for k, v in values.items()}, arch)
    mx.save_safetensors(str(directory / "model.safetensors"), weights, metadata={"format": "mlx"})
    (directory / "config.json").write_text(json.dumps(_hf_config(variant), indent=1))
    # The same vocabulary as the GGUF, through our reader, saved as tokenizer.json.
    probe = directory / "vocab.gguf"
    write_gguf(probe, variant, "F32", seed)
    _, meta = mx.load(str(probe), return_metadata=True)
    probe.unlink()
    load_gguf_tokenizer(meta)._tokenizer.save_pretrained(str(directory))
    return directory


def write_mlx_quantized(directory: Path, hf: Path, bits: int) -> Path:
    """An mlx-lm directory of ``hf``'s model quantized to ``bits`` (group 64), as ``mlx_lm.convert -q``."""
    from mlx_lm.utils import load_model

    directory = Path(directory)
    model, config = load_model(Path(hf))
    nn.quantize(model, group_size=64, bits=bits)
    directory.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(directory / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    config = json.loads((Path(hf) / "config.json").read_text())
    config["quantization"] = {"group_size": 64, "bits": bits}
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    for f in Path(hf).iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, directory / f.name)
    return directory


def write_zoo(root: Path) -> dict[tuple[str, str], Path]:
    """Every (variant, container) pair under ``root``: path to pass to ``Engine.load``."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    zoo: dict[tuple[str, str], Path] = {}
    for variant in VARIANTS:
        zoo[variant, "gguf"] = write_gguf(root / f"{variant}.gguf", variant)
        hf = zoo[variant, "hf"] = write_hf_dir(root / f"{variant}-hf", variant)
        for bits in (4, 8):
            zoo[variant, f"mlx{bits}"] = write_mlx_quantized(root / f"{variant}-mlx{bits}", hf, bits)
    return zoo


__all__ = ["CONTAINERS", "GGUF_TYPES", "VARIANTS", "decode", "write_gguf", "write_hf_dir", "write_mlx_quantized",
           "write_zoo"]

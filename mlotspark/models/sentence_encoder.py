"""A transformer encoder in MLX for sentence-transformers checkpoints: BERT and MPNet.

Our own module rather than ``mlx-embeddings``: its 0.1.0 wheel requires ``mlx-vlm``
(OpenCV, mlx-audio, datasets, FastAPI), far too much to carry for one small encoder.
One implementation covers both families (all-MiniLM-L6-v2 is a BERT,
all-mpnet-base-v2 an MPNet); ``config.json``'s ``model_type`` says which, and
``NAMES`` maps each family's Hugging Face weight names onto ours, so the
checkpoint's ``model.safetensors`` loads as it is.

Both are post-LN: each layer is ``x = LN(x + Attn(x))``, ``x = LN(x + FFN(x))`` with
exact (erf) GELU and absolute position embeddings. Where they differ:

- BERT adds the embedding of token type 0 to every token (single-segment input);
  positions count from 0.
- MPNet has no token types; positions count from ``pad_token_id + 1`` (RoBERTa's
  scheme); every layer adds one shared **relative position bias** to its attention
  scores, ``relative_attention_bias[bucket(j - i)]``, a learned value per head for
  each of 32 buckets. Half the buckets are for keys before the query, half for keys
  after; distances below 8 get a bucket each, larger ones share log-spaced buckets up
  to 128 (T5's scheme, with the sign convention of HF's
  ``MPNetEncoder.relative_position_bucket``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

# Hugging Face module names -> ours, per model_type; "layer." stands for "encoder.layer.N.".
_SHARED = {
    "embeddings.word_embeddings": "word_embeddings",
    "embeddings.position_embeddings": "position_embeddings",
    "embeddings.LayerNorm": "embed_norm",
    "layer.intermediate.dense": "ffn_in",
    "layer.output.dense": "ffn_out",
    "layer.output.LayerNorm": "ffn_norm",
}
NAMES = {
    "bert": {
        **_SHARED,
        "embeddings.token_type_embeddings": "token_type_embeddings",
        "layer.attention.self.query": "q", "layer.attention.self.key": "k", "layer.attention.self.value": "v",
        "layer.attention.output.dense": "o", "layer.attention.output.LayerNorm": "attn_norm",
    },
    "mpnet": {
        **_SHARED,
        "encoder.relative_attention_bias": "relative_attention_bias",
        "layer.attention.attn.q": "q", "layer.attention.attn.k": "k", "layer.attention.attn.v": "v",
        "layer.attention.attn.o": "o", "layer.attention.LayerNorm": "attn_norm",
    },
}
UNUSED = ("pooler.", "embeddings.position_ids")  # sentence-transformers pools the hidden states itself


@dataclass(frozen=True)
class EncoderConfig:
    """The architecture, from the fields of a Hugging Face ``config.json``.

    ``type_vocab_size`` 0 means no token type embeddings (MPNet);
    ``relative_attention_num_buckets`` 0 means no relative position bias (BERT);
    ``position_offset`` is the first real token's position id.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    layer_norm_eps: float
    type_vocab_size: int = 0
    relative_attention_num_buckets: int = 0
    position_offset: int = 0
    hidden_act: str = "gelu"

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> "EncoderConfig":
        """The known fields of a parsed ``config.json``, with what its family implies.

        Raises:
            ValueError: a ``model_type`` other than ``bert``/``mpnet``, or another activation.
            TypeError: a required field is missing.
        """
        kind = config.get("model_type")
        if kind not in NAMES:
            raise ValueError(f"unsupported encoder model_type {kind!r} (bert or mpnet)")
        known = {k: config[k] for k in cls.__dataclass_fields__ if k in config}
        if kind == "bert":
            known.update(type_vocab_size=config.get("type_vocab_size", 2), relative_attention_num_buckets=0)
        else:
            known.update(type_vocab_size=0, relative_attention_num_buckets=config.get("relative_attention_num_buckets", 32),
                         position_offset=config.get("pad_token_id", 1) + 1)
        if known.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"unsupported encoder activation {known['hidden_act']!r} (only 'gelu')")
        return cls(**known)


def relative_position_bucket(relative_position: np.ndarray, num_buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """The bucket of each relative position ``key - query`` (HF ``MPNetEncoder.relative_position_bucket``).

    Args:
        relative_position: int array of ``j - i`` (key index minus query index).
        num_buckets: buckets in all (half for each direction).
        max_distance: distances at or past this share the last bucket of their side.

    Returns:
        int64 array of the same shape, values in ``[0, num_buckets)``.
    """
    n = -np.asarray(relative_position, dtype=np.int64)  # > 0: the key is before the query
    half = num_buckets // 2
    ret = (n < 0).astype(np.int64) * half  # keys after the query use the upper half
    n = np.abs(n)
    max_exact = half // 2
    # float32 as torch computes it, then truncation toward zero (.to(long)); small n are masked below.
    far = np.maximum(n, max_exact).astype(np.float32)
    large = max_exact + (np.log(far / max_exact) / math.log(max_distance / max_exact) * (half - max_exact)).astype(np.int64)
    large = np.minimum(large, half - 1)
    return ret + np.where(n < max_exact, n, large)


class EncoderLayer(nn.Module):
    """Post-LN self-attention then feed-forward (exact erf GELU, as HF's ``"gelu"``)."""

    def __init__(self, c: EncoderConfig):
        super().__init__()
        self.heads = c.num_attention_heads
        self.q, self.k, self.v, self.o = (nn.Linear(c.hidden_size, c.hidden_size) for _ in range(4))
        self.attn_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.ffn_in = nn.Linear(c.hidden_size, c.intermediate_size)
        self.ffn_out = nn.Linear(c.intermediate_size, c.hidden_size)
        self.ffn_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def __call__(self, x: mx.array, bias: mx.array) -> mx.array:
        B, T, H = x.shape
        # (B, T, H) -> (B, heads, T, head_dim)
        q, k, v = (f(x).reshape(B, T, self.heads, -1).transpose(0, 2, 1, 3) for f in (self.q, self.k, self.v))
        a = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(H // self.heads), mask=bias)
        x = self.attn_norm(x + self.o(a.transpose(0, 2, 1, 3).reshape(B, T, H)))
        return self.ffn_norm(x + self.ffn_out(nn.gelu(self.ffn_in(x))))


class Encoder(nn.Module):
    """A BERT or MPNet encoder without its pooler (sentence-transformers pools the last hidden states).

    Args:
        config: the architecture (``EncoderConfig.from_dict``).
    """

    def __init__(self, config: EncoderConfig):
        super().__init__()
        c = self.config = config
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        if c.type_vocab_size:
            self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.embed_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        if c.relative_attention_num_buckets:
            self.relative_attention_bias = nn.Embedding(c.relative_attention_num_buckets, c.num_attention_heads)
        self.layers = [EncoderLayer(c) for _ in range(c.num_hidden_layers)]

    def position_bias(self, T: int) -> mx.array:
        """(1, heads, T, T) relative bias shared by every layer: one learned value per head and bucket."""
        rel = np.arange(T)[None, :] - np.arange(T)[:, None]  # key j minus query i
        buckets = relative_position_bucket(rel, self.config.relative_attention_num_buckets)
        return self.relative_attention_bias(mx.array(buckets.astype(np.int32))).transpose(2, 0, 1)[None]

    def __call__(self, ids: mx.array, mask: mx.array) -> mx.array:
        """Last hidden states.

        Args:
            ids: (B, T) int32 token ids, right-padded.
            mask: (B, T) float32, 1 for real tokens, 0 for padding.

        Returns:
            (B, T, H) float32 hidden states (rows at padding are meaningless).
        """
        T = ids.shape[1]
        x = self.word_embeddings(ids) + self.position_embeddings(mx.arange(T) + self.config.position_offset)[None]
        if self.config.type_vocab_size:
            x = x + self.token_type_embeddings.weight[0]
        x = self.embed_norm(x)
        # Padding keys get a large negative bias, as HF's extended attention mask does: (B, 1, 1, T).
        bias = ((1.0 - mask) * -1e9)[:, None, None, :]
        if self.config.relative_attention_num_buckets:
            bias = self.position_bias(T) + bias  # (B, heads, T, T)
        bias = bias.astype(x.dtype)
        for layer in self.layers:
            x = layer(x, bias)
        return x


def encoder_weights(weights: dict[str, mx.array], model_type: str) -> list[tuple[str, mx.array]]:
    """A Hugging Face checkpoint's weights under ``Encoder``'s names (``NAMES``).

    Args:
        weights: the tensors of ``model.safetensors``.
        model_type: ``bert`` or ``mpnet``.

    Returns:
        (name, array) pairs for ``Encoder.load_weights``; the pooler and the
        ``position_ids`` buffer are left out, names the map does not know are kept
        as they are, so a strict load names them.
    """
    names = NAMES[model_type]
    out = []
    for key, value in weights.items():
        if key.startswith(UNUSED):
            continue
        module, _, leaf = key.rpartition(".")
        layer = re.match(r"encoder\.layer\.(\d+)\.", module)
        ours = names.get("layer." + module[layer.end():] if layer else module)
        if ours is not None and layer:
            ours = f"layers.{layer[1]}.{ours}"
        out.append((f"{ours}.{leaf}" if ours else key, value))
    return out


def mean_pool_normalize(hidden: mx.array, mask: mx.array) -> mx.array:
    """sentence-transformers' ``Pooling(mean)`` then ``Normalize``.

    Args:
        hidden: (B, T, H) last hidden states.
        mask: (B, T) 1 for real tokens.

    Returns:
        (B, H) L2-normalised sentence vectors.
    """
    summed = (hidden * mask[..., None]).sum(axis=1)
    pooled = summed / mx.maximum(mask.sum(axis=1, keepdims=True), 1e-9)  # clamp as ST does
    return pooled / mx.maximum(mx.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


__all__ = ["Encoder", "EncoderConfig", "EncoderLayer", "NAMES", "encoder_weights", "mean_pool_normalize",
           "relative_position_bucket"]

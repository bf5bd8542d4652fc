"""A BERT encoder in MLX, enough to run all-MiniLM-L6-v2 (sentence-transformers).

Our own ~100 lines rather than ``mlx-embeddings``: its 0.1.0 wheel requires
``mlx-vlm`` (OpenCV, mlx-audio, datasets, FastAPI), far too much to carry for one
six-layer encoder. Weight names are Hugging Face's ``BertModel`` ones, so the
checkpoint's ``model.safetensors`` loads as it is.

Post-LN BERT: each layer is ``x = LN(x + Attn(x))``, ``x = LN(x + FFN(x))`` with
exact (erf) GELU, absolute position embeddings, token type 0 throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn


@dataclass(frozen=True)
class BertConfig:
    """The fields of a Hugging Face BERT ``config.json`` that the encoder uses."""

    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> "BertConfig":
        """Pick the known fields of a parsed ``config.json`` (others are ignored)."""
        known = {k: config[k] for k in cls.__dataclass_fields__ if k in config}
        return cls(**known)


class BertEmbeddings(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def __call__(self, ids: mx.array) -> mx.array:
        # ids: (B, T) -> (B, T, H); single-segment input, so token type 0 everywhere.
        positions = mx.arange(ids.shape[1])
        x = self.word_embeddings(ids) + self.position_embeddings(positions)[None]
        return self.LayerNorm(x + self.token_type_embeddings.weight[0])


class BertSelfAttention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.heads = c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)


class BertSelfOutput(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)


class BertAttention(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertSelfOutput(c)

    def __call__(self, x: mx.array, bias: mx.array) -> mx.array:
        s = self.self
        return self.output.LayerNorm(x + self.output.dense(attend(x, s.query, s.key, s.value, s.heads, bias)))


def attend(x: mx.array, query: nn.Module, key: nn.Module, value: nn.Module, heads: int, bias: mx.array) -> mx.array:
    """Bidirectional multi-head attention of ``x`` (B, T, H) under an additive ``bias``,
    before the output projection (BERT's and MPNet's, which name their weights apart)."""
    B, T, H = x.shape
    # (B, T, H) -> (B, heads, T, head_dim)
    q, k, v = (f(x).reshape(B, T, heads, -1).transpose(0, 2, 1, 3) for f in (query, key, value))
    a = mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0 / math.sqrt(H // heads), mask=bias)
    return a.transpose(0, 2, 1, 3).reshape(B, T, H)


class BertIntermediate(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)


class BertOutput(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.dense = nn.Linear(c.intermediate_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)


class BertLayer(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertOutput(c)

    def __call__(self, x: mx.array, bias: mx.array) -> mx.array:
        x = self.attention(x, bias)
        h = nn.gelu(self.intermediate.dense(x))  # exact erf GELU, as HF's "gelu"
        return self.output.LayerNorm(x + self.output.dense(h))


class BertEncoder(nn.Module):
    def __init__(self, c: BertConfig):
        super().__init__()
        self.layer = [BertLayer(c) for _ in range(c.num_hidden_layers)]


class BertModel(nn.Module):
    """BERT without its pooler (sentence-transformers pools the last hidden states).

    Args:
        config: the architecture.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        if config.hidden_act != "gelu":
            raise ValueError(f"unsupported BERT activation {config.hidden_act!r} (only 'gelu')")
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)

    def __call__(self, ids: mx.array, mask: mx.array) -> mx.array:
        """Last hidden states.

        Args:
            ids: (B, T) int32 token ids, right-padded.
            mask: (B, T) float32, 1 for real tokens, 0 for padding.

        Returns:
            (B, T, H) float32 hidden states (rows at padding are meaningless).
        """
        x = self.embeddings(ids)
        # Padding keys get a large negative bias, as HF's extended attention mask does.
        bias = ((1.0 - mask) * -1e9)[:, None, None, :].astype(x.dtype)  # (B, 1, 1, T)
        for layer in self.encoder.layer:
            x = layer(x, bias)
        return x


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

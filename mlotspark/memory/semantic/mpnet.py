"""An MPNet encoder in MLX, enough to run all-mpnet-base-v2 (sentence-transformers).

Our own module beside ``bert.py`` for the same reason (``mlx-embeddings`` drags in
``mlx-vlm`` and its stack). Weight names are Hugging Face's ``MPNetModel`` ones, so
the checkpoint's ``model.safetensors`` loads as it is.

How MPNet differs from BERT (the rest is the same post-LN layer, exact GELU):

- no token type embeddings; absolute positions count from ``padding_idx + 1`` over
  real tokens (RoBERTa's scheme): position ids are ``cumsum(mask) * mask + padding_idx``;
- every layer adds one shared **relative position bias** to its attention scores:
  ``relative_attention_bias[bucket(j - i)]``, a learned value per head for each of 32
  buckets. Half the buckets are for keys before the query, half for keys after;
  distances below 8 get a bucket each, larger ones share log-spaced buckets up to
  128 (T5's scheme, with the sign convention of ``MPNetEncoder.relative_position_bucket``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlotspark.memory.semantic.bert import BertIntermediate, BertLayer, BertOutput, attend


@dataclass(frozen=True)
class MPNetConfig:
    """The fields of a Hugging Face MPNet ``config.json`` that the encoder uses."""

    vocab_size: int = 30527
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 514
    relative_attention_num_buckets: int = 32
    layer_norm_eps: float = 1e-5
    pad_token_id: int = 1
    hidden_act: str = "gelu"

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> "MPNetConfig":
        """Pick the known fields of a parsed ``config.json`` (others are ignored)."""
        known = {k: config[k] for k in cls.__dataclass_fields__ if k in config}
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


class MPNetEmbeddings(nn.Module):
    def __init__(self, c: MPNetConfig):
        super().__init__()
        self.padding_idx = c.pad_token_id
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def __call__(self, ids: mx.array, mask: mx.array) -> mx.array:
        # ids, mask: (B, T) -> (B, T, H). Right padding: real tokens count 2, 3, ...; padding sits at 1.
        m = mask.astype(mx.int32)
        positions = mx.cumsum(m, axis=1) * m + self.padding_idx
        return self.LayerNorm(self.word_embeddings(ids) + self.position_embeddings(positions))


class MPNetSelfAttention(nn.Module):
    def __init__(self, c: MPNetConfig):
        super().__init__()
        self.heads = c.num_attention_heads
        self.q = nn.Linear(c.hidden_size, c.hidden_size)
        self.k = nn.Linear(c.hidden_size, c.hidden_size)
        self.v = nn.Linear(c.hidden_size, c.hidden_size)
        self.o = nn.Linear(c.hidden_size, c.hidden_size)


class MPNetAttention(nn.Module):
    def __init__(self, c: MPNetConfig):
        super().__init__()
        self.attn = MPNetSelfAttention(c)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def __call__(self, x: mx.array, bias: mx.array) -> mx.array:
        s = self.attn
        return self.LayerNorm(x + s.o(attend(x, s.q, s.k, s.v, s.heads, bias)))


class MPNetLayer(nn.Module):
    """BERT's layer with MPNet's attention (its feed-forward weights are named as BERT's)."""

    def __init__(self, c: MPNetConfig):
        super().__init__()
        self.attention = MPNetAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertOutput(c)

    __call__ = BertLayer.__call__


class MPNetEncoder(nn.Module):
    def __init__(self, c: MPNetConfig):
        super().__init__()
        self.layer = [MPNetLayer(c) for _ in range(c.num_hidden_layers)]
        self.relative_attention_bias = nn.Embedding(c.relative_attention_num_buckets, c.num_attention_heads)
        self.num_buckets = c.relative_attention_num_buckets

    def position_bias(self, T: int) -> mx.array:
        """(1, heads, T, T) bias shared by every layer: one learned value per head and bucket."""
        rel = np.arange(T)[None, :] - np.arange(T)[:, None]  # key j minus query i
        buckets = mx.array(relative_position_bucket(rel, self.num_buckets).astype(np.int32))
        return self.relative_attention_bias(buckets).transpose(2, 0, 1)[None]


class MPNetModel(nn.Module):
    """MPNet without its pooler (sentence-transformers pools the last hidden states).

    Args:
        config: the architecture.
    """

    def __init__(self, config: MPNetConfig):
        super().__init__()
        if config.hidden_act != "gelu":
            raise ValueError(f"unsupported MPNet activation {config.hidden_act!r} (only 'gelu')")
        self.config = config
        self.embeddings = MPNetEmbeddings(config)
        self.encoder = MPNetEncoder(config)

    def __call__(self, ids: mx.array, mask: mx.array) -> mx.array:
        """Last hidden states.

        Args:
            ids: (B, T) int32 token ids, right-padded.
            mask: (B, T) float32, 1 for real tokens, 0 for padding.

        Returns:
            (B, T, H) float32 hidden states (rows at padding are meaningless).
        """
        x = self.embeddings(ids, mask)
        # Relative bias (1, heads, T, T) plus a large negative bias on padding keys (B, 1, 1, T).
        bias = self.encoder.position_bias(ids.shape[1]) + ((1.0 - mask) * -1e9)[:, None, None, :]
        bias = bias.astype(x.dtype)
        for layer in self.encoder.layer:
            x = layer(x, bias)
        return x

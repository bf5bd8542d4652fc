"""Our llama-family model: llama, mistral, qwen2, qwen3 and GGUF ``llama``.

It follows mlx-lm's ``models/llama.py`` (same parameter names, so mlx-lm weights and
its loader fit), with one change that the memory cascade needs: attention hands
its *un-rotated* queries, keys and values to the cache's ``attend`` method, and the
cache decides where RoPE goes. A plain KV cache rotates at its offset and runs
full attention; the cascade stores keys without RoPE and rotates the assembled
context [sinks | blocks | window | new] at contiguous positions.

Nothing here says how a step executes on this machine: that is the runner built when
the model is loaded (``models/execution.py``: the CPU backend's NumPy step
and ``W @ x`` products, the GPU's compiled decode pieces).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import BaseModelArgs, create_attention_mask
from mlx_lm.models.rope_utils import initialize_rope

from mlotspark.caches.kv import KVCache

#: model_type values this module runs (anything else goes to mlx-lm's classes).
SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class ModelArgs(BaseModelArgs):
    model_type: str = "llama"
    hidden_size: int = 576
    num_hidden_layers: int = 30
    intermediate_size: int = 1536
    num_attention_heads: int = 9
    rms_norm_eps: float = 1e-5
    vocab_size: int = 49152
    head_dim: Optional[int] = None
    max_position_embeddings: Optional[int] = None  # trained context; the cascade stays below it
    num_key_value_heads: Optional[int] = None
    attention_bias: bool = False  # qwen2 forces q/k/v bias on
    mlp_bias: bool = False
    rope_theta: float = 10000.0
    rope_traditional: bool = False  # GGUF llama weights need True (llama.cpp permutes Q/K)
    rope_scaling: Optional[Dict[str, Union[float, str]]] = None
    tie_word_embeddings: bool = True
    qk_norm: bool = False  # qwen3 normalises q and k per head before RoPE
    # GGUF Llama 3.x: llama.cpp stores its `llama3` rope_scaling as per-frequency divisors.
    rope_freq_factors: Optional[List[float]] = None
    extra: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.model_type == "qwen2":
            self.attention_bias = True
        if self.model_type == "qwen3":
            self.qk_norm = True


class FactorRoPE(nn.Module):
    """RoPE whose frequencies are divided by per-frequency factors, as llama.cpp's
    ``rope_freqs`` tensor says (its form of Llama 3's ``llama3`` rope_scaling; the
    same rotation as mlx-lm's ``Llama3RoPE``)."""

    def __init__(self, dims: int, traditional: bool, base: float, factors: List[float]):
        super().__init__()
        if len(factors) != dims // 2:
            raise ValueError(f"rope_freq_factors has {len(factors)} entries, expected {dims // 2}")
        self.dims, self.traditional = dims, traditional
        # mx.fast.rope takes periods: angle = position / period.
        self._freqs = (base ** (mx.arange(0, dims, 2, dtype=mx.float32) / dims)) * mx.array([float(f) for f in factors], dtype=mx.float32)

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=None, scale=1.0,
                            offset=offset, freqs=self._freqs)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        dim = args.hidden_size
        self.n_heads = args.num_attention_heads
        self.n_kv_heads = args.num_key_value_heads
        self.head_dim = head_dim = args.head_dim
        self.scale = head_dim**-0.5
        bias = args.attention_bias
        self.q_proj = nn.Linear(dim, self.n_heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * head_dim, dim, bias=False)
        if args.qk_norm:
            self.q_norm = nn.RMSNorm(head_dim, eps=args.rms_norm_eps)
            self.k_norm = nn.RMSNorm(head_dim, eps=args.rms_norm_eps)
        self.qk_norm = args.qk_norm
        if args.rope_freq_factors:
            self.rope = FactorRoPE(head_dim, args.rope_traditional, args.rope_theta, args.rope_freq_factors)
        else:
            self.rope = initialize_rope(
                head_dim,
                args.rope_theta,
                args.rope_traditional,
                args.rope_scaling,
                args.max_position_embeddings,
            )

    def project(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """Queries, keys and values (B, H, L, D) of ``x`` (B, L, dim), not yet rotated."""
        B, L, _ = x.shape
        q = self.q_proj(x).reshape(B, L, self.n_heads, -1)
        k = self.k_proj(x).reshape(B, L, self.n_kv_heads, -1)
        v = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        return q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)

    def attend(self, q: mx.array, k: mx.array, v: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        """Attention output (B, H, L, D): RoPE and the cache's context, or plain causal attention."""
        if cache is None:
            q, k = self.rope(q), self.rope(k)
            return mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return cache.attend(q, k, v, rope=self.rope, scale=self.scale, mask=mask)

    def output(self, out: mx.array) -> mx.array:
        """Merge the heads of ``out`` (B, H, L, D) and project back to (B, L, dim)."""
        B, _, L, _ = out.shape
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        return self.output(self.attend(*self.project(x), mask=mask, cache=cache))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        dim, hidden = args.hidden_size, args.intermediate_size
        self.gate_proj = nn.Linear(dim, hidden, bias=args.mlp_bias)
        self.down_proj = nn.Linear(hidden, dim, bias=args.mlp_bias)
        self.up_proj = nn.Linear(dim, hidden, bias=args.mlp_bias)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [TransformerBlock(args) for _ in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, inputs: mx.array, cache: Optional[list] = None) -> mx.array:
        h = self.embed_tokens(inputs)
        if cache is None:
            cache = [None] * len(self.layers)
        # Caches that assemble their own context (the cascade) build their own mask.
        mask = create_attention_mask(h, cache[0])
        for layer, c in zip(self.layers, cache):
            h = layer(h, mask, c)
        return self.norm(h)


class Model(nn.Module):
    """A llama-family causal LM. ``model(tokens (B, L), cache) -> logits (B, L, V)``."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.model = LlamaModel(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(self, inputs: mx.array, cache: Optional[list] = None) -> mx.array:
        return self.logits(self.model(inputs, cache))

    def logits(self, hidden: mx.array) -> mx.array:
        """Project final hidden states (B, L, H) to vocabulary logits (B, L, V)."""
        if self.args.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(hidden)
        return self.lm_head(hidden)

    def sanitize(self, weights: dict) -> dict:
        weights = {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}
        if self.args.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
            weights.pop("lm_head.scales", None)
            weights.pop("lm_head.biases", None)
        return weights

    @property
    def layers(self) -> list:
        return self.model.layers

    def make_cache(self) -> list:
        """One plain (full attention) KV cache per layer."""
        return [KVCache() for _ in self.layers]

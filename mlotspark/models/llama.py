"""Our llama-family model: llama, mistral, qwen2, qwen3 and GGUF ``llama``.

It follows mlx-lm's ``models/llama.py`` (same parameter names, so mlx-lm weights and
its loader fit), with one change that the memory cascade needs: attention hands
its *un-rotated* queries, keys and values to the cache's ``attend`` method, and the
cache decides where RoPE goes. A plain KV cache rotates at its offset and runs
full attention; the cascade stores keys without RoPE and rotates the assembled
context [sinks | blocks | window | new] at contiguous positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import BaseModelArgs, create_attention_mask
from mlx_lm.models.rope_utils import initialize_rope

from mlotspark.models import compiled_step, cpu_step, prefill_ops
from mlotspark.models.kv_cache import KVCache
from mlotspark.models.matvec import Linear, matvec

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

    plain_periods = True  # mx.fast.rope with the periods in _freqs: cpu_step.py can mirror it

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
        self.q_proj = Linear(dim, self.n_heads * head_dim, bias=bias)
        self.k_proj = Linear(dim, self.n_kv_heads * head_dim, bias=bias)
        self.v_proj = Linear(dim, self.n_kv_heads * head_dim, bias=bias)
        self.o_proj = Linear(self.n_heads * head_dim, dim, bias=False)
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
            return prefill_ops.attention(q, k, v, scale=self.scale, mask=mask)
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
        self.gate_proj = Linear(dim, hidden, bias=args.mlp_bias)
        self.down_proj = Linear(hidden, dim, bias=args.mlp_bias)
        self.up_proj = Linear(dim, hidden, bias=args.mlp_bias)

    def __call__(self, x: mx.array) -> mx.array:
        g, u = self.gate_proj(x), self.up_proj(x)
        if x.shape[-2] > 1 and prefill_ops.use_cpu_prefill_ops():
            # Many tokens on the CPU: exp as a vectorised polynomial (prefill_ops.py);
            # one-token steps keep nn.silu, so decode is unchanged.
            return self.down_proj(prefill_ops.silu_mul(g, u))
        return self.down_proj(nn.silu(g) * u)


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), mask, cache)
        return self.finish(h)

    def begin(self, x: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """The part before attention: norm, then queries, keys and values."""
        return self.self_attn.project(self.input_layernorm(x))

    def end(self, x: mx.array, attn: mx.array) -> mx.array:
        """The part after attention: output projection, residual, norm, MLP, residual."""
        return self.finish(x + self.self_attn.output(attn))

    def finish(self, h: mx.array) -> mx.array:
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [TransformerBlock(args) for _ in range(args.num_hidden_layers)]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        #: Decode steps (one token per sequence) through compiled pieces: True, False, or
        #: None = on a GPU only. On this CPU they cut graph building per token (6.3 ->
        #: 5.5 ms) but not the step (16.2 vs 17.6 tok/s, benchmarks/RESULTS.md "Issue 12"),
        #: where the BLAS calls dominate; on Metal, host time is what limits small models.
        self.compiled_decode: Optional[bool] = None
        self._compiled: Optional[list] = None
        #: Compiled decode over a plain KV cache as one whole-step call (``compiled_step.py``)
        #: instead of the per-layer pieces. Off by default: on an H100 (CUDA) it cut host
        #: time to 0.9 ms/token but decoded 0.81-0.85x as fast as the pieces, its masked
        #: attention over the padded buffer costing more than the Python it saves
        #: (benchmarks/RESULTS.md "Issue 12, round 4").
        self.whole_step = False
        self._step: Optional[compiled_step.CompiledStep] = None
        #: One-token products as ``W @ x`` in OpenBLAS small-kernel blocks (``matvec.py``):
        #: True, False, or None = on the CPU backend only, where it measured 1.2-1.7x
        #: faster per step (benchmarks/RESULTS.md "Issue 12, round 3"); Metal and CUDA
        #: have GEMV kernels for either orientation.
        self.decode_matvec: Optional[bool] = None
        self.matvec_on = False  # what the Linear layers are set to now
        #: One-token decode steps of one sequence over a plain float32 cache in NumPy
        #: (``cpu_step.py``: sgemv instead of MLX's sgemm, ~1 µs per op; 2.2x mlx-lm's decode).
        #: True, False, or None = on the CPU backend only (RESULTS "Issue 12, round 5").
        self.numpy_steps: Optional[bool] = None

    def _set_matvec(self) -> bool:
        """Resolve ``decode_matvec`` and hand it to the Linear layers when it changes."""
        on = self.decode_matvec
        if on is None:
            on = mx.default_device().type == mx.DeviceType.cpu
        if on != self.matvec_on:
            for _, m in self.named_modules():
                if isinstance(m, Linear):
                    m.matvec = on
            self.matvec_on = on
            object.__setattr__(self, "_compiled", None)  # traced with the old form
            object.__setattr__(self, "_step", None)
        return on

    def __call__(self, inputs: mx.array, cache: Optional[list] = None) -> mx.array:
        h = self.embed_tokens(inputs)
        self._set_matvec()
        if cache is None:
            cache = [None] * len(self.layers)
        # Caches that assemble their own context (the cascade) build their own mask.
        mask = create_attention_mask(h, cache[0])
        compiled = self.compiled_decode
        if compiled is None:
            compiled = mx.default_device().type == mx.DeviceType.gpu
        if h.shape[1] == 1 and cache[0] is not None and compiled:
            if self.whole_step and compiled_step.fits(cache):
                if self._step is None:
                    object.__setattr__(self, "_step", compiled_step.CompiledStep(self))
                return self._step(h, cache)
            return self._decode(h, mask, cache)
        for layer, c in zip(self.layers, cache):
            h = layer(h, mask, c)
        return self.norm(h)

    def _decode(self, h: mx.array, mask: Any, cache: list) -> mx.array:
        """One decode step (L == 1) through compiled pieces: only attention over the cache,
        whose context grows each token, runs op by op; everything between two
        attentions (output projection, residual, norm, MLP, residual, the next layer's
        norm and q/k/v) is one compiled call, so ~60 small ops per layer cost one
        dispatch from Python and their elementwise work is fused."""
        pieces = self._pieces()
        q, k, v = pieces[0](h)
        last = len(self.layers) - 1
        for i, (layer, c) in enumerate(zip(self.layers, cache)):
            attn = layer.self_attn.attend(q, k, v, mask=mask, cache=c)
            if i < last:
                h, q, k, v = pieces[i + 1](h, attn)
            else:
                h = pieces[-1](h, attn)
        return h

    def _pieces(self) -> list:
        # Built on first use, after the loader has converted the weights. The modules are
        # implicit inputs (``inputs=``, read at each call), so a later ``update`` of the
        # weights is seen, not frozen into the compiled graph.
        if self._compiled is None:
            layers, norm = self.layers, self.norm

            def between(i: int):
                def step(x, attn):
                    h = layers[i].end(x, attn)
                    return (h, *layers[i + 1].begin(h))
                return mx.compile(step, inputs=[layers[i], layers[i + 1]])

            def last(x, attn):
                return norm(layers[-1].end(x, attn))

            pieces = (
                [mx.compile(lambda x: layers[0].begin(x), inputs=[layers[0]])]
                + [between(i) for i in range(len(layers) - 1)]
                + [mx.compile(last, inputs=[layers[-1], norm])]
            )
            # object.__setattr__: a list set on an nn.Module would join its parameter tree.
            object.__setattr__(self, "_compiled", pieces)
        return self._compiled


class Model(nn.Module):
    """A llama-family causal LM. ``model(tokens (B, L), cache) -> logits (B, L, V)``."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.model = LlamaModel(args)
        if not args.tie_word_embeddings:
            self.lm_head = Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(self, inputs: mx.array, cache: Optional[list] = None) -> mx.array:
        logits = cpu_step.run(self, inputs, cache)  # None: this step runs on MLX
        if logits is not None:
            return logits
        return self.logits(self.model(inputs, cache))

    def logits(self, hidden: mx.array) -> mx.array:
        """Project final hidden states (B, L, H) to vocabulary logits (B, L, V)."""
        if self.args.tie_word_embeddings:
            if self.model.matvec_on and hidden.size == hidden.shape[-1] and type(self.model.embed_tokens) is nn.Embedding:
                # One token: the 113 MB tied output layer in small-kernel blocks (matvec.py).
                return matvec(self.model.embed_tokens.weight, hidden)
            return self.model.embed_tokens.as_linear(hidden)
        if isinstance(self.lm_head, Linear):  # outside LlamaModel's walk in _set_matvec
            self.lm_head.matvec = self.model.matvec_on
        return self.lm_head(hidden)

    def sanitize(self, weights: dict) -> dict:
        weights = {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}
        if self.args.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
            weights.pop("lm_head.scales", None)
            weights.pop("lm_head.biases", None)
        return weights

    def fuse_projections(self) -> int:
        """Put each layer's q/k/v weights, and its gate/up weights, in one buffer each, the
        modules keeping row views of it (same values, same memory once the old arrays go).

        Why: a one-token step on the CPU (``cpu_step.py``) then reads each group with one
        sgemv instead of three or two, and rotates q and k in one pass: fewer NumPy calls
        per token, which is the step's host overhead. MLX's own paths see the same
        weights. Only groups of dense float32 ``Linear`` weights are fused (what that
        step runs); anything else is left as it is.

        Returns:
            How many groups were fused.
        """
        fused = 0
        for layer in self.model.layers:
            at, mlp = layer.self_attn, layer.mlp
            for group in ((at.q_proj, at.k_proj, at.v_proj), (mlp.gate_proj, mlp.up_proj)):
                if not all(type(m) in (Linear, nn.Linear) and m.weight.dtype == mx.float32 for m in group):
                    continue
                if len({m.weight.shape[1] for m in group}) != 1:
                    continue
                whole = mx.concatenate([m.weight for m in group])
                mx.eval(whole)
                start = 0
                for m in group:
                    rows = m.weight.shape[0]
                    m.weight = whole[start:start + rows]  # a view: MLX slices share the buffer
                    start += rows
                mx.eval([m.weight for m in group])
                fused += 1
        if fused:
            mx.clear_cache()  # the separate arrays' memory back to the system, not MLX's cache
        return fused

    @property
    def layers(self) -> list:
        return self.model.layers

    def make_cache(self) -> list:
        """One plain (full attention) KV cache per layer."""
        return [KVCache() for _ in self.layers]

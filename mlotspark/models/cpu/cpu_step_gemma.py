"""One-token decode steps of Gemma 3 (mlx-lm's ``gemma3_text``) in NumPy, on MLX's CPU backend.

Why: as for the llama family (``cpu_step.py``), MLX's CPU backend has no GEMV, and Gemma 3
270M's tied 262144 x 640 output layer (671 MB of its 1,072) took 62 ms a token as an MLX
product against 26 ms as NumPy's ``sgemv`` on the same buffer (measured on the CPU VM,
benchmarks/RESULTS.md "Models"). Calling NumPy for that one layer inside the MLX forward
was slower than not (decode 8.25 -> 6.33 tok/s): the whole step has to leave MLX.

What differs from the llama step, all as mlx-lm's ``gemma3_text`` computes it: four
RMSNorms a layer scaling by ``1 + w``, q and k normed per head, the embedding scaled by
sqrt(hidden) rounded to bfloat16, GELU (tanh form), sliding-window layers with their own
RoPE base. The KV caches are mlx-lm's own (``RotatingKVCache`` for sliding layers,
``KVCache`` for global ones, from ``model.make_cache``): each layer's new K and V go in
through the cache's ``update_and_fetch`` (its rotation and trimming rules stay its own;
one small MLX update a layer) and attention reads what it returns, as mlx-lm's forward
does. A one-token step needs no mask: a rotating cache returns at most its window.

Runs only for dense float32 weights, one sequence, those two cache classes; anything
else returns None and the step runs on MLX.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlotspark.models.cpu.cpu_step import _rope_angles, _watched_view
from mlotspark.models.cpu.matvec import MatvecEmbedding, MatvecLinear

_GELU_C = math.sqrt(2 / math.pi)


def applies(model: Any) -> bool:
    """Whether ``model`` is mlx-lm's Gemma 3 text model (the only one this step runs)."""
    return getattr(model, "model_type", None) == "gemma3_text" and hasattr(model, "model")


def run(model: Any, inputs: mx.array, cache: Optional[Sequence[Any]]) -> Optional[mx.array]:
    """Logits (1, 1, V) of one decode step through NumPy, or None when it must run on MLX."""
    if cache is None or inputs.shape != (1, 1):
        return None
    step = _plan(model)
    if step is None or not step.fits(cache):
        return None
    return step(int(inputs.item()), cache)


def takes(model: Any, cache: Sequence[Any]) -> bool:
    """Whether a one-token step of ``model`` over ``cache`` would run here."""
    step = _plan(model) if applies(model) else None
    return step is not None and bool(cache) and step.fits(cache)


def _plan(model: Any) -> Optional["GemmaStep"]:
    plan = model.__dict__.get("_cpu_plan")
    if plan is None or (plan is not False and not plan.current()):
        plan = GemmaStep.build(model) or False
        object.__setattr__(model, "_cpu_plan", plan)  # not a parameter of the model
    return plan or None


class GemmaStep:
    """NumPy views of one Gemma 3 model's weights and the step that reads them."""

    def __init__(self, args: Any, layers: list, final: tuple, watched: list):
        self.H, self.KV, self.D = args.num_attention_heads, args.num_key_value_heads, args.head_dim
        self.eps = args.rms_norm_eps
        self.scale = np.float32(args.query_pre_attn_scalar ** -0.5)
        # mlx-lm scales the embedding by sqrt(hidden) rounded to bfloat16.
        self.embed_scale = np.float32(mx.array(args.hidden_size ** 0.5, mx.bfloat16).astype(mx.float32).item())
        self.layers = layers
        self.embed, self.norm, self.head = final
        # The views are of these arrays; ``current`` checks each is still its module's.
        self._watched = watched

    @classmethod
    def build(cls, model: Any) -> Optional["GemmaStep"]:
        """The step for ``model``, or None when it holds anything this path does not run."""
        from mlx_lm.models.cache import KVCache, RotatingKVCache

        if not applies(model):
            return None
        args, watched = model.args, []
        if args.num_attention_heads % args.num_key_value_heads:
            return None

        def take(module: Any, key: str = "weight") -> Optional[np.ndarray]:
            return _watched_view(module, key, watched)

        def linear(m: Any) -> Optional[np.ndarray]:
            if type(m) not in (nn.Linear, MatvecLinear) or "bias" in m:
                return None
            return take(m)

        def norm(m: Any) -> Optional[np.ndarray]:
            w = take(m) if type(m).__name__ == "RMSNorm" else None
            return None if w is None else (1.0 + w).astype(np.float32)  # gemma scales by 1 + w

        pattern = args.sliding_window_pattern
        kinds = [i % pattern != pattern - 1 for i in range(args.num_hidden_layers)]  # as make_cache
        layers, ropes = [], {}
        for layer, sliding in zip(model.model.layers, kinds):
            at, mlp = layer.self_attn, layer.mlp
            rope = _rope_angles(at.rope)
            if rope is None or rope[1] or at.is_sliding != sliding:
                return None  # only non-traditional plain RoPE, as gemma3 builds it
            rope = ropes.setdefault((rope[0], rope[2].tobytes()), rope)  # one object per kind: angles once a token
            parts = (linear(at.q_proj), linear(at.k_proj), linear(at.v_proj), linear(at.o_proj),
                     linear(mlp.gate_proj), linear(mlp.up_proj), linear(mlp.down_proj),
                     norm(layer.input_layernorm), norm(layer.post_attention_layernorm),
                     norm(layer.pre_feedforward_layernorm), norm(layer.post_feedforward_layernorm),
                     norm(at.q_norm), norm(at.k_norm))
            if any(p is None for p in parts):
                return None
            layers.append((*parts, rope, RotatingKVCache if sliding else KVCache))
        if type(model.model.embed_tokens) not in (nn.Embedding, MatvecEmbedding):
            return None
        embed, fnorm = take(model.model.embed_tokens), norm(model.model.norm)
        head = embed if getattr(model, "tie_word_embeddings", False) else linear(model.get("lm_head"))
        if embed is None or fnorm is None or head is None:
            return None
        return cls(args, layers, (embed, fnorm, head), watched)

    def current(self) -> bool:
        """False once any weight array was replaced (``update``, ``load_weights``)."""
        return all(m.get(k) is a for m, k, a in self._watched)

    def fits(self, cache: Sequence[Any]) -> bool:
        """One cache per layer, each of the class the model makes for it, all at one offset,
        holding float32 (or nothing yet)."""
        if len(cache) != len(self.layers):
            return False
        pos = cache[0].offset
        for c, layer in zip(cache, self.layers):
            if type(c) is not layer[-1] or c.offset != pos:
                return False
            if c.keys is not None and c.keys.dtype != mx.float32:
                return False
        return True

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """RMSNorm over the last axis in float32, as ``mx.fast.rms_norm`` (``w`` is 1 + weight)."""
        ms = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
        return (x * (1.0 / np.sqrt(ms + np.float32(self.eps))).astype(np.float32) * w).astype(np.float32)

    @staticmethod
    def _angles(rope: tuple, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin of ``rope``'s frequencies at ``pos`` (once a token per RoPE kind)."""
        angle = np.float32(pos) * rope[2]
        return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)

    @staticmethod
    def _rope(x: np.ndarray, rope: tuple, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """``mx.fast.rope`` (non-traditional: the two halves of the rotated dims) of (heads, D)."""
        dims = rope[0]
        half = dims // 2
        out = x.copy()
        a, b = x[:, :half], x[:, half:dims]
        out[:, :half] = a * cos - b * sin
        out[:, half:dims] = a * sin + b * cos
        return out

    def __call__(self, token: int, cache: Sequence[Any]) -> mx.array:
        """Logits (1, 1, V) after ``token`` at position ``cache[0].offset``; advances every cache."""
        H, KV, D = self.H, self.KV, self.D
        pos = cache[0].offset
        rms, tables = self._rms, {}
        x = self.embed[token] * self.embed_scale
        for (wq, wk, wv, wo, wg, wu, wd, n_in, n_post, n_pre_ff, n_post_ff, qn, kn, rope, _), c in zip(
                self.layers, cache):
            h = rms(x, n_in)
            angles = tables.get(id(rope))
            if angles is None:  # sliding and global layers have one RoPE each
                angles = tables[id(rope)] = self._angles(rope, pos)
            q = self._rope(rms((wq @ h).reshape(H, D), qn), rope, *angles)
            k = self._rope(rms((wk @ h).reshape(KV, D), kn), rope, *angles)
            v = (wv @ h).reshape(KV, D)
            keys, values = c.update_and_fetch(mx.array(k.reshape(1, KV, 1, D)), mx.array(v.reshape(1, KV, 1, D)))
            mx.eval(keys, values)
            kb, vb = np.asarray(keys)[0], np.asarray(values)[0]  # (KV, n, D)
            qg = q.reshape(KV, H // KV, D) * self.scale
            s = np.matmul(qg, kb.transpose(0, 2, 1))  # (KV, group, n)
            s = np.exp(s - s.max(axis=-1, keepdims=True))
            o = np.matmul(s, vb) / s.sum(axis=-1, keepdims=True)
            del keys, values, kb, vb  # the cache's buffer stays its own (in-place next update)
            x = x + rms(wo @ o.reshape(H * D), n_post)
            hf = rms(x, n_pre_ff)
            g = wg @ hf
            gelu = 0.5 * g * (1.0 + np.tanh(np.float32(_GELU_C) * (g + np.float32(0.044715) * g * g * g)))
            x = x + rms(wd @ (gelu * (wu @ hf)), n_post_ff)
        x = rms(x, self.norm)
        return mx.array((self.head @ x).reshape(1, 1, -1))

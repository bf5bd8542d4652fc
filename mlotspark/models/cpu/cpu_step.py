"""One-token decode steps of one sequence in NumPy, on MLX's CPU backend.

Why not MLX here: its CPU backend sends every float32 matmul to ``cblas_sgemm`` (it has
no GEMV path, so a one-token product runs OpenBLAS's packed GEMM at a third of the
bandwidth, ``matvec.py``) and runs each of a step's ~600 small ops through its
scheduler. A one-token step is ~540 MB of weights read once: NumPy's ``W @ x`` is
OpenBLAS's ``sgemv`` on the *same* weights (zero-copy views of the MLX arrays: CPU and
unified memory), with ~1 µs of Python per op. Measured 2.3x mlx-lm's decode on this CPU
with the same greedy tokens (measured; the figures are in ``git show bce40ee:benchmarks/history/RESULTS-rounds-1-6.md``). Prefill stays on
MLX (``prefill_ops.py``): a NumPy prefill of the same chunks measured 1.44x mlx-lm against
1.85x for MLX with those forms, its GEMMs being the same OpenBLAS calls.

It is part of the CPU runner (``execution.py``), which calls ``run`` for each
one-token step, and it runs only where it is exact and cheap: our llama-family ``Model``
with dense float32 weights, one sequence (B = 1), and a plain ``KVCache`` of float32 in
every layer. Batches, the memory cascade, float16/quantized KV, float16/quantized
weights and other model classes stay on MLX (``run`` returns None); Gemma 3 has its own
step (``cpu_step_gemma.py``). Metal has GEMV
kernels and cheap dispatch; nothing here runs there.

That runner leaves q/k/v and gate/up of each layer as row views of one buffer each
(``execution.fuse_projections``), so a layer is five sgemv calls, not seven, and q and
k rotate in one pass: per token that is the step's host time (~38 NumPy calls a layer).

KV writes go in place into the cache's MLX buffer through a NumPy view, as MLX's own
``keys[..., i, :] = k`` does when it can reuse the buffer. MLX copies instead when
another array shares the buffer; we cannot see that, so the first step on a buffer we
did not allocate, or after the cache was trimmed below where we last wrote, copies the
live tokens into a fresh buffer of our own first (``_own``).
"""

from __future__ import annotations

import math
import operator
import weakref
from typing import Any, Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlotspark.caches.kv import KVCache
from mlotspark.models.llama import FactorRoPE
from mlotspark.models.cpu.matvec import MatvecEmbedding, MatvecLinear

#: KV buffers grow by this many positions, as mlx-lm's ``KVCache.step``.
_STEP = KVCache.step


def run(model: Any, inputs: mx.array, cache: Optional[Sequence[Any]]) -> Optional[mx.array]:
    """Logits (1, 1, V) of one decode step of one sequence through NumPy, or None when
    this step must run on MLX (see the module docstring for when)."""
    if cache is None or inputs.shape != (1, 1):
        return None
    plan = _plan(model, cache)
    return None if plan is None else plan(int(inputs.item()), cache)


def takes(model: Any, cache: Sequence[Any]) -> bool:
    """Whether a one-token step of ``model`` over ``cache`` would run here (not on MLX)."""
    return bool(cache) and _plan(model, cache) is not None


def _plan(model: Any, cache: Sequence[Any]) -> Optional["CpuStep"]:
    """The model's step (built or rebuilt as needed), or None when it does not run this
    model or this cache."""
    plan = model.__dict__.get("_cpu_plan")
    if plan is None or (plan is not False and not plan.current()):
        plan = CpuStep.build(model) or False
        object.__setattr__(model, "_cpu_plan", plan)  # not a parameter of the model
        # NumPy's BLAS threads are the scheduler's: the cores other processes leave free
        # (thermal/cores.py; two threads beside busy work collapsed a step 25x, measured).
    if plan is False or not plan.fits(cache):
        return None
    return plan


def _dense(a: Any) -> Optional[np.ndarray]:
    """A zero-copy NumPy view of a dense float32 MLX array, or None."""
    if not isinstance(a, mx.array) or a.dtype != mx.float32:
        return None
    v = np.asarray(a)
    return v if v.flags.c_contiguous and not v.flags.owndata else None


def _watched_view(module: Any, key: str, watched: list) -> Optional[np.ndarray]:
    """``_dense`` of ``module[key]``, noting (module, key, array) in ``watched`` so the step
    can tell when the weight is replaced (``current``); None for anything but dense float32."""
    arr = module.get(key) if isinstance(module, nn.Module) else None
    view = _dense(arr)
    if view is not None:
        watched.append((module, key, arr))
    return view


def _span(views: Sequence[np.ndarray]) -> Optional[np.ndarray]:
    """One read-only (rows, in) view over weight views that lie back to back in memory,
    as ``execution.fuse_projections`` leaves q/k/v and gate/up; None when they do not.
    (The views stay referenced by the step, so the memory they span stays alive.)"""
    first, end = views[0], views[0].ctypes.data + views[0].nbytes
    for v in views[1:]:
        if v.shape[1:] != first.shape[1:] or v.ctypes.data != end:
            return None
        end += v.nbytes
    rows = sum(v.shape[0] for v in views)
    return np.lib.stride_tricks.as_strided(first, (rows,) + first.shape[1:], first.strides, writeable=False)


def one_buffer(arrays: Sequence[mx.array]) -> bool:
    """Whether dense float32 ``arrays`` lie back to back in memory, in order (row views of
    one buffer, as ``execution.fuse_projections`` leaves a group)."""
    views = [_dense(a) for a in arrays]
    return all(v is not None for v in views) and _span(views) is not None


def _rope_angles(rope: Any) -> Optional[tuple[int, bool, np.ndarray]]:
    """(dims, traditional, angle per position for each frequency) of the rope kinds whose
    rotation is ``mx.fast.rope`` with plain frequencies; None for any other."""
    from mlx_lm.models.rope_utils import Llama3RoPE

    if type(rope) is nn.RoPE:
        inv = rope.base ** (-np.arange(0, rope.dims, 2, dtype=np.float32) / rope.dims)
        return rope.dims, rope.traditional, (rope.scale * inv).astype(np.float32)
    if type(rope) in (Llama3RoPE, FactorRoPE):  # mx.fast.rope with the periods in _freqs, scale 1
        return rope.dims, rope.traditional, (1.0 / np.array(rope._freqs, dtype=np.float32)).astype(np.float32)
    return None


class CpuStep:
    """NumPy views of one model's weights and the step that reads them."""

    def __init__(self, model: Any, layers: list, tied: list, rope: tuple, watched: list):
        a = model.args
        self.n_heads, self.n_kv = a.num_attention_heads, a.num_key_value_heads
        self.head_dim, self.eps = a.head_dim, a.rms_norm_eps
        self.scale = model.model.layers[0].self_attn.scale
        (self.embed, self.norm, self.head) = tied
        # Each layer's products write into two buffers reused by every layer: q|k|v and
        # gate|up (a fused group in one sgemv, ``_products``); the step reads row views.
        Q, K = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        F = sum(w.shape[0] for w, _, _ in layers[0][1]) // 2
        qkv, gu = np.empty(Q + 2 * K, np.float32), np.empty(2 * F, np.float32)
        self.qk, self.v = qkv[:Q + K], qkv[Q + K:].reshape(self.n_kv, self.head_dim)
        self.q, self.k = qkv[:Q], qkv[Q:Q + K]
        self.qkv, self.g, self.u = qkv, gu[:F], gu[F:]
        # Rotated q|k, written in place each layer; q as (KV, group, D) for attention.
        rot = np.empty(Q + K, np.float32)
        self.rot, self.rot_q = rot, rot[:Q].reshape(self.n_kv, self.n_heads // self.n_kv, self.head_dim)
        self.rot_k = rot[Q:].reshape(self.n_kv, self.head_dim)

        def bind(products: list, buf: np.ndarray) -> list:
            return [(w, buf[a:b]) for w, a, b in products]

        self.layers = [(bind(p, qkv), bind(m, gu), *rest) for p, m, *rest in layers]
        # RoPE as x * cos + x[perm] * sign * sin: component a[i] pairs with b[i] (interleaved
        # or the two halves of the rotated dims), both turning by frequency i; a component
        # past the rotated dims takes the appended frequency 0 (cos 1, sin 0).
        d, traditional, freqs = rope
        D = self.head_dim
        a, b = (np.arange(0, d, 2), np.arange(1, d, 2)) if traditional else (np.arange(d // 2), np.arange(d // 2, d))
        perm, freq, sign = np.arange(D), np.full(D, d // 2), np.zeros(D, np.float32)
        perm[a], perm[b] = b, a
        freq[a] = freq[b] = np.arange(d // 2)
        sign[a], sign[b] = -1, 1
        # q and k rotate together, as one flat vector q|k (the heads of q, then of k); the
        # query part also carries the attention scale, so attention needs no scaling.
        heads = self.n_heads + self.n_kv
        self.perm_qk = (np.arange(heads)[:, None] * D + perm).reshape(-1)
        self.rope_freqs = np.append(freqs, np.float32(0))
        self.freq_qk = np.tile(freq, heads)
        scale = np.repeat(np.array([self.scale, 1.0], np.float32), [self.n_heads * D, self.n_kv * D])
        self.scale_qk, self.sign_qk = scale, np.tile(sign, heads) * scale
        # The views are of these arrays; ``current`` checks each is still its module's.
        self._modules, self._keys, self._arrays = (list(t) for t in zip(*watched))

    @staticmethod
    def _products(weights: Sequence[np.ndarray]) -> list:
        """(weight, first row, end row) of one layer's group of products into its buffer:
        a single product when ``execution.fuse_projections`` put the group in one buffer."""
        whole = _span(weights)
        if whole is not None:
            return [(whole, 0, whole.shape[0])]
        out, start = [], 0
        for w in weights:
            out.append((w, start, start + w.shape[0]))
            start += w.shape[0]
        return out

    @classmethod
    def build(cls, model: Any) -> Optional["CpuStep"]:
        """The step for ``model`` (our ``llama.Model``, the only caller), or None when it has
        anything this path does not run."""
        args = model.args
        watched: list = []

        def take(module: Any, key: str = "weight") -> Optional[np.ndarray]:
            return _watched_view(module, key, watched)

        def linear(m: Any) -> Optional[tuple]:
            """(weight, bias or None) views, or None for anything but a dense float32 Linear."""
            if type(m) not in (nn.Linear, MatvecLinear):  # the CPU strategy's, or a plain one
                return None
            w, b = take(m), (take(m, "bias") if "bias" in m else None)
            return None if w is None or ("bias" in m and b is None) else (w, b)

        def norm(m: Any) -> Optional[np.ndarray]:
            return take(m) if type(m) is nn.RMSNorm else None

        first = model.model.layers[0].self_attn
        rope = _rope_angles(first.rope)
        if rope is None or args.num_attention_heads % args.num_key_value_heads:
            return None
        layers = []
        for layer in model.model.layers:
            at, mlp = layer.self_attn, layer.mlp
            if type(at.rope) is not type(first.rope) or at.scale != first.scale:
                return None
            q, k, v, o = linear(at.q_proj), linear(at.k_proj), linear(at.v_proj), linear(at.o_proj)
            gate, up, down = linear(mlp.gate_proj), linear(mlp.up_proj), linear(mlp.down_proj)
            n1, n2 = norm(layer.input_layernorm), norm(layer.post_attention_layernorm)
            qn, kn = (norm(at.q_norm), norm(at.k_norm)) if args.qk_norm else (None, None)
            if any(p is None for p in (q, k, v, o, gate, up, down, n1, n2)) or (args.qk_norm and (qn is None or kn is None)):
                return None
            if any(m[1] is not None for m in (o, gate, up, down)):
                return None  # biases only on q/k/v (qwen2)
            biases = (q[1], k[1], v[1])
            bqkv = None if biases[0] is None else np.concatenate(biases)
            # One flat record per layer: the step reads it with one unpacking, no lookups.
            # Products are (weight, rows of the step's buffer): one for a fused group.
            layers.append((cls._products((q[0], k[0], v[0])), cls._products((gate[0], up[0])),
                           o[0], down[0], n1, n2, bqkv, qn, kn))
        if type(model.model.embed_tokens) not in (nn.Embedding, MatvecEmbedding):
            return None
        embed, fnorm = take(model.model.embed_tokens), norm(model.model.norm)
        head = embed if args.tie_word_embeddings else linear(getattr(model, "lm_head", None))
        if embed is None or fnorm is None or head is None:
            return None
        if not args.tie_word_embeddings:
            if head[1] is not None:
                return None
            head = head[0]
        return cls(model, layers, [embed, fnorm, head], rope, watched)

    def current(self) -> bool:
        """False once any weight array was replaced (``update``, ``load_weights``)."""
        return all(map(operator.is_, map(dict.get, self._modules, self._keys), self._arrays))

    def fits(self, cache: Sequence[Any]) -> bool:
        """Whether ``cache`` is one plain float32 KV cache per layer, all at one offset."""
        if len(cache) != len(self.layers) or type(cache[0]) is not KVCache:
            return False
        pos = cache[0].offset
        for c in cache:
            if type(c) is not KVCache or c.offset != pos:
                return False
        first = cache[0].keys  # every layer's KV comes from the same model dtype
        return first is None or first.dtype == mx.float32

    def _own(self, c: KVCache, pos: int) -> None:
        """Give ``c`` fresh buffers of our own with room at ``pos``, its ``pos`` live tokens
        copied; capacity in whole steps, as mlx-lm grows its buffers."""
        cap = (pos // _STEP + 1) * _STEP
        keys = mx.zeros((1, self.n_kv, cap, self.head_dim), mx.float32)
        values = mx.zeros((1, self.n_kv, cap, self.head_dim), mx.float32)
        mx.eval(keys, values)
        nk, nv = np.asarray(keys), np.asarray(values)
        if nk.flags.owndata or not (nk.flags.writeable and nk.flags.c_contiguous):
            raise RuntimeError("MLX did not hand out a writable view of a fresh KV buffer")
        if c.keys is not None and pos:
            nk[:, :, :pos] = np.asarray(c.keys)[:, :, :pos]
            nv[:, :, :pos] = np.asarray(c.values)[:, :, :pos]
        c.keys, c.values = keys, values

    def _buffers(self, c: KVCache, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """Writable (KV, capacity, D) views of ``c``'s buffers with room at ``pos``."""
        mark = c.__dict__.get("_cpu_step_mark")
        if (mark is None or c.keys is None or mark[0]() is not c.keys or mark[1]() is not c.values
                or pos < mark[2]):
            self._own(c, pos)
            mark = c._cpu_step_mark = [weakref.ref(c.keys), weakref.ref(c.values), 0]
        # Fresh views each step: MLX may have moved the array to a new buffer since.
        kb, vb = np.asarray(c.keys)[0], np.asarray(c.values)[0]
        if pos >= kb.shape[1]:  # full: grow by a step
            self._own(c, pos)
            mark[:2] = weakref.ref(c.keys), weakref.ref(c.values)
            kb, vb = np.asarray(c.keys)[0], np.asarray(c.values)[0]
        mark[2] = pos + 1
        return kb, vb

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """RMSNorm over the last axis, in float32 as ``mx.fast.rms_norm``."""
        ms = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
        return x * (1.0 / np.sqrt(ms + self.eps)).astype(np.float32) * w

    def _rope_tables(self, pos: int) -> tuple[np.ndarray, np.ndarray]:
        """Per-step cos and signed-sin rows over the flat q|k, the query's part scaled by
        ``scale`` (so attention needs no separate scaling)."""
        angle = pos * self.rope_freqs  # its last entry is 0: cos 1, sin 0 for unrotated dims
        i = self.freq_qk
        return np.cos(angle)[i] * self.scale_qk, np.sin(angle)[i] * self.sign_qk

    def __call__(self, token: int, cache: Sequence[KVCache]) -> mx.array:
        """Logits (1, 1, V) after ``token`` at position ``cache[0].offset``; advances every cache."""
        pos = cache[0].offset
        buffers = [self._buffers(c, pos) for c in cache]
        x = self._layers(token, pos, buffers, exact=False)
        ss = float(np.dot(x, x))
        if not math.isfinite(ss):  # a softmax overflowed (see _layers): again, exactly
            x = self._layers(token, pos, buffers, exact=True)
            ss = float(np.dot(x, x))
        for c in cache:
            c.offset = pos + 1
        h = x * (1.0 / math.sqrt(ss / x.size + self.eps)) * self.norm
        return mx.array((self.head @ h).reshape(1, 1, -1))

    def _layers(self, token: int, pos: int, buffers: list, exact: bool) -> np.ndarray:
        """The hidden state after every layer for ``token`` at ``pos``, its K and V written
        into ``buffers`` (so a second run at the same position writes the same values).

        Softmax subtracts each row's score of the new token, not the row's maximum: that
        score is in the row (so the row's sum is >= 1, nothing underflows to 0/0) and a
        slice costs less than a reduction, 30 of them a token. A score more than ~88 above
        it overflows to inf, which reaches the hidden state; the caller then runs again
        with ``exact`` (the maximum)."""
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        n = pos + 1
        cs, sn = self._rope_tables(pos)
        perm, qkv, qk, q_raw, k_raw, v = self.perm_qk, self.qkv, self.qk, self.q, self.k, self.v
        rot, rot_q, rot_k, g, u = self.rot, self.rot_q, self.rot_k, self.g, self.u
        top, total = np.maximum.reduce, np.add.reduce  # ~0.5 µs less per call than the methods
        dot, sqrt, eps, inv = np.dot, math.sqrt, self.eps, 1.0 / self.embed.shape[1]
        x = self.embed[token].copy()
        with np.errstate(over="ignore", invalid="ignore"):  # SiLU's exp(-g) -> inf for g < -88: silu -> -0
            for (proj, mlp, wo, wd, n1, n2, bqkv, qn, kn), (kb, vb) in zip(self.layers, buffers):
                # RMSNorm of one vector, inline: its scale a Python float (float32 kept)
                h = x * (1.0 / sqrt(float(dot(x, x)) * inv + eps)) * n1
                for w, out in proj:  # sgemv: W is (out, in) row-major
                    np.matmul(w, h, out=out)
                if bqkv is not None:
                    qkv += bqkv
                if qn is not None:
                    q_raw[:] = self._rms(q_raw.reshape(H, D), qn).reshape(-1)
                    k_raw[:] = self._rms(k_raw.reshape(KV, D), kn).reshape(-1)
                np.multiply(qk, cs, out=rot)  # q (scaled by 1/sqrt(D) too) and k, rotated
                rot += qk[perm] * sn
                kb[:, pos] = rot_k
                vb[:, pos] = v
                s = np.matmul(rot_q, kb[:, :n].transpose(0, 2, 1))
                s = np.exp(s - (top(s, axis=-1, keepdims=True) if exact else s[..., -1:]))
                o = np.matmul(s, vb[:, :n]) / total(s, axis=-1, keepdims=True)
                x = x + wo @ o.reshape(H * D)
                h = x * (1.0 / sqrt(float(dot(x, x)) * inv + eps)) * n2
                for w, out in mlp:
                    np.matmul(w, h, out=out)
                x = x + wd @ ((g / (1.0 + np.exp(-g))) * u)
        return x

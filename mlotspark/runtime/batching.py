"""Batched decoding over sequences that each keep their own cache.

A decode step runs the token embedding, projections, MLP and LM head once for B
sequences. Attention is where sequences differ, so each layer gets a
:class:`BatchCache`: rows whose caches are plain KV are packed into one left-padded
buffer (mlx-lm's ``BatchKVCache``) and attended in one call; every other row
(memory cascade, float16 or quantized KV, anything with ``attend``) goes to its
own cache object, so it keeps its own positions, RoPE offsets and cascade state.
Packed rows are written back into their own caches when they leave the batch.

Steps are pipelined as in mlx-lm's ``generate_step``: a step is launched with the
previous step's sampled tokens before they are read back, so building one step
overlaps the compute of the one before.

A row is a request's engine-side ``runtime.sequence.Sequence`` (its cache, sampler, counters
and ``feed``); it is not imported here, as ``sequence.py`` imports this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.models.cache import KVCache as MlxKVCache

from mlotspark.models.execution import runner_for
from mlotspark.caches.kv import KVCache
from mlotspark.decoding.sampling import process_logits, to_logprobs

__all__ = ["BatchCache", "DecodeBatch", "Inflight", "attend_packed", "is_plain_kv", "supports_batching"]


class BatchCache:
    """One layer's view of the batch for one decode step.

    Rows ``[0, P)`` are packed plain-KV rows attended together (one left-padded
    buffer, one attention call); each later row goes to its own cache's ``attend``.

    Args:
        caches: the per-row caches (rows after the packed ones); anything with ``attend``.
        packed: this layer's packed buffer for the first rows, or None.
        mask: the packed rows' mask (their left padding), shared by all layers.
    """

    def __init__(self, caches: Sequence[Any], packed: BatchKVCache | None = None, mask: Any = None):
        self.caches = list(caches)
        self.packed = packed
        self.mask = mask

    @property
    def sole(self) -> Any:
        """The row's own cache when the batch is one unpacked row, else None."""
        return self.caches[0] if self.packed is None and len(self.caches) == 1 else None

    def make_mask(self, N: int, return_array: bool = False, window_size: Any = None) -> None:
        """No model-level mask: each part of the batch brings its own."""
        if N != 1:
            raise ValueError(f"a batch cache decodes one token per row, got {N}")
        return None

    def attend(
        self,
        q: mx.array,
        k: mx.array,
        v: mx.array,
        *,
        rope: Callable[..., mx.array],
        scale: float,
        mask: Any = None,
    ) -> mx.array:
        """Attend the packed rows together, then every other row with its own cache.

        Args:
            q: un-rotated queries (B, Hq, 1, D); k, v: (B, Hkv, 1, D).

        Returns:
            (B, Hq, 1, D) attention output.
        """
        if self.sole is not None:
            return self.sole.attend(q, k, v, rope=rope, scale=scale)
        outs, P = [], 0
        if self.packed is not None:
            P = self.packed.offset.shape[0]
            qp, kp, vp = (q, k, v) if P == q.shape[0] else (q[:P], k[:P], v[:P])
            outs.append(attend_packed(self.packed, qp, kp, vp, rope=rope, scale=scale, mask=self.mask))
        for i, c in enumerate(self.caches, start=P):
            outs.append(c.attend(q[i : i + 1], k[i : i + 1], v[i : i + 1], rope=rope, scale=scale))
        return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=0)


def attend_packed(kv: BatchKVCache, q: mx.array, k: mx.array, v: mx.array, *, rope: Callable[..., mx.array],
                  scale: float, mask: Any) -> mx.array:
    """Attention of rows packed in one left-padded buffer (a decode step's ``BatchCache``,
    a batched prefill's ``PrefillCache``): each row rotated at its own position.

    Args:
        kv: the rows' merged buffer; q: un-rotated (P, Hq, L, D); k, v: (P, Hkv, L, D).
        mask: the rows' mask (their left padding; causal over a prefill chunk).

    Returns:
        (P, Hq, L, D) attention output.
    """
    pos = kv.offset  # (P,) each row's position of its first new token
    q, k = rope(q, offset=pos), rope(k, offset=pos)
    keys, values = kv.update_and_fetch(k, v)  # (P, Hkv, T, D), left-padded
    return mx.fast.scaled_dot_product_attention(q, keys, values, scale=scale, mask=mask)


def is_plain_kv(cache: Sequence[Any]) -> bool:
    """True when every layer is a plain full-attention KV cache (ours or mlx-lm's)."""
    return bool(cache) and all(type(c) in (KVCache, MlxKVCache) for c in cache)


def supports_batching(model: Any) -> bool:
    """True for models whose attention goes through ``cache.attend`` (``models.llama``, or a
    share of one that says so with ``batchable``: a distributed rank's layers)."""
    from mlotspark.models import llama

    return isinstance(model, llama.Model) or getattr(model, "batchable", False) is True


def _seed_for(seed: int, step: int) -> int:
    """The seed of a seeded request's ``step``-th sample."""
    # A request's own random stream, independent of whoever shares its batch.
    return (seed * 0x9E3779B1 + step * 0x85EBCA77 + 1) & 0xFFFFFFFF


def _sample_rows(seqs: Sequence[Any], logits: mx.array) -> mx.array:
    """Sample one token per row with each sequence's own options.

    Args:
        logits: (B, V) last-position logits.

    Returns:
        (B,) token ids (not yet evaluated).
    """
    plain = all(s.greedy and not s.processors for s in seqs)
    if plain:  # the common greedy case: one argmax over the batch
        return mx.argmax(logits, axis=-1)
    out = []
    for i, s in enumerate(seqs):
        row = logits[i : i + 1]  # (1, V)
        if s.processors:
            row = process_logits(row, [s.history()], [s.processors])
        logprobs = to_logprobs(row)
        if s.options.seed is not None and not s.greedy:
            # The key is taken when the op is built, so the next row may reseed at once.
            mx.random.seed(_seed_for(s.options.seed, s.steps))
        tok = s.sampler(logprobs)
        out.append(tok.reshape(1))
    return mx.concatenate(out)


@dataclass
class Inflight:
    """A launched decode step: its rows and their sampled tokens (not read back yet)."""

    rows: list[Any]
    sampled: mx.array  # (B,)
    t_launch: float
    ids: set[int] = field(default_factory=set)
    tag: Any = None  # the caller's note (the scheduler's governor state and cap)


class DecodeBatch:
    """The decode batch, kept across steps by the engine thread.

    Sequences whose caches are all plain KV are packed into one left-padded buffer
    per layer (mlx-lm's ``BatchKVCache``) while two or more of them decode
    together: one attention call for all of them instead of one per row, which is
    what makes batch 8 pay off on a CPU. Their own cache objects are emptied while
    packed (no double memory) and written back when they leave the batch, so the
    caller finds an ordinary cache afterwards. Other caches (cascade, quantized)
    attend row by row and are never copied.

    A model whose attention does not go through ``cache.attend`` (mlx-lm's classes) steps
    each row on its own, through the runner's ``step``: a lone request is a batch of one.

    Args:
        model: the model's runner (``models/execution.py``; a bare model runs plainly).
    """

    def __init__(self, model: Any):
        self.runner = runner_for(model)
        self.batchable = supports_batching(self.runner.model)  # rows may share one forward pass
        self.packed: list[Any] = []
        self._kv: list[BatchKVCache] = []
        self._inflight: Inflight | None = None
        self._singles = False  # this step's rows go one by one through the NumPy step

    @property
    def inflight(self) -> Inflight | None:
        """The step launched last and not collected yet."""
        return self._inflight

    def launch(self, seqs: Sequence[Any]) -> Inflight | None:
        """Start a decode step for ``seqs`` without waiting for it; return the previous one.

        Rows that were in the previous step feed its sampled token without reading
        it back first (as mlx-lm's ``generate_step`` does), so building this step
        overlaps the previous one's compute. Pass the returned step to :meth:`collect`.

        Args:
            seqs: the sequences decoding together (B ≥ 1).
        """
        t_launch = time.perf_counter()  # graph building is part of the step's time
        prev = self._inflight
        from_prev = {id(r): i for i, r in enumerate(prev.rows)} if prev is not None else {}
        self._sync(seqs)
        others = [s for s in seqs if s not in self.packed]
        rows = self.packed + others  # packed rows first: BatchCache expects them there
        pieces = []
        for s in rows:
            j = from_prev.get(id(s))
            if j is not None:
                s.lazy_input = prev.sampled[j : j + 1]  # (1,) not read back yet
                pieces.append(s.lazy_input)
            else:
                s.lazy_input = None
                if s.decoded:  # the first step feeds the prompt's last token, already listed
                    s.feed(s.next_token)
                pieces.append(mx.array([s.next_token]))
            s.decoded = True
            s.steps += 1
            s.batch_sizes += len(rows)
        tokens = mx.concatenate(pieces)[:, None]  # (B, 1)
        if self._singles:
            # Each row a step of its own through the runner (the NumPy step, or a model without
            # ``cache.attend``); the NumPy step reads its input token: no overlap with the step before.
            logits = mx.concatenate([self.runner.step(tokens[i : i + 1], s.cache)[:, -1, :]
                                     for i, s in enumerate(rows)])
        else:
            n_layers = len(self.runner.layers)
            if self.packed:
                mask = self._kv[0].make_mask(1)  # (P, 1, 1, T) hides each row's left padding
                caches = [BatchCache([s.cache[i] for s in others], self._kv[i], mask) for i in range(n_layers)]
            else:
                caches = [BatchCache([s.cache[i] for s in others]) for i in range(n_layers)]
            logits = self.runner.forward(tokens, caches)[:, -1, :]  # (B, V)
        sampled = _sample_rows(rows, logits)
        mx.async_eval(sampled)
        self._inflight = Inflight(rows, sampled, t_launch, {id(r) for r in rows})
        return prev

    def collect(self, step: Inflight | None) -> list[tuple[Any, int]]:
        """Wait for ``step`` and return each row's sampled token.

        A row that the step after it feeds straight from ``step`` gets the token
        noted as fed (``feed``) here, now that its value is known.
        """
        if step is None:
            return []
        values = step.sampled.tolist()
        nxt = self._inflight
        for s, tok in zip(step.rows, values):
            if nxt is not None and nxt is not step and id(s) in nxt.ids and s.lazy_input is not None:
                s.feed(tok)
        return list(zip(step.rows, values))

    def drain(self) -> list[tuple[Any, int]]:
        """Wait for the step in flight, if any, and return its tokens; none is left."""
        step, self._inflight = self._inflight, None
        return self.collect(step)

    def step(self, seqs: Sequence[Any]) -> list[int]:
        """One decode step, waited for (tests, benchmarks): tokens in the order of ``seqs``."""
        self.collect(self.launch(seqs))
        by_row = {id(s): t for s, t in self.drain()}
        return [by_row[id(s)] for s in seqs]

    def release(self, seq: Any, write_back: bool = True) -> None:
        """Take ``seq`` out of the packed buffer (its KV back in its cache unless told not to)."""
        if seq in self.packed:
            self._remove([seq], write_back)

    def _one_by_one(self, rows: Sequence[Any]) -> bool:
        """Whether ``rows`` are better stepped one by one than packed: the runner says."""
        return self.runner.prefers_unpacked([s.cache for s in rows])

    def _sync(self, seqs: Sequence[Any]) -> None:
        """Pack the plain rows of ``seqs`` (two or more, unless they go one by one through
        the NumPy step: ``_one_by_one``), unpack rows no longer wanted."""
        if not self.batchable:  # the model's own attention: each row a step of its own
            self._singles = True
            return
        plain = [s for s in seqs if s.plain]
        self._singles = 0 < len(plain) == len(seqs) and self._one_by_one(plain)
        if len(plain) < 2 or self._singles:
            plain = []
        leaving = [s for s in self.packed if s not in plain]
        if leaving:
            self._remove(leaving, write_back=True)
        joining = [s for s in plain if s not in self.packed]
        if not joining:
            return
        for i in range(len(self.runner.layers)):
            merged = BatchKVCache.merge([s.cache[i] for s in joining])
            if self.packed:
                self._kv[i].extend(merged)
            else:
                self._kv.append(merged)
        for s in joining:
            for c in s.cache:  # the packed buffer holds these now
                c.keys = c.values = None
        self.packed += joining

    def _remove(self, seqs: Sequence[Any], write_back: bool) -> None:
        idx = [self.packed.index(s) for s in seqs]
        if write_back:
            for s, row in zip(seqs, idx):
                for own, kv in zip(s.cache, self._kv):
                    out = kv.extract(row)
                    own.keys, own.values, own.offset = out.keys, out.values, out.offset
        keep = [i for i in range(len(self.packed)) if i not in idx]
        self.packed = [self.packed[i] for i in keep]
        if not self.packed:
            self._kv = []
            return
        rows = mx.array(keep)
        for kv in self._kv:
            kv.filter(rows)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed buffers."""
        return sum(kv.nbytes for kv in self._kv)

"""Prefill on the engine thread: one request's chunk alone, or several requests' chunks at once.

The one module that runs a prompt into a cache: every request chunk by chunk
(``prefill_chunk``, ``prefill_batch``, driven by the scheduler), whether it then decodes in
the batch or in its own loop (beams, speculation, several returns), and a caller's record
outside the engine all at once (``prefill_prompt``: tests, tools that fill a cache).

Many short requests arriving together (an HTTP server under load) would otherwise
each pay a forward pass of their own before they can join the decode batch. As
mlx-lm's ``BatchGenerator`` does, the chunks of several plain-KV requests run as one
(B, L) forward pass: their caches are merged into one left-padded buffer per layer
(mlx-lm's ``BatchKVCache``, each row keeping its own length, so prompt-cache hits of
different lengths mix), the shorter chunks are right-padded, and after the pass the
padding is rolled to the left (``BatchKVCache.finalize``) and every row's KV is
written back into its own cache. A right-padded position comes after its row's real
tokens, so causality alone keeps it out of their attention; its keys end up in the
left padding, which the mask hides.

All prompt tokens but the last are prefilled here (as mlx-lm's ``generate_step``
does); the last one is the sequence's first decode input. Between the two, each
request's caches get their lifecycle step (``prepare_decode``,
``caches/interface.py``), here, so every path that prefills through this module
(solo and batched requests, conversations, the server, every distributed rank) runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import BatchKVCache

from mlotspark.caches.interface import prepare_decode
from mlotspark.models.execution import runner_for
from mlotspark.runtime.batching import attend_packed
from mlotspark.runtime.progress import ProgressListener, meter_for

__all__ = ["MAX_PREFILL_BATCH", "PrefillCache", "PromptPrefill", "prefill_batch", "prefill_chunk", "prefill_prompt"]

#: Requests prefilled in one pass at most (mlx-lm's ``prefill_batch_size`` default).
MAX_PREFILL_BATCH = 8


class PromptPrefill:
    """Prefill counters over a caller's record that has no engine-side ``Sequence`` (a test,
    a tool that fills a cache): what ``prefill_chunk`` reads of a ``Sequence`` (``prompt``,
    ``cache``, ``options``, ``prefilled``, ``prefill_left``, ``meter``), no decode state.

    Args:
        gen: the request's record (prompt, cache, ``options.prefill_chunk``).
        on_progress: takes each ``PrefillProgress``; None: nobody listens.
    """

    def __init__(self, gen: Any, on_progress: ProgressListener | None = None):
        self.prompt, self.cache, self.options = gen.prompt, gen.cache, gen.options
        self.prefilled = 0
        self.meter = meter_for(gen, on_progress)

    @property
    def prefill_left(self) -> int:
        """Prompt tokens still to prefill (all but the last: it starts decode)."""
        return max(len(self.prompt) - 1 - self.prefilled, 0)


def prefill_prompt(model: Any, seq: Any) -> int:
    """Run all of ``seq.prompt`` but its last token into ``seq.cache``, in chunks of
    ``options.prefill_chunk``, then the caches' ``prepare_decode``; progress goes to
    ``seq.meter``.

    Args:
        model: the model's runner (a bare model runs plainly).
        seq: the request: a ``Sequence`` (engine side), or a record (``Generation``),
            prefilled through a ``PromptPrefill`` over it.

    Returns:
        Tokens prefilled.
    """
    state = seq if hasattr(seq, "prefill_left") else PromptPrefill(seq)
    while prefill_chunk(model, state):
        mx.clear_cache()
    if state.meter is not None:
        state.meter(len(state.prompt))  # a one-token prompt: nothing ran, the prompt is in
    return state.prefilled


def _advance(model: Any, seq: Any, n: int) -> None:
    """Count ``n`` more prompt tokens of ``seq`` as prefilled and report progress; once
    the prefill is done, run the caches' lifecycle step before the first decode step
    (``prepare_decode``: the cascade's question pass)."""
    seq.prefilled += n
    if seq.prefill_left == 0:
        prepare_decode(model, seq.cache, seq.prompt[: seq.prefilled])
    if seq.meter is not None:
        # The last prompt token runs in the first decode step: the prompt counts as
        # prefilled once nothing else is left, as in mlx-lm's generate_step.
        seq.meter(len(seq.prompt) if seq.prefill_left == 0 else seq.prefilled)


def _chunk_len(seq: Any) -> int:
    return min(seq.options.prefill_chunk, seq.prefill_left)


def prefill_chunk(model: Any, seq: Any) -> int:
    """Run one prefill chunk of ``seq`` alone through the model's runner (any cache kind).

    Returns:
        Tokens processed (0 when nothing was left).
    """
    n = _chunk_len(seq)
    if n <= 0:
        return 0
    model = runner_for(model)
    start = seq.prefilled
    chunk = mx.array(seq.prompt[start : start + n])[None]  # (1, n)
    model.forward(chunk, seq.cache)  # the logits are never evaluated: only the cache is
    mx.eval([c.state for c in seq.cache])
    _advance(model, seq, n)
    return n


class PrefillCache:
    """One layer's view of a batched prefill chunk: the rows' merged KV.

    Args:
        kv: this layer's merged, left-padded buffer (right padding prepared).
        mask: (B, 1, L, T) boolean mask of the chunk, shared by all layers.
    """

    def __init__(self, kv: BatchKVCache, mask: mx.array):
        self.kv = kv
        self.mask = mask

    def make_mask(self, N: int, return_array: bool = False, window_size: Any = None) -> None:
        """No model-level mask: ``attend`` uses the chunk's own (left padding hidden)."""
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
        """Rotate at each row's own position, append to the buffer, attend.

        Args:
            q: un-rotated queries (B, Hq, L, D); k, v: (B, Hkv, L, D).

        Returns:
            (B, Hq, L, D) attention output.
        """
        return attend_packed(self.kv, q, k, v, rope=rope, scale=scale, mask=self.mask)


def prefill_batch(model: Any, seqs: Sequence[Any]) -> int:
    """Run one prefill chunk of each of ``seqs`` (plain-KV caches) in one forward pass.

    Each row takes its own chunk length (``options.prefill_chunk``, at most what it
    has left); the caches are merged for the pass and written back after it, so
    every request holds an ordinary ``KVCache`` again.

    Args:
        model: the runner of a ``models.llama.Model`` (attention through ``cache.attend``).
        seqs: sequences whose caches are all plain KV (``runtime.sequence.Sequence.plain``).

    Returns:
        Tokens processed over all rows (0 when none had anything left).

    Raises:
        ValueError: a sequence whose cache is not plain KV.
    """
    seqs = [s for s in seqs if s.prefill_left > 0]
    if not seqs:
        return 0
    bad = [s for s in seqs if not s.plain]
    if bad:
        raise ValueError(f"batched prefill needs plain KV caches, got {type(bad[0].cache[0]).__name__}")
    if len(seqs) == 1:
        return prefill_chunk(model, seqs[0])
    model = runner_for(model)
    lengths = [_chunk_len(s) for s in seqs]
    L = max(lengths)
    right = [L - n for n in lengths]
    rows = [s.prompt[s.prefilled : s.prefilled + n] + [0] * (L - n) for s, n in zip(seqs, lengths)]
    tokens = mx.array(rows)  # (B, L), right-padded with token 0 (never attended by real tokens)
    n_layers = len(seqs[0].cache)
    kvs = []
    for i in range(n_layers):
        kv = BatchKVCache.merge([s.cache[i] for s in seqs])
        kv.prepare(right_padding=right)
        kvs.append(kv)
    # Every layer shares the padding, so one mask serves them all.
    mask = create_causal_mask(L, offset=kvs[0].size(), left_padding=kvs[0].left_padding)
    model.forward(tokens, [PrefillCache(kv, mask) for kv in kvs])
    for kv in kvs:
        kv.finalize()  # right padding rolled to the left, where the mask hides it
    # What BatchKVCache.extract does, but into each request's own cache objects (our
    # KVCache, with attend) and with one host read of the paddings, not one per row and layer.
    pads, end = kvs[0].left_padding.tolist(), kvs[0].size()  # the same in every layer
    for row, (s, pad) in enumerate(zip(seqs, pads)):
        for own, kv in zip(s.cache, kvs):
            own.keys = mx.contiguous(kv.keys[row : row + 1, :, pad:end])
            own.values = mx.contiguous(kv.values[row : row + 1, :, pad:end])
            own.offset = end - pad
    mx.eval([c.state for s in seqs for c in s.cache])
    for s, n in zip(seqs, lengths):
        _advance(model, s, n)
    return sum(lengths)

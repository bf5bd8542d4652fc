"""Pipeline parallelism: each rank runs a contiguous slice of the layers.

Every rank runs the same batched steps (rank 0's scheduler decides them, ``leader.py``);
only the hidden states cross machines. Rank 0 embeds the tokens and runs the first
slice; each next rank receives (``mx.distributed.recv``), runs its slice and sends
on (``send``); the last slice's output comes back to rank 0 through an
``all_gather`` that every rank joins, and rank 0 alone holds the norm and LM head,
and samples.

Every transfer is evaluated at once, with its input evaluated first. mlx-lm leaves
them lazy inside the step's graph (tied to the caches with ``mx.depends``); on MLX's
CPU backend with the ring (mlx 0.32) that hung both ranks whenever a collective's
input was still a lazy computation (measured here). The cost is the overlap of
building one step's graph with the compute of the one before: small next to the
transfer itself.
"""

from __future__ import annotations

from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask

from mlotspark.models import llama
from mlotspark.caches.kv import KVCache


class PipelineModel(nn.Module):
    """One rank's share of a llama-family model. ``model(tokens (B, L), cache) -> logits``.

    On rank 0 the logits are real; on other ranks they are a zero stand-in (their
    sampler's choice is replaced by rank 0's anyway).

    Args:
        model: the full-size model whose layers outside ``[start, end)`` are dropped
            (unevaluated, so lazily loaded weights of other ranks are never read).
        group: the MLX group; ``rank``/``size`` come from it.
        start: first layer of this rank; end: one past its last layer.
        hidden_dtype: dtype of the hidden states rank 0's embedding produces.
    """

    #: attention goes through ``cache.attend`` (llama's layers): the scheduler may batch it.
    batchable = True

    def __init__(self, model: llama.Model, group: Any, start: int, end: int, hidden_dtype: Any):
        super().__init__()
        self.args = model.args
        self.model_type = model.model_type
        self.group = group
        self.rank, self.size = group.rank(), group.size()
        self.start, self.end = start, end
        self.hidden_dtype = hidden_dtype
        inner = model.model
        inner.layers = inner.layers[start:end]
        if self.rank != 0:  # the embedding and head live on rank 0 only
            inner.pop("embed_tokens")
            inner.pop("norm")
        elif not model.args.tie_word_embeddings:
            self.lm_head = model.lm_head
        self.model = inner

    @property
    def layers(self) -> list:
        return self.model.layers

    def make_cache(self) -> list:
        """One plain KV cache per layer of this rank."""
        return [KVCache() for _ in self.layers]

    def reduce_scores(self, scores: mx.array) -> mx.array:
        """Sum per-block scores over every rank (``ScoreReducer``): each holds other layers,
        so the question pass's consensus is the one a single process would take."""
        if self.size == 1:
            return scores
        return _now(mx.distributed.all_sum(scores, group=self.group))

    def logits(self, hidden: mx.array) -> mx.array:
        """Rank 0: final hidden states (B, L, H) to logits (B, L, V)."""
        if self.args.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(hidden)
        return self.lm_head(hidden)

    def __call__(self, inputs: mx.array, cache: Optional[list] = None) -> mx.array:
        B, L = inputs.shape
        H, V = self.args.hidden_size, self.args.vocab_size
        if cache is None:
            cache = [None] * len(self.layers)
        if self.rank == 0:
            h = self.model.embed_tokens(inputs)
        else:
            h = _now(mx.distributed.recv((B, L, H), self.hidden_dtype, self.rank - 1, group=self.group))
        mask = create_attention_mask(h, cache[0])
        for layer, c in zip(self.layers, cache):
            h = layer(h, mask, c)
        if self.size == 1:  # a group of one: no transfer, so the step stays lazy as on the plain path
            return self.logits(self.model.norm(h))
        mx.eval(h)
        if self.rank < self.size - 1:
            h = _now(mx.distributed.send(h, self.rank + 1, group=self.group))
        if self.size > 1:
            h = _now(mx.distributed.all_gather(h, group=self.group))[(self.size - 1) * B :]  # the last stage
        if self.rank == 0:
            return self.logits(self.model.norm(h))
        return mx.broadcast_to(mx.zeros((1, 1, V), dtype=mx.float32), (B, L, V))


def _now(x: mx.array) -> mx.array:
    """Evaluate a transfer at once (see the module docstring)."""
    mx.eval(x)
    return x

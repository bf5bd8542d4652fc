"""How episodic blocks are chosen: block summaries, scores, and routing strategies.

Every sealed block gets a *summary* of its keys (without RoPE), kept in memory
even when the block's payload is spilled:

- ``minmax`` (default): the per-dimension minimum and maximum of the block's keys,
  as in Quest (Tang et al., 2024). ``q+ . max + q- . min`` is an upper bound of the
  best single key's score ``max_j q . k_j``, the exact max-similarity that DESIGN §4
  found to work, at the cost of two vectors per block.
- ``mean``: one mean key (InfLLM-like with one representative; poor in DESIGN §4).
- ``keys``: every key (exact max-similarity; routing cost grows with the length).

A query is scored against the summaries of its own KV head: the scores of the
query heads of one GQA group are summed, so each KV head picks its own top-k
blocks. A *router* says which queries drive the choice:

- ``sequence``: every query of the chunk, in runs of ``PREFILL_POOL`` tokens; the
  block distributions (softmax over blocks) of the runs are averaged, so a few
  tokens that need a block can win it against a chunk of filler (one mean query
  would be dominated by the filler).
- ``token``: the current token alone at decode; sequence-level for prefill.
- ``rolling``: the last ``rolling_window`` queries (prefill tail included),
  aggregated like ``sequence``, so the choice changes slowly.
- ``hybrid``: sequence-level for prefill, rolling for decode.
- ``question`` (default): sequence-level for prefill; at decode, the last
  ``rolling_window`` queries of the prompt (its question) keep driving the choice,
  so the selection stays put for the whole answer (DESIGN §4 saw answers lose a
  digit when it drifted between the decode steps of one answer).

``top_blocks`` then takes the best blocks per KV head; with ``follow`` each brings
the block after it, because what answers a question (a needle's value) follows
the key that matches it and often crosses a block edge (measured: "… is 8429." for
8429145 with the key in one block and "145" in the next).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import mlx.core as mx

from mlotspark.memory.cascade.config import CascadeConfig


#: Prefill queries averaged per routing row. Routing a chunk costs rows x blocks,
#: and blocks grow with the length: scoring every token made routing +65% of a
#: 512-token chunk's prefill at 32k tokens (1000 blocks); runs of 16 keep a short
#: question distinct within a chunk of filler at 1/16 of the cost.
PREFILL_POOL = 16


# ------------------------------------------------------------------ summaries
def summarize(k: mx.array, kind: str) -> mx.array:
    """Summary of one block's keys for routing.

    Args:
        k: keys without RoPE, (Hkv, B, D).
        kind: ``minmax | mean | keys``.

    Returns:
        float32 (Hkv, R, D): R = 2 (min, max), 1 (mean) or B (every key).
    """
    k = k.astype(mx.float32)
    if kind == "minmax":
        return mx.stack([k.min(axis=1), k.max(axis=1)], axis=1)
    if kind == "mean":
        return k.mean(axis=1, keepdims=True)
    return k


def summarize_blocks(k: mx.array, kind: str) -> mx.array:
    """``summarize`` of ``n`` consecutive blocks at once, laid out as ``SummaryIndex`` rows.

    Args:
        k: keys without RoPE, (Hkv, n, B, D): block ``j`` is ``k[:, j]``.
        kind: ``minmax | mean | keys``.

    Returns:
        float32 (Hkv, R, n, D): column ``j`` is ``summarize(k[:, j], kind)``.
    """
    k = k.astype(mx.float32)
    if kind == "minmax":
        return mx.stack([k.min(axis=2), k.max(axis=2)], axis=1)
    if kind == "mean":
        return k.mean(axis=2)[:, None]
    return k.swapaxes(1, 2)


def _pool(x: mx.array, size: int) -> mx.array:
    """Mean over runs of ``size`` consecutive rows: (H, M, D) -> (H, ceil(M / size), D)."""
    H, M, D = x.shape
    if size <= 1 or M <= 1:
        return x
    full = (M // size) * size
    parts = [x[:, :full].reshape(H, M // size, size, D).mean(axis=2)] if full else []
    if full < M:
        parts.append(x[:, full:].mean(axis=1, keepdims=True))
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1)


def score_blocks(q: mx.array, summaries: mx.array, kind: str, pool: int = 1) -> mx.array:
    """Score routing queries against block summaries, per KV head.

    The scores of a GQA group's query heads are summed, and with ``pool`` > 1 the
    scores of each run of ``pool`` consecutive queries are averaged. Both are linear
    in (q+, q-), so they are applied to the queries before the matmul: the cost is
    M / pool rows, not G * M.

    Args:
        q: routing queries without RoPE, (Hkv, G, M, D): G query heads per KV head.
        summaries: (Hkv, R, N, D) float32 (``SummaryIndex.view``).
        kind: the summary kind.
        pool: queries averaged per scored row.

    Returns:
        (Hkv, ceil(M / pool), N) float32 scores (higher = more relevant).
    """
    q = q.astype(mx.float32)
    Hkv, R, N, D = summaries.shape
    if kind == "minmax":
        qp = _pool(mx.maximum(q, 0).sum(axis=1), pool)  # (Hkv, M', D)
        qn = _pool(mx.minimum(q, 0).sum(axis=1), pool)
        # (Hkv, N, D) rows are contiguous, so BLAS reads the transposes as they are
        return qp @ summaries[:, 1].swapaxes(-1, -2) + qn @ summaries[:, 0].swapaxes(-1, -2)
    qs = _pool(q.sum(axis=1), pool)  # (Hkv, M', D)
    if R == 1:
        return qs @ summaries[:, 0].swapaxes(-1, -2)
    # ``keys``: the best key of each block (max over its rows)
    return mx.stack([qs @ summaries[:, r].swapaxes(-1, -2) for r in range(R)]).max(axis=0)


class SummaryIndex:
    """The summaries of one layer's blocks, appended as blocks are sealed.

    Stored (Hkv, R, capacity, D) so that each KV head's rows are contiguous for the
    scoring matmul (a strided operand costs a copy per call). The capacity grows by a
    quarter (at least 64 rows), so it holds at most ~25% unused rows (doubling held up to
    as many as in use: ~0.8 GB more at 1M tokens on Qwen2.5-0.5B) for a few more copies.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self.n = 0
        self.buf: mx.array | None = None  # (Hkv, R, cap, D) float32

    def add(self, summary: mx.array) -> None:
        """Append one block's summary (Hkv, R, D)."""
        self.add_many(summary[:, :, None])

    def add_many(self, summaries: mx.array) -> None:
        """Append ``n`` blocks' summaries (Hkv, R, n, D) (``summarize_blocks``) in one
        write; the capacity grows in the steps one block at a time would take."""
        H, R, n, D = summaries.shape
        cap = 0 if self.buf is None else self.buf.shape[2]
        new_cap = cap
        while new_cap < self.n + n:
            new_cap += max(64, new_cap // 4)
        if new_cap > cap:
            extra = mx.zeros((H, R, new_cap - cap, D), dtype=mx.float32)
            self.buf = extra if self.buf is None else mx.concatenate([self.buf, extra], axis=2)
        self.buf[:, :, self.n : self.n + n] = summaries
        self.n += n

    def view(self) -> mx.array:
        """(Hkv, R, N, D) summaries of the N blocks so far."""
        return self.buf[:, :, : self.n]

    def score(self, q: mx.array, pool: int = 1) -> mx.array:
        """``score_blocks`` of routing queries (Hkv, G, M, D) -> (Hkv, M', N)."""
        return score_blocks(q, self.view(), self.kind, pool)

    @property
    def nbytes(self) -> int:
        """Bytes of the summaries in use."""
        return self.view().nbytes if self.n else 0

    def to_array(self) -> mx.array | None:
        return self.view() if self.n else None

    @classmethod
    def from_array(cls, kind: str, a: mx.array | None) -> "SummaryIndex":
        index = cls(kind)
        if a is not None:
            index.buf, index.n = a, a.shape[2]
        return index


def block_distribution(scores: mx.array, scale: float) -> mx.array:
    """Average over queries of each query's softmax over blocks: (Hkv, M, N) -> (Hkv, N)."""
    return mx.softmax(scores * scale, axis=-1).mean(axis=1)


def top_blocks(relevance: mx.array, k: int, follow: int = 0,
               exclude: set[int] | frozenset[int] = frozenset(), lead: int = 0) -> tuple[tuple[int, ...], ...]:
    """The ``k`` blocks to attend per KV head, in original order.

    With ``follow`` > 0 each block taken, best first, brings the ``follow`` blocks
    after it (while they exist and ``k`` is not reached): the tokens after a key
    that matches the question (a needle's value, the rest of its sentence) often
    cross into the next block, and they match the question less than the key does.

    Args:
        relevance: (Hkv, N) with N > k.
        k: blocks per KV head.
        follow: successors taken with each block.
        exclude: blocks never taken, nor counted (already attended: the pinned ones
            ``CascadeCache._route_beside`` routes beside); at least k of the N lie outside it.
        lead: predecessors taken with each block (before it, then its successors).

    Returns:
        One sorted tuple of ``k`` block ids per KV head (a host sync: the block
        store needs the ids).
    """
    if follow <= 0 and lead <= 0 and not exclude:
        idx = mx.argpartition(-relevance, kth=k - 1, axis=-1)[:, :k]
        return tuple(tuple(sorted(row)) for row in idx.tolist())
    n = relevance.shape[-1]
    out = []
    for ranked in mx.argsort(-relevance, axis=-1).tolist():
        chosen: set[int] = set()
        for b in ranked:
            if b in exclude:
                continue
            for c in around(b, n, lead, follow):
                if c not in exclude and len(chosen) < k:
                    chosen.add(c)
            if len(chosen) == k:
                break
        out.append(tuple(sorted(chosen)))
    return tuple(out)


def around(b: int, n: int, lead: int, follow: int) -> list[int]:
    """Block ``b``, then ``lead`` blocks before it and ``follow`` after (nearest first), within
    [0, n): the order they are taken in, so a budget that runs out keeps ``b`` itself."""
    return [b, *range(b - 1, max(-1, b - lead - 1), -1), *range(b + 1, min(n, b + follow + 1))]


# ------------------------------------------------------------------- routers
def group_queries(q: mx.array, n_kv_heads: int) -> mx.array:
    """(1, Hq, L, D) -> (Hkv, G, L, D): query head i belongs to KV head i // G."""
    _, Hq, L, D = q.shape
    return q.reshape(n_kv_heads, Hq // n_kv_heads, L, D)


class Router(ABC):
    """Chooses the queries that pick a layer's blocks. One instance per layer."""

    name: str = ""
    interval: int = 1  # decode steps a choice is kept before the blocks are scored again

    def pool(self, decode: bool) -> int:
        """Queries averaged per scored row: 1 at decode; ``PREFILL_POOL`` for a
        prefill chunk, which keeps routing a small share of prefill at any length."""
        return 1 if decode else PREFILL_POOL

    @abstractmethod
    def queries(self, q: mx.array, decode: bool) -> mx.array:
        """Routing queries (Hkv, G, M, D) for a call with grouped queries ``q``
        (Hkv, G, L, D); ``decode`` is True for single-token steps."""

    def reset(self) -> None:
        """Forget remembered queries (a new sequence)."""

    def to_state(self) -> dict[str, mx.array]:
        return {}

    def from_state(self, arrays: dict[str, mx.array]) -> None:
        pass


class SequenceRouter(Router):
    """Every query of the chunk drives the choice (decode: the one token)."""

    name = "sequence"

    def queries(self, q: mx.array, decode: bool) -> mx.array:
        return q


class TokenRouter(SequenceRouter):
    """Per token at decode; a prefill chunk is routed as a sequence (its tokens
    share one assembled context)."""

    name = "token"


class RollingRouter(Router):
    """The last ``n`` queries drive the choice, so it drifts slowly."""

    name = "rolling"

    def __init__(self, n: int):
        self.n = n
        # Its choice moves slowly by design: re-score every n/4 decode steps.
        self.interval = max(1, n // 4)
        self.recent: mx.array | None = None  # (Hkv, G, <=n, D)

    def remember(self, q: mx.array) -> mx.array:
        seen = q if self.recent is None else mx.concatenate([self.recent, q], axis=2)
        self.recent = seen[:, :, -self.n :]
        return self.recent

    def queries(self, q: mx.array, decode: bool) -> mx.array:
        return self.remember(q)

    def reset(self) -> None:
        self.recent = None

    def to_state(self) -> dict[str, mx.array]:
        return {} if self.recent is None else {"recent": self.recent}

    def from_state(self, arrays: dict[str, mx.array]) -> None:
        self.recent = arrays.get("recent")


class HybridRouter(RollingRouter):
    """Sequence-level for prefill chunks, rolling at decode."""

    name = "hybrid"

    def queries(self, q: mx.array, decode: bool) -> mx.array:
        recent = self.remember(q)
        return recent if decode else q


class QuestionRouter(RollingRouter):
    """Sequence-level for prefill; at decode the prompt's last queries, frozen (the default).

    The tail of the prompt is where a question sits; an answer's own tokens ("The
    special magic number for ... is") say little about which block holds the
    answer, and re-routing on them moved the selection mid-answer. Decode steps
    re-score only when a block was sealed meanwhile (and with the same queries).
    """

    name = "question"

    def __init__(self, n: int, keep: int = 0):
        super().__init__(n)
        self.interval = 1 << 30  # never re-score on decode steps alone
        self.keep = max(n, keep)  # queries remembered: the question pass may score more than routing uses

    def remember(self, q: mx.array) -> mx.array:
        seen = q if self.recent is None else mx.concatenate([self.recent, q], axis=2)
        self.recent = seen[:, :, -self.keep :]
        return self.recent[:, :, -self.n :]

    def queries(self, q: mx.array, decode: bool) -> mx.array:
        if decode:
            return q if self.recent is None else self.recent[:, :, -self.n :]
        return self.remember(q)


def make_router(config: CascadeConfig) -> Router:
    """A fresh router for one layer, as ``config.routing`` names."""
    if config.routing == "question":
        return QuestionRouter(config.rolling_window, config.question_queries)
    if config.routing == "sequence":
        return SequenceRouter()
    if config.routing == "token":
        return TokenRouter()
    if config.routing == "rolling":
        return RollingRouter(config.rolling_window)
    return HybridRouter(config.rolling_window)

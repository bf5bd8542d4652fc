"""The question pass: re-read the prompt's tail with the blocks its question chooses.

Why (benchmarks/RESULTS.md, issue 14 round 4): at 8k tokens the needle's blocks
were in only ~29% of the (layer, KV head) selections at the answer's first step,
although the deep layers' question queries ranked them near the top; and forcing
them into the *answer's* selections alone did not help, because the question's own
tokens had been prefilled in a chunk whose selection the surrounding haystack chose.
With the needle forced into both, the model answered.

So, once per prompt, between the last prefill chunk and the first decode step:

1. every layer's remembered question queries (the ``question`` router keeps the
   prompt's last ``rolling_window``) score the blocks of that layer; the softmax
   block distributions of all layers and KV heads are summed, so the layers whose
   queries point at a few blocks decide (a *consensus*), and the top ``top_k`` blocks
   (with ``follow``) become the selection of every layer and KV head;
2. the prompt's last ``question_pass`` tokens are trimmed from working memory and
   read again with that selection pinned (their KV and the remembered queries are
   rewritten, now having seen the chosen blocks);
3. the selection stays pinned for the whole answer (no re-routing on answer
   tokens), until the next prefill chunk unpins it.

Nothing happens while every block fits in ``top_k`` (then sinks + window + all
blocks is exact attention). The pass needs the token ids, so it is driven from the
model's forward (``LlamaModel.__call__`` asks ``cache[0].before_call``); it costs
``question_pass`` tokens of prefill once per prompt and makes decode routing free.
"""

from __future__ import annotations

from typing import Any, Sequence

import mlx.core as mx

from mlotspark.memory.cascade.routing import block_distribution, top_blocks


def consensus(caches: Sequence[Any], k: int, follow: int) -> tuple[int, ...]:
    """The ``k`` blocks the question queries of all layers agree on.

    Args:
        caches: one sequence's per-layer cascade caches (settled: same block count).
        k: blocks to choose.
        follow: successors taken with each block (``top_blocks``).

    Returns:
        Sorted block ids, or () when a layer has no remembered queries.
    """
    n = min(c.n_blocks for c in caches)
    total = None
    for c in caches:
        q = getattr(c.router, "recent", None)
        if q is None or c.index.n == 0:
            return ()
        rel = block_distribution(c.index.score(q, 1), c.scale)[:, :n].sum(axis=0)  # (N,)
        total = rel if total is None else total + rel
    return top_blocks(total[None], k, follow)[0]


class QuestionPass:
    """One sequence's question pass, shared by its layer caches (``cache.question``).

    Args:
        tokens: prompt tokens re-read (``CascadeConfig.question_pass``).
    """

    def __init__(self, tokens: int):
        self.tokens = tokens
        self.tail: mx.array | None = None  # the last ``tokens`` prompt ids seen in prefill
        self.pending = False  # a prefill happened and its question was not re-read yet
        self.running = False  # inside the re-read (its own forward must pass through)
        self.passes = 0  # re-reads done (stats, tests)

    def before_call(self, model: Any, inputs: mx.array, caches: Sequence[Any]) -> None:
        """Called by the model's forward before it runs ``inputs`` (1, L) on ``caches``.

        A prefill chunk (L > 1) is remembered and unpins the selection; the first
        single-token call after it (the prompt's last token: mlx-lm's
        ``generate_step`` and our scheduler prefill all but it) re-reads the tail first.
        """
        if self.running or inputs.ndim != 2 or inputs.shape[0] != 1:
            return
        if inputs.shape[1] > 1:
            for c in caches:
                c.pinned = None
            seen = inputs[0] if self.tail is None else mx.concatenate([self.tail, inputs[0]])
            self.tail = seen[-self.tokens :]
            self.pending = True
            return
        if not self.pending:
            return
        self.pending = False
        tail, self.tail = self.tail, None
        for c in caches:
            c.settle()  # what each layer's next call would do first: equal block counts
        first = caches[0]
        k = first.config.top_k
        n = tail.shape[0]
        if min(c.n_blocks for c in caches) <= k or any(c.n_window < n for c in caches):
            return  # every block is attended anyway, or the tail already left the window
        chosen = consensus(caches, k, first.config.follow)
        if len(chosen) != k:
            return
        for c in caches:
            if c.trim(n) != n:  # cannot happen after the check above; stay consistent if it does
                raise RuntimeError(f"cascade layer {c.layer} could not drop {n} tokens for the question pass")
            c.pinned = chosen
        self.running = True
        try:
            model(tail[None], caches)  # rewrites the tail's KV; its output is not needed
        finally:
            self.running = False
        self.passes += 1


__all__ = ["QuestionPass", "consensus"]

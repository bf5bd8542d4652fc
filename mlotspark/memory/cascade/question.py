"""The question pass: re-read the prompt's tail with the blocks its question chooses.

Why (measured): at 8k tokens the needle's blocks
were in only ~29% of the (layer, KV head) selections at the answer's first step,
although the deep layers' question queries ranked them near the top; and forcing
them into the *answer's* selections alone did not help, because the question's own
tokens had been prefilled in a chunk whose selection the surrounding haystack chose.
With the needle forced into both, the model answered.

So, once per prompt, between the last prefill chunk and the first decode step:

1. every layer's remembered question queries (the ``question`` router keeps the
   prompt's last ``question_queries``) are scored exactly against all of that layer's
   keys; the attention mass each block gets (``block_mass``) is summed over layers
   and KV heads, so the layers whose question looks at a few blocks decide (a
   *consensus*), and the top ``top_k`` blocks (with ``follow``) become the selection
   of every layer and KV head (optionally each pair's mass raised to
   ``question_sharpen`` first, and only the blocks near the best kept with
   ``question_focus``: see ``consensus``);
2. the prompt's last ``question_pass`` tokens are trimmed from working memory and
   read again with that selection pinned (their KV and the remembered queries are
   rewritten, now having seen the chosen blocks);
3. the selection stays pinned for the whole answer (no re-routing on answer
   tokens), until the next prefill chunk unpins it; blocks sealed after the pass
   (tokens the answer pushes out of the window) join it (``CascadeCache.pin``).

Nothing happens while every block fits in ``top_k`` (then sinks + window + all
blocks is exact attention). The pass needs the token ids, so it is driven by the
runtime as an explicit lifecycle step (``prepare_decode``, ``caches/interface.py``:
after the prompt's prefill, before its first decode step, on every path); it costs
``question_pass`` tokens of prefill and one exact scoring of the question against
every stored key (a read of the episodic store's keys, spilled blocks included, that
leaves its residency and LRU order alone) once per prompt, and makes decode routing free.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import mlx.core as mx

from mlotspark.memory.cascade.routing import around, top_blocks


def block_mass(cache: Any, n: int) -> mx.array:
    """How much attention the remembered question queries of one layer pay each of
    its first ``n`` blocks: (Hkv, n).

    Exact, not the routing summaries: the largest share any question query gives a
    block (``query_mass``; one question token that looks at a block is enough).
    Measured at 8k: the needle's block ranked 0-1 of 220
    this way, 7-48 under the minmax summaries, whose upper bound favours blocks of
    unusual keys.
    """
    return query_mass(cache, n).max(axis=1)


#: Blocks whose keys one step of ``query_mass`` scores: a step's memory stays ~150 MB on
#: a 0.5B model (2 KV heads x 112 question queries x 64k keys of scores and their exp,
#: float32, and the keys) at any length, where scoring a layer's keys at once took ~1 GB
#: more per layer at 1M tokens.
SCORE_BLOCKS = 2048


def query_mass(cache: Any, n: int) -> mx.array:
    """Each remembered question query's attention share on each of the layer's first
    ``n`` blocks: (Hkv, G * M, n), M = ``question_queries``.

    The queries are scored against every key of the layer ([sinks | blocks | window],
    without RoPE, as routing scores them), and each query's softmax over all of them
    is summed per block. The blocks are scored ``SCORE_BLOCKS`` at a time, each step's
    sums relative to its own largest score, and put on the softmax's common scale at
    the end (the running-max softmax of flash attention), so memory does not grow
    with the prompt's length.
    """
    B = cache.config.block_size
    q = cache.router.recent[:, :, -cache.config.question_queries :].astype(mx.float32)  # (Hkv, G, M, D)
    H, G, M, D = q.shape
    q = q.reshape(H, G * M, D) * cache.scale

    if n == 0:
        return mx.zeros((H, G * M, 0), dtype=mx.float32)

    def scores(keys: mx.array) -> mx.array:  # (Hkv, T, D) -> (Hkv, G * M, T)
        return q @ keys.swapaxes(-1, -2)

    held = ((cache.sink_k, cache.n_sinks), (cache.win_k, cache.n_window))  # working memory: sinks, window
    working = [a[0, :, :m].astype(mx.float32) for a, m in held if m]
    steps: list[tuple[mx.array, mx.array]] = []  # (block sums relative to the step's max, that max)
    for lo in range(0, n, SCORE_BLOCKS):
        ids = list(range(lo, min(n, lo + SCORE_BLOCKS)))
        s = scores(cache.store.peek_keys(cache.layer, ids, mx.float32))
        top = s.max(axis=-1, keepdims=True)
        sums = mx.exp(s - top).reshape(H, G * M, len(ids), B).sum(axis=-1)
        mx.eval(sums, top)  # one step's scores at a time
        steps.append((sums, top))
    # log of each query's softmax denominator over every key: working memory and all steps
    parts = [mx.log(sums.sum(axis=-1, keepdims=True)) + top for sums, top in steps]
    if working:
        parts.append(mx.logsumexp(scores(mx.concatenate(working, axis=1)), axis=-1, keepdims=True))
    total = mx.logsumexp(mx.concatenate(parts, axis=-1), axis=-1, keepdims=True)  # (Hkv, G * M, 1)
    return mx.concatenate([sums * mx.exp(top - total) for sums, top in steps], axis=-1)


def consensus(caches: Sequence[Any], k: int, follow: int, sharpen: int = 1, focus: float = 0.0,
              reduce: Callable[[mx.array], mx.array] | None = None, lead: int = 0) -> tuple[int, ...]:
    """The blocks the question queries of all layers agree on.

    Each (layer, KV head)'s ``block_mass`` is raised to ``sharpen`` before the sum
    over layers and heads. Why (measured): on niah_multikey the
    needles share their wording, and most (layer, head) pairs spread the question's
    attention over all of them a little; the few *retrieval* pairs that match the
    asked key (layers 17-18 of the default model) put most of one token's attention
    on its block. A plain sum lets the many diffuse pairs decide (right needle at
    1.3-1.8x the best wrong one); the cube lets the confident ones decide (17-20x).

    With ``focus`` > 0 only the blocks scoring at least ``focus`` times the best one
    are chosen (best first, each with its ``follow`` successors, at most ``k``), not
    the ``k`` best: blocks the question matches only through words it shares with
    others (the other needles) are then left out instead of filling the budget.

    Args:
        caches: one sequence's per-layer cascade caches (settled: same block count).
        k: most blocks to choose.
        follow: successors taken with each block (``top_blocks``).
        sharpen: exponent on each (layer, KV head)'s block mass (1 = plain sum).
        focus: keep blocks scoring >= ``focus`` x the best (0 = the ``k`` best).
        reduce: sums the scores over the ranks that hold the other layers (None: one process).
        lead: predecessors taken with each block (``top_blocks``).

    Returns:
        Sorted block ids (``k`` of them unless ``focus`` leaves fewer), or () when a
        layer has no remembered queries.
    """
    n = min(c.n_blocks for c in caches)
    total = None
    for c in caches:
        if getattr(c.router, "recent", None) is None or n == 0:
            return ()
        mass = block_mass(c, n)
        if sharpen != 1:
            mass = mass**sharpen
        mass = mass.sum(axis=0)  # (n,)
        total = mass if total is None else total + mass
        mx.eval(total)  # one layer's scores at a time: bounded memory at any length
    if reduce is not None:
        total = reduce(total)
    if focus <= 0:
        return top_blocks(total[None], k, follow, lead=lead)[0]
    return focused(total, k, follow, focus, lead)


def focused(score: mx.array, k: int, follow: int, focus: float, lead: int = 0) -> tuple[int, ...]:
    """The blocks of ``score`` (n,) at least ``focus`` x its best, best first, each with
    its ``lead`` predecessors and ``follow`` successors, at most ``k`` in all; sorted."""
    best = score.max().item()
    ranked = mx.argsort(-score).tolist()
    values = score.tolist()
    chosen: set[int] = set()
    n = len(values)
    for b in ranked:
        if values[b] < focus * best or len(chosen) >= k:
            break
        for c in around(b, n, lead, follow):
            if len(chosen) < k:
                chosen.add(c)
    return tuple(sorted(chosen))


class QuestionPass:
    """One sequence's question pass, shared by its layer caches (``cache.question``).

    Args:
        tokens: prompt tokens re-read (``CascadeConfig.question_pass``).
    """

    def __init__(self, tokens: int):
        self.tokens = tokens
        self.running = False  # inside the re-read (its own prefill must not unpin)
        self.passes = 0  # re-reads done (stats, tests)

    def run(self, model: Any, caches: Sequence[Any], prompt: Sequence[int]) -> bool:
        """Re-read the prompt's tail with the blocks its question chooses (see the module
        docstring); the runtime calls this through ``prepare_decode`` once per request,
        after the prefill and before the first decode step.

        Args:
            model: the model (or a rank's share of it: its ``reduce_scores`` sums the
                consensus over ranks, so every rank pins the same blocks).
            caches: one sequence's per-layer cascade caches.
            prompt: the tokens prefilled by this request (the last ``tokens`` are re-read).

        Returns:
            True when a re-read ran.
        """
        if self.running:
            return False
        for c in caches:  # this prompt's pass chooses afresh (a one-token prefill did not unpin)
            c.pinned = None
        if not prompt:
            return False
        tail = mx.array(list(prompt[-self.tokens :]))
        for c in caches:
            c.settle()  # what each layer's next call would do first: equal block counts
        first = caches[0]
        k = first.config.top_k
        n = tail.shape[0]
        if min(c.n_blocks for c in caches) <= k or any(c.n_window < n for c in caches):
            return False  # every block is attended anyway, or the tail already left the window
        cfg = first.config
        reduce = getattr(model, "reduce_scores", None)  # a ScoreReducer (caches/interface.py) when split over ranks
        chosen = consensus(caches, k, cfg.follow, cfg.question_sharpen, cfg.question_focus, reduce, cfg.lead)
        if not chosen:
            return False
        for c in caches:
            if c.trim(n) != n:  # cannot happen after the check above; stay consistent if it does
                raise RuntimeError(f"cascade layer {c.layer} could not drop {n} tokens for the question pass")
            c.pin(chosen)
        self.running = True
        try:
            model(tail[None], cache=list(caches))  # rewrites the tail's KV; its output is not needed
            mx.eval([c.state for c in caches])
        finally:
            self.running = False
        self.passes += 1
        return True


__all__ = ["SCORE_BLOCKS", "QuestionPass", "consensus", "focused"]

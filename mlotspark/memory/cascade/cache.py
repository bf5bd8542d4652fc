# Past 500 lines on purpose: attend, eviction, trim and state share one ring and its block bookkeeping.
"""The per-layer cascade cache: working memory (sinks + window) + retrieved blocks.

It stands in for ``caches.kv.KVCache``: the model's attention hands it un-rotated
q, k, v and it returns the attention output. Per call of L new tokens:

1. routing picks ``top_k`` episodic blocks per KV head (``routing.py``);
2. the context [sinks | selected blocks in original order | window | new] is
   rotated at contiguous positions 0, 1, ... (so no distance exceeds the span the
   config allows, whatever the total length) and attended, causal over the new;
3. the new tokens join the sinks (until full) or the window; whole blocks of B
   leave the window's old end for the episodic store when the next call finds it
   past W tokens (so ``trim`` can still drop the newest tokens).

The rotated context lives in one preallocated buffer; decode writes its token in
place, and the buffer is rebuilt only when the selection changes or a block leaves
the window (the positions shift), so a steady decode step costs what a plain KV
cache step costs over sinks + top_k * B + W keys.

What speaks of the whole model (check, make, snapshot, restore) is in ``model_caches.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import mlx.core as mx

from mlotspark.errors import SnapshotError
from mlotspark.memory.cascade.block_codec import STORED_KINDS
from mlotspark.memory.cascade.blocks import Block, EpisodicStore
from mlotspark.memory.cascade.config import CascadeConfig
from mlotspark.models.cpu import prefill_ops
from mlotspark.memory.cascade.question import QuestionPass
from mlotspark.memory.cascade.routing import Router, SummaryIndex, block_distribution, group_queries, make_router, summarize_blocks, top_blocks

Selection = tuple[tuple[int, ...], ...]  # per KV head, sorted block indices
_STEP = 256  # buffer growth, in tokens (as mlx-lm's KVCache)


@dataclass
class LayerCounters:
    """What one layer's cache did; summed by ``cascade_stats``."""

    calls: int = 0  # attend calls (prefill pieces + decode steps)
    routed: int = 0  # calls that scored blocks (a host sync each)
    selected: int = 0  # blocks attended, summed over calls and KV heads
    changes: int = 0  # calls whose selection differed from the previous call's
    rebuilds: int = 0  # rotated-context rebuilds


def _count(selection: Selection) -> int:
    return len(selection[0]) if selection else 0


def _grow(buf: mx.array | None, need: int, like: mx.array) -> mx.array:
    """A (1, H, cap, D) buffer holding at least ``need`` tokens, old content kept."""
    cap = 0 if buf is None else buf.shape[2]
    if need <= cap:
        return buf  # type: ignore[return-value]
    _, H, _, D = like.shape
    extra = mx.zeros((1, H, ((need - cap + _STEP - 1) // _STEP) * _STEP, D), dtype=like.dtype)
    return extra if buf is None else mx.concatenate([buf, extra], axis=2)


class CascadeCache:
    """One layer's working memory plus its view of the shared episodic store.

    Args:
        config: the cascade configuration.
        layer: this layer's index (the store key).
        store: the episodic store shared by all layers.
        router: this layer's routing strategy (default: ``make_router(config)``).
        question: the sequence's question pass, shared by its layers (None: off).
        attention: the attention function over the assembled context (the model's runner's,
            ``models/execution.py``; default MLX's own, ``prefill_ops.attention``).
    """

    attention: Callable[..., mx.array] = staticmethod(prefill_ops.attention)

    def __init__(self, config: CascadeConfig, layer: int, store: EpisodicStore, router: Router | None = None,
                 question: QuestionPass | None = None, attention: Callable[..., mx.array] | None = None):
        if attention is not None:
            self.attention = attention
        self.config = config
        self.layer = layer
        self.store = store
        self.router = router or make_router(config)
        self.offset = 0  # tokens seen
        self.n_sinks = 0
        self.n_window = 0
        self.n_blocks = 0
        self.sink_k: mx.array | None = None  # (1, Hkv, S, D) without RoPE
        self.sink_v: mx.array | None = None
        self.win_k: mx.array | None = None  # (1, Hkv, cap, D) without RoPE, first n_window valid
        self.win_v: mx.array | None = None
        self.index = SummaryIndex(config.representation)  # block summaries for routing
        self.selection: Selection = ()
        self.question = question
        self.pinned: tuple[int, ...] | None = None  # blocks every KV head attends, set by the question pass
        self._pinned_from = 0  # blocks that existed when it was set (``pin``)
        self.scale = 1.0  # attention scale of the last call (the question pass scores with it)
        self.counters = LayerCounters()
        # The rotated context [sinks | blocks | window] and the layout it was built for.
        self._ctx_k: mx.array | None = None  # (1, Hkv, cap, D)
        self._ctx_v: mx.array | None = None
        self._ctx_len = 0
        self._ctx_layout: tuple | None = None
        self._n_kv_heads = 0
        self._since_route = 0  # decode steps since the blocks were last scored
        self._new_blocks = False  # blocks sealed since the last scoring

    # ----------------------------------------- the cache interface (caches/interface.py)
    def prepare_decode(self, model: Any, caches: Sequence[Any], prompt: Sequence[int]) -> None:
        """After the prompt's prefill, before its first decode step: the question pass
        (``question.py``), once per request (from the first layer's cache)."""
        if self.question is not None and caches and caches[0] is self:
            self.question.run(model, caches, prompt)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> Any:
        """Not for the cascade: it keeps keys without RoPE and assembles its own rotated
        context, so attention must go through ``attend`` (``check_cascade`` refuses
        models whose attention does not)."""
        raise NotImplementedError("the memory cascade is attended through attend(), not update_and_fetch()")

    def make_mask(self, N: int, return_array: bool = False, window_size: Any = None) -> None:
        """No model-level mask: ``attend`` builds its own (causal over the new tokens)."""
        return None

    @property
    def state(self) -> list[mx.array]:
        """Arrays to evaluate after a prefill chunk (``generate_step`` calls this).

        The router's remembered queries are among them: left lazy, each chunk's slice
        of them would keep the previous chunk's queries alive (about 35 MB a chunk on
        the default model, 2 GB of peak memory by 32k tokens)."""
        arrays = (self.sink_k, self.sink_v, self.win_k, self.win_v, self._ctx_k, self._ctx_v, self.index.buf,
                  *self.router.to_state().values())
        return [a for a in arrays if a is not None]

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        """Drop the newest ``n`` tokens (speculative drafts, a reply cut by a stop string).

        Only tokens still in working memory can go: from the window, or from the sinks
        while nothing has left for the episodic store. A longer cut trims nothing and
        returns 0, so callers fall back (re-prefill); the rolling router keeps the
        queries of dropped tokens, a routing hint only.

        Returns:
            ``n`` when trimmed, else 0.
        """
        if n <= 0:
            return 0
        if n <= self.n_window:  # the layout (sinks, where the window starts) stays valid
            self.n_window -= n
            if self._ctx_layout is not None:
                self._ctx_len -= n
        elif self.n_window == 0 and self.n_blocks == 0 and n <= self.n_sinks:
            self.n_sinks -= n
            self.sink_k = self.sink_k[..., : self.n_sinks, :] if self.n_sinks else None
            self.sink_v = self.sink_v[..., : self.n_sinks, :] if self.n_sinks else None
            self._ctx_layout = None  # the sinks changed: rebuild at the next call
        else:
            return 0
        self.offset -= n
        return n

    def empty(self) -> bool:
        return self.offset == 0

    @property
    def nbytes(self) -> int:
        """Bytes of this layer's working memory (window, sinks, rotated context) and summaries."""
        arrays = (self.sink_k, self.sink_v, self.win_k, self.win_v, self._ctx_k, self._ctx_v)
        return sum(a.nbytes for a in arrays if a is not None) + self.index.nbytes

    # ------------------------------------------------------------------ attend
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
        """Attend new queries (1, Hq, L, D) to the cascade plus the new keys.

        Args:
            q, k, v: un-rotated queries (1, Hq, L, D), keys and values (1, Hkv, L, D).
            rope: the model's RoPE module, ``rope(x, offset=int)``.
            scale: attention scale.
            mask: ignored (``make_mask`` returns None); causal over the new tokens.

        Returns:
            (1, Hq, L, D) attention output.
        """
        if q.shape[0] != 1:
            raise ValueError(f"the memory cascade runs one sequence per cache, got batch {q.shape[0]}")
        L, c = q.shape[2], self.config.max_chunk
        if L > 1 and not (self.question is not None and self.question.running):
            self.pinned = None  # a new prompt's prefill: its own question pass chooses again
        if L <= c:
            return self._attend(q, k, v, rope, scale)
        outs = []
        for i in range(0, L, c):
            piece = slice(i, i + c)
            outs.append(self._attend(q[:, :, piece], k[:, :, piece], v[:, :, piece], rope, scale))
        return mx.concatenate(outs, axis=2)

    def _attend(self, q: mx.array, k: mx.array, v: mx.array, rope: Callable, scale: float) -> mx.array:
        L = q.shape[2]
        self.settle()
        self._n_kv_heads = k.shape[1]
        self.scale = scale
        self.counters.calls += 1
        selection = self._select(q, decode=L == 1, scale=scale)
        if selection != self.selection:
            self.counters.changes += 1
        self.selection = selection
        self.counters.selected += sum(len(s) for s in selection)
        layout = (selection, self.n_sinks, self.offset - self.n_window)
        old = self._ctx_layout
        if old is not None and old[1:] == layout[1:] and _count(old[0]) == _count(selection):
            if old[0] != selection:  # same positions: only the blocks' slots change
                self._rewrite_blocks(selection, rope, k.dtype)
        else:
            self._rebuild(selection, rope, k.dtype, room=L)
        self._ctx_layout = layout
        start = self._ctx_len
        q = rope(q, offset=start)
        kr = rope(k, offset=start)
        self._ctx_k = _grow(self._ctx_k, start + L, kr)
        self._ctx_v = _grow(self._ctx_v, start + L, v)
        self._ctx_k[..., start : start + L, :] = kr
        self._ctx_v[..., start : start + L, :] = v
        self._ctx_len = start + L
        keys = self._ctx_k[..., : self._ctx_len, :]  # (1, Hkv, P + n + L, D)
        values = self._ctx_v[..., : self._ctx_len, :]
        out = self.attention(q, keys, values, scale=scale, mask="causal" if L > 1 else None)
        self._append(k, v)
        if self.counters.calls % 32 == 0:
            # Decode may go on long without reading the window or the remembered
            # queries; evaluate them now and then so their lazy graphs stay short.
            mx.async_eval([a for a in (self.win_k, self.win_v, *self.router.to_state().values()) if a is not None])
        return out

    # --------------------------------------------------------------- selection
    def _select(self, q: mx.array, decode: bool, scale: float) -> Selection:
        """Blocks to attend for this call, per KV head."""
        k, n, Hkv = self.config.top_k, self.n_blocks, self._n_kv_heads
        if k == 0:
            return ()
        rq = self.router.queries(group_queries(q, Hkv), decode)  # (Hkv, G, M, D); rolling remembers
        if n == 0:
            return ()
        if n <= k:  # everything fits: no scoring, no host sync
            return tuple(tuple(range(n)) for _ in range(Hkv))
        if self.pinned is not None:  # the question pass chose for the question's re-read and its answer
            pinned = self._with_sealed_since_pin()
            if decode and self.config.answer_route:
                return self._route_beside(q, pinned, scale)
            return tuple(pinned for _ in range(Hkv))
        # A slow router keeps its choice for a few decode steps while no block was
        # added: no scoring, no host sync, and the assembled context is reused.
        if decode and not self._new_blocks and _count(self.selection) == k and self._since_route < self.router.interval:
            self._since_route += 1
            return self.selection
        self._since_route = 1 if decode else self.router.interval  # a decode after prefill re-scores
        self._new_blocks = False
        self.counters.routed += 1
        relevance = block_distribution(self.index.score(rq, self.router.pool(decode)), scale)
        return top_blocks(relevance, k, self.config.follow, lead=self.config.lead)

    def _route_beside(self, q: mx.array, base: tuple[int, ...], scale: float) -> Selection:
        """``base`` (the pinned blocks and those sealed since) plus, per KV head, the
        ``answer_route`` other blocks this decode step's query scores best (with their
        ``follow`` successors, within the count), so every head attends as many blocks.

        Why: the question pass pins what the question matches; a chain (RULER vt) is
        followed by the answer's own tokens ("3. VAR LZTKA" asks where LZTKA is
        assigned), which the question never names."""
        Hkv, n = self._n_kv_heads, self.n_blocks
        base_set = set(base)
        r = min(self.config.answer_route, n - len(base_set))
        if r <= 0:
            return tuple(base for _ in range(Hkv))
        self.counters.routed += 1
        relevance = block_distribution(self.index.score(group_queries(q, Hkv), 1), scale)  # (Hkv, n)
        chosen = top_blocks(relevance, r, self.config.follow, exclude=base_set, lead=self.config.lead)
        return tuple(tuple(sorted(base_set.union(row))) for row in chosen)

    def pin(self, blocks: tuple[int, ...]) -> None:
        """Attend ``blocks`` (the question pass's choice) until the next prompt's prefill,
        and the blocks sealed after this call (``_with_sealed_since_pin``)."""
        self.pinned = tuple(blocks)
        self._pinned_from = self.n_blocks

    def _with_sealed_since_pin(self) -> tuple[int, ...]:
        """The pinned blocks plus those sealed since: tokens that were in the window when
        the question chose stay in view while the answer pushes them out of it (without
        this, a needle at the window's edge lost its tail mid-answer: "754" for 7544128,
        measured). The first ones sealed, which held the window the
        question saw (a long answer's own older tokens come after them), and at most a
        prefill piece's worth less one token, so with the decoded token the attended keys
        stay within the span ``for_model`` checked."""
        most = (self.config.max_chunk - 1) // self.config.block_size
        later = range(self._pinned_from, min(self.n_blocks, self._pinned_from + most))
        if not later:
            return self.pinned
        return tuple(sorted(set(self.pinned).union(later)))

    # ------------------------------------------------------------ the context
    def _gather(self, selection: Selection, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        """Keys and values of the selected blocks, (1, Hkv, k*B, D) each, in order."""
        wanted = sorted({i for head in selection for i in head})
        uk, uv = self.store.fetch(self.layer, wanted, dtype)  # (Hkv, U*B, D): the union, in order
        if all(head == tuple(wanted) for head in selection):
            return uk[None], uv[None]
        # Each KV head takes its own blocks out of the union (few ops, whatever k is).
        B = self.config.block_size
        slot = {b: j for j, b in enumerate(wanted)}
        rows = [[slot[b] * B + t for b in head for t in range(B)] for head in selection]
        idx = mx.array(rows)[..., None]  # (Hkv, k*B, 1)
        return mx.take_along_axis(uk, idx, axis=1)[None], mx.take_along_axis(uv, idx, axis=1)[None]

    def _rebuild(self, selection: Selection, rope: Callable, dtype: mx.Dtype, room: int = 1) -> None:
        """Rotate [sinks | selected blocks | window] at positions 0.. into a new buffer
        with room for ``room`` new tokens (a prefill piece then needs no second copy)."""
        self.counters.rebuilds += 1
        parts_k, parts_v = [], []
        if self.n_sinks:
            parts_k.append(self.sink_k[..., : self.n_sinks, :])
            parts_v.append(self.sink_v[..., : self.n_sinks, :])
        if _count(selection):
            bk, bv = self._gather(selection, dtype)
            parts_k.append(bk)
            parts_v.append(bv)
        if self.n_window:
            parts_k.append(self.win_k[..., : self.n_window, :])
            parts_v.append(self.win_v[..., : self.n_window, :])
        if not parts_k:
            self._ctx_len = 0
            return
        ck = rope(mx.concatenate(parts_k, axis=2), offset=0)  # (1, Hkv, P + n, D)
        cv = mx.concatenate(parts_v, axis=2)
        n = ck.shape[2]
        # A fresh buffer: the old one may still be read by an unevaluated step.
        self._ctx_k = _grow(None, n + max(room, self.config.block_size), ck)
        self._ctx_v = _grow(None, n + max(room, self.config.block_size), cv)
        self._ctx_k[..., :n, :] = ck
        self._ctx_v[..., :n, :] = cv
        self._ctx_len = n

    def _rewrite_blocks(self, selection: Selection, rope: Callable, dtype: mx.Dtype) -> None:
        """Swap in a new selection of as many blocks; sinks and window stay put."""
        bk, bv = self._gather(selection, dtype)
        a, b = self.n_sinks, self.n_sinks + bk.shape[2]
        self._ctx_k[..., a:b, :] = rope(bk, offset=a)
        self._ctx_v[..., a:b, :] = bv

    # ------------------------------------------------------------------ memory
    def _append(self, k: mx.array, v: mx.array) -> None:
        """Add new un-rotated keys/values to sinks, then window; evict whole blocks."""
        L = k.shape[2]
        take = min(L, self.config.sinks - self.n_sinks)
        if take > 0:
            # No blocks and an empty window yet, so the rotated context stays valid.
            new_k, new_v = k[..., :take, :], v[..., :take, :]
            if self.sink_k is not None:
                new_k = mx.concatenate([self.sink_k, new_k], axis=2)
                new_v = mx.concatenate([self.sink_v, new_v], axis=2)
            self.sink_k, self.sink_v = new_k, new_v
            self.n_sinks += take
        rest = L - take
        if rest > 0:
            n = self.n_window
            self.win_k = _grow(self.win_k, n + rest, k)
            self.win_v = _grow(self.win_v, n + rest, v)
            self.win_k[..., n : n + rest, :] = k[..., take:, :]
            self.win_v[..., n : n + rest, :] = v[..., take:, :]
            self.n_window = n + rest
        self.offset += L
        if self._ctx_layout is not None:
            self._ctx_layout = (self.selection, self.n_sinks, self.offset - self.n_window)
        # Past W, whole blocks leave for the store at the start of the next call, not
        # now: a ``trim`` before it (rejected drafts) then finds them still in the window.

    def settle(self) -> None:
        """Move whole blocks past the window's W tokens to the episodic store now
        (each call does it first; this is for readers between calls)."""
        if self.n_window > self.config.window:
            self._evict()

    def _evict(self) -> None:
        """Move whole blocks from the window's old end to the episodic store.

        All the blocks of one call go at once (a prefill chunk seals chunk / B of them
        per layer): one store call, one summary op, one index write, so the MLX ops and
        the Python work per call do not grow with the blocks sealed."""
        B, W = self.config.block_size, self.config.window
        n_out = -(-(self.n_window - W) // B)  # blocks needed to get back under W
        start = self.offset - self.n_window
        _, H, _, D = self.win_k.shape
        ks = self.win_k[0, :, : n_out * B, :].reshape(H, n_out, B, D)  # (Hkv, n, B, D)
        vs = self.win_v[0, :, : n_out * B, :].reshape(H, n_out, B, D)
        blocks = self.store.add_many(self.layer, self.n_blocks, start, ks.swapaxes(0, 1), vs.swapaxes(0, 1))
        self.index.add_many(summarize_blocks(ks, self.config.representation))  # (Hkv, R, n, D)
        self.n_blocks += n_out
        sealed = [a for b in blocks if b.payload is not None for a in b.payload.values()]
        # Evaluate the sealed payloads soon (without waiting), so they do not pin old window buffers.
        if sealed:
            mx.async_eval(sealed)
        self._drop_from_window(n_out * B)

    def _drop_from_window(self, n: int) -> None:
        """Drop the window's oldest ``n`` tokens (just stored as blocks)."""
        keep = self.n_window - n
        # A fresh window buffer: an in-place shift would alias the slice it reads.
        cap, kept = self.win_k.shape[2], slice(n, self.n_window)
        self.win_k = mx.concatenate([self.win_k[..., kept, :], mx.zeros_like(self.win_k[..., : cap - keep, :])], axis=2)
        self.win_v = mx.concatenate([self.win_v[..., kept, :], mx.zeros_like(self.win_v[..., : cap - keep, :])], axis=2)
        self.n_window = keep
        self._new_blocks = True
        self._ctx_layout = None  # positions shift: rebuild at the next call

    # ------------------------------------------------------------- snapshots
    def to_state(self) -> tuple[dict[str, mx.array], dict]:
        """This layer's cascade as arrays + JSON-able metadata (for snapshots).

        Spilled blocks are read back into the arrays (they stay spilled here). The
        rotated context is not saved: ``from_state`` rebuilds it from the rest.

        Returns:
            ``(arrays, meta)``; ``from_state(arrays, meta, config)`` inverts it.
        """
        arrays: dict[str, mx.array] = {}
        if self.n_sinks:
            arrays["sink_k"], arrays["sink_v"] = self.sink_k, self.sink_v
        if self.n_window:
            arrays["win_k"], arrays["win_v"] = self.win_k[..., : self.n_window, :], self.win_v[..., : self.n_window, :]
        if self.n_blocks:
            arrays["summaries"] = self.index.view()
        blocks = []
        for i in range(self.n_blocks):
            b = self.store.blocks[(self.layer, i)]
            for name, a in self.store.payload_of(b).items():
                arrays[f"block.{i}.{name}"] = a
            blocks.append({"start": b.start, "last_used": b.last_used, "hits": b.hits, "loads": b.loads, "kind": b.kind})
        arrays.update({f"router.{n}": a for n, a in self.router.to_state().items()})
        meta = {
            "layer": self.layer,
            "offset": self.offset,
            "n_sinks": self.n_sinks,
            "n_window": self.n_window,
            "n_kv_heads": self._n_kv_heads,
            "head_dim": self.index.buf.shape[-1] if self.index.buf is not None else 0,
            "selection": [list(h) for h in self.selection],
            "since_route": self._since_route,
            "new_blocks": self._new_blocks,
            "blocks": blocks,
            "counters": asdict(self.counters),
            "config": self.config.to_dict(),
            "episodic_budget": self.store.budget_bytes,  # the engine's, weights and limit known (restore)
        }
        return arrays, meta

    @classmethod
    def from_state(
        cls, arrays: dict[str, mx.array], meta: dict, config: CascadeConfig, store: EpisodicStore | None = None,
        settle: bool = True,
    ) -> "CascadeCache":
        """Rebuild a layer's cascade from ``to_state`` output.

        Args:
            arrays, meta: what ``to_state`` returned.
            config: the configuration to run with; its block size, summary kind and
                sinks must match the saved ones (each block keeps the kind it was stored
                as, so another block kind only changes how new blocks are stored).
            store: the episodic store shared by the model's layers (None = a new one).
            settle: order the store and apply its budget now; False when more layers
                follow (``restore_cascade_cache`` settles once, after the last: one sort,
                and the budget applied to every layer's blocks at once).

        Raises:
            SnapshotError: the state does not fit ``config`` or is incomplete.
        """
        saved = meta.get("config", {})
        for name in ("block_size", "representation", "sinks"):
            if saved.get(name) != getattr(config, name):
                raise SnapshotError(
                    f"cascade state has {name}={saved.get(name)!r}, the config has {getattr(config, name)!r}"
                )
        store = store if store is not None else EpisodicStore.from_config(config)
        c = cls(config, int(meta["layer"]), store)
        try:
            c.offset, c.n_sinks, c.n_window = int(meta["offset"]), int(meta["n_sinks"]), int(meta["n_window"])
            c._n_kv_heads = int(meta["n_kv_heads"])
            if c.n_sinks:
                c.sink_k, c.sink_v = arrays["sink_k"], arrays["sink_v"]
            if c.n_window:
                c.win_k = _grow(None, c.n_window, arrays["win_k"])
                c.win_v = _grow(None, c.n_window, arrays["win_v"])
                c.win_k[..., : c.n_window, :] = arrays["win_k"]
                c.win_v[..., : c.n_window, :] = arrays["win_v"]
            c.n_blocks = len(meta["blocks"])
            c.index = SummaryIndex.from_array(config.representation, arrays["summaries"] if c.n_blocks else None)
            for i, info in enumerate(meta["blocks"]):
                prefix = f"block.{i}."
                payload = {n[len(prefix) :]: a for n, a in arrays.items() if n.startswith(prefix)}
                if not payload:
                    raise KeyError(prefix)
                nbytes = sum(a.nbytes for a in payload.values())
                shape = (c._n_kv_heads, config.block_size, int(meta["head_dim"]))
                # States written before blocks recorded their kind hold the config's (never auto then).
                kind = info.get("kind", saved.get("block_kind", "float16"))
                if kind not in STORED_KINDS:
                    raise ValueError(f"block kind {kind!r}")
                block = Block(c.layer, i, int(info["start"]), shape, nbytes, payload, kind=kind)
                block.last_used, block.hits, block.loads = int(info["last_used"]), int(info["hits"]), int(info["loads"])
                store.restore(block)
            if settle:
                store.settle()
            c.router.from_state({n[7:]: a for n, a in arrays.items() if n.startswith("router.")})
            c.selection = tuple(tuple(int(i) for i in h) for h in meta["selection"])
            c._since_route, c._new_blocks = int(meta["since_route"]), bool(meta["new_blocks"])
            c.counters = LayerCounters(**meta["counters"])
        except (KeyError, TypeError, ValueError) as e:
            raise SnapshotError(f"incomplete cascade state for layer {meta.get('layer')!r}: missing or bad {e}") from e
        return c

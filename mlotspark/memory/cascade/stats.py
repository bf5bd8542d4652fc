"""``cascade_stats``: what the memory cascade holds and does, for the API, TUI and bench."""

from __future__ import annotations

from mlotspark.memory.cascade.cache import CascadeCache


def cascade_stats(caches: list) -> dict:
    """Tokens and bytes per tier, blocks in memory / on disk, retrievals and hits.

    Args:
        caches: the per-layer caches of one sequence (``make_cascade_cache``).

    Returns:
        A JSON-able dict (empty if ``caches`` are not cascade caches)::

            tokens: {total, sinks, window, episodic}   (per layer; all layers agree)
            bytes: {working, summaries, episodic_memory, episodic_disk}   (all layers)
            blocks: {total, in_memory, on_disk}   (all layers)
            retrieval: {calls, routed_calls, blocks_per_call, selection_changes, rebuilds}
            store: {hits, loads, spills, compressed, hit_rate, bytes_written, bytes_read}
            question_passes: question passes run on these caches (a conversation's carry
                over from turn to turn: one per prompt at most)
    """
    layers = [c for c in caches if isinstance(c, CascadeCache)]
    if not layers:
        return {}
    first, store = layers[0], layers[0].store
    B = first.config.block_size
    in_memory = sum(1 for b in store.blocks.values() if b.payload is not None)
    on_disk_bytes = sum(b.nbytes for b in store.blocks.values() if b.payload is None)
    summaries = sum(c.index.nbytes for c in layers)
    working = sum(c.nbytes for c in layers) - summaries
    calls = sum(c.counters.calls for c in layers)
    heads = max(first._n_kv_heads, 1)
    served = store.counters.hits + store.counters.loads
    return {
        "config": first.config.to_dict(),
        "tokens": {
            "total": first.offset,
            "sinks": first.n_sinks,
            "window": first.n_window,
            "episodic": first.n_blocks * B,
        },
        "bytes": {
            "working": working,
            "summaries": summaries,
            "episodic_memory": store.resident_bytes,
            "episodic_disk": on_disk_bytes,
            # bounds episodic_memory + summaries: past it blocks go 8-bit (auto), then spill to disk
            "episodic_budget": store.budget_bytes,
        },
        "blocks": {"total": len(store.blocks), "in_memory": in_memory, "on_disk": len(store.blocks) - in_memory},
        "retrieval": {
            "calls": calls // len(layers),  # per layer: prefill pieces + decode steps
            "routed_calls": sum(c.counters.routed for c in layers) // len(layers),
            "blocks_per_call": round(sum(c.counters.selected for c in layers) / max(calls, 1) / heads, 3),
            "selection_changes": sum(c.counters.changes for c in layers),
            "rebuilds": sum(c.counters.rebuilds for c in layers),
        },
        "store": {
            "hits": store.counters.hits,
            "loads": store.counters.loads,
            "spills": store.counters.spills,
            "compressed": store.counters.compressed,  # re-stored 8-bit to stay in memory (block_kind auto)
            "hit_rate": round(store.counters.hits / served, 4) if served else None,
            "bytes_written": store.counters.bytes_written,
            "bytes_read": store.counters.bytes_read,
        },
        # Re-reads of the prompt's question with the blocks it chose (question.py); 0 with
        # another routing, or while every block fits in top_k.
        "question_passes": first.question.passes if first.question is not None else 0,
    }

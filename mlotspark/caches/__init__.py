"""KV caches: what a cache must provide, the caches themselves, their kinds, and which
kind a request gets under ``cache_kind="auto"``.

- ``interface``: the one declared interface between attention and KV memory (the
  ``Cache`` Protocol, ``AttentionContext``) and the lifecycle step ``prepare_decode``.
- ``kv``: ``KVCache``, the plain full-attention cache (mlx-lm's, plus ``attend``).
- ``kinds``: the kinds ``float16 | q8 | q4`` (``make_cache``, ``kv_bytes``, beam
  search's ``reorder_cache``/``tile_cache``).
- ``policy``: ``cache_kind="auto"`` (byte budget, quality gates, speed; probes persisted).

Not here: the memory cascade's cache (``memory/cascade/``, with its tiers); the state of
any cache as arrays (``memory/kv_state.py``, which serialises the cascade too); the
choice between the cascade and a KV kind (``runtime/cache_choice.py``, above both).

May import: ``errors``, ``steps``, ``storage``, ``platform`` (the layer below) and
``models`` (same layer: the attention kernels in ``models.cpu.prefill_ops``, the llama
model a kind is made for).
"""

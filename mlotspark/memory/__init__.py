"""The memory cascade's three tiers and their persistence (DESIGN §4).

- ``cascade/``: working memory (sinks + local window) and episodic blocks retrieved
  back into attention: config, routing (*how blocks are chosen*: ``routing.py``),
  the block store, the per-layer cache, stats.
- ``kv_state``: capture, restore, trim and measure per-layer cache state (plain KV or
  cascade), the form snapshots and the prefix cache store.
- ``snapshots``: KV snapshots on disk (safetensors + JSON, fingerprint-checked).
- ``prefix_cache``: shared prompt prefixes (LFU with aging), kept across restarts.
- ``semantic/``: the semantic tier (SQLite + FTS5 + vectors).

Conversations and the persistence that budgets all of the above live above the
runtime, in ``mlotspark.conversations``.

May import: ``errors``, ``options``, ``results``, ``storage``, ``platform``, ``models``,
``caches``.
Never ``decoding``, ``runtime``, ``conversations`` or ``engine``.
``import mlotspark.memory.semantic`` must not import MLX.
"""

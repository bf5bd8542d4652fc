"""The memory cascade's three tiers and their persistence (DESIGN §4).

- ``cascade/``: working memory (sinks + local window) and episodic blocks retrieved
  back into attention: config, routing (*how blocks are chosen*: ``routing.py``),
  the block store, the per-layer cache, stats.
- ``kv_state``: capture, restore, trim and measure per-layer cache state (plain KV or
  cascade), the form snapshots and the prefix cache store.
- ``snapshots``: KV snapshots on disk (safetensors + JSON, fingerprint-checked).
- ``prefix_cache``: shared prompt prefixes (LFU with aging), kept across restarts.
- ``conversations``: ``Conversation``: one turn = retrieve, render, reuse the longest
  cached prefix, submit, then store (*where a turn is persisted*: ``_finish``).
- ``persistence``: ``Persistence``: the budgets and eviction of all of the above.
- ``semantic/``: the semantic tier (SQLite + FTS5 + vectors).
- ``host``: Protocols for what memory needs from the engine above it.

May import: ``errors``, ``options``, ``results``, ``storage``, ``platform``, ``models``.
Never ``decoding``, ``runtime`` or ``engine``: a turn reaches the engine through
``host.EngineLike``. ``import mlotspark.memory.semantic`` must not import MLX.
"""

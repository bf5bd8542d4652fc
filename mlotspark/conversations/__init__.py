"""Conversations that survive restarts, and the persistence of an engine's memory.

- ``conversation``: ``Conversation``: one turn = retrieve, render, reuse the longest
  cached prefix, submit, then store (*where a turn is persisted*: ``_store``).
- ``record``: a conversation on disk: its record, directory and lock (no MLX).
- ``persistence``: ``Persistence``: conversations, snapshots, the prefix cache and
  semantic memory of one engine, with their budgets and eviction.
- ``writer``: stores finished turns beside the engine thread, in order.
- ``host``: what a ``Conversation`` asks of its ``Persistence``.

This package sits above the runtime and drives the engine only through its declared
interface (``runtime.engine_api.EngineProtocol``); ``mlotspark.engine`` imports it
(``engine.conversation(name)``), never the reverse.
May import: everything below the engine (``memory``, ``runtime`` ...), never ``engine``.
"""

"""The semantic tier: what lasts across conversations (DESIGN §4).

Text entries in SQLite (WAL, FTS5 for words, float32 vector blobs for meaning),
found by a hybrid search and put into the system prompt at the start of a turn.

- ``store``: ``SemanticStore``; ``search`` its score and what goes into a prompt,
  ``lexical`` the BM25 half, ``duplicates``, ``transfer`` (export/import),
  ``reembed`` the vectors table (loading, re-embedding for a new embedder).
- ``database``: the SQLite file (schema, upgrades, WAL, durability, permissions).
- ``records``: ``Entry``, ``Hit``, value checks, the export JSON form.
- ``prompt``: ``format_memory_section``, the section put into the system prompt.
- The embedders (the ``Embedder`` protocol, ``HashingEmbedder``, ``MPNetEmbedder``,
  ``MiniLMEmbedder``, ``default_embedder``: MPNet, else MiniLM, else hashing) live in
  ``mlotspark.models.embedders`` and ``sentence_embedders``, re-exported here.
- ``calibration``: how cosine and lexical scores combine, and the injection
  thresholds, per embedder.
- ``writer``: the ``MemoryWriter`` protocol (a turn and its related entries ->
  ``Operation`` s: add / supersede / delete / none) and ``SimpleWriter``;
  ``model_writer``: ``ModelWriter``, the chat model proposing them in one
  JSON-constrained call; ``requests``: sentences, "remember that …", "forget …";
  ``learning``: ``learn_turn``, a turn through a writer into the store.
- ``history``: superseded marks; ``dates``: every entry dated, shown with its day.
- ``text`` and ``index``: word helpers and the in-memory vector matrix.

Engine wiring, per turn: ``retrieve_for_prompt(user_text, count_tokens=...)`` →
``format_memory_section(hits)`` into the system prompt (among entries about the same
thing the newest is shown, dated: ``search.newest_of_alike``), hit ids into the turn's
stats; after the turn, ``learn_turn(store, user_text, name, writer)``.

May import: ``errors``, ``options``, ``storage``, ``steps``, ``models`` and NumPy/SQLite; never MLX
at import time (the ``memory`` commands stay light).
"""

from mlotspark.memory.semantic.calibration import Calibration, about_user, calibration_for, is_request
from mlotspark.models.embedders import Embedder, HashingEmbedder
from mlotspark.models.embedders import default_embedder, describe_embedder
from mlotspark.memory.semantic.learning import Learned, learn_turn
from mlotspark.memory.semantic.writer import MemoryWriter, Operation, SimpleWriter
from mlotspark.memory.semantic.database import SCHEMA_VERSION
from mlotspark.memory.semantic.prompt import MEMORY_HEADER, approx_tokens, format_memory_section
from mlotspark.memory.semantic.records import Entry, Hit
from mlotspark.memory.semantic.store import DEFAULT_THRESHOLD, SemanticStore
from mlotspark.models.sentence_embedders import MiniLMEmbedder, MPNetEmbedder

__all__ = [
    "DEFAULT_THRESHOLD",
    "Calibration",
    "MEMORY_HEADER",
    "SCHEMA_VERSION",
    "Embedder",
    "Entry",
    "HashingEmbedder",
    "MiniLMEmbedder",
    "MPNetEmbedder",
    "Hit",
    "Learned",
    "MemoryWriter",
    "Operation",
    "SimpleWriter",
    "SemanticStore",
    "about_user",
    "approx_tokens",
    "calibration_for",
    "default_embedder",
    "describe_embedder",
    "format_memory_section",
    "is_request",
    "learn_turn",
]

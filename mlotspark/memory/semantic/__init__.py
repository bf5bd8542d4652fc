"""The semantic tier: what lasts across conversations (DESIGN §4).

Text entries in SQLite (WAL, FTS5 for words, float32 vector blobs for meaning),
found by a hybrid search and put into the system prompt at the start of a turn.

- ``store``: ``SemanticStore``; ``search`` its score and what goes into a prompt,
  ``lexical`` the BM25 half, ``duplicates``, ``transfer`` (export/import),
  ``reembed`` the vectors table (loading, re-embedding for a new embedder).
- ``database``: the SQLite file (schema, upgrades, WAL, durability, permissions).
- ``records``: ``Entry``, ``Hit``, value checks, the export JSON form.
- ``prompt``: ``format_memory_section``, the section put into the system prompt.
- ``embedding``: the ``Embedder`` protocol and ``HashingEmbedder``, the fallback
  (why not the chat model's hidden states: see that module).
- ``choice``: ``default_embedder`` (MPNet, else MiniLM, else hashing). The sentence
  embedders ``MPNetEmbedder`` and ``MiniLMEmbedder`` live in
  ``mlotspark.models.sentence_embedders`` and are re-exported here.
- ``calibration``: how cosine and lexical scores combine, and the injection
  thresholds, per embedder.
- ``facts``: ``extract_facts``, the sentences of a user turn worth remembering;
  ``learning``: ``learn_turn``, a turn's retractions then its facts; ``updates``
  and ``history``: when a newer fact supersedes an older one, and marking it;
  ``retractions``: what "forget that ..." names, and the entry it takes.
- ``events``: dated facts ("I got the promotion today!" shown with the day it
  was said; the store's ``clock`` dates entries) and events told on several days
  (one entry, each day an occurrence).
- ``text`` and ``index``: word helpers and the in-memory vector matrix.

Engine wiring, per turn: ``retrieve_for_prompt(user_text, count_tokens=...)`` →
``format_memory_section(hits)`` into the system prompt, hit ids into the turn's
stats; after the turn, ``learn_turn(store, user_text, name)`` (retractions, then
``remember(f, source="turn", conversation=name)`` for each ``f`` in ``extract_facts(user_text)``).

May import: ``errors``, ``options``, ``storage``, ``steps``, ``models`` and NumPy/SQLite; never MLX
at import time (the ``memory`` commands stay light).
"""

from mlotspark.memory.semantic.calibration import Calibration, about_user, calibration_for, is_request
from mlotspark.memory.semantic.embedding import Embedder, HashingEmbedder
from mlotspark.memory.semantic.choice import default_embedder, describe_embedder
from mlotspark.memory.semantic.facts import extract_facts
from mlotspark.memory.semantic.learning import Learned, learn_turn
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
    "SemanticStore",
    "about_user",
    "approx_tokens",
    "calibration_for",
    "default_embedder",
    "describe_embedder",
    "extract_facts",
    "format_memory_section",
    "is_request",
    "learn_turn",
]

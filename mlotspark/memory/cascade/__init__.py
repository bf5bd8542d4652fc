"""The memory cascade's working and episodic tiers (DESIGN §4).

- ``config``: ``CascadeConfig`` (sizes and policies, validated).
- ``routing``: block summaries, scores and the routing strategies.
- ``blocks``: the episodic block store (float16 / q8 / q4, or auto: 8-bit past the budget; spill to disk).
- ``block_codec``: how a block's keys and values are packed (float16, or quantized along D).
- ``cache``: the per-layer cascade cache.
- ``model_caches``: a model's caches as one: ``check_cascade``, ``make_cascade_cache``, ``is_cascade``,
  ``cascade_state`` and ``restore_cascade_cache``.
- ``stats``: ``cascade_stats``.

May import: ``errors``, ``storage``, ``models`` (the llama model it serves).
"""

from mlotspark.memory.cascade.blocks import EpisodicStore
from mlotspark.memory.cascade.cache import CascadeCache
from mlotspark.memory.cascade.config import BLOCK_KINDS, ROUTINGS, CascadeConfig
from mlotspark.memory.cascade.model_caches import (
    cascade_state,
    check_cascade,
    is_cascade,
    make_cascade_cache,
    restore_cascade_cache,
)
from mlotspark.memory.cascade.routing import HybridRouter, RollingRouter, Router, SequenceRouter, TokenRouter, make_router
from mlotspark.memory.cascade.stats import cascade_stats

__all__ = [
    "BLOCK_KINDS",
    "ROUTINGS",
    "CascadeCache",
    "CascadeConfig",
    "EpisodicStore",
    "HybridRouter",
    "RollingRouter",
    "Router",
    "SequenceRouter",
    "TokenRouter",
    "cascade_state",
    "cascade_stats",
    "check_cascade",
    "is_cascade",
    "make_cascade_cache",
    "make_router",
    "restore_cascade_cache",
]

"""The memory cascade's working and episodic tiers (DESIGN §4).

- ``config``: ``CascadeConfig`` (sizes and policies, validated).
- ``routing``: block summaries, scores and the routing strategies.
- ``blocks``: the episodic block store (float16 / q8 / q4, spill to disk).
- ``cache``: the per-layer cascade cache and ``make_cascade_cache``.
- ``stats``: ``cascade_stats``.
"""

from mlotspark.memory.cascade.blocks import EpisodicStore
from mlotspark.memory.cascade.cache import CascadeCache, cascade_state, make_cascade_cache, restore_cascade_cache
from mlotspark.memory.cascade.config import BLOCK_KINDS, ROUTINGS, CascadeConfig
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
    "make_cascade_cache",
    "make_router",
    "restore_cascade_cache",
]

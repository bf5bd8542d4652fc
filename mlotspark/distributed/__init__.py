"""One model across several processes or machines, on MLX's own distributed layer.

Ranks are started by ``mlx.launch`` (ring backend over TCP or Thunderbolt, or MPI)
and joined with ``mx.distributed.init``; hidden states move with
``mx.distributed.send/recv``, control messages as JSON through collectives.

- ``group``: ``RankGroup``, joining the group, JSON gather/broadcast.
- ``split``: ``plan_layers``: which layers each rank runs (by free memory or evenly).
- ``pipeline``: ``PipelineModel`` (one rank's slice of the layers) and
  ``broadcast_sampler`` (rank 0's token for every rank).
- ``tensor``: the head-count check and MLX's sharded linear layers.
- ``loading``: the handshake (fingerprints, free memory) and per-rank loading.
- ``runner``: rank 0's request loop with its watchdog; the other ranks' ``follow``.
- ``rank_memory``: a follower's share of each conversation's cache and its per-rank snapshot.
- ``session``: ``DistributedSession``, what an Engine holds in a multi-rank run.

May import: ``errors``, ``options``, ``results``, ``storage``, ``platform``, ``models``,
``thermal``, ``memory``, ``runtime``. Never ``engine``, ``cli``, ``bench`` or ``tui``.
"""

from mlotspark.distributed.group import RankGroup, join, launched
from mlotspark.distributed.loading import MODES, DistributedSetup, check_distributed, load
from mlotspark.distributed.runner import DEFAULT_TIMEOUT_S, RankRequest
from mlotspark.distributed.session import DistributedSession
from mlotspark.distributed.split import SPLITS, plan_layers

__all__ = [
    "DEFAULT_TIMEOUT_S", "MODES", "SPLITS", "DistributedSession", "DistributedSetup", "RankGroup", "RankRequest",
    "check_distributed", "join", "launched", "load", "plan_layers",
]

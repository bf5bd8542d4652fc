"""One model across several processes or machines, on MLX's own distributed layer.

Ranks are started by ``mlx.launch`` (ring backend over TCP or Thunderbolt, JACCL over
RDMA on Thunderbolt 5, or MPI) and joined with ``mx.distributed.init``; hidden states move with
``mx.distributed.send/recv``, control messages as JSON through collectives.

- ``group``: ``RankGroup``, joining the group, JSON gather/broadcast.
- ``split``: ``plan_layers``: which layers each rank runs (by free memory or evenly).
- ``pipeline``: ``PipelineModel`` (one rank's slice of the layers).
- ``tensor``: the head-count check and MLX's sharded linear layers.
- ``loading``: the handshake (fingerprints, free memory) and per-rank loading.
- ``protocol``: the step messages rank 0 broadcasts, and what every rank decides alike.
- ``leader``: ``RankLeader``, rank 0's scheduler's steps told to the others, with a watchdog.
- ``follower``: the other ranks' loop: the same batched steps on their share.
- ``rank_status``: each rank's figures; rank 0's governor reading every rank's probes.
- ``rank_memory``: a follower's share of each conversation's cache and its per-rank snapshot.
- ``session``: ``DistributedSession``, what an Engine holds in a multi-rank run.

May import: ``errors``, ``options``, ``results``, ``storage``, ``platform``, ``models``,
``caches``, ``thermal``, ``memory``, ``runtime``. Never ``engine``, ``cli``, ``bench`` or ``tui``.
"""

from mlotspark.distributed.group import RankGroup, join, launched
from mlotspark.distributed.loading import MODES, DistributedSetup, check_distributed, load
from mlotspark.distributed.protocol import DEFAULT_TIMEOUT_S
from mlotspark.distributed.session import DistributedSession
from mlotspark.distributed.split import SPLITS, plan_layers

__all__ = [
    "DEFAULT_TIMEOUT_S", "MODES", "SPLITS", "DistributedSession", "DistributedSetup", "RankGroup",
    "check_distributed", "join", "launched", "load", "plan_layers",
]
